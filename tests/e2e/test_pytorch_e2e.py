"""Real PyTorch through tether: ``torchrun --nproc-per-node 2`` on the CPU (gloo), each rank with a
DataLoader of 2 workers, a breakpoint in rank 1's training step set while the run was queued.

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
from direct_debugpy import copy_programs
from node_harness import open_vscode_session, scenario
from stack import debug_run, program_python, relay_stack, runnable_by_anyone, worker
from test_processes_e2e import run_through_tether
from test_rank_eval_e2e import tether_eval
from test_rank_group_e2e import rank_session
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


EVAL_PROGRAM = Path(__file__).resolve().parent / "programs" / "ddp_eval.py"
EVAL_LINE = next(
    n
    for n, line in enumerate(EVAL_PROGRAM.read_text().splitlines(), 1)
    if "# the breakpoint" in line
)


async def test_tether_eval_compares_the_loss_and_a_gradient_across_four_paused_ranks(
    tmp_path: Path, torch_python: str
) -> None:
    """``torchrun --nproc-per-node 4``: rank 2 stops after its backward, the group pauses the
    others (waiting for it in a Python loop); ``tether eval`` shows each rank's loss and the
    gradient's tensor summary (computed in each rank), never its data."""
    ws = copy_programs(tmp_path / "ws")
    home = tmp_path / "home"
    isolated = runnable_by_anyone(torch_python) and program_python() is not None
    steps: list[dict[str, Any]] = [
        {"op": "mark", "name": "configured", "wait": True},
        rank_session(2),
        {"op": "wait_stopped", "session": "r2", "reason": "breakpoint", "line": EVAL_LINE},
        *[rank_session(r) for r in (0, 1, 3)],
        *[{"op": "wait_stopped", "session": f"r{r}", "reason": "pause"} for r in (0, 1, 3)],
        {"op": "evaluate", "session": "r0", "label": "all", "expression": "@all grad"},
        {"op": "mark", "name": "paused", "wait": True},
        {"op": "continue", "session": "r2"},
        {"op": "wait_output", "contains": "rank 2 done"},
        {"op": "wait_terminated", "label": "end"},
        {"op": "disconnect"},
    ]
    command = ["-m", "torch.distributed.run", "--nproc-per-node", "4", "ddp_eval.py"]
    async with (
        relay_stack(home, isolated=isolated) as (_up, relay),
        debug_run(home, relay, ws, torch_python, *command) as (debug, run, port),
    ):
        spec = scenario(port, ws, steps, breakpoints={"ddp_eval.py": [EVAL_LINE]},
                        timeout_ms=400_000)  # fmt: skip
        async with open_vscode_session(spec, timeout=500) as session:
            await session.wait_mark("configured")
            async with worker(home, relay, isolated=isolated):
                await session.release("configured")
                await session.wait_mark("paused", timeout=300)
                code, losses = await tether_eval(home, relay, run, "loss.item()", "--json")
                assert code == 0, losses
                _, grads = await tether_eval(home, relay, run, "grad")
                _, nans = await tether_eval(
                    home, relay, run, "grad / 0 * 0 if rank == 3 else grad", "--by-value"
                )
                await session.release("paused")
                result, _messages = await session.result()
        await debug.wait_line(r"ended \(exited, exit code 0\)", timeout=120)
    assert result["labels"]["end"]["exitCode"] == 0
    report = json.loads(losses)
    assert [(v["rank"], v["state"], v["type"]) for v in report["values"]] == [
        (r, "value", "float") for r in range(4)
    ]
    assert all(isinstance(v["number"], float) for v in report["values"])
    assert report["summary"][0].startswith("summary: numbers: min ")
    # the gradient, all-reduced: the same in every rank; its summary, not its data
    lines = grads.splitlines()
    assert re.fullmatch(r"ranks 0-3: tensor\[1, 4\] float32 norm [0-9.e+-]+ nan 0 inf 0", lines[1])
    assert lines[2].startswith("summary: 4 tensors/arrays, shape [1, 4] float32; norm min ")
    assert "tensor(" not in grads  # no data
    nan_lines = nans.splitlines()
    assert nan_lines[2].startswith("rank 3 (1): tensor[1, 4] float32 ") and "nan 4" in nan_lines[2]
    assert "NaN elements in rank 3 (rank 3: 4)" in nans
    all_ranks = result["labels"]["all"]
    assert all_ranks["success"] and all_ranks["result"].startswith(
        "ranks 0-3: tensor[1, 4] float32"
    )
