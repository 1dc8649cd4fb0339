"""A plain run's program started debuggable later (``_tether_debugpy_boot.py --tether-attach``):
it runs as plain ``python`` would, with nothing of the debugger loaded, until the worker asks; then
debugpy starts in it and a client's breakpoints apply to the running program. Real processes and
real debugpy, no relay."""

from __future__ import annotations

import subprocess
import sys
from functools import partial
from pathlib import Path
from typing import Any

import pytest
import trio

from adapter.scripted_ide.dap_client import open_dap_client
from worker_shim.program.python_command import build_attachable_argv, debugpy_home

pytestmark = pytest.mark.timeout(60)

NODELAY = "__import__('pydevd').get_global_debugger()._client_socket.getsockopt(6, 1)"
QUICK_EXIT = "__import__('pydevd').TIMEOUT_SLOW"

SHOW = """\
import sys
print(repr(sys.argv), __name__, repr(sys.path[0]), 'debugpy' in sys.modules or 'pydevd' in sys.modules)
"""
CRASH = """\
def inner():
    raise ValueError("boom")


inner()
"""
LOOP = """\
import time

done = False


def step(i):
    value = i + 1
    return value  # line 8


i = 0
while not done:
    i = step(i)
    time.sleep(0.005)
print("ended at", i)
"""


