"""A child that forks and then execs Python in the same pid (as some launchers do): debugpy
announces the pid twice, once for the fork and once for the exec'd program. The second is a new
incarnation of the process: it gets a session of its own, is configured, and runs to its end.
Real debugpy, the real shim, a real relay (the harness of ``test_worker_processes.py``)."""

from __future__ import annotations

import sys
from pathlib import Path

import orjson
import pytest
from test_worker_processes import WORKDIR, dap, debug_run, line_of, set_breakpoints, status

from protocol_specs.session.processes import ProcessInfo
from protocol_specs.session.session import StatusEvent
from protocol_specs.wire.wire import DapEntry, StatusEntry

pytestmark = [pytest.mark.slow, pytest.mark.timeout(180)]

FORK_EXEC = """\
import os, sys

pid = os.fork()
if pid == 0:
    os.execv(sys.executable, [sys.executable, "execd.py"])
_, status = os.waitpid(pid, 0)
print("PARENT child status", os.waitstatus_to_exitcode(status), flush=True)
sys.exit(os.waitstatus_to_exitcode(status))
"""

EXECD = """\
import os
value = 6 * 7
print("EXECD", os.getpid(), value, flush=True)  # EXECD
"""


async def test_a_fork_then_exec_child_is_debugged_again_and_runs_to_its_end(
    tmp_path: Path,
) -> None:
    bp = set_breakpoints("execd.py", line_of(EXECD, "# EXECD"), 1)
    files = {"main.py": FORK_EXEC, "execd.py": EXECD}
    async with debug_run(tmp_path, files, [sys.executable, "main.py"], [bp]) as run:
        # the exec'd program stops at its breakpoint, in the forked child's pid
        stopped = await run.until(lambda e: dap("event", "stopped")(e) and e.process != "")
        assert isinstance(stopped, DapEntry)
        key = stopped.process
        starts = [s for s in run.statuses(StatusEvent.PROCESS_STARTED) if s.process == key]
        # two incarnations of one pid: the fork's, ended, then the exec'd program's
        assert len(starts) == 2, run.statuses(StatusEvent.PROCESS_STARTED)
        assert {ProcessInfo.model_validate(s.data).pid for s in starts} == {int(key)}
        thread = orjson.loads(stopped.body)["body"]["threadId"]
        trace = {"seq": 7, "type": "request", "command": "stackTrace",
                 "arguments": {"threadId": thread}}  # fmt: skip
        await run.ide.publish(DapEntry(origin="ide1", body=orjson.dumps(trace), process=key))
        answer = await run.until(lambda e: dap("response", "stackTrace")(e) and e.process == key)
        assert isinstance(answer, DapEntry)
        frame = orjson.loads(answer.body)["body"]["stackFrames"][0]
        assert frame["source"]["path"] == f"{WORKDIR}/execd.py"
        go = {"seq": 8, "type": "request", "command": "continue",
              "arguments": {"threadId": thread}}  # fmt: skip
        await run.ide.publish(DapEntry(origin="ide1", body=orjson.dumps(go), process=key))
        exited = await run.until(status(StatusEvent.EXITED))
        assert isinstance(exited, StatusEntry) and exited.exit_code == 0
        output = b"".join(e.body for e in run.seen if isinstance(e, DapEntry))
        assert b"EXECD" in output and b"PARENT child status 0" in output
    assert run.code == [0]
