"""Every listener tether opens on a port the user chose (the adapter's, the relay's and its web
view's, `tether port-forward`'s) serves on a port the last session left in TIME-WAIT, and a port a
live listener holds is still refused (real sockets on loopback, a real Redis)."""

from __future__ import annotations

import socket
from pathlib import Path

import pytest
import trio

from adapter.cli.runs import _port_free
from adapter.cli.tunnel import listen_local
from relay.server import serve_relay, server_port
from relay.store import Store

pytestmark = pytest.mark.timeout(60)


def time_wait_port() -> int:
    """A port left in TIME-WAIT by a connection its listening side closed first (as an adapter
    does when its run ends while the IDE is still connected)."""
    with socket.create_server(("127.0.0.1", 0)) as server:
        port = int(server.getsockname()[1])
        client = socket.create_connection(("127.0.0.1", port))
        accepted, _ = server.accept()
    accepted.close()
    with client:
        assert client.recv(1) == b""  # the FIN: the closing side goes to TIME-WAIT
    assert "06" in _states(port), "no TIME-WAIT on the port"
    return port


def _states(port: int) -> set[str]:
    rows = Path("/proc/net/tcp").read_text().splitlines()[1:]
    return {c[3] for c in (r.split() for r in rows) if int(c[1].rsplit(":", 1)[1], 16) == port}


def test_the_adapter_port_in_time_wait_is_free_and_a_live_one_is_refused() -> None:
    port = time_wait_port()
    _port_free(port)  # tether debug / attach --port PORT: serves at once
    with socket.create_server(("127.0.0.1", port)), pytest.raises(SystemExit) as refused:
        _port_free(port)
    assert f"127.0.0.1:{port} is in use" in str(refused.value)


async def test_port_forward_listens_on_a_port_in_time_wait_and_refuses_a_live_one() -> None:
    port = time_wait_port()
    listeners = await listen_local(port)
    try:
        assert listeners[0].socket.getsockname()[1] == port
        with pytest.raises(SystemExit, match=rf"cannot listen on 127\.0\.0\.1:{port}: Address"):
            await listen_local(port)  # held by a live listener: ours
    finally:
        for listener in listeners:
            await listener.aclose()


@pytest.mark.redis
async def test_the_relay_serves_on_a_port_in_time_wait_and_refuses_a_live_one(
    redis_store: Store,
) -> None:
    port = time_wait_port()
    async with trio.open_nursery() as nursery:
        server = await nursery.start(
            lambda task_status: serve_relay(redis_store, port=port, task_status=task_status)
        )
        assert server_port(server) == port  # tether up --relay-port / tether relay --port
        with pytest.raises(OSError, match="in use"):
            await trio.open_tcp_listeners(port, host="127.0.0.1")  # a second relay: refused
        nursery.cancel_scope.cancel()
