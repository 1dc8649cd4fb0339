"""A link-delay proxy: a TCP hop on 127.0.0.1 that holds every chunk for a one-way delay.

It stands for a slow link (a laptop far from the relay, an SSH tunnel to a GPU node) in the
benchmarks: ``async with delay_proxy(upstream_port, rtt_ms=50) as port:`` and connect to ``port``
instead of ``upstream_port``. It is byte-level, so DAP and WebSocket traffic pass unchanged.

Theory of operation. Each accepted connection opens one to the upstream, and each direction is a
pair of tasks: a reader stamps every chunk it receives with its delivery time and queues it; a
writer sleeps until that time and sends it. The delivery time (:class:`Schedule`, no I/O) is
``max(previous delivery in this direction, received + RTT/2 + U(0, jitter))``: the delay is one
way, jitter never reorders bytes, and the two directions are independent. End of file is a chunk
like any other, so it is passed on (``send_eof``, a half-close) after the data before it; the
connection closes once both directions ended, or at once, both ways, when either side breaks.

What it models: latency only. No bandwidth cap, no loss; opening the connection itself costs
nothing (only the data is delayed). Both sockets have ``TCP_NODELAY`` (trio's ``SocketStream``
sets it; set again here so no reader has to know that), so the proxy adds no Nagle stall of its
own. Backpressure: each direction queues at most :data:`QUEUED_CHUNKS` chunks; beyond that the
reader stops reading and TCP pushes back on the sender.
"""

from __future__ import annotations

import random
import socket
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from dataclasses import dataclass, field

import trio

__all__ = [
    "QUEUED_CHUNKS",
    "Schedule",
    "delay_proxy",
    "delivery_time",
    "schedules",
    "splice",
]

#: chunks in flight per direction before the proxy stops reading (at most 64 KiB each)
QUEUED_CHUNKS = 1024
_CHUNK = 65536


def delivery_time(received: float, previous: float, delay: float, jitter: float) -> float:
    """When a chunk received at ``received`` is delivered: ``delay + jitter`` later, but never
    before the chunk before it in the same direction (``previous``), so bytes keep their order."""
    return max(previous, received + delay + jitter)


@dataclass
class Schedule:
    """The delivery times of one direction (seconds, on whatever clock the caller reads).

    ``delay`` is the one-way delay (RTT/2); each chunk adds a jitter drawn uniformly from
    ``[0, jitter]`` with ``rng``."""

    delay: float
    jitter: float = 0.0
    rng: random.Random = field(default_factory=random.Random)
    previous: float = float("-inf")

    def next(self, received: float) -> float:
        extra = self.rng.uniform(0.0, self.jitter) if self.jitter > 0 else 0.0
        self.previous = delivery_time(received, self.previous, self.delay, extra)
        return self.previous


async def _forward(
    source: trio.abc.ReceiveStream, sink: trio.abc.HalfCloseableStream, schedule: Schedule
) -> None:
    """Copy ``source`` to ``sink``, each chunk at its scheduled time, then pass the EOF on."""
    send, receive = trio.open_memory_channel[tuple[float, bytes]](QUEUED_CHUNKS)

    async def read() -> None:
        async with send:
            while True:
                data = await source.receive_some(_CHUNK)
                await send.send((schedule.next(trio.current_time()), data))
                if not data:  # EOF: queued like data, so it goes after the bytes before it
                    return

    async def write() -> None:
        async with receive:
            async for at, data in receive:
                await trio.sleep_until(at)
                if data:
                    await sink.send_all(data)
                else:
                    await sink.send_eof()
                    return

    async with trio.open_nursery() as nursery:
        nursery.start_soon(read)
        nursery.start_soon(write)


async def splice(
    a: trio.abc.HalfCloseableStream,
    b: trio.abc.HalfCloseableStream,
    a_to_b: Schedule,
    b_to_a: Schedule,
) -> None:
    """Forward ``a`` <-> ``b``, each direction on its own schedule, until both directions passed
    their EOF on; closes both streams on the way out. A broken stream ends both directions (the
    error propagates); a cancel leaves both closed."""
    try:
        async with trio.open_nursery() as nursery:
            nursery.start_soon(_forward, a, b, a_to_b)
            nursery.start_soon(_forward, b, a, b_to_a)
    finally:
        with trio.CancelScope(shield=True):
            await trio.aclose_forcefully(a)
            await trio.aclose_forcefully(b)


def schedules(
    rtt_ms: float, jitter_ms: float = 0.0, rng: random.Random | None = None
) -> tuple[Schedule, Schedule]:
    """One :class:`Schedule` per direction: RTT/2 each way, jitter drawn independently."""
    rng = rng or random.Random()
    delay, jitter = rtt_ms / 2000, jitter_ms / 1000
    return (
        Schedule(delay, jitter, random.Random(rng.random())),
        Schedule(delay, jitter, random.Random(rng.random())),
    )


def _nodelay(stream: trio.SocketStream) -> None:
    stream.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, True)


@asynccontextmanager
async def delay_proxy(
    upstream_port: int,
    *,
    rtt_ms: float = 50.0,
    jitter_ms: float = 0.0,
    upstream_host: str = "127.0.0.1",
    seed: int | None = None,
) -> AsyncIterator[int]:
    """Listen on 127.0.0.1 (a free port, yielded) and forward each connection to
    ``upstream_host:upstream_port`` through :func:`splice`. Leaving the block closes the listener
    and every connection. A connection whose upstream refuses is closed at once (logged nowhere:
    the client sees the close, as it would the refusal)."""
    rng = random.Random(seed)

    async def handle(client: trio.SocketStream) -> None:
        try:
            upstream = await trio.open_tcp_stream(upstream_host, upstream_port)
        except OSError:
            await trio.aclose_forcefully(client)
            return
        _nodelay(client)
        _nodelay(upstream)
        try:
            await splice(client, upstream, *schedules(rtt_ms, jitter_ms, rng))
        except* (trio.BrokenResourceError, trio.ClosedResourceError):
            pass  # one side went away: both are closed now, which is what the other side sees

    listeners = await trio.open_tcp_listeners(0, host="127.0.0.1")
    port = listeners[0].socket.getsockname()[1]
    async with trio.open_nursery() as nursery:
        nursery.start_soon(trio.serve_listeners, handle, listeners)
        try:
            yield port
        finally:
            nursery.cancel_scope.cancel()
