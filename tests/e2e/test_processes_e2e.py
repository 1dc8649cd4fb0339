"""End to end, multi-process programs through tether: `tether up`, `tether worker`, `tether debug`
(default ``--processes stopped``), real debugpy with subprocess debugging, and Microsoft's
DebugClient through the scenario runner (``node/vscode_scenario.mjs``), which answers the
adapter's ``startDebugging`` by opening a child session on the same port as VS Code does
(checked against plain debugpy in ``test_node_harness_subprocess.py``).

As in ``test_vscode_client_e2e.py`` the worker starts only once the IDE configured the queued run,
so every breakpoint below was set before any process existed. Every message tether sends, in every
session, is validated against the DAP schema.
"""

from __future__ import annotations

import re
import sys
from pathlib import Path
from typing import Any

import pytest
import trio
from direct_debugpy import copy_programs
from node_harness import open_vscode_session, scenario, session_messages, sessions_by_kind
from stack import debug_run, program_python, relay_stack, runnable_by_anyone, worker

from protocol_specs.dap.schema import validate_message
from protocol_specs.session.processes import COLLECTIVE_TIMEOUT_HINT

pytestmark = [pytest.mark.slow, pytest.mark.timeout(300)]

SPAWN_CHILD_LINE = 9  # programs/mp_spawn.py, work(): print(f"child total {total}")
SPAWN_CHILD_FIRST = 8  # programs/mp_spawn.py, work(): total = n * 7
POOL_MAIN_LINE = 14  # programs/mp_pool.py, main(): print(f"pool total {total}")
FLAKY_CHILD_LINE = 12  # programs/mp_flaky.py, work(): only attempt 2 starts the child
RANK1_LINE = 36  # programs/ranks_worker.py, main(): only rank != 0 runs it

SHELL_LAUNCHER = """\
#!/bin/sh
export WORLD_SIZE="$1" MASTER_ADDR=127.0.0.1
MASTER_PORT=$(PYTHON -c 'import socket; s = socket.socket(); s.bind(("", 0)); print(s.getsockname()[1])')
export MASTER_PORT
rank=0 pids=""
while [ "$rank" -lt "$WORLD_SIZE" ]; do
    RANK=$rank LOCAL_RANK=$rank PYTHON ranks_worker.py &
    pids="$pids $!"
    rank=$((rank + 1))
done
codes=""
for pid in $pids; do wait "$pid"; codes="$codes${codes:+, }$?"; done
echo "launcher done, rank exit codes [$codes]"
"""


async def run_through_tether(
    tmp_path: Path,
    command: list[str],
    breakpoints: dict[str, list[Any]],
    steps: list[Any],
    *,
    program: str = "python",
    extra: tuple[str, ...] = (),
    held: dict[str, float] | None = None,
) -> tuple[dict[str, Any], list[dict[str, Any]], int]:
    """Queue ``program command`` with `tether debug`, configure it from the runner, start a worker,
    run the steps; returns (result, messages, adapter port) once the run ended with exit code 0.
    ``held``: for each waiting ``mark`` step named there, in order, how many seconds the runner is
    held there (the time measured, as a paused rank's peers wait: not a synchronisation)."""
    ws = copy_programs(tmp_path / "ws")
    # an interpreter the program's uid may run (a root worker's programs run as uids of their own);
    # a program the test names that no such uid may run (a venv made from an interpreter under
    # /root) runs as the worker's user
    python = program_python() if runnable_by_anyone(program) else None
    # a console script, as pip installs torchrun: a Python script with a #! line, no .py
    launcher = ws / "launch-ranks"
    launcher.write_text(f"#!{python or sys.executable}\n" + (ws / "ranks_launcher.py").read_text())
    launcher.chmod(0o755)
    # a launcher in shell, as many Slurm batch scripts are: one python per rank, in the background
    shell = ws / "launch-ranks.sh"
    shell.write_text(SHELL_LAUNCHER.replace("PYTHON", python or sys.executable))
    shell.chmod(0o755)
    home = tmp_path / "home"
    all_steps = [{"op": "mark", "name": "configured", "wait": True}, *steps]
    async with (
        relay_stack(home, isolated=python is not None) as (_up, relay),
        debug_run(home, relay, ws, program, *command, extra=extra) as (debug, _run, port),
    ):
        spec = scenario(port, ws, all_steps, breakpoints=breakpoints, timeout_ms=120_000)
        async with open_vscode_session(spec, timeout=270) as session:
            await session.wait_mark("configured")
            async with worker(home, relay, isolated=python is not None):
                await session.release("configured")
                for name, seconds in (held or {}).items():
                    await session.wait_mark(name, timeout=240)
                    await trio.sleep(seconds)
                    await session.release(name)
                result, messages = await session.result()
        await debug.wait_line(r"ended \(exited, exit code 0\)", timeout=60)
    for message in messages:
        validate_message(message)
    return result, messages, port


