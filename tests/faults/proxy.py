"""A TCP proxy for fault injection: cut, reset and stall the links it carries.

Each accepted connection is paired with a fresh connection to the target; two pump tasks move bytes,
one per direction (``up``: client to target, ``down``: back). ``stall()`` closes a gate each
pump passes with every chunk it read, before sending it on, so the chunk waits in the proxy and
what follows in the kernel's buffers (nothing is lost or reordered) until ``resume()``;
``stall("up")`` or ``stall("down")`` holds one direction only, and
:meth:`FaultProxy.wait_held` waits until a chunk read in it waits at its gate. ``on_pass(direction, chunk)``, if set, is called with each chunk that passed its gate,
before it is sent on: a test stalls a direction at an exact point of a conversation (the reply
after the handshake, say), in place before the peer can have read that chunk, let alone answered
it. ``cut()`` closes both sockets of every pair (FIN); ``reset()``
aborts them with RST (``SO_LINGER`` 0). ``refuse(True)`` closes new connections at once, like a
service that is down.
"""

from __future__ import annotations

import socket
import struct
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Literal

import trio

__all__ = ["Direction", "FaultProxy"]

#: ``up``: from the client to the target; ``down``: back
Direction = Literal["up", "down"]


@dataclass(eq=False)
class _Pair:
    client: trio.SocketStream
    upstream: trio.SocketStream
    scope: trio.CancelScope = field(default_factory=trio.CancelScope)


class FaultProxy:
    """A TCP proxy on 127.0.0.1 (or ``listen``) that forwards to (host, port) and can cut, stall and reset links."""

    def __init__(self, target_host: str, target_port: int, *, listen: str = "127.0.0.1") -> None:
        self.target = (target_host, target_port)
        #: the address it listens on (another namespace's nodes reach the relay on a bridge's)
        self.listen = listen
        self.port = 0
        self.accepted = 0
        self.faults: Counter[str] = Counter()
        self._pairs: set[_Pair] = set()
        self._gates: dict[Direction, trio.Event] = {"up": trio.Event(), "down": trio.Event()}
        for gate in self._gates.values():
            gate.set()
        #: chunks read and waiting at a closed gate, per direction
        self.held: Counter[Direction] = Counter()
        #: called with each chunk that passed its gate, before it is sent on
        self.on_pass: Callable[[Direction, bytes], None] | None = None
        self._refusing = False
        self._changed = trio.Event()

    def __repr__(self) -> str:
        return f"<FaultProxy :{self.port} -> {self.target} pairs={len(self._pairs)}>"

    def url_for(self, scheme: str = "ws") -> str:
        return f"{scheme}://{self.listen}:{self.port}"

    @property
    def connections(self) -> int:
        return len(self._pairs)

    async def run(self, *, task_status: trio.TaskStatus[int] = trio.TASK_STATUS_IGNORED) -> None:
        listeners = await trio.open_tcp_listeners(0, host=self.listen)
        self.port = listeners[0].socket.getsockname()[1]
        async with trio.open_nursery() as nursery:
            await nursery.start(trio.serve_listeners, self._handle, listeners)
            task_status.started(self.port)

    def retarget(self, host: str, port: int) -> None:
        self.target = (host, port)

    def stall(self, direction: Direction | Literal["both"] = "both") -> None:
        stalled = False
        for name in ("up", "down") if direction == "both" else (direction,):
            if self._gates[name].is_set():
                self._gates[name] = trio.Event()
                stalled = True
        self.faults["stall"] += stalled

    def resume(self) -> None:
        for gate in self._gates.values():
            gate.set()

    async def wait_refused(self, n: int) -> None:
        """Until ``n`` connections were refused (``refuse(True)``) in all."""
        while self.faults["refused"] < n:
            await self._changed.wait()

    async def wait_held(self, direction: Direction) -> None:
        """Until a chunk read in ``direction`` waits at its closed gate."""
        while not self.held[direction]:
            await self._changed.wait()

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
            self._notify()
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
                    nursery.start_soon(self._pump, client, upstream, "up", nursery.cancel_scope)
                    nursery.start_soon(self._pump, upstream, client, "down", nursery.cancel_scope)
        finally:
            self._pairs.discard(pair)
            self._notify()
            with trio.CancelScope(shield=True):
                await _close(client)
                await _close(upstream)

    async def _pump(
        self,
        source: trio.SocketStream,
        sink: trio.SocketStream,
        direction: Direction,
        done: trio.CancelScope,
    ) -> None:
        try:
            while True:
                data = await source.receive_some(65536)
                if not data:
                    break
                await self._hold(direction)
                if self.on_pass is not None:  # before the peer can answer it: no race
                    self.on_pass(direction, data)
                await sink.send_all(data)
        except (trio.BrokenResourceError, trio.ClosedResourceError, OSError):
            pass
        done.cancel()

    async def _hold(self, direction: Direction) -> None:
        """Wait at ``direction``'s gate with a chunk in hand (counted in :attr:`held`)."""
        gate = self._gates[direction]
        if gate.is_set():
            return
        self.held[direction] += 1
        self._notify()
        try:
            await gate.wait()
        finally:
            self.held[direction] -= 1


async def _close(stream: trio.SocketStream) -> None:
    try:
        await stream.aclose()
    except (trio.BrokenResourceError, trio.ClosedResourceError, OSError):
        pass
