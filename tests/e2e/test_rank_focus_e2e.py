"""End to end, focus and many ranks (issue 42, items 6 and 8): the torchrun-style launcher without
PyTorch, real debugpy in every rank, and Microsoft's DebugClient answering ``startDebugging`` with
a session of its own (``node/vscode_scenario.mjs``), as in ``test_rank_group_e2e.py``.

- Many ranks: a breakpoint in rank 5 of a large job pauses every rank, the IDE is offered ONE
  session (rank 5's) with the others summarized in one line, ``tetherFocus [7]`` opens rank 7's,
  and a continue from rank 5's session runs every rank to the end. The RSS of the adapter and of
  the worker's side with every rank paused is printed (``-s``) for the record.
- ``tether attach RUN --ranks 1,2``: the attach's IDE is offered only ranks 1 and 2, and only
  they get breakpoints (rank 0 runs the line with a breakpoint and does not stop). Then the focus
  narrows to rank 2: rank 1's session, still open, sets a breakpoint; it is answered unverified
  (why in its message) and rank 1 runs through that line.
"""

from __future__ import annotations

import os
import re
import sys
import time
from pathlib import Path
from typing import Any

import pytest
from direct_debugpy import copy_programs
from node_harness import open_vscode_session, scenario, sessions_by_kind
from stack import debug_run, relay_stack, tether, worker

from protocol_specs.dap.schema import validate_message
from protocol_specs.session.rank_values import parse_rank_list

pytestmark = [pytest.mark.slow, pytest.mark.timeout(600)]

#: how many ranks the large job has (64; TETHER_E2E_RANKS to measure another size)
MANY = int(os.environ.get("TETHER_E2E_RANKS", "64"))
RANK5_LINE = 55  # programs/ranksN_worker.py, main(): only rank 5 runs it
RANK2_LINE = 51  # programs/ranks4_worker.py, main(): only rank 2 runs it
RANK0_LINE = 47  # programs/ranks4_worker.py, main(): only rank 0 runs it, after rank 2's line
DONE_LINE = 57  # programs/ranks4_worker.py, main(): every rank runs it last


def _tree(pid: int) -> list[int]:
    """``pid`` and every process below it."""
    out, todo = [], [pid]
    while todo:
        p = todo.pop()
        out.append(p)
        for task in Path(f"/proc/{p}/task").glob("*"):  # a child of any of its threads
            try:
                todo.extend(int(c) for c in (task / "children").read_text().split())
            except OSError:
                continue
    return out


def _rss_mib(pid: int) -> float:
    try:
        for line in Path(f"/proc/{pid}/status").read_text().splitlines():
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) / 1024
    except OSError:
        pass
    return 0.0


def _cmdline(pid: int) -> str:
    try:
        return Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode()
    except OSError:
        return ""


def memory_report(adapter_pid: int, worker_pid: int) -> dict[str, float]:
    """RSS (MiB) of the adapter, of tether's worker processes, of debugpy's adapter, and of the
    ranks (the program, debugpy inside it)."""
    figures = {"adapter": _rss_mib(adapter_pid), "worker": 0.0, "debugpy adapter": 0.0}
    ranks = []
    for pid in _tree(worker_pid):
        cmd = _cmdline(pid)
        if "ranks_launcher" in cmd:
            continue  # the program's own launcher
        if "ranksN_worker.py" in cmd:
            ranks.append(_rss_mib(pid))
        elif "debugpy/adapter" in cmd or "debugpy.adapter" in cmd:
            figures["debugpy adapter"] += _rss_mib(pid)
        else:
            figures["worker"] += _rss_mib(pid)
    figures["ranks"] = len(ranks)
    figures["per rank"] = sum(ranks) / len(ranks) if ranks else 0.0
    return figures


async def test_many_ranks_offer_one_session_a_summary_and_a_focused_rank_on_demand(
    tmp_path: Path,
) -> None:
    ws = copy_programs(tmp_path / "ws")
    home = tmp_path / "home"
    others = ",".join(["0-4", f"6-{MANY - 1}"])
    steps: list[dict[str, Any]] = [
        {"op": "mark", "name": "configured", "wait": True},
        {
            "op": "wait_session",
            "label": "r5",
            "stopped": True,
            "name": r"^rank 5 \(pid \d+\)",
            "timeoutMs": 300_000,
        },
        {"op": "wait_stopped", "session": "r5", "reason": "breakpoint", "line": RANK5_LINE},
        # every other rank paused with it, not offered: a line says so (two, should a rank's
        # pause come later than the summary's quiet period on a loaded machine: checked below)
        {
            "op": "wait_output",
            "session": "r5",
            "label": "summary",
            "timeoutMs": 120_000,
            "contains": "paused with rank 5; open one",
        },
        {"op": "mark", "name": "all paused", "wait": True},
        {
            "op": "request",
            "session": "r5",
            "label": "focus",
            "command": "tetherFocus",
            "arguments": {"ranks": [7]},
        },
        {"op": "wait_session", "label": "r7", "stopped": True, "name": r"^rank 7 \(pid \d+\)"},
        {"op": "wait_stopped", "session": "r7", "reason": "pause"},
        {"op": "continue", "session": "r5"},
        {
            "op": "wait_output",
            "timeoutMs": 120_000,
            "contains": f"launcher done, rank exit codes [{', '.join(['0'] * MANY)}]",
        },
        {"op": "wait_terminated", "label": "end", "timeoutMs": 60_000},
        {"op": "disconnect"},
    ]
    started = time.monotonic()
    async with (
        relay_stack(home, isolated=False) as (_up, relay),
        debug_run(
            home, relay, ws, "python", "ranks_launcher.py", str(MANY), "ranksN_worker.py"
        ) as (debug, _run, port),
    ):
        spec = scenario(port, ws, steps, breakpoints={"ranksN_worker.py": [RANK5_LINE]},
                        timeout_ms=120_000)  # fmt: skip
        async with open_vscode_session(spec, timeout=540) as session:
            await session.wait_mark("configured")
            async with worker(home, relay, isolated=False) as shim:
                await session.release("configured")
                await session.wait_mark("all paused", timeout=420)
                paused = time.monotonic() - started
                figures = memory_report(debug.process.pid, shim.process.pid)
                await session.release("all paused")
                result, messages = await session.result()
        await debug.wait_line(r"ended \(exited, exit code 0\)", timeout=60)
    print(f"\n{MANY} ranks: every rank paused {paused:.1f} s after the start; "
          f"RSS MiB: {figures}; whole test {time.monotonic() - started:.1f} s", file=sys.stderr)  # fmt: skip
    for message in messages:
        validate_message(message)
    labels = result["labels"]
    # the summary names the ranks paused with rank 5 (all of them, but for one whose pause came
    # after the quiet period: its line follows), never rank 5
    said = labels["summary"]["text"]
    [named] = re.findall(r"tether: ranks? ([\d,-]+) paused with rank 5", said)
    summarized = set(parse_rank_list(named))
    assert summarized <= set(parse_rank_list(others)) and len(summarized) > MANY // 2, said
    assert labels["focus"]["success"] is True
    assert labels["focus"]["body"]["ranks"] == [7]
    [opened] = labels["focus"]["body"]["offered"]
    assert opened.startswith("rank 7 (pid ")
    # one session offered for the group stop, one more on demand: not MANY
    children = sessions_by_kind(result, "child")
    assert sorted(c["name"].split(" (")[0] for c in children) == ["rank 5", "rank 7"]
    assert figures["ranks"] == MANY
    assert labels["end"]["exitCode"] == 0


