"""End to end, one expression compared across the ranks of a job (``tether eval RUN EXPR`` and the
debug console's ``@all`` / ``@ranks``) on a real stack (`tether up`, `tether worker`, `tether
debug`, real debugpy, Microsoft's DebugClient answering each rank's ``startDebugging``): four
torchrun-style ranks without PyTorch (``programs/ranks4_worker.py``); rank 2 stops at a
breakpoint in ``main``, the group pauses the others (``--stop all``, the default) in their
``wait_for`` loop, where a ``sock`` is in scope (not in rank 2's frame)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
import trio
from direct_debugpy import copy_programs
from node_harness import open_vscode_session, scenario
from stack import debug_run, program_python, relay_stack, tether, worker
from test_rank_group_e2e import LAUNCH, RANK2_LINE, rank_session

pytestmark = [pytest.mark.slow, pytest.mark.timeout(300)]

RANK = "int(os.environ['RANK'])"


async def tether_eval(home: Path, relay: str, *args: str) -> tuple[int, str]:
    async with tether("eval", "--relay", relay, *args, home=home, name="eval") as e:
        with trio.fail_after(120):
            await e.process.wait()
    return e.process.returncode, e.output


async def test_tether_eval_and_the_consoles_at_all_compare_a_value_across_four_paused_ranks(
    tmp_path: Path,
) -> None:
    ws = copy_programs(tmp_path / "ws")
    home = tmp_path / "home"
    python = program_python()
    steps: list[dict[str, Any]] = [
        {"op": "mark", "name": "configured", "wait": True},
        rank_session(2),
        {"op": "wait_stopped", "session": "r2", "reason": "breakpoint", "line": RANK2_LINE},
        *[rank_session(r) for r in (0, 1, 3)],
        *[{"op": "wait_stopped", "session": f"r{r}", "reason": "pause"} for r in (0, 1, 3)],
        # the debug console of rank 1's session: every paused rank; then two of them
        {"op": "evaluate", "session": "r1", "label": "all", "expression": f"@all {RANK} * 0.5"},
        {
            "op": "evaluate",
            "session": "r2",
            "label": "some",
            "expression": "@ranks 2-3 sock.gettimeout()",
        },
        {
            "op": "evaluate",
            "session": "r2",
            "label": "plain",
            "expression": "marker if 0 else rank",
        },
        {"op": "mark", "name": "paused", "wait": True},
        {"op": "continue", "session": "r2"},
        {"op": "wait_output", "contains": "launcher done, rank exit codes [0, 0, 0, 0]"},
        {"op": "wait_terminated", "label": "end"},
        {"op": "disconnect"},
    ]
    async with (
        relay_stack(home, isolated=python is not None) as (_up, relay),
        debug_run(home, relay, ws, python or "python", *LAUNCH) as (debug, run, port),
    ):
        spec = scenario(port, ws, steps, breakpoints={"ranks4_worker.py": [RANK2_LINE]},
                        timeout_ms=200_000)  # fmt: skip
        async with open_vscode_session(spec, timeout=270) as session:
            await session.wait_mark("configured")
            async with worker(home, relay, isolated=python is not None):
                await session.release("configured")
                await session.wait_mark("paused", timeout=150)
                every = await tether_eval(home, relay, run, RANK)
                some = await tether_eval(home, relay, run, RANK, "--ranks", "1-2", "--json")
                failing = await tether_eval(home, relay, run, "sock.gettimeout()")
                grouped = await tether_eval(home, relay, run, f"{RANK} % 2", "--by-value")
                missing = await tether_eval(home, relay, "nosuchrun", RANK)
                absent = await tether_eval(home, relay, run, RANK, "--ranks", "7")
                await session.release("paused")
                result, _messages = await session.result()
        await debug.wait_line(r"ended \(exited, exit code 0\)", timeout=60)
    assert result["labels"]["end"]["exitCode"] == 0

    code, text = every
    assert code == 0, text
    assert text.splitlines() == [
        f"run {run}: {RANK}  (4 of 4 ranks evaluated)",
        "rank 0: 0",
        "rank 1: 1",
        "rank 2: 2",
        "rank 3: 3",
        "summary: numbers: min 0 (rank 0), max 3 (rank 3), mean 1.5 of 4",
        "  all 4 evaluated ranks differ",
    ]
    code, text = some
    assert code == 0, text
    report = json.loads(text)
    assert report["run"] == run and report["expression"] == RANK
    assert [(v["rank"], v["state"], v["number"], v["type"]) for v in report["values"]] == [
        (1, "value", 1.0, "int"),
        (2, "value", 2.0, "int"),
    ]
    assert report["summary"][0] == "summary: numbers: min 1 (rank 1), max 2 (rank 2), mean 1.5 of 2"
    code, text = failing  # rank 2 stopped in main(): no sock there
    assert code == 0, text
    assert text.splitlines()[1:4] == [
        "ranks 0-1,3: 0.05",
        "rank 2: NameError: name 'sock' is not defined",
        "summary: numbers: min 0.05 (ranks 0-1,3), max 0.05 (ranks 0-1,3), mean 0.05 of 3",
    ]
    assert "Traceback" not in text
    code, text = grouped
    assert code == 0, text
    assert text.splitlines()[1:3] == ["ranks 0,2 (2): 0", "ranks 1,3 (2): 1"]
    code, text = missing
    assert code != 0 and len(text.strip().splitlines()) == 1, text
    assert "nosuchrun" in text and "Traceback" not in text
    code, text = absent
    assert code == 1, text
    assert text.strip() == f"tether: run {run}: rank 7: no such rank is being debugged"

    labels = result["labels"]
    assert labels["all"]["success"], labels["all"]
    assert labels["all"]["result"].splitlines() == [
        "rank 0: 0.0",
        "rank 1: 0.5",
        "rank 2: 1.0",
        "rank 3: 1.5",
        "summary: numbers: min 0 (rank 0), max 1.5 (rank 3), mean 0.75 of 4",
        "  all 4 evaluated ranks differ",
    ]
    assert labels["some"]["result"].splitlines()[:2] == [
        "rank 2: NameError: name 'sock' is not defined",
        "rank 3: 0.05",
    ]
    # an ordinary evaluate in the same console: rank 2's own frame, as ever
    assert labels["plain"]["success"] and labels["plain"]["result"] == "2"