@pytest.mark.parametrize("method", ["spawn", "fork"])
async def test_breakpoint_in_a_spawned_child_is_debugged_in_the_childs_own_session(
    tmp_path: Path, method: str
) -> None:
    steps: list[dict[str, Any]] = [
        # --processes stopped: the child is offered when it first stops, not before
        {"op": "wait_session", "label": "kid"},
        {
            "op": "wait_stopped",
            "session": "kid",
            "label": "hit",
            "reason": "breakpoint",
            "path": "mp_spawn.py",
            "line": SPAWN_CHILD_LINE,
            "function": "work",
        },
        {"op": "stack_trace", "session": "kid", "label": "stack"},
        {"op": "variables", "session": "kid", "label": "locals", "scope": "Locals"},
        {"op": "evaluate", "session": "kid", "label": "sum", "expression": "total + n"},
        {"op": "continue", "session": "kid"},
        {"op": "wait_terminated", "session": "kid"},  # the child's session ends with the child
        {"op": "wait_output", "label": "done", "contains": "parent done, child exit code 0"},
        {"op": "wait_terminated", "label": "end"},
        {"op": "disconnect"},
    ]
    result, messages, port = await run_through_tether(
        tmp_path, ["mp_spawn.py", method], {"mp_spawn.py": [SPAWN_CHILD_LINE]}, steps
    )
    labels = result["labels"]
    kid = labels["kid"]
    # one child offered: the one that stopped (not multiprocessing's resource tracker)
    [child] = sessions_by_kind(result, "child")
    assert child["index"] == kid["session"] and kid["via"] == "startDebugging"
    pid = kid["subProcessId"]
    assert isinstance(pid, int) and f"pid {pid}" in kid["name"]
    assert kid["port"] == port  # the same adapter, a second connection
    assert kid["configuration"]["request"] == "attach"
    assert kid["handshake"]["attach"]["success"] is True
    # the run's breakpoint had been set before the worker started; it was the child that hit it
    [queued] = result["handshake"]["setBreakpoints"][0]["breakpoints"]
    assert queued["verified"] is False and "waiting for a worker" in queued["message"]
    hit = labels["hit"]
    assert hit["session"] == child["index"]
    assert hit["frames"][0]["path"] == str(tmp_path / "ws" / "mp_spawn.py")  # mapped back
    assert labels["stack"]["names"][0] == "work"
    assert labels["locals"]["values"]["total"] == "42"
    assert labels["sum"]["result"] == "48"
    # the stop belongs to the child's session; the main session never saw it
    assert "stopped" not in result["eventCounts"]
    assert child["eventCounts"]["stopped"] == 1
    assert all(
        m.get("event") != "stopped"
        for m in session_messages(result, messages, result["sessions"][0]["index"])
    )
    assert child["eventCounts"]["terminated"] == 1
    assert labels["end"]["exitCode"] == 0


def child_ids(handshake: dict[str, Any]) -> dict[int, int]:
    """line -> the breakpoint id a child session's own ``setBreakpoints`` answer gave it."""
    [answer] = handshake["setBreakpoints"]
    return {bp["line"]: bp["id"] for bp in answer["breakpoints"]}