def _run(argv: list[str], cwd: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run(argv, cwd=cwd, capture_output=True, text=True, timeout=30, check=False)


def _attachable(tmp_path: Path, command: list[str]) -> list[str]:
    return build_attachable_argv(
        command,
        python=sys.executable,
        home=str(debugpy_home(tmp_path)),
        socket=str(tmp_path / "attach.sock"),
    )


@pytest.mark.parametrize(
    "target",
    [["show.py", "a", "b"], ["-m", "show", "a", "b"], ["-c", SHOW, "a", "b"]],
    ids=["script", "module", "code"],
)
def test_the_program_runs_as_plain_python_would_with_no_debugger_loaded(
    tmp_path: Path, target: list[str]
) -> None:
    (tmp_path / "show.py").write_text(SHOW)
    plain = _run([sys.executable, *target], tmp_path)
    ours = _run(_attachable(tmp_path, ["python", *target]), tmp_path)
    assert ours.returncode == plain.returncode == 0, ours.stderr
    assert ours.stdout == plain.stdout
    assert ours.stdout.rstrip().endswith("False")  # neither debugpy nor pydevd imported


def test_an_uncaught_exception_is_reported_as_plain_python_reports_it(tmp_path: Path) -> None:
    (tmp_path / "crash.py").write_text(CRASH)
    plain = _run([sys.executable, "crash.py"], tmp_path)
    ours = _run(_attachable(tmp_path, ["python", "crash.py"]), tmp_path)
    assert ours.returncode == plain.returncode == 1
    # the same frames: none of the boot script, runpy or debugpy above the program's own
    assert ours.stderr.replace(str(tmp_path) + "/", "") == plain.stderr.replace(
        str(tmp_path) + "/", ""
    )


async def test_attach_starts_debugpy_in_the_running_program(tmp_path: Path) -> None:
    (tmp_path / "loop.py").write_text(LOOP)
    argv = _attachable(tmp_path, ["python", "loop.py"])
    listener = trio.socket.socket(trio.socket.AF_UNIX, trio.socket.SOCK_STREAM)
    await listener.bind(str(tmp_path / "attach.sock"))  # the worker's side, before the program
    listener.listen(1)
    async with trio.open_nursery() as nursery:
        process = await nursery.start(partial(trio.run_process, argv, cwd=tmp_path, check=False))
        with trio.fail_after(20):
            conn, _ = await listener.accept()  # the program connects when it starts
            async with trio.SocketStream(conn) as stream:
                await stream.send_all(b"garbage\nattach\n")  # a line that is no request: ignored
                answer = b""
                while not answer.endswith(b"\n"):
                    answer += await stream.receive_some(100)
        port = int(answer)
        async with open_dap_client("127.0.0.1", port) as ide:
            await ide.request("initialize", {"adapterID": "debugpy", "pathFormat": "path"})
            attach = ide.send_request_nowait("attach", {"justMyCode": True})
            await ide.wait_event("initialized", timeout=20)
            path = str(tmp_path / "loop.py")
            answer_bp = await ide.request(
                "setBreakpoints", {"source": {"path": path}, "breakpoints": [{"line": 8}]}
            )
            assert answer_bp["body"]["breakpoints"][0]["verified"]
            await ide.request("configurationDone")
            await ide.response(attach, timeout=20)
            stopped = await ide.wait_event("stopped", timeout=20)
            thread = stopped["body"]["threadId"]
            frames = await ide.request("stackTrace", {"threadId": thread})
            frame = frames["body"]["stackFrames"][0]
            assert (frame["name"], frame["line"]) == ("step", 8)
            names = [f["name"] for f in frames["body"]["stackFrames"]]
            assert names == ["step", "<module>"]  # none of the boot script's
            threads = await ide.request("threads")
            assert [t["name"] for t in threads["body"]["threads"]] == ["MainThread"]

            async def evaluate(expression: str) -> str:
                args = {"expression": expression, "frameId": frame["id"], "context": "repl"}
                result: str = (await ide.request("evaluate", args))["body"]["result"]
                return result

            # the boot script's fixes, applied when debugpy started
            assert await evaluate(NODELAY) == "1"
            assert await evaluate(QUICK_EXIT) == "0.05"
            await evaluate("globals().update(done=True)")
            await ide.request("setBreakpoints", {"source": {"path": path}, "breakpoints": []})
            await ide.request("continue", {"threadId": thread})
            await ide.wait_event("terminated", timeout=20)
        with trio.fail_after(20):
            assert await process.wait() == 0
    listener.close()


PM = """\
import sys
import threading


def fail(n):
    x = {"n": n}
    raise ValueError(f"boom {n}")  # line 7


def in_thread():
    fail(7)  # line 11


if sys.argv[1] == "thread":
    t = threading.Thread(target=in_thread)
    t.start()
    t.join()
    print("thread over")
elif sys.argv[1] == "exit":
    sys.exit(3)
fail(3)  # line 21
"""


async def _post_mortem(tmp_path: Path, mode: str) -> tuple[list[tuple[str, str, list[Any]]], int]:
    """Run PM in ``mode`` with post-mortem on, as the worker would: each ``post-mortem PORT``
    line gets a client that configures debugpy (uncaught exceptions) and inspects each stop:
    (exception, its first variables, the frames), then lets the thread go. The stops and the
    exit code."""
    (tmp_path / "pm.py").write_text(PM)
    argv = build_attachable_argv(
        ["python", "pm.py", mode],
        python=sys.executable,
        home=str(debugpy_home(tmp_path)),
        socket=str(tmp_path / "attach.sock"),
        post_mortem=True,
    )
    listener = trio.socket.socket(trio.socket.AF_UNIX, trio.socket.SOCK_STREAM)
    await listener.bind(str(tmp_path / "attach.sock"))
    listener.listen(1)
    stops: list[tuple[str, str, list[Any]]] = []
    err = tmp_path / "stderr"
    async with trio.open_nursery() as nursery:
        with err.open("wb") as sink:
            process = await nursery.start(
                partial(trio.run_process, argv, cwd=tmp_path, stderr=sink, check=False)
            )
        with trio.fail_after(30):
            conn, _ = await listener.accept()
            stream = trio.SocketStream(conn)
            nursery.start_soon(_close_at_exit, process, stream)
            line = b""
            while not line.endswith(b"\n"):
                chunk = await stream.receive_some(100)
                if not chunk:
                    break  # the program ended without a post-mortem
                line += chunk
        if line:
            word, port = line.split()
            assert word == b"post-mortem"
            async with open_dap_client("127.0.0.1", int(port)) as ide:
                await ide.request("initialize", {"adapterID": "debugpy", "pathFormat": "path"})
                attach = ide.send_request_nowait("attach", {"justMyCode": True})
                await ide.wait_event("initialized", timeout=20)
                await ide.request("setExceptionBreakpoints", {"filters": ["uncaught"]})
                await ide.request("configurationDone")
                await ide.response(attach, timeout=20)
                for _ in range(2 if mode == "thread" else 1):
                    stopped = await ide.wait_event("stopped", timeout=20)
                    assert stopped["body"]["reason"] == "exception"
                    thread = stopped["body"]["threadId"]
                    info = await ide.request("exceptionInfo", {"threadId": thread})
                    assert info["body"]["breakMode"] == "unhandled"
                    frames = await ide.request("stackTrace", {"threadId": thread})
                    top = frames["body"]["stackFrames"][0]
                    scopes = await ide.request("scopes", {"frameId": top["id"]})
                    ref = scopes["body"]["scopes"][0]["variablesReference"]
                    variables = await ide.request("variables", {"variablesReference": ref})
                    values = {v["name"]: v["value"] for v in variables["body"]["variables"]}
                    stops.append(
                        (
                            f"{info['body']['exceptionId']}: {info['body']['description']}",
                            values["x"],
                            [(f["name"], f["line"]) for f in frames["body"]["stackFrames"]],
                        )
                    )
                    await ide.request("continue", {"threadId": thread})
                await ide.wait_event("terminated", timeout=20)
        with trio.fail_after(20):
            code = await process.wait()
    listener.close()
    plain = _run([sys.executable, "pm.py", mode], tmp_path)
    assert err.read_text().replace(str(tmp_path) + "/", "") == plain.stderr.replace(
        str(tmp_path) + "/", ""
    )  # once let go, it ends as plain python would have: the same traceback
    assert code == plain.returncode
    return stops, code


async def _close_at_exit(process: trio.Process, stream: trio.SocketStream) -> None:
    await process.wait()
    await stream.aclose()


async def test_an_uncaught_exception_stops_in_its_frame_post_mortem(tmp_path: Path) -> None:
    stops, code = await _post_mortem(tmp_path, "main")
    assert stops == [("ValueError: boom 3", "{'n': 3}", [("fail", 7), ("<module>", 21)])]
    assert code == 1


async def test_a_threads_uncaught_exception_stops_it_then_the_main_threads_once(
    tmp_path: Path,
) -> None:
    """The thread's post-mortem starts debugpy; the main thread's exception after it is
    debugpy's own stop on an uncaught exception (once, not twice)."""
    stops, code = await _post_mortem(tmp_path, "thread")
    assert stops == [
        ("ValueError: boom 7", "{'n': 7}", [("fail", 7), ("in_thread", 11)]),
        ("ValueError: boom 3", "{'n': 3}", [("fail", 7), ("<module>", 21)]),
    ]
    assert code == 1


async def test_sys_exit_is_how_a_program_ends_not_a_crash(tmp_path: Path) -> None:
    stops, code = await _post_mortem(tmp_path, "exit")
    assert stops == [] and code == 3


STOPS = """\
def work(n):
    total = n * 7
    breakpoint()
    return total  # line 4


print("got", work(6))
"""


async def test_breakpoint_call_pauses_the_plain_run_as_debug_when_does(tmp_path: Path) -> None:
    """``breakpoint()`` in a plain run's program: debugpy starts, the worker is told ``pause
    PORT``, configures it, and the thread stops in the caller's frame; let go, it runs on."""
    (tmp_path / "stops.py").write_text(STOPS)
    argv = _attachable(tmp_path, ["python", "stops.py"])
    listener = trio.socket.socket(trio.socket.AF_UNIX, trio.socket.SOCK_STREAM)
    await listener.bind(str(tmp_path / "attach.sock"))
    listener.listen(1)
    async with trio.open_nursery() as nursery:
        process = await nursery.start(partial(trio.run_process, argv, cwd=tmp_path, check=False))
        with trio.fail_after(30):
            conn, _ = await listener.accept()
            stream = trio.SocketStream(conn)
            line = b""
            while not line.endswith(b"\n"):
                line += await stream.receive_some(100)
            word, port = line.split()
            assert word == b"pause"
            async with open_dap_client("127.0.0.1", int(port)) as ide:
                await ide.request("initialize", {"adapterID": "debugpy", "pathFormat": "path"})
                attach = ide.send_request_nowait("attach", {"justMyCode": True})
                await ide.wait_event("initialized", timeout=20)
                await ide.request("configurationDone")
                await ide.response(attach, timeout=20)
                stopped = await ide.wait_event("stopped", timeout=20)
                thread = stopped["body"]["threadId"]
                frames = await ide.request("stackTrace", {"threadId": thread})
                top = frames["body"]["stackFrames"][0]
                assert (top["name"], top["line"]) == ("work", 4)
                await ide.request("continue", {"threadId": thread})
                await ide.wait_event("terminated", timeout=20)
            await stream.aclose()
        with trio.fail_after(20):
            code = await process.wait()
    listener.close()
    assert code == 0
