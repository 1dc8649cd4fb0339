"""The ``websockets.trio`` fix (``relay/client/ws_flow.py``): both ends of one connection send a lot
at once, each reading what the other sends, and neither waits for ever (unpatched, each end's
reader waits for the send lock its blocked writer holds, and neither reads again)."""

from __future__ import annotations

import subprocess
import sys
from functools import partial

import pytest
import trio
from websockets.trio.client import connect
from websockets.trio.server import ServerConnection, serve

from relay.client import ws_flow

pytestmark = pytest.mark.timeout(60)

#: imports every module that makes websockets.trio connections, then says whether it is patched
_IMPORTS = (
    "import relay.client, relay.client.ws_flow, relay.server, adapter.cli.main;"
    "from websockets.trio.connection import Connection;"
    "print(getattr(Connection.send_data, '_tether', False))"
)

MESSAGES = 200
SIZE = 256 * 1024  # 50 MiB each way: far beyond what the sockets' buffers hold


async def _both_ways(ws: object) -> int:
    """Send MESSAGES while reading as many; the bytes read."""
    got = 0

    async def send() -> None:
        for _ in range(MESSAGES):
            await ws.send(b"x" * SIZE)  # type: ignore[attr-defined]

    async with trio.open_nursery() as nursery:
        nursery.start_soon(send)
        for _ in range(MESSAGES):
            got += len(await ws.recv())  # type: ignore[attr-defined]
    return got


async def test_two_ends_sending_a_lot_at_once_both_finish() -> None:
    assert ws_flow.apply()
    assert ws_flow.apply()  # again: nothing more to do, still in place
    served: list[int] = []

    async def handler(ws: ServerConnection) -> None:
        served.append(await _both_ways(ws))

    async with trio.open_nursery() as nursery:
        server = await nursery.start(
            partial(serve, handler, 0, host="127.0.0.1", compression=None, max_size=None)
        )
        port = server.listeners[0].socket.getsockname()[1]
        with trio.fail_after(45):
            async with connect(f"ws://127.0.0.1:{port}", compression=None, max_size=None) as ws:
                assert await _both_ways(ws) == MESSAGES * SIZE
        nursery.cancel_scope.cancel()
    assert served == [MESSAGES * SIZE]


def test_importing_patches_nothing() -> None:
    """The fix is applied where connections start, never as a side effect of an import."""
    out = subprocess.run(
        [sys.executable, "-c", _IMPORTS], capture_output=True, text=True, check=True
    )
    assert out.stdout.strip() == "False"
