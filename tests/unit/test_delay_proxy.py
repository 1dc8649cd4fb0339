"""The benchmarks' link-delay proxy (bench/delay_proxy.py): its scheduling rule as a pure function,
then the forwarding on memory streams and on real loopback sockets, all on trio's mock clock (the
times asserted are the mock clock's, never wall time)."""

from __future__ import annotations

import functools
import random
import socket

import pytest
import trio
import trio.testing

from bench.delay_proxy import Schedule, delay_proxy, delivery_time, schedules, splice

RTT_MS = 50.0
DELAY = RTT_MS / 2000


# -- the rule ----------------------------------------------------------------------------------


def test_delivery_time_is_the_delay_after_receipt_unless_the_chunk_before_is_later() -> None:
    assert delivery_time(1.0, float("-inf"), 0.025, 0.0) == 1.025
    assert delivery_time(1.0, 0.9, 0.025, 0.010) == pytest.approx(1.035)
    # the chunk before is delivered later (it drew more jitter): this one waits for it
    assert delivery_time(1.0, 1.2, 0.025, 0.0) == 1.2


def test_jitter_never_reorders_and_stays_within_its_bounds() -> None:
    rng = random.Random(7)
    schedule = Schedule(delay=0.025, jitter=0.040, rng=random.Random(8))
    received, previous = 0.0, float("-inf")
    for _ in range(2000):
        received += rng.choice((0.0, 0.0001, 0.003, 0.05))  # bursts and gaps
        at = schedule.next(received)
        assert at >= previous
        assert at >= received + 0.025
        assert at <= max(previous, received + 0.025 + 0.040)
        previous = at


def test_without_jitter_every_chunk_takes_exactly_the_delay() -> None:
    schedule = Schedule(delay=0.01)
    assert [schedule.next(t) for t in (0.0, 0.0, 0.5, 0.5001)] == pytest.approx(
        [0.01, 0.01, 0.51, 0.5101]
    )


# -- forwarding on memory streams ---------------------------------------------------------------


class Link:
    """client <-> [splice] <-> upstream, on memory streams."""

    def __init__(self) -> None:
        self.client, self.client_side = trio.testing.memory_stream_pair()
        self.upstream_side, self.upstream = trio.testing.memory_stream_pair()


async def _collect(
    stream: trio.abc.ReceiveStream, got: list[tuple[float, bytes]], done: trio.Event
) -> None:
    """Record (arrival time, bytes) until EOF (recorded as b"")."""
    while True:
        data = await stream.receive_some(65536)
        got.append((trio.current_time(), data))
        if not data:
            done.set()
            return


async def _send_chunks(
    stream: trio.abc.SendStream, chunks: list[tuple[float, bytes]], sent: list[tuple[float, int]]
) -> None:
    """Send each chunk after its pause; record (send time, offset just past it)."""
    offset = 0
    for pause, data in chunks:
        await trio.sleep(pause)
        await stream.send_all(data)
        offset += len(data)
        sent.append((trio.current_time(), offset))


def _check_arrivals(
    sent: list[tuple[float, int]], got: list[tuple[float, bytes]], delay: float
) -> None:
    """Every byte arrived no earlier than its chunk's send time + ``delay``. ``sent`` holds (send
    time, offset just past the chunk); a received piece may hold parts of several chunks."""
    starts = [0] + [e for _, e in sent[:-1]]
    spans = [(t, start, end) for (t, end), start in zip(sent, starts, strict=True)]
    end = 0
    for arrived, data in got:
        start, end = end, end + len(data)
        for sent_at, c_start, c_end in spans:
            if c_start < end and c_end > start:
                assert arrived >= sent_at + delay - 1e-9, (arrived, sent_at)


def _chunks(seed: int, n: int) -> list[tuple[float, bytes]]:
    rng = random.Random(seed)
    out = []
    for i in range(n):
        pause = rng.choice((0.0, 0.0, 0.001, 0.02, 0.3))
        out.append((pause, bytes([i % 256]) * rng.randint(1, 5000)))
    return out


@pytest.mark.parametrize("jitter_ms", [0.0, 80.0])
async def test_bytes_arrive_complete_in_order_and_no_earlier_than_scheduled(
    autojump_clock: trio.testing.MockClock, jitter_ms: float
) -> None:
    link = Link()
    chunks = _chunks(1, 200)
    sent: list[tuple[float, int]] = []
    got: list[tuple[float, bytes]] = []
    done = trio.Event()
    with trio.fail_after(60):
        async with trio.open_nursery() as nursery:
            nursery.start_soon(
                splice,
                link.client_side,
                link.upstream_side,
                *schedules(RTT_MS, jitter_ms, random.Random(3)),
            )
            nursery.start_soon(_collect, link.upstream, got, done)
            await _send_chunks(link.client, chunks, sent)
            await link.client.send_eof()
            await done.wait()
            nursery.cancel_scope.cancel()
    assert b"".join(d for _, d in got) == b"".join(d for _, d in chunks)
    assert got[-1][1] == b""
    _check_arrivals(sent, got[:-1], DELAY)


