"""Unattended stops and the hours-later story, with real processes and real debugpy.

- wait (the default): every process on the user's side ends before the worker starts; the program
  stops at the breakpoint and waits; `tether attach` rebuilds the session from the relay alone and
  the IDE inspects, steps and continues.
- continue / terminate: the IDE leaves while the program is paused; `tether debug`'s terminal rings
  and prints the notice, the run's webhook gets it, and after --unattended-timeout the worker acts.
"""

from __future__ import annotations

import json
import os
import re
import signal
from pathlib import Path
from typing import Any

import pytest
import trio
from stack import PROJECT, debug_run, relay_stack, tether, worker
from test_session_e2e import bp_args, ide_session, resume, stopped_frame

from adapter.scripted_ide.dap_client import open_dap_client

pytestmark = [pytest.mark.slow, pytest.mark.timeout(180)]

#: app.py: ``result = {...}`` in compute(), reached once
ONCE_LINE = 12


@pytest.fixture
def workdir(tmp_path: Path) -> Path:
    dest = tmp_path / "project"
    dest.mkdir()
    for f in PROJECT.glob("*.py"):
        (dest / f.name).write_text(f.read_text())
    return dest


async def test_hours_later_the_paused_program_waits_for_tether_attach(
    tmp_path: Path, workdir: Path
) -> None:
    home = tmp_path / "home"
    # on the local pool a debug run nobody attends ends after 5 minutes, unless told to wait
    wait = ("--on-unattended-stop", "wait")
    async with relay_stack(home) as (_up, relay):
        async with debug_run(home, relay, workdir, "python", "app.py", extra=wait) as (
            debug,
            run_id,
            port,
        ):
            async with open_dap_client("127.0.0.1", port) as ide:
                async with ide_session(ide, [bp_args(workdir, "app.py", ONCE_LINE)]):
                    pass
                await ide.request("disconnect", {"terminateDebuggee": False})
            os.killpg(debug.process.pid, signal.SIGKILL)  # laptop off: nothing of the user's runs
            await debug.process.wait()
        async with worker(home, relay) as pool:
            await pool.wait_line(
                rf"Run {run_id} is paused at app\.py:{ONCE_LINE} in compute \(breakpoint\) and no "
                r"IDE is attached\. It stays paused until an IDE attaches",
                timeout=60,
            )
            async with tether(
                "attach", run_id, "--relay", relay, "--port", "0", home=home, name="attach"
            ) as attach:
                m = await attach.wait_line(r"adapter on 127\.0\.0\.1:(\d+)")
                async with open_dap_client("127.0.0.1", int(m.group(1))) as ide:
                    async with ide_session(ide, [bp_args(workdir, "app.py", ONCE_LINE)]):
                        pass
                    stopped, frame = await stopped_frame(ide)
                    assert (frame["name"], frame["line"]) == ("compute", ONCE_LINE)
                    thread = stopped["body"]["threadId"]
                    total = await ide.request(
                        "evaluate", {"expression": "total", "frameId": frame["id"]}
                    )
                    assert total["body"]["result"] == "150"
                    await resume(ide, "next", thread)
                    _, frame = await stopped_frame(ide)
                    assert frame["line"] == ONCE_LINE + 1
                    await resume(ide, "continue", thread)
                    exited = await ide.wait_event("exited", timeout=60)
                    assert exited["body"]["exitCode"] == 0
                await attach.wait_line(r"ended \(exited, exit code 0\)")


async def _webhook_server(
    nursery: trio.Nursery, received: list[dict[str, Any]], arrived: trio.Event
) -> int:
    async def handler(stream: trio.SocketStream) -> None:
        data = b""
        while b"\r\n\r\n" not in data:
            data += await stream.receive_some(4096)
        head, _, body = data.partition(b"\r\n\r\n")
        length = int(
            next(
                line.split(b":")[1]
                for line in head.split(b"\r\n")
                if line.lower().startswith(b"content-length")
            )
        )
        while len(body) < length:
            body += await stream.receive_some(4096)
        received.append(json.loads(body))
        arrived.set()
        await stream.send_all(b"HTTP/1.1 204 No Content\r\n\r\n")
        await stream.aclose()

    listeners = await nursery.start(trio.serve_tcp, handler, 0)
    return int(listeners[0].socket.getsockname()[1])


@pytest.mark.parametrize("policy", ["continue", "terminate"])
async def test_an_unattended_stop_is_announced_then_the_policy_acts(
    tmp_path: Path, workdir: Path, policy: str
) -> None:
    home = tmp_path / "home"
    received: list[dict[str, Any]] = []
    arrived = trio.Event()
    async with trio.open_nursery() as nursery:
        hook_port = await _webhook_server(nursery, received, arrived)
        flags = (
            "--on-unattended-stop",
            policy,
            "--unattended-timeout",
            "1s",
            "--webhook",
            f"http://127.0.0.1:{hook_port}/tether",
        )
        async with (
            relay_stack(home, workers=1) as (_up, relay),
            debug_run(home, relay, workdir, "python", "app.py", extra=flags) as (
                debug,
                run_id,
                port,
            ),
        ):
            async with open_dap_client("127.0.0.1", port) as ide:
                async with ide_session(ide, [bp_args(workdir, "app.py", ONCE_LINE)]):
                    pass
                _, frame = await stopped_frame(ide)
                assert frame["line"] == ONCE_LINE
                await ide.request("disconnect", {"terminateDebuggee": False})
            notice = await debug.wait_line(
                r"\a.*no IDE is attached\. If no IDE attaches within 1 s"
            )
            assert f"it will {policy}" in notice.string
            page = relay.replace("ws://", "http://") + f"/ui/runs/{run_id}"
            await debug.wait_line(rf"Its page: {re.escape(page)}$")
            with trio.fail_after(30):
                await arrived.wait()
            assert received[0]["event"] == "unattended_stop" and received[0]["run"] == run_id
            assert received[0]["url"] == page  # the web view's page of the run
            assert received[0]["data"]["where"] == f"app.py:{ONCE_LINE} in compute"
            if policy == "continue":
                await debug.wait_line(r"ended \(exited, exit code 0\)", timeout=60)
            else:
                await debug.wait_line(r"Terminating: the program stayed paused", timeout=60)
                await debug.wait_line(r"ended \(exited, exit code -?\d+\)", timeout=60)
            await debug.process.wait()
        nursery.cancel_scope.cancel()
