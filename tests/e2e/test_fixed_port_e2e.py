"""The fix-and-rerun loop on a fixed adapter port (launch.json's ``"port": 19205``): a session that
just ended leaves its port in TIME-WAIT, and the next `tether debug --port P` serves on it at
once; a port a live listener holds is still refused (real processes, the Python DAP client)."""

from __future__ import annotations

import socket
from pathlib import Path

import pytest
import trio
from stack import TETHER, home_env, relay_stack, tether

from adapter.scripted_ide.dap_client import open_dap_client
from protocol_specs.dap.capabilities import VSCODE_INITIALIZE

pytestmark = [pytest.mark.slow, pytest.mark.timeout(240)]


def unused_port() -> int:
    """A port nothing holds (bound, never connected, closed: no TIME-WAIT of its own)."""
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return int(probe.getsockname()[1])


def states_on(port: int) -> set[str]:
    """The TCP states of the sockets whose local port is ``port`` (``"06"``: TIME-WAIT)."""
    found = set()
    for row in Path("/proc/net/tcp").read_text().splitlines()[1:]:
        cols = row.split()
        if int(cols[1].rsplit(":", 1)[1], 16) == port:
            found.add(cols[3])
    return found


async def one_session(home: Path, workdir: Path, port: int) -> None:
    """`tether debug --port PORT` with an IDE attached until the run ends; the adapter's side
    closes first (the process ends while the IDE still holds its connection), so its port is left
    in TIME-WAIT, as after VS Code's session ends."""
    async with tether(
        "debug", "--port", str(port), "--workdir", str(workdir), "--", "python", "app.py",
        home=home, name="debug",
    ) as debug:  # fmt: skip
        await debug.wait_line(rf"adapter on 127\.0\.0\.1:{port}\b")
        async with open_dap_client("127.0.0.1", port) as ide:
            await ide.request("initialize", VSCODE_INITIALIZE)
            attach = ide.send_request_nowait("attach", {"justMyCode": True})
            await ide.wait_event("initialized", timeout=30)
            await ide.request("setExceptionBreakpoints", {"filters": []})
            assert (await ide.request("configurationDone"))["success"]
            assert (await ide.response(attach))["success"]
            await ide.wait_event("terminated", timeout=120)
            with trio.fail_after(60):
                assert await debug.process.wait() == 0, debug.output


async def test_a_rerun_serves_on_the_port_the_last_session_left_in_time_wait(
    tmp_path: Path,
) -> None:
    home, workdir = tmp_path / "home", tmp_path / "project"
    workdir.mkdir()
    (workdir / "app.py").write_text("print('done')\n")
    port = unused_port()
    async with relay_stack(home, workers=1):
        await one_session(home, workdir, port)
        assert "06" in states_on(port), "the first session left no TIME-WAIT to test against"
        await one_session(home, workdir, port)  # the fix-and-rerun loop: at once, same port
        with socket.create_server(("127.0.0.1", port)) as held:  # a live listener: refused
            assert held.getsockname()[1] == port
            with trio.fail_after(60):
                done = await trio.run_process(
                    [TETHER, "debug", "--port", str(port), "--workdir", str(workdir), "--",
                     "python", "app.py"],
                    env=home_env(home), capture_stdout=True,
                    capture_stderr=True, check=False,
                )  # fmt: skip
    said = done.stderr.decode()
    assert done.returncode == 1 and f"127.0.0.1:{port} is in use" in said, said
    assert "Traceback" not in said