async def test_a_childs_stops_are_its_own_and_attended_while_the_ide_is_attached(
    tmp_path: Path,
) -> None:
    """Two breakpoints set while the run was queued; the child stops at both in its own session.
    Each ``stopped`` names the id the child session's own ``setBreakpoints`` gave that line (the
    first stop comes from the worker's configuration, before the session existed), and nobody is
    told that no IDE is attached: it was, all along."""
    steps: list[dict[str, Any]] = [
        {"op": "wait_session", "label": "kid"},
        {"op": "wait_stopped", "session": "kid", "label": "first", "line": SPAWN_CHILD_FIRST},
        {"op": "continue", "session": "kid"},
        {"op": "wait_stopped", "session": "kid", "label": "second", "line": SPAWN_CHILD_LINE},
        {"op": "continue", "session": "kid"},
        {"op": "wait_terminated", "session": "kid"},
        {"op": "wait_output", "contains": "parent done, child exit code 0"},
        {"op": "wait_terminated", "label": "end"},
        {"op": "disconnect"},
    ]
    bps = {"mp_spawn.py": [SPAWN_CHILD_FIRST, SPAWN_CHILD_LINE]}
    result, messages, _port = await run_through_tether(
        tmp_path, ["mp_spawn.py", "spawn"], bps, steps
    )
    labels = result["labels"]
    ids = child_ids(labels["kid"]["handshake"])
    assert labels["first"]["hitBreakpointIds"] == [ids[SPAWN_CHILD_FIRST]]
    assert labels["second"]["hitBreakpointIds"] == [ids[SPAWN_CHILD_LINE]]
    # the worker's own word on its configuration is never shown to an IDE
    assert all(m.get("event") != "tetherBreakpointPlaces" for m in messages)
    said = [m["body"]["output"] for m in messages if m.get("event") == "output"]
    assert not [line for line in said if "no IDE is attached" in line or "lost sight" in line]
    assert labels["end"]["exitCode"] == 0


async def test_pool_of_16_with_a_breakpoint_in_the_main_process_completes(tmp_path: Path) -> None:
    steps: list[dict[str, Any]] = [
        {
            "op": "wait_stopped",
            "label": "hit",
            "reason": "breakpoint",
            "path": "mp_pool.py",
            "line": POOL_MAIN_LINE,
            "function": "main",
        },
        {"op": "variables", "label": "locals", "scope": "Locals"},
        {"op": "continue"},
        {"op": "wait_output", "contains": "pool total 85344"},
        {"op": "wait_terminated", "label": "end"},
        {"op": "disconnect"},
    ]
    result, _messages, _port = await run_through_tether(
        tmp_path, ["mp_pool.py"], {"mp_pool.py": [POOL_MAIN_LINE]}, steps
    )
    assert result["labels"]["locals"]["values"]["total"] == "85344"
    # 16 pool workers (and the resource tracker) were debugged, but none stopped: none offered
    assert sessions_by_kind(result, "child") == []
    assert result["sessions"][0]["reverseRequests"] == []
    assert result["labels"]["end"]["exitCode"] == 0


@pytest.mark.parametrize(
    "launch",
    [["python", "ranks_launcher.py", "2"], ["./launch-ranks", "2"], ["./launch-ranks.sh", "2"]],
    ids=["python-launcher", "console-script", "shell-script"],
)
async def test_torchrun_style_ranks_rank_1_stops_in_its_own_session(
    tmp_path: Path, launch: list[str]
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
            "path": "ranks_worker.py",
            "line": RANK1_LINE,
            "function": "main",
        },
        {"op": "variables", "session": "rank1", "label": "locals", "scope": "Locals"},
        # rank 0 waits for rank 1 meanwhile, like peers in a collective
        {
            "op": "wait_output",
            "session": "rank1",
            "label": "hint",
            # DAP's "important": shown in the console and as a notification, once per session
            "category": "important",
            "contains": COLLECTIVE_TIMEOUT_HINT,
        },
        {"op": "continue", "session": "rank1"},
        {"op": "wait_output", "contains": "launcher done, rank exit codes [0, 0]"},
        {"op": "wait_terminated", "label": "end"},
        {"op": "disconnect"},
    ]
    result, _messages, _port = await run_through_tether(
        tmp_path, launch[1:], {"ranks_worker.py": [RANK1_LINE]}, steps, program=launch[0]
    )
    labels = result["labels"]
    # only rank 1 reaches the line, so only rank 1 is offered (--processes stopped)
    [child] = sessions_by_kind(result, "child")
    assert child["index"] == labels["rank1"]["session"]
    assert "rank 1" in child["name"]
    assert re.search(rf"\(pid {labels['rank1']['subProcessId']}\)", child["name"])
    assert labels["hit"]["session"] == child["index"]
    values = labels["locals"]["values"]
    assert (values["rank"], values["world_size"], values["partial"]) == ("1", "2", "20")
    # said once, in the paused rank's own session
    assert child["output"]["important"].count(COLLECTIVE_TIMEOUT_HINT) == 1
    assert COLLECTIVE_TIMEOUT_HINT not in result["output"].get("important", "")
    assert labels["end"]["exitCode"] == 0