async def test_attach_with_ranks_offers_only_those_and_only_they_get_breakpoints(
    tmp_path: Path,
) -> None:
    ws = copy_programs(tmp_path / "ws")
    home = tmp_path / "home"
    steps: list[dict[str, Any]] = [
        {"op": "mark", "name": "configured", "wait": True},
        {"op": "wait_session", "label": "r2", "stopped": True, "name": r"^rank 2 \(pid \d+\)"},
        {"op": "wait_stopped", "session": "r2", "reason": "breakpoint", "line": RANK2_LINE},
        {"op": "wait_session", "label": "r1", "stopped": True, "name": r"^rank 1 \(pid \d+\)"},
        {"op": "wait_stopped", "session": "r1", "reason": "pause"},
        # the focus narrows to rank 2: rank 1's open session sets a breakpoint on the line it
        # runs next; answered unverified, it is not set in rank 1 (which would stop again)
        {
            "op": "request",
            "session": "r2",
            "label": "focus",
            "command": "tetherFocus",
            "arguments": {"ranks": [2]},
        },
        {
            "op": "request",
            "session": "r1",
            "label": "r1 breakpoints",
            "command": "setBreakpoints",
            "arguments": {
                "source": {"path": str(ws / "ranks4_worker.py")},
                "breakpoints": [{"line": DONE_LINE}],
            },
        },
        # rank 0 runs RANK0_LINE next: outside the focus, it has no breakpoint there
        {"op": "continue", "session": "r2"},
        {"op": "wait_output", "contains": "launcher done, rank exit codes [0, 0, 0, 0]"},
        {"op": "wait_terminated", "label": "end"},
        {"op": "disconnect"},
    ]
    breakpoints = {"ranks4_worker.py": [RANK2_LINE, RANK0_LINE]}
    async with (
        relay_stack(home, isolated=False) as (_up, relay),
        debug_run(home, relay, ws, "python", "ranks_launcher.py", "4", "ranks4_worker.py") as (
            debug,
            run,
            _port,
        ),
        tether(
            "attach",
            run,
            "--relay",
            relay,
            "--port",
            "0",
            "--ranks",
            "1,2",
            home=home,
            name="attach",
        ) as attach,  # fmt: skip
    ):
        m = await attach.wait_line(r"adapter on 127\.0\.0\.1:(\d+)")
        spec = scenario(int(m.group(1)), ws, steps, breakpoints=breakpoints, timeout_ms=120_000)
        async with open_vscode_session(spec, timeout=270) as session:
            await session.wait_mark("configured")
            async with worker(home, relay, isolated=False):
                await session.release("configured")
                result, messages = await session.result()
        await debug.wait_line(r"ended \(exited, exit code 0\)", timeout=60)
    for message in messages:
        validate_message(message)
    children = {c["name"].split(" (")[0]: c for c in sessions_by_kind(result, "child")}
    assert sorted(children) == ["rank 1", "rank 2"]  # ranks 0 and 3 are outside the focus
    for child in children.values():
        assert child["eventCounts"]["stopped"] == 1  # ranks 0 and 1 never stopped it again
    [outside] = result["labels"]["r1 breakpoints"]["body"]["breakpoints"]
    assert outside["verified"] is False, outside
    assert outside["message"].startswith("rank 1 is outside the focus (rank 2)"), outside
    assert result["labels"]["end"]["exitCode"] == 0


async def test_attach_refuses_a_malformed_rank_list_at_once(tmp_path: Path) -> None:
    home = tmp_path / "home"
    async with tether("attach", "r1", "--rank", "3-1", home=home, name="attach") as attach:
        line = await attach.wait_line(r"error: argument --rank/--ranks")
    assert "a range goes up" in line.group(0) or "a range goes up" in "\n".join(attach.lines)
