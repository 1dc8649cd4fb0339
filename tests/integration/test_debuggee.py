"""Starting programs under real debugpy: readiness without probing, a debug session over the one
connection, exit codes, child processes, and nothing left behind however the run ends.

Every run gets an environment variable of its own (``TETHER_TEST_RUN``); every process of the run
inherits it, debugpy's adapter included (which leaves the program's process group), so "nothing is
left behind" means: no live process carries it.

Faults debugpy does not offer a switch for are injected with a ``sitecustomize`` module that the
debuggee's interpreter imports before anything else (``fault`` fixture).
"""

from __future__ import annotations

import json
import os
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
import trio
from debuggee_harness import LOCAL_ROOT, RETURN_LINE, Run, client, configure, evaluate

from adapter.scripted_ide.dap_client import DapClient, open_dap_client
from protocol_specs.dap.capabilities import VSCODE_INITIALIZE
from worker_shim.program.debuggee import Debuggee, DebuggeeStartError, start_debuggee
from worker_shim.program.python_command import BOOT

pytestmark = [pytest.mark.slow, pytest.mark.timeout(90)]

NODELAY = "__import__('pydevd').get_global_debugger()._client_socket.getsockopt(6, 1)"
#: pydevd's poll and its wait for its own threads at the end: the boot script's quick exit
QUICK_EXIT = (
    "(__import__('pydevd').TIMEOUT_SLOW, "
    "hasattr(__import__('pydevd').PyDB.dispose_and_kill_all_pydevd_threads, '__wrapped__'))"
)


POOL_PROGRAM = """\
import multiprocessing


def square(x):
    return x * x


def main():
    with multiprocessing.get_context("spawn").Pool(2) as pool:
        squares = pool.map(square, range(10))
    total = sum(squares)
    print("total", total)


if __name__ == "__main__":
    main()
"""
POOL_SUM_LINE = 11

SITECUSTOMIZE = """\
import os, sys, time

report = os.environ.get("TETHER_TEST_ADAPTER_SOCKETS")
if report and "--for-server" in sys.argv:  # debugpy's adapter process: say how it accepts
    import socket
    accept = socket.socket.accept
    def reporting_accept(self):
        conn, address = accept(self)
        with open(report, "a") as f:
            f.write(f"{conn.getsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY)}\\n")
        return conn, address
    socket.socket.accept = reporting_accept
fault = os.environ.pop("TETHER_TEST_FAULT", None)  # popped: debugpy's adapter must not see it
if fault == "exit-before-debugpy":
    print("boom: exiting before debugpy starts", file=sys.stderr, flush=True)
    os._exit(5)
elif fault == "hold-before-debugpy":
    open(os.environ["TETHER_TEST_FIFO"], "w").close()  # returns once the test opened it
    time.sleep(3600)
elif fault == "hold-before-pydevd-connects":
    from debugpy.server import api
    api._settrace = lambda **kwargs: time.sleep(3600)  # the adapter runs, pydevd never connects
elif fault == "foreign-start-client":
    from debugpy.server import api  # imports pydevd
    import pydevd
    original = pydevd.start_client
    pydevd.start_client = lambda *args, **kwargs: original(*args, **kwargs)
"""


@pytest.fixture
def run(tmp_path: Path) -> Run:
    return Run(tmp_path)


@pytest.fixture
def fault(tmp_path: Path) -> Callable[[Run, str], None]:
    """``fault(run, name)``: the run's interpreter injects fault ``name`` (see SITECUSTOMIZE)."""
    site = tmp_path / "site"
    site.mkdir()
    (site / "sitecustomize.py").write_text(SITECUSTOMIZE)

    def inject(run: Run, name: str) -> None:
        path = os.pathsep.join(p for p in (str(site), os.environ.get("PYTHONPATH")) if p)
        run.env |= {"PYTHONPATH": path, "TETHER_TEST_FAULT": name}

    return inject


