"""End to end, with real processes: the program's output reaches the IDE from its pipes, a flood does
not starve the debugger, and output keeps its place before ``stopped``, a REPL answer and ``exited``.

`tether up` (bundled server + relay + one worker slot), `tether debug`, real debugpy, and tether's
Python DAP client attaching as VS Code does (``debugOptions: ["RedirectOutput"]``). Outcomes only:
no time is asserted; the ``fail_after`` deadlines are deadlock guards.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import trio
from stack import debug_run, relay_stack
from test_session_e2e import assert_schema_valid, ide_session

from adapter.scripted_ide.dap_client import DapClient, open_dap_client

pytestmark = [pytest.mark.slow, pytest.mark.timeout(240)]

FLOOD = """\
import subprocess
import sys

keep_going = True
n = 0
while keep_going:
    print("line", n)
    n += 1
subprocess.run([sys.executable, "-c", "print('child')"], check=True)
for i in range(2000):
    print("tail", i)
print("last line")
"""


def stdout_before(client: DapClient, index: int) -> str:
    """The program's stdout as the IDE saw it, from the messages received before ``index``."""
    return "".join(
        m["body"]["output"]
        for m in client.received[:index]
        if m.get("event") == "output" and m["body"].get("category") == "stdout"
    )


def index_of(client: DapClient, predicate: Any) -> int:
    return next(i for i, m in enumerate(client.received) if predicate(m))


async def test_a_flood_leaves_the_debugger_responsive_and_in_order(tmp_path: Path) -> None:
    workdir = tmp_path / "project"
    workdir.mkdir()
    (workdir / "flood.py").write_text(FLOOD)
    home = tmp_path / "home"
    async with (
        relay_stack(home, workers=1) as (_up, relay),
        debug_run(home, relay, workdir, "python", "flood.py") as (debug, _run, port),
        open_dap_client("127.0.0.1", port) as ide,
    ):
        async with ide_session(ide, [], filters=[]):
            pass
        await ide.wait_event(
            "output", timeout=60, predicate=lambda e: "line " in e["body"]["output"]
        )
        # while the program floods: requests one after the other, then a pipelined burst
        thread = 0
        with trio.fail_after(120):
            for _ in range(10):
                threads = await ide.request("threads", timeout=60)
                assert threads["success"], threads
                thread = threads["body"]["threads"][0]["id"]
            burst = [ide.send_request_nowait("threads") for _ in range(10)]
            for seq in burst:
                assert (await ide.response(seq, timeout=60))["success"]
            paused = await ide.request("pause", {"threadId": thread}, timeout=60)
            assert paused["success"], paused
            stopped = await ide.wait_event("stopped", timeout=60)
        assert stopped["body"]["reason"] == "pause"

        # every line printed before the stop arrived before `stopped`
        at_stop = index_of(ide, lambda m: m.get("event") == "stopped")
        lines = stdout_before(ide, at_stop).splitlines()
        assert lines == [f"line {i}" for i in range(len(lines))], lines[-3:]
        stack = await ide.request("stackTrace", {"threadId": thread, "levels": 1})
        frame = stack["body"]["stackFrames"][0]["id"]
        value = await ide.request(
            "evaluate", {"expression": "n", "frameId": frame, "context": "watch"}
        )
        printed = int(value["body"]["result"])
        assert printed > 0 and len(lines) in (printed, printed + 1), (printed, len(lines))

        # a REPL print arrives before the evaluate response, once
        shown = await ide.request(
            "evaluate",
            {"expression": "print('from the repl')", "frameId": frame, "context": "repl"},
        )
        assert shown["success"], shown
        answered = index_of(ide, lambda m: m is shown)
        assert stdout_before(ide, answered).count("from the repl") == 1

        await ide.request(
            "evaluate", {"expression": "keep_going = False", "frameId": frame, "context": "repl"}
        )
        ide.discard_events("stopped")
        assert (await ide.request("continue", {"threadId": thread}))["success"]
        exited = await ide.wait_event("exited", timeout=60)
        assert exited["body"]["exitCode"] == 0

        # a child's output reaches the IDE, and the last lines before the exit come before `exited`
        at_exit = index_of(ide, lambda m: m.get("event") == "exited")
        tail = stdout_before(ide, at_exit)
        assert "child\n" in tail
        after_child = tail[tail.index("child\n") :].splitlines()[1:]
        assert after_child == [*(f"tail {i}" for i in range(2000)), "last line"]
        assert stdout_before(ide, len(ide.received)).count("from the repl") == 1
        assert_schema_valid(ide)
        await ide.wait_event("terminated", timeout=30)
        await debug.wait_line(r"ended \(exited, exit code 0\)")
