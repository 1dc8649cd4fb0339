"""End to end: ``breakpoint()`` in a child process of a debug run stops that child, in its own
session, however it started: ``multiprocessing`` spawn, fork and forkserver, ``subprocess``, the
ranks of a torchrun-style launcher (Python, a console script, a shell script). No breakpoint is
set anywhere: the stops are the program's own ``breakpoint()`` calls. The child stops in the
frame that called it, at the next line, as the main process does (and debugpy there).

Before ``_tether_breakpoint.py`` debugpy's hook picked a frame of its own in most of these
children: the child ran on (console-script ranks, and subprocess and fork under stock debugpy), or
stopped in another line, by chance.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
from node_harness import sessions_by_kind
from test_processes_e2e import run_through_tether

pytestmark = [pytest.mark.slow, pytest.mark.timeout(300)]

CHILD_LINE = 13  # programs/bp_children.py, work(): the line after breakpoint()
RANK_LINE = 41  # programs/ranks_worker.py, main(): the line after breakpoint() (BREAK_IN_RANK)
WAYS = ["spawn", "fork", "forkserver", "subprocess"]


async def test_breakpoint_call_stops_each_child_however_it_started(tmp_path: Path) -> None:
    steps: list[dict[str, Any]] = [  # the main process first, in the main session
        {"op": "wait_stopped", "label": "main-hit", "line": CHILD_LINE, "function": "work"},
        {"op": "continue"},
        {"op": "wait_output", "contains": "child main total 42"},
    ]
    for how in WAYS:  # one child at a time: each stops, is looked at, and let go
        steps += [
            {"op": "wait_session", "label": how},
            {
                "op": "wait_stopped",
                "session": how,
                "label": f"{how}-hit",
                "reason": "breakpoint",
                "path": "bp_children.py",
                "line": CHILD_LINE,
                "function": "work",
            },
            {"op": "variables", "session": how, "label": f"{how}-locals", "scope": "Locals"},
            {"op": "continue", "session": how},
            {"op": "wait_output", "contains": f"child {how} total 42"},
        ]
    steps += [
        {"op": "wait_output", "contains": "parent done, child exit codes [0, 0, 0, 0, 0]"},
        {"op": "wait_terminated", "label": "end"},
        {"op": "disconnect"},
    ]
    result, _messages, _port = await run_through_tether(
        tmp_path, ["bp_children.py", "main", *WAYS], {}, steps
    )
    labels = result["labels"]
    children = sessions_by_kind(result, "child")
    for how in WAYS:
        assert labels[f"{how}-hit"]["session"] == labels[how]["session"]
        assert labels[f"{how}-hit"]["hitBreakpointIds"] == []  # no breakpoint of the IDE's
        assert labels[f"{how}-locals"]["values"]["how"] == repr(how)
    # one session per child that stopped (not multiprocessing's helpers)
    assert len(children) == len(WAYS)
    assert result["eventCounts"]["stopped"] == 1  # the main process's own
    assert labels["end"]["exitCode"] == 0


async def test_pythonbreakpoint_0_turns_breakpoint_off_in_every_process(tmp_path: Path) -> None:
    """``PYTHONBREAKPOINT=0``, the user's, wins as in plain python: nothing stops (debugpy's own
    hook ignored it: the main process stopped)."""
    steps: list[dict[str, Any]] = [
        {"op": "wait_output", "contains": "parent done, child exit codes [0, 0, 0]"},
        {"op": "wait_terminated", "label": "end"},
        {"op": "disconnect"},
    ]
    result, _messages, _port = await run_through_tether(
        tmp_path,
        ["bp_children.py", "main", "spawn", "subprocess"],
        {},
        steps,
        extra=("--env", "PYTHONBREAKPOINT=0"),
    )
    assert "stopped" not in result["eventCounts"]
    assert sessions_by_kind(result, "child") == []
    assert result["labels"]["end"]["exitCode"] == 0


@pytest.mark.parametrize(
    "launch",
    [["python", "ranks_launcher.py", "2"], ["./launch-ranks", "2"], ["./launch-ranks.sh", "2"]],
    ids=["python-launcher", "console-script", "shell-script"],
)
async def test_breakpoint_call_in_a_rank_stops_that_rank(tmp_path: Path, launch: list[str]) -> None:
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
            "path": "ranks_worker.py",
            "line": RANK_LINE,
            "function": "main",
        },
        {"op": "variables", "session": "rank1", "label": "locals", "scope": "Locals"},
        {"op": "continue", "session": "rank1"},
        {"op": "wait_output", "contains": "rank 1 let go"},
        {"op": "wait_output", "contains": "launcher done, rank exit codes [0, 0]"},
        {"op": "wait_terminated", "label": "end"},
        {"op": "disconnect"},
    ]
    result, _messages, _port = await run_through_tether(
        tmp_path,
        launch[1:],
        {},
        steps,
        program=launch[0],
        extra=("--env", "BREAK_IN_RANK=1"),
    )
    labels = result["labels"]
    [child] = sessions_by_kind(result, "child")  # rank 0 never stopped: never offered
    assert labels["hit"]["session"] == child["index"]
    assert labels["locals"]["values"]["total"] == "30"
    assert labels["end"]["exitCode"] == 0
