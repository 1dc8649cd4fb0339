"""Real PyTorch through tether: ``torchrun --nproc-per-node 2`` on the CPU (gloo), each rank with a
DataLoader of 2 workers, a breakpoint in rank 1's training step set while the run was queued; and
issue 42's "Done when" with ``--nproc-per-node 4``: the ranks stopped, inspected (``tether
stacks``, ``tether eval``), stepped, held paused past their process group's timeout and continued
as one.

PyTorch lives in a venv of its own (``.venv-torch`` at the repository's root, made here on first
use with ``pip install torch==2.13.0 numpy``), and tether runs the program on that interpreter,
lending it only its debugpy: the user's environment, as in real use. Marked ``torch``: ``./dev
test -m torch`` runs it alone; the whole suite and CI run it too (``TETHER_REQUIRE_TORCH=1``, set
by ``.ci/run``: a venv that cannot be made fails the test instead of skipping it).
"""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

import pytest
import trio
from direct_debugpy import copy_programs
from node_harness import open_vscode_session, scenario
from stack import debug_run, program_python, relay_stack, runnable_by_anyone, worker
from test_processes_e2e import run_through_tether
from test_rank_eval_e2e import tether_eval
from test_rank_group_e2e import rank_session
from test_rank_stacks_e2e import stacks
from venvs import own_venv

from protocol_specs.session.processes import COLLECTIVE_TIMEOUT_HINT

pytestmark = [pytest.mark.slow, pytest.mark.torch, pytest.mark.timeout(600)]

TORCH = "torch==2.13.0"  # the CPU build this machine keeps on disk (pip takes it from there)
PROGRAM = Path(__file__).resolve().parent / "programs" / "train_ddp.py"
#: train_step(): the line only rank 1 runs, at step 2
STEP_LINE = next(
    n for n, line in enumerate(PROGRAM.read_text().splitlines(), 1) if "# the breakpoint" in line
)


@pytest.fixture(scope="module")
def torch_python() -> str:
    probe = "import torch, numpy"
    return str(own_venv(".venv-torch", [TORCH, "numpy"], probe, require="TETHER_REQUIRE_TORCH"))


async def test_torchrun_rank_1_stops_in_its_training_step(
    tmp_path: Path, torch_python: str
) -> None:
    steps: list[dict[str, Any]] = [
        {
            "op": "wait_session",
            "label": "rank1",
            "expect": {"name": {"$regex": r"^rank 1 \(pid \d+\)"}},
        },
        {
            "op": "wait_stopped",
            "session": "rank1",
            "label": "hit",
            "reason": "breakpoint",
            "path": "train_ddp.py",
            "line": STEP_LINE,
            "function": "train_step",
        },
        {"op": "variables", "session": "rank1", "label": "locals", "scope": "Locals"},
        {
            "op": "evaluate",
            "session": "rank1",
            "label": "world",
            "expression": "__import__('os').environ['WORLD_SIZE']",
        },
        {
            "op": "wait_output",
            "session": "rank1",
            "category": "important",
            "contains": COLLECTIVE_TIMEOUT_HINT,
        },
        {"op": "continue", "session": "rank1"},
        {"op": "wait_output", "contains": "rank 1 done, 4 steps"},
        {"op": "wait_terminated", "label": "end"},
        {"op": "disconnect"},
    ]
    command = ["-m", "torch.distributed.run", "--nproc-per-node", "2", "train_ddp.py"]
    result, _messages, _port = await run_through_tether(
        tmp_path, command, {"train_ddp.py": [STEP_LINE]}, steps, program=torch_python
    )
    labels = result["labels"]
    values = labels["locals"]["values"]
    assert (values["step"], values["rank"]) == ("2", "1")
    assert labels["world"]["result"] == "'2'"
    assert labels["end"]["exitCode"] == 0


