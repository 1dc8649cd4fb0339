"""The trio DAP client against a real debugpy 1.8.22: a whole attach session, schema-checked.

The debuggee is started with ``python -m debugpy --listen 127.0.0.1:0 --wait-for-client``. Its
adapter writes the port it listens on to the file named by ``DEBUGPY_ADAPTER_ENDPOINTS``
(``debugpy/adapter/__main__.py``); the test waits for that file. It never probes the port: a
probing connection would become debugpy's one client.
"""

from __future__ import annotations

import json
import os
import sys
from functools import partial
from pathlib import Path
from typing import Any

import pytest
import trio

from adapter.scripted_ide.dap_client import open_dap_client
from protocol_specs.dap.capabilities import DEBUGPY_CAPABILITIES, VSCODE_INITIALIZE
from protocol_specs.dap.schema import validate_message

pytestmark = pytest.mark.slow

TARGET = """\
import sys


def compute(x):
    y = x * 2
    return y


print("result", compute(21))
sys.exit(3)
"""
BREAKPOINT_LINE = 5


async def wait_for_endpoints(path: Path, process: trio.Process, log: Path) -> dict[str, Any]:
    """Poll for the endpoints file debugpy's adapter writes (not atomically: retry until whole)."""
    with trio.fail_after(30):
        while True:
            if process.returncode is not None:
                tail = (await trio.Path(log).read_text(errors="replace"))[-2000:]
                raise RuntimeError(
                    f"debuggee exited with {process.returncode} before listening:\n{tail}"
                )
            try:
                text = await trio.Path(path).read_text()
            except FileNotFoundError:
                text = ""
            if text.endswith("\n"):
                endpoints: dict[str, Any] = json.loads(text)
                return endpoints
            await trio.sleep(0.02)


async def test_attach_session_against_real_debugpy(tmp_path: Path) -> None:
    remote = tmp_path / "remote"
    remote.mkdir()
    (remote / "target.py").write_text(TARGET)
    local_root = tmp_path / "local"  # the IDE's copy: only pathMappings connect the two
    local_file = str(local_root / "target.py")
    endpoints_file = tmp_path / "endpoints.json"
    log = tmp_path / "debuggee.log"
    env = {
        **os.environ,
        "DEBUGPY_ADAPTER_ENDPOINTS": str(endpoints_file),
        "PYDEVD_DISABLE_FILE_VALIDATION": "1",
    }
    argv = [
        sys.executable,
        "-X",
        "frozen_modules=off",
        "-m",
        "debugpy",
        "--listen",
        "127.0.0.1:0",
        "--wait-for-client",
        "target.py",
    ]
    with trio.fail_after(90), log.open("wb") as log_file:
        async with trio.open_nursery() as nursery:
            process: trio.Process = await nursery.start(
                partial(
                    trio.run_process,
                    argv,
                    cwd=remote,
                    env=env,
                    stdout=log_file,
                    stderr=log_file,
                    check=False,
                )
            )
            endpoints = await wait_for_endpoints(endpoints_file, process, log)
            port = endpoints["client"]["port"]
            assert endpoints["client"]["host"] == "127.0.0.1" and port > 0

            async with open_dap_client("127.0.0.1", port) as ide:
                init = await ide.request("initialize", VSCODE_INITIALIZE)
                assert init["success"] and init["body"] == DEBUGPY_CAPABILITIES
                # Pushed on connect (usually before the initialize response; under load debugpy's
                # threads may order them the other way) and taken only now: events are buffered.
                sockets = await ide.wait_event("debugpySockets")
                assert {"host": "127.0.0.1", "port": port, "internal": False} in sockets["body"][
                    "sockets"
                ]
                assert sockets in ide.received

                attach = ide.send_request_nowait(
                    "attach",
                    {
                        "name": "Python Debugger: Remote Attach",
                        "type": "debugpy",
                        "request": "attach",
                        "connect": {"host": "127.0.0.1", "port": port},
                        "pathMappings": [{"localRoot": str(local_root), "remoteRoot": "."}],
                        "justMyCode": True,
                        "debugOptions": ["RedirectOutput", "ShowReturnValue"],
                        "showReturnValue": True,
                        "clientOS": "unix",
                    },
                )
                await ide.wait_event("initialized")
                # VS Code sends the configuration concurrently (research/dap.md section 2.4).
                configuration = [
                    ide.send_request_nowait(
                        "setBreakpoints",
                        {
                            "source": {"name": "target.py", "path": local_file},
                            "lines": [BREAKPOINT_LINE],
                            "breakpoints": [{"line": BREAKPOINT_LINE}],
                            "sourceModified": False,
                        },
                    ),
                    ide.send_request_nowait("setFunctionBreakpoints", {"breakpoints": []}),
                    ide.send_request_nowait("setExceptionBreakpoints", {"filters": ["uncaught"]}),
                ]
                breakpoints, *others = [await ide.response(seq) for seq in configuration]
                assert breakpoints["success"] and all(r["success"] for r in others)
                (breakpoint,) = breakpoints["body"]["breakpoints"]
                assert breakpoint["verified"] and breakpoint["line"] == BREAKPOINT_LINE

                done = await ide.request("configurationDone")
                assert done["success"]
                attached = await ide.response(attach)  # debugpy answers attach only now
                assert attached["success"]
                assert ide.received.index(done) < ide.received.index(attached)

                stopped = await ide.wait_event("stopped")
                assert stopped["body"]["reason"] == "breakpoint"
                thread = stopped["body"]["threadId"]
                threads = await ide.request("threads")
                assert thread in [t["id"] for t in threads["body"]["threads"]]
                trace = await ide.request(
                    "stackTrace", {"threadId": thread, "startFrame": 0, "levels": 1}
                )
                (frame,) = trace["body"]["stackFrames"]
                assert (frame["name"], frame["line"]) == ("compute", BREAKPOINT_LINE)
                assert frame["source"]["path"] == local_file  # mapped back to the IDE's side
                scopes = await ide.request("scopes", {"frameId": frame["id"]})
                local_scope = scopes["body"]["scopes"][0]
                variables = await ide.request(
                    "variables", {"variablesReference": local_scope["variablesReference"]}
                )
                assert {"x": "21"}.items() <= {
                    v["name"]: v["value"] for v in variables["body"]["variables"]
                }.items()

                stale = await ide.request("scopes", {"frameId": 987654})
                assert stale["success"] is False and stale["message"]  # answered, not raised

                resumed = await ide.request("continue", {"threadId": thread})
                assert resumed["success"]
                # sys.exit(3) raises an uncaught SystemExit with a non-zero code: the "uncaught"
                # filter stops there too.
                stopped = await ide.wait_event("stopped")
                assert stopped["body"]["reason"] == "exception"
                info = await ide.request("exceptionInfo", {"threadId": thread})
                assert "SystemExit" in info["body"]["exceptionId"]
                resumed = await ide.request("continue", {"threadId": thread})
                assert resumed["success"]
                await ide.wait_event("terminated")
                stdout = "".join(
                    m["body"]["output"]
                    for m in ide.received
                    if m["type"] == "event"
                    and m["event"] == "output"
                    and m["body"].get("category") == "stdout"
                )
                assert "result 42" in stdout
                disconnected = await ide.request("disconnect", {"restart": False})
                assert disconnected["success"]

            for message in ide.received:
                validate_message(message)
            assert await process.wait() == 3, log.read_text(errors="replace")