@pytest.mark.parametrize("fast", [True, False], ids=["boot", "stock"])
async def test_a_breakpoint_session_over_the_one_connection(run: Run, fast: bool) -> None:
    async with run.start(fast=fast) as debuggee:
        async with client(debuggee) as ide:
            (bp,) = await configure(ide, breakpoints=[RETURN_LINE], just_my_code=False)
            assert bp["verified"] and bp["line"] == RETURN_LINE
            stopped = await ide.wait_event("stopped")
            assert stopped["body"]["reason"] == "breakpoint"
            thread = stopped["body"]["threadId"]
            frames = (await ide.request("stackTrace", {"threadId": thread}))["body"]["stackFrames"]
            top = frames[0]
            assert (top["name"], top["line"]) == ("compute", RETURN_LINE)
            assert top["source"]["path"] == f"{LOCAL_ROOT}/prog.py"  # mapped back to the IDE's side
            # neither debugpy's nor tether's launcher shows, even with justMyCode off
            paths = [f.get("source", {}).get("path", "") for f in frames]
            assert not [p for p in paths if "debugpy" in p or BOOT.name in p], paths
            assert await evaluate(ide, top["id"], "total") == "6"
            # the boot script's point: pydevd's socket has TCP_NODELAY (pinned to this debugpy)
            assert await evaluate(ide, top["id"], NODELAY) == ("1" if fast else "0")
            # and pydevd polls every 50 ms, and waits 50 ms at most for its threads at the end
            assert await evaluate(ide, top["id"], QUICK_EXIT) == (
                "(0.05, True)" if fast else "(0.2, False)"
            )
            assert (await ide.request("continue", {"threadId": thread}))["success"]
            await ide.wait_event("terminated")
        assert await debuggee.wait() == 0
        with pytest.raises(RuntimeError, match="one connection"):
            await debuggee.connect()
    assert "result 6" in run.log.read_text()
    assert run.leftovers() == []


@pytest.mark.parametrize("fast", [True, False], ids=["boot", "stock"])
async def test_debugpys_adapter_process_writes_without_nagle(
    run: Run, fault: Callable[[Run, str], None], fast: bool
) -> None:
    """The sockets debugpy's adapter process accepts (the shim's connection, pydevd's) have
    ``TCP_NODELAY`` under the boot script, so the ``stopped`` it writes right after ``next``'s
    response is not held for the shim's delayed ACK; stock debugpy's have not."""
    report = run.dir / "adapter-sockets"
    fault(run, "none")  # only the reporting sitecustomize
    run.env["TETHER_TEST_ADAPTER_SOCKETS"] = str(report)
    async with run.start(fast=fast) as debuggee, client(debuggee) as ide:
        await configure(ide, breakpoints=[2])  # total = 0
        thread = (await ide.wait_event("stopped"))["body"]["threadId"]
        assert (await ide.request("next", {"threadId": thread}))["success"]
        assert (await ide.wait_event("stopped"))["body"]["reason"] == "step"
        await ide.request("continue", {"threadId": thread})
        await ide.wait_event("terminated")
        assert await debuggee.wait() == 0
    accepted = report.read_text().split()
    assert len(accepted) >= 2, accepted  # the shim's connection, then pydevd's
    assert set(accepted) == {"1" if fast else "0"}


@pytest.mark.parametrize("fast", [True, False], ids=["boot", "stock"])
async def test_held_until_configured_then_exit_code_is_reported(tmp_path: Path, fast: bool) -> None:
    run = Run(tmp_path, "import pathlib, sys\npathlib.Path('ran').write_text('yes')\nsys.exit(3)\n")
    async with run.start(fast=fast) as debuggee:
        assert not (run.dir / "ran").exists()  # nothing of the program ran before configuration
        async with client(debuggee) as ide:
            await configure(ide)
            await ide.wait_event("terminated")
        assert await debuggee.wait() == 3
    assert (run.dir / "ran").read_text() == "yes"
    assert run.leftovers() == []


