"""A TCP proxy for fault injection: cut, reset and stall the links it carries.

Each accepted connection is paired with a fresh connection to the target; two pump tasks move bytes,
one per direction. ``stall()`` closes a gate the pumps pass before every read, so bytes wait in the
kernel's buffers (nothing is lost or reordered) until ``resume()``. ``cut()`` closes both sockets of
every pair (FIN); ``reset()`` aborts them with RST (``SO_LINGER`` 0). ``refuse(True)`` closes new
connections at once, like a service that is down.
"""

from __future__ import annotations

import socket
import struct
from collections import Counter
from dataclasses import dataclass, field

import trio

__all__ = ["FaultProxy"]


@dataclass(eq=False)
class _Pair:
    client: trio.SocketStream
    upstream: trio.SocketStream
    scope: trio.CancelScope = field(default_factory=trio.CancelScope)


class FaultProxy:
    """A TCP proxy on 127.0.0.1 that forwards to (host, port) and can cut, stall and reset links."""

    def __init__(self, target_host: str, target_port: int) -> None:
        self.target = (target_host, target_port)
        self.port = 0
        self.accepted = 0
        self.faults: Counter[str] = Counter()
        self._pairs: set[_Pair] = set()
        self._open_gate = trio.Event()
        self._open_gate.set()
        self._refusing = False
        self._changed = trio.Event()

    def __repr__(self) -> str:
        return f"<FaultProxy :{self.port} -> {self.target} pairs={len(self._pairs)}>"

    def url_for(self, scheme: str = "ws") -> str:
        return f"{scheme}://127.0.0.1:{self.port}"

    @property
    def connections(self) -> int:
        return len(self._pairs)

    async def run(self, *, task_status: trio.TaskStatus[int] = trio.TASK_STATUS_IGNORED) -> None:
        listeners = await trio.open_tcp_listeners(0, host="127.0.0.1")
        self.port = listeners[0].socket.getsockname()[1]
        async with trio.open_nursery() as nursery:
            await nursery.start(trio.serve_listeners, self._handle, listeners)
            task_status.started(self.port)

    def retarget(self, host: str, port: int) -> None:
        self.target = (host, port)

    def stall(self) -> None:
        if self._open_gate.is_set():
            self._open_gate = trio.Event()
            self.faults["stall"] += 1

    def resume(self) -> None:
        self._open_gate.set()

    def refuse(self, on: bool) -> None:
        self._refusing = on

    async def cut(self) -> int:
        pairs = list(self._pairs)
        for pair in pairs:
            pair.scope.cancel()
            await _close(pair.client)
            await _close(pair.upstream)
        self.faults["cut"] += bool(pairs)
        return len(pairs)

    async def reset(self) -> int:
        pairs = list(self._pairs)
        for pair in pairs:
            for stream in (pair.client, pair.upstream):
                try:
                    stream.socket.setsockopt(
                        socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0)
                    )
                except OSError:
                    pass
            pair.scope.cancel()
            await _close(pair.client)
            await _close(pair.upstream)
        self.faults["reset"] += bool(pairs)
        return len(pairs)

    async def wait_connections(self, n: int) -> None:
        while len(self._pairs) < n:
            await self._changed.wait()

    def _notify(self) -> None:
        self._changed.set()
        self._changed = trio.Event()

    async def _handle(self, client: trio.SocketStream) -> None:
        self.accepted += 1
        if self._refusing:
            self.faults["refused"] += 1
            await _close(client)
            return
        try:
            upstream = await trio.open_tcp_stream(*self.target)
        except OSError:
            await _close(client)
            return
        pair = _Pair(client, upstream)
        self._pairs.add(pair)
        self._notify()
        try:
            with pair.scope:
                async with trio.open_nursery() as nursery:
                    nursery.start_soon(self._pump, client, upstream, nursery.cancel_scope)
                    nursery.start_soon(self._pump, upstream, client, nursery.cancel_scope)
        finally:
            self._pairs.discard(pair)
            self._notify()
            with trio.CancelScope(shield=True):
                await _close(client)
                await _close(upstream)

    async def _pump(
        self, source: trio.SocketStream, sink: trio.SocketStream, done: trio.CancelScope
    ) -> None:
        try:
            while True:
                await self._open_gate.wait()
                data = await source.receive_some(65536)
                if not data:
                    break
                await self._open_gate.wait()
                await sink.send_all(data)
        except (trio.BrokenResourceError, trio.ClosedResourceError, OSError):
            pass
        done.cancel()


async def _close(stream: trio.SocketStream) -> None:
    try:
        await stream.aclose()
    except (trio.BrokenResourceError, trio.ClosedResourceError, OSError):
        pass