GROUP_PROGRAM = Path(__file__).resolve().parent / "programs" / "ddp_group.py"
#: train_step(): the line only rank 2 runs, at step 2, after its backward
GROUP_LINE = next(
    n
    for n, line in enumerate(GROUP_PROGRAM.read_text().splitlines(), 1)
    if "# the breakpoint" in line
)
#: train_step(): where the others wait for rank 2 (a Python loop around a non-blocking barrier)
WAIT_LINES = {GROUP_LINE + 2, GROUP_LINE + 3}
#: how long the job is held paused: six times its process group's timeout (10 s)
PAUSE_S = 60


def _all_paused(report: dict[str, Any]) -> bool:
    """Every rank's pause is on record (the stop reports reach the relay soon after the stops)."""
    return sorted(p["rank"] for p in report["processes"] if p["state"] == "paused") == [0, 1, 2, 3]


async def test_issue_42_torchrun_4_ranks_stop_step_and_continue_as_one_and_are_compared(
    tmp_path: Path, torch_python: str
) -> None:
    """Issue 42's "Done when", as a user does it: ``torchrun --nproc-per-node 4`` (gloo), a
    DataLoader of 2 workers per rank, a process group timeout of 10 s, a breakpoint set while the
    run was queued in rank 2's training step. Rank 2 stops, the group pauses the other three
    (each rank's session offered: 4 ranks); ``tether stacks`` shows one rank at the breakpoint
    and three paused elsewhere; ``tether eval`` each rank's loss and the gradient's tensor
    summary; a ``next`` in rank 0's session moves all four to their next line; the job stays
    paused for 60 s in all (the others' barrier pending the while), then a continue in rank 2's
    session runs them all and the job ends with exit code 0."""
    ws = copy_programs(tmp_path / "ws")
    home = tmp_path / "home"
    isolated = runnable_by_anyone(torch_python) and program_python() is not None
    steps: list[dict[str, Any]] = [
        {"op": "mark", "name": "configured", "wait": True},
        rank_session(2),
        {
            "op": "wait_stopped",
            "session": "r2",
            "reason": "breakpoint",
            "path": "ddp_group.py",
            "line": GROUP_LINE,
            "function": "train_step",
        },
        *[rank_session(r) for r in (0, 1, 3)],
        *[
            {
                "op": "wait_stopped",
                "session": f"r{r}",
                "label": f"paused{r}",
                "reason": "pause",
                "function": "train_step",
            }
            for r in (0, 1, 3)
        ],
        {
            "op": "evaluate",
            "session": "r0",
            "label": "all",
            "expression": "@all model.module.weight.grad",
        },
        {"op": "mark", "name": "paused", "wait": True},
        # a next in rank 0's session: all four stop on their next line
        {"op": "next", "session": "r0"},
        *[
            {
                "op": "wait_stopped",
                "session": f"r{r}",
                "label": f"step{r}",
                "reason": "step",
                "function": "train_step",
            }
            for r in range(4)
        ],
        {"op": "mark", "name": "held", "wait": True},
        {"op": "continue", "session": "r2"},
        {"op": "wait_terminated", "label": "end"},
        {"op": "disconnect"},
    ]
    command = ["-m", "torch.distributed.run", "--nproc-per-node", "4", "ddp_group.py"]
    async with (
        relay_stack(home, isolated=isolated) as (_up, relay),
        debug_run(home, relay, ws, torch_python, *command) as (debug, run, port),
    ):
        spec = scenario(port, ws, steps, breakpoints={"ddp_group.py": [GROUP_LINE]},
                        timeout_ms=120_000)  # fmt: skip
        async with open_vscode_session(spec, timeout=400) as session:
            await session.wait_mark("configured")
            async with worker(home, relay, isolated=isolated):
                await session.release("configured")
                await session.wait_mark("paused", timeout=300)
                paused_at = trio.current_time()
                with trio.fail_after(60):  # the ranks' pauses are on record
                    while not _all_paused(
                        report := json.loads(await stacks(home, relay, run, "--json"))
                    ):
                        pass
                text = await stacks(home, relay, run)
                code, losses = await tether_eval(home, relay, run, "loss.item()", "--json")
                assert code == 0, losses
                _, grads = await tether_eval(home, relay, run, "model.module.weight.grad")
                _, nans = await tether_eval(
                    home,
                    relay,
                    run,
                    "model.module.weight.grad / 0 * 0 if rank == 3 else model.module.weight.grad",
                    "--by-value",
                )
                await session.release("paused")
                await session.wait_mark("held", timeout=120)
                # paused PAUSE_S in all (the time measured, as the ranks' barrier waits)
                await trio.sleep(max(0.0, PAUSE_S - (trio.current_time() - paused_at)))
                await session.release("held")
                result, _messages = await session.result()
        await debug.wait_line(r"ended \(exited, exit code 0\)", timeout=120)
    labels = result["labels"]
    assert labels["end"]["exitCode"] == 0
    said = "".join(str(v) for v in result.get("output", {}).values())
    assert all(f"rank {r} done, 4 steps" in said for r in range(4)), said
    # the next: rank 2 to the line after its breakpoint, the others on in their wait
    assert labels["step2"]["line"] == GROUP_LINE + 1
    for r in (0, 1, 3):
        assert labels[f"paused{r}"]["line"] in WAIT_LINES
        assert labels[f"step{r}"]["line"] in WAIT_LINES
    assert labels["all"]["success"], labels["all"]
    assert labels["all"]["result"].startswith("ranks 0-3: tensor[1, 4] float32"), labels["all"]
    # tether stacks: rank 2 at its breakpoint, the three others paused in their wait; the
    # launcher and the ranks' 8 DataLoader workers run
    rank_of = {p["pid"]: p["rank"] for p in report["processes"]}
    paused_classes = [
        (sorted(rank_of[pid] for pid in c["pids"]), c["state"], c["frames"][-1])
        for c in report["classes"]
        if c["state"].startswith("paused")
    ]
    [(at_bp, _, top)] = [c for c in paused_classes if c[1] == "paused: breakpoint"]
    assert (at_bp, top["function"], top["line"]) == ([2], "train_step", GROUP_LINE)
    elsewhere = [c for c in paused_classes if c[1] == "paused: pause"]
    assert sorted(r for ranks, _, _ in elsewhere for r in ranks) == [0, 1, 3], report
    assert all(t["function"] == "train_step" and t["line"] in WAIT_LINES for *_, t in elsewhere)
    lines = [line.strip() for line in text.splitlines()]
    assert lines[0].startswith(f"run {run}: 13 Python processes, 4 paused, in "), text
    assert f"rank 2 (paused: breakpoint): ddp_group.py:{GROUP_LINE} train_step" in lines, text
    assert any(re.search(r"\(paused: pause\): ddp_group.py:\d+ train_step$", x) for x in lines)
    assert "_tether_" not in text and "debugpy" not in text and "pydevd" not in text, text
    # tether eval: four losses, each rank's own; the gradient's summary, not its data
    report_losses = json.loads(losses)
    values = report_losses["values"]
    assert [(v["rank"], v["state"], v["type"]) for v in values] == [
        (r, "value", "float") for r in range(4)
    ]
    assert len({v["number"] for v in values}) == 4  # the ranks' data differ
    assert report_losses["summary"][0].startswith("summary: numbers: min ")
    # the gradient, all-reduced: the same in every rank
    grad_lines = grads.splitlines()
    assert re.fullmatch(
        r"ranks 0-3: tensor\[1, 4\] float32 norm [0-9.e+-]+ nan 0 inf 0", grad_lines[1]
    ), grads
    assert grad_lines[2].startswith("summary: 4 tensors/arrays, shape [1, 4] float32; norm min ")
    assert "tensor(" not in grads  # no data
    nan_lines = nans.splitlines()
    assert nan_lines[2].startswith("rank 3 (1): tensor[1, 4] float32 ") and "nan 4" in nan_lines[2]
    assert "NaN elements in rank 3 (rank 3: 4)" in nans