async def test_a_spawn_pool_runs_to_completion_under_the_debugger(tmp_path: Path) -> None:
    # With subprocess debugging on, debugpy announces each child (the pool's two workers and
    # multiprocessing's resource tracker) with a ``debugpyAttach`` event to a client without
    # ``startDebugging``, and holds it until someone attaches: pool.map never returns.
    run = Run(tmp_path, POOL_PROGRAM)
    without_start_debugging = {**VSCODE_INITIALIZE, "supportsStartDebuggingRequest": False}
    with trio.fail_after(60):
        async with run.start() as debuggee, client(debuggee) as ide:
            (bp,) = await configure(
                ide, breakpoints=[POOL_SUM_LINE], initialize=without_start_debugging
            )
            assert bp["verified"]
            stopped = await ide.wait_event("stopped", timeout=30)
            thread = stopped["body"]["threadId"]
            stack = await ide.request("stackTrace", {"threadId": thread, "levels": 1})
            top = stack["body"]["stackFrames"][0]
            assert (top["name"], top["line"]) == ("main", POOL_SUM_LINE)
            assert await evaluate(ide, top["id"], "squares[-1]") == "81"
            await ide.request("continue", {"threadId": thread})
            await ide.wait_event("terminated")
            assert await debuggee.wait() == 0
            # no child was offered for debugging
            assert not [
                m
                for m in ide.received
                if m.get("command") == "startDebugging" or m.get("event") == "debugpyAttach"
            ]
    assert "total 285" in run.log.read_text()
    assert run.leftovers() == []


@pytest.mark.parametrize("options", [[], ["-I"]], ids=["default", "isolated"])
async def test_the_program_sees_the_sys_path_plain_python_gives_it(
    tmp_path: Path, options: list[str]
) -> None:
    run = Run(tmp_path, "import json, sys\nprint('PATH', json.dumps(sys.path))\n")
    async with run.start(*options) as debuggee, client(debuggee) as ide:
        await configure(ide)
        await ide.wait_event("terminated")
    (line,) = [x for x in run.log.read_text().splitlines() if x.startswith("PATH ")]
    debugged = json.loads(line.removeprefix("PATH "))
    plain = await trio.run_process(
        [sys.executable, *options, "prog.py"], cwd=run.dir, capture_stdout=True, env=run.env
    )
    expected = json.loads(plain.stdout.decode().removeprefix("PATH "))
    assert str(BOOT.parent) not in debugged
    assert debugged.pop().endswith("debugpy-home")  # the worker's debugpy, after everything else
    if not options:  # the script's directory comes first, relative to the cwd (debugpy's way)
        assert debugged[0] == ""
        debugged[0] = str(run.dir)
    assert debugged == expected


async def test_terminate_ends_the_program_its_children_and_then_debugpy(run: Run) -> None:
    (run.dir / "prog.py").write_text(
        "import subprocess, sys, time\n"
        "subprocess.Popen([sys.executable, '-c', 'import time; time.sleep(600)'])\n"
        "while True:\n"
        "    time.sleep(0.1)\n"
    )
    async with run.start() as debuggee, client(debuggee) as ide:
        await configure(ide)
        await ide.wait_event("thread")  # the program runs its endless loop
        await debuggee.terminate(grace=5)
        # debugpy's adapter outlives the program until its client goes, and tells it
        await ide.wait_event("terminated")
        assert debuggee.process.returncode is not None
    assert run.leftovers() == []


async def test_cancelled_while_paused_and_connected_leaves_nothing(run: Run) -> None:
    # debugpy's adapter waits for its client to disconnect; here the client outlives the run
    async def hold_client(debuggee: Debuggee, *, task_status: Any) -> None:
        async with client(debuggee) as ide:
            task_status.started(ide)
            await trio.sleep_forever()

    async with trio.open_nursery() as nursery:
        with trio.CancelScope() as scope:
            async with run.start() as debuggee:
                ide: DapClient = await nursery.start(hold_client, debuggee)
                await configure(ide, breakpoints=[RETURN_LINE])
                await ide.wait_event("stopped")
                scope.cancel()
                await trio.sleep_forever()
        assert scope.cancelled_caught
        assert run.leftovers() == []
        nursery.cancel_scope.cancel()


