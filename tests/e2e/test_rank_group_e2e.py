"""End to end, the ranks of a job stopped and moved as one (``--stop all``, the default): the
torchrun-style launcher without PyTorch starting 4 ranks (``programs/ranks4_worker.py``), real
debugpy, and Microsoft's DebugClient answering each rank's ``startDebugging`` with a session of
its own (``node/vscode_scenario.mjs``), as in ``test_processes_e2e.py``."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
from node_harness import sessions_by_kind
from test_processes_e2e import run_through_tether

pytestmark = [pytest.mark.slow, pytest.mark.timeout(300)]

RANK2_LINE = 51  # programs/ranks4_worker.py, main(): only rank 2 runs it
LAUNCH = ["ranks_launcher.py", "4", "ranks4_worker.py"]


def rank_session(rank: int) -> dict[str, Any]:
    return {
        "op": "wait_session",
        "label": f"r{rank}",
        "stopped": True,
        "name": rf"^rank {rank} \(pid \d+\)",  # whichever order the ranks' stops came in
    }


async def test_a_breakpoint_in_rank_2_pauses_all_four_and_they_step_and_continue_as_one(
    tmp_path: Path,
) -> None:
    steps: list[dict[str, Any]] = [
        rank_session(2),
        {
            "op": "wait_stopped",
            "session": "r2",
            "label": "hit",
            "reason": "breakpoint",
            "path": "ranks4_worker.py",
            "line": RANK2_LINE,
        },
        # every other rank paused by the worker: offered at its stop, in its own session
        *[rank_session(r) for r in (0, 1, 3)],
        *[
            {
                "op": "wait_stopped",
                "session": f"r{r}",
                "label": f"paused{r}",
                "reason": "pause",
                "path": "ranks4_worker.py",
            }
            for r in (0, 1, 3)
        ],
        # a next in rank 2's session: all four stop on their next line
        {"op": "next", "session": "r2"},
        *[
            {
                "op": "wait_stopped",
                "session": f"r{r}",
                "label": f"step{r}",
                "reason": "step",
                "path": "ranks4_worker.py",
            }
            for r in range(4)
        ],
        # a continue in rank 2's session runs them all to the end
        {"op": "continue", "session": "r2"},
        {"op": "wait_output", "contains": "launcher done, rank exit codes [0, 0, 0, 0]"},
        {"op": "wait_terminated", "label": "end"},
        {"op": "disconnect"},
    ]
    result, _messages, _port = await run_through_tether(
        tmp_path, LAUNCH, {"ranks4_worker.py": [RANK2_LINE]}, steps
    )
    labels = result["labels"]
    children = {c["index"]: c for c in sessions_by_kind(result, "child")}
    assert len(children) == 4
    assert labels["step2"]["line"] == RANK2_LINE + 1
    for r in range(4):
        child = children[labels[f"r{r}"]["session"]]
        # each session saw its own stops and its own continues (the next's and the continue's)
        assert child["eventCounts"]["stopped"] == 2
        assert child["eventCounts"]["continued"] >= 2
        assert child["eventCounts"]["terminated"] == 1
    assert labels["end"]["exitCode"] == 0


async def test_stop_one_stops_rank_2_alone(tmp_path: Path) -> None:
    steps: list[dict[str, Any]] = [
        rank_session(2),
        {"op": "wait_stopped", "session": "r2", "reason": "breakpoint", "line": RANK2_LINE},
        {"op": "continue", "session": "r2"},
        {"op": "wait_output", "contains": "launcher done, rank exit codes [0, 0, 0, 0]"},
        {"op": "wait_terminated", "label": "end"},
        {"op": "disconnect"},
    ]
    result, _messages, _port = await run_through_tether(
        tmp_path, LAUNCH, {"ranks4_worker.py": [RANK2_LINE]}, steps, extra=("--stop", "one")
    )
    # the others ran on (waiting for rank 2): none stopped, none offered
    [child] = sessions_by_kind(result, "child")
    assert "rank 2" in child["name"] and child["eventCounts"]["stopped"] == 1
    assert result["labels"]["end"]["exitCode"] == 0