async def test_a_paused_child_is_offered_again_to_an_ide_that_comes_back(tmp_path: Path) -> None:
    """The IDE goes away (both sessions) while the child is paused; the next IDE is offered the
    paused child at once and sees its stop replayed in the child's session, then continues it."""
    ws = copy_programs(tmp_path / "ws")
    home = tmp_path / "home"
    breakpoints = {"mp_spawn.py": [SPAWN_CHILD_LINE]}
    first: list[dict[str, Any]] = [
        {"op": "mark", "name": "configured", "wait": True},
        {"op": "wait_session", "label": "kid", "stopped": True},
        {"op": "wait_stopped", "session": "kid", "line": SPAWN_CHILD_LINE, "function": "work"},
        {"op": "disconnect", "session": "kid", "terminateDebuggee": False},
        {"op": "disconnect", "terminateDebuggee": False},
    ]
    again: list[dict[str, Any]] = [
        {"op": "wait_session", "label": "kid"},
        {
            "op": "wait_stopped",
            "session": "kid",
            "label": "replayed",
            "line": SPAWN_CHILD_LINE,
            "function": "work",
        },
        {"op": "variables", "session": "kid", "label": "locals", "scope": "Locals"},
        {"op": "continue", "session": "kid"},
        {"op": "wait_output", "contains": "parent done, child exit code 0"},
        {"op": "wait_terminated", "label": "end"},
        {"op": "disconnect"},
    ]
    async with (
        relay_stack(home) as (_up, relay),
        debug_run(home, relay, ws, "python", "mp_spawn.py") as (debug, _run, port),
    ):
        spec = scenario(port, ws, first, breakpoints=breakpoints, timeout_ms=120_000)
        async with open_vscode_session(spec, timeout=270) as session:
            await session.wait_mark("configured")
            async with worker(home, relay):
                await session.release("configured")
                await session.result()
                spec = scenario(port, ws, again, breakpoints=breakpoints, timeout_ms=120_000)
                async with open_vscode_session(spec, timeout=270) as back:
                    result, messages = await back.result()
        await debug.wait_line(r"ended \(exited, exit code 0\)", timeout=60)
    for message in messages:
        validate_message(message)
    labels = result["labels"]
    assert labels["replayed"]["session"] == labels["kid"]["session"]
    # the stop replayed names the id this child session was given for the line
    ids = child_ids(labels["kid"]["handshake"])
    assert labels["replayed"]["hitBreakpointIds"] == [ids[SPAWN_CHILD_LINE]]
    assert labels["locals"]["values"]["total"] == "42"
    assert labels["end"]["exitCode"] == 0


async def test_a_retry_applies_the_breakpoints_in_the_children_of_the_next_attempt(
    tmp_path: Path, shared_tmp: Path
) -> None:
    """Attempt 1 fails before any child exists; attempt 2's child gets the breakpoint that was set
    while the run was queued, stops, and is debugged in its own session."""
    state = shared_tmp / "state"  # mounted: the program (a uid of its own) writes in it
    state.mkdir(mode=0o777)
    state.chmod(0o777)
    steps: list[dict[str, Any]] = [
        {"op": "wait_output", "contains": "attempt first"},
        {"op": "wait_session", "label": "kid"},
        {
            "op": "wait_stopped",
            "session": "kid",
            "label": "hit",
            "reason": "breakpoint",
            "line": FLAKY_CHILD_LINE,
            "function": "work",
        },
        {"op": "continue", "session": "kid"},
        {"op": "wait_output", "contains": "parent done, child exit code 0"},
        {"op": "wait_terminated", "label": "end"},
        {"op": "disconnect"},
    ]
    retry = ("--max-retries", "1", "--retry-backoff", "0", "--mount", f"state={state}")
    bps = {"mp_flaky.py": [FLAKY_CHILD_LINE]}
    result, _messages, _port = await run_through_tether(
        tmp_path, ["mp_flaky.py"], bps, steps, extra=retry
    )
    [child] = sessions_by_kind(result, "child")
    assert result["labels"]["hit"]["session"] == child["index"]
    assert result["labels"]["end"]["exitCode"] == 0