async def test_cancelled_while_waiting_for_debugpy_leaves_nothing(
    run: Run, fault: Callable[[Run, str], None]
) -> None:
    fifo = run.dir / "held"
    os.mkfifo(fifo)
    fault(run, "hold-before-debugpy")
    run.env["TETHER_TEST_FIFO"] = str(fifo)
    started = False
    async with trio.open_nursery() as nursery:

        async def start() -> None:
            nonlocal started
            async with run.start():
                started = True

        nursery.start_soon(start)
        with trio.fail_after(30):  # opening the FIFO returns once the program holds it open
            await trio.to_thread.run_sync(lambda: open(fifo, "rb").close(), abandon_on_cancel=True)
        nursery.cancel_scope.cancel()
    assert not started
    assert run.leftovers() == []


async def test_a_program_gone_before_pydevd_connected_leaves_no_adapter(
    run: Run, fault: Callable[[Run, str], None]
) -> None:
    # debugpy's adapter waits for pydevd's first connection forever, outside the program's group
    fault(run, "hold-before-pydevd-connects")
    async with run.start():
        assert [p for p in run.leftovers() if "--for-server" in p]  # the adapter, running
    assert run.leftovers() == []


async def test_a_program_that_cannot_start_is_reported_with_its_log(
    run: Run, fault: Callable[[Run, str], None]
) -> None:
    fault(run, "exit-before-debugpy")
    with pytest.raises(DebuggeeStartError, match="exited with 5") as caught:
        async with run.start():
            pytest.fail("started")
    assert "boom: exiting before debugpy starts" in str(caught.value)
    assert run.leftovers() == []


async def test_when_debugpy_internals_differ_the_boot_falls_back_to_stock_debugpy(
    run: Run, fault: Callable[[Run, str], None]
) -> None:
    fault(run, "foreign-start-client")
    async with run.start() as debuggee, client(debuggee) as ide:
        await configure(ide, breakpoints=[RETURN_LINE])
        stopped = await ide.wait_event("stopped")
        thread = stopped["body"]["threadId"]
        stack = await ide.request("stackTrace", {"threadId": thread, "levels": 1})
        frame = stack["body"]["stackFrames"][0]
        assert frame["line"] == RETURN_LINE
        assert await evaluate(ide, frame["id"], NODELAY) == "0"
        await ide.request("continue", {"threadId": thread})
        await ide.wait_event("terminated")
        assert await debuggee.wait() == 0
    log = run.log.read_text()
    assert "running without the TCP_NODELAY fix" in log and "result 6" in log


async def test_a_missing_script_fails_the_run_with_the_reason_in_its_log(run: Run) -> None:
    (run.dir / "prog.py").unlink()
    async with run.start() as debuggee:
        async with open_dap_client("127.0.0.1", debuggee.port) as ide:
            await configure(ide)
            await ide.wait_event("terminated")
        assert await debuggee.wait() != 0
    assert "prog.py" in run.log.read_text()


async def test_the_runs_log_file_is_private_and_has_secret_values_blanked(tmp_path: Path) -> None:
    secret = "hunter2-not-for-logs"
    run = Run(
        tmp_path,
        "import sys\n"
        f"sys.stdout.write({secret[:7]!r}); sys.stdout.flush()\n"  # a value split across writes
        f"sys.stdout.write({secret[7:]!r} + '\\n')\n"
        f"print('and again', {secret!r}, file=sys.stderr)\n",
    )
    async with start_debuggee(
        [sys.executable, "prog.py"],
        cwd=str(run.dir),
        env=run.env,
        log_path=str(run.log),
        secrets=[secret],
    ) as debuggee:
        async with client(debuggee) as ide:
            await configure(ide)
            await ide.wait_event("terminated")
        assert await debuggee.wait() == 0
    text = run.log.read_text()
    assert secret not in text and "and again" in text, text
    assert run.log.stat().st_mode & 0o777 == 0o600


async def test_a_script_that_does_not_compile_is_reported_as_plain_python_reports_it(
    tmp_path: Path,
) -> None:
    run = Run(tmp_path, "total = (\n")
    async with run.start() as debuggee:
        async with client(debuggee) as ide:
            await configure(ide)
            await ide.wait_event("terminated")
        assert await debuggee.wait() == 1
    log = run.log.read_text()
    assert "SyntaxError: '(' was never closed" in log and 'File "prog.py", line 1' in log, log
    assert "debugpy" not in log.replace("PYDEVD", "") and BOOT.name not in log, log