async def test_each_chunk_is_delivered_at_its_scheduled_time(
    autojump_clock: trio.testing.MockClock,
) -> None:
    """Without jitter, each chunk arrives exactly RTT/2 after it was sent (the proxy adds nothing
    of its own on the mock clock), however close together the chunks went."""
    link = Link()
    got: list[tuple[float, bytes]] = []
    done = trio.Event()
    async with trio.open_nursery() as nursery:
        nursery.start_soon(splice, link.client_side, link.upstream_side, *schedules(RTT_MS))
        nursery.start_soon(_collect, link.upstream, got, done)
        t0 = trio.current_time()
        await link.client.send_all(b"a")
        await trio.sleep(0.010)
        await link.client.send_all(b"b")
        await trio.sleep(0.100)
        await link.client.send_all(b"c")
        await link.client.send_eof()
        await done.wait()
        nursery.cancel_scope.cancel()
    assert [(round(t - t0, 9), d) for t, d in got] == [
        (DELAY, b"a"),
        (0.010 + DELAY, b"b"),
        (0.110 + DELAY, b"c"),
        (0.110 + DELAY, b""),
    ]


async def test_eof_is_passed_on_after_the_data_and_the_other_way_stays_open(
    autojump_clock: trio.testing.MockClock,
) -> None:
    """A half-close: the client's EOF reaches the upstream after the client's data; the upstream
    can still answer, and the client gets the answer, then the upstream's EOF."""
    link = Link()
    async with trio.open_nursery() as nursery:
        nursery.start_soon(splice, link.client_side, link.upstream_side, *schedules(RTT_MS, 30.0))
        await link.client.send_all(b"request")
        await link.client.send_eof()
        got = b""
        while data := await link.upstream.receive_some(100):
            got += data
        assert got == b"request"
        await link.upstream.send_all(b"answer after your EOF")
        await link.upstream.send_eof()
        got = b""
        while data := await link.client.receive_some(100):
            got += data
        assert got == b"answer after your EOF"
        nursery.cancel_scope.cancel()


class _Greatest(random.Random):
    """A "jitter" that always draws its maximum."""

    def uniform(self, a: float, b: float) -> float:
        return b


async def test_the_two_directions_are_independent(
    autojump_clock: trio.testing.MockClock,
) -> None:
    """A chunk held back by jitter in one direction holds back nothing in the other."""
    link = Link()
    up: list[tuple[float, bytes]] = []
    down: list[tuple[float, bytes]] = []
    up_done, down_done = trio.Event(), trio.Event()
    slow = Schedule(DELAY, jitter=0.5, rng=_Greatest())
    async with trio.open_nursery() as nursery:
        nursery.start_soon(splice, link.client_side, link.upstream_side, slow, Schedule(DELAY))
        nursery.start_soon(_collect, link.upstream, up, up_done)
        nursery.start_soon(_collect, link.client, down, down_done)
        t0 = trio.current_time()
        await link.client.send_all(b"slow")
        await link.upstream.send_all(b"fast")
        await link.client.send_eof()
        await link.upstream.send_eof()
        await up_done.wait()
        await down_done.wait()
        nursery.cancel_scope.cancel()
    assert [(round(t - t0, 9), d) for t, d in down] == [(DELAY, b"fast"), (DELAY, b"")]
    assert [(round(t - t0, 9), d) for t, d in up] == [(DELAY + 0.5, b"slow"), (DELAY + 0.5, b"")]


# -- the proxy on real loopback sockets ---------------------------------------------------------


async def _echo(stream: trio.SocketStream) -> None:
    """Echo until EOF, then half-close back."""
    async with stream:
        while data := await stream.receive_some(65536):
            await stream.send_all(data)
        await stream.send_eof()


async def test_proxy_round_trip_takes_the_rtt_and_closes_cleanly(
    autojump_clock: trio.testing.MockClock,
) -> None:
    async with trio.open_nursery() as nursery:
        listeners = await nursery.start(
            functools.partial(trio.serve_tcp, _echo, 0, host="127.0.0.1")
        )
        upstream = listeners[0].socket.getsockname()[1]
        async with delay_proxy(upstream, rtt_ms=RTT_MS, jitter_ms=0) as port:
            with trio.fail_after(10):
                client = await trio.open_tcp_stream("127.0.0.1", port)
                assert client.getsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY)
                async with client:
                    for payload in (b"x", b"y" * 200_000):
                        t0 = trio.current_time()
                        await client.send_all(payload)
                        got = b""
                        while len(got) < len(payload):
                            got += await client.receive_some(65536)
                        assert got == payload
                        assert (
                            trio.current_time() - t0 >= RTT_MS / 1000 - 1e-9
                        )  # float steps of the mock clock
                    t0 = trio.current_time()
                    await client.send_eof()
                    assert await client.receive_some(10) == b""  # the echo's EOF, passed back
                    assert (
                        trio.current_time() - t0 >= RTT_MS / 1000 - 1e-9
                    )  # float steps of the mock clock
        nursery.cancel_scope.cancel()


async def test_a_refused_upstream_closes_the_client(
    autojump_clock: trio.testing.MockClock,
) -> None:
    probe = socket.socket()
    probe.bind(("127.0.0.1", 0))
    closed_port = probe.getsockname()[1]
    probe.close()  # nothing listens there now
    async with delay_proxy(closed_port, rtt_ms=RTT_MS) as port:
        with trio.fail_after(10):
            async with await trio.open_tcp_stream("127.0.0.1", port) as client:
                try:
                    assert await client.receive_some(10) == b""
                except trio.BrokenResourceError:
                    pass  # closed with a reset: as good
