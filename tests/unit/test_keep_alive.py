"""A relay notices a peer gone without a word by TCP keepalive (``relay.server.keep_alive``), not
by WebSocket pings of its own."""

from __future__ import annotations

import socket
import sys
from types import SimpleNamespace
from typing import Any, cast

import pytest
import trio

from relay.config import RelayConfig
from relay.server import keep_alive


@pytest.mark.skipif(sys.platform != "linux", reason="the option names are Linux's")
async def test_an_accepted_connection_is_probed_after_the_ping_interval() -> None:
    listeners = await trio.open_tcp_listeners(0, host="127.0.0.1")
    port = listeners[0].socket.getsockname()[1]
    async with await trio.open_tcp_stream("127.0.0.1", port) as client:
        accepted = await listeners[0].accept()
        assert accepted.getsockopt(socket.SOL_SOCKET, socket.SO_KEEPALIVE) == 0
        keep_alive(
            cast(Any, SimpleNamespace(stream=accepted)),
            RelayConfig(ping_interval=20, ping_timeout=9),
        )
        assert accepted.getsockopt(socket.SOL_SOCKET, socket.SO_KEEPALIVE) == 1
        # silent for 20 s: probed every 3 s, dropped after 3 unanswered (9 s)
        assert accepted.getsockopt(socket.IPPROTO_TCP, socket.TCP_KEEPIDLE) == 20
        assert accepted.getsockopt(socket.IPPROTO_TCP, socket.TCP_KEEPINTVL) == 3
        assert accepted.getsockopt(socket.IPPROTO_TCP, socket.TCP_KEEPCNT) == 3
        await accepted.aclose()
        await client.aclose()
    for listener in listeners:
        await listener.aclose()
