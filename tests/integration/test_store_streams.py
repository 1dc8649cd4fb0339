"""The storage seam's conformance suite, part one: streams (reads after a cursor, ``maxlen``),
blocking reads and consumer groups.

The ``store`` fixture (tests/conftest.py) runs each test on the fake (``memory``) and on each
real server (``bundled`` valkey always, ``system`` redis-server when installed); real-server
cases carry the ``redis`` marker.
The other parts: ``test_store_appends.py`` (exactly-once appends, notices) and
``test_store_keys.py`` (hashes, strings, sets, sorted sets, expiry).
"""

from __future__ import annotations

import pytest
import trio
import trio.testing

from relay.store import BlockingReader, Entry, MemoryStore, Store, StoreError


def _id(entry_id: str) -> tuple[int, int]:
    ms, _, seq = entry_id.partition("-")
    return int(ms), int(seq)


# --- streams --------------------------------------------------------------------------------------


async def test_read_after_is_exclusive_and_in_order(store: Store) -> None:
    ids = [await store.append("s", b"%d" % i) for i in range(3)]
    assert [_id(i) for i in ids] == sorted({_id(i) for i in ids})  # strictly increasing
    assert await store.read_after("s", "0") == list(zip(ids, [b"0", b"1", b"2"], strict=True))
    assert await store.read_after("s", ids[0]) == [(ids[1], b"1"), (ids[2], b"2")]
    assert await store.read_after("s", ids[2]) == []
    assert await store.read_after("s", "0", count=2) == [(ids[0], b"0"), (ids[1], b"1")]
    assert await store.read_after("missing", "0") == []


async def test_read_after_pages_through_a_long_stream(store: Store) -> None:
    written = [(await store.append("s", b"%d" % i), b"%d" % i) for i in range(300)]
    got: list[Entry] = []
    cursor = "0"
    while page := await store.read_after("s", cursor, count=128):
        assert len(page) <= 128
        got += page
        cursor = page[-1][0]
    assert got == written


async def test_last_id(store: Store) -> None:
    assert await store.last_id("s") is None
    await store.append("s", b"a")
    last = await store.append("s", b"b")
    assert await store.last_id("s") == last


async def test_read_last_is_the_tail_oldest_first(store: Store) -> None:
    assert await store.read_last("s", 3) == []
    ids = [await store.append("s", bytes([i])) for i in range(5)]
    assert await store.read_last("s", 2) == [(ids[3], b"\x03"), (ids[4], b"\x04")]
    assert [i for i, _ in await store.read_last("s", 10)] == ids
    assert await store.read_last("s", 0) == []


async def test_payloads_are_kept_byte_for_byte(store: Store) -> None:
    payloads = [bytes(range(256)) * 4, b"", b"\x00", "é".encode()]
    ids = [await store.append("s", p) for p in payloads]
    assert await store.read_after("s", "0") == list(zip(ids, payloads, strict=True))


async def test_an_invalid_cursor_is_refused(store: Store) -> None:
    await store.append("s", b"x")
    with pytest.raises(StoreError, match=r"(?i)invalid stream id"):
        await store.read_after("s", "not-an-id")
    with pytest.raises(ValueError, match="count"):
        await store.read_after("s", "0", count=0)


async def test_maxlen_keeps_the_newest_entries_exactly(store: Store) -> None:
    ids = [await store.append("s", b"%d" % i, maxlen=3) for i in range(10)]
    assert await store.read_after("s", "0") == [(ids[7], b"7"), (ids[8], b"8"), (ids[9], b"9")]
    assert await store.last_id("s") == ids[9]
    after = await store.append("s", b"10")  # ids keep growing past trimmed entries
    assert _id(after) > _id(ids[9])
    await store.append("s", b"11", maxlen=1)
    assert [p for _, p in await store.read_after("s", "0")] == [b"11"]


# --- blocking reads -------------------------------------------------------------------------------


async def test_blocking_read_returns_at_once_when_entries_exist(store: Store) -> None:
    first = await store.append("s", b"one")
    async with store.blocking_reader() as reader:
        with trio.fail_after(5):
            assert await reader.read("s", "0", block_ms=10_000) == [(first, b"one")]
            assert await reader.read("s", "0", block_ms=10_000, count=1) == [(first, b"one")]


async def test_blocking_read_wakes_on_append_from_another_task(store: Store) -> None:
    got: list[Entry] = []

    async def wait(reader: BlockingReader) -> None:
        got.extend(await reader.read("s", "0", block_ms=20_000))

    async with store.blocking_reader() as reader:
        with trio.fail_after(10):  # far below block_ms: woken by the append, not by the timeout
            async with trio.open_nursery() as nursery:
                nursery.start_soon(wait, reader)
                await trio.testing.wait_all_tasks_blocked()
                assert got == []
                entry = await store.append("s", b"late")
    assert got == [(entry, b"late")]


async def test_blocking_read_times_out_empty(store: Store) -> None:
    await store.append("s", b"old")
    last = await store.last_id("s")
    assert last is not None
    async with store.blocking_reader() as reader:
        with trio.fail_after(10):
            assert await reader.read("s", last, block_ms=50) == []
            assert await reader.read("missing", "0", block_ms=50) == []


async def test_readers_block_independently_of_each_other_and_of_the_store(store: Store) -> None:
    """Each reader has its own connection: a pending block stalls neither the store nor another."""
    got: dict[str, list[Entry]] = {}

    async def wait(name: str, reader: BlockingReader) -> None:
        got[name] = await reader.read("s", "0", block_ms=20_000)

    async with store.blocking_reader() as r1, store.blocking_reader() as r2:
        with trio.fail_after(10):
            async with trio.open_nursery() as nursery:
                nursery.start_soon(wait, "r1", r1)
                nursery.start_soon(wait, "r2", r2)
                await trio.testing.wait_all_tasks_blocked()
                assert await store.last_id("s") is None
                entry = await store.append("s", b"both")
    assert got == {"r1": [(entry, b"both")], "r2": [(entry, b"both")]}


async def test_a_cancelled_blocking_read_leaves_reader_and_store_usable(store: Store) -> None:
    async with store.blocking_reader() as reader:
        async with trio.open_nursery() as nursery:
            cancelled = trio.Event()

            async def wait_forever() -> None:
                try:
                    await reader.read("s", "0", block_ms=0)
                except trio.Cancelled:
                    cancelled.set()
                    raise

            nursery.start_soon(wait_forever)
            await trio.testing.wait_all_tasks_blocked()
            nursery.cancel_scope.cancel()
        assert cancelled.is_set()
        with trio.fail_after(10):
            # glide: the cancelled XREAD BLOCK 0 would still occupy the reader's connection
            assert await reader.read("s", "0", block_ms=50) == []
            entry = await store.append("s", b"after")
            assert await store.read_after("s", "0") == [(entry, b"after")]
            assert await reader.read("s", "0", block_ms=5000) == [(entry, b"after")]
            assert await reader.read("s", entry, block_ms=50) == []


async def test_the_fake_blocks_on_trio_time(autojump_clock: trio.testing.MockClock) -> None:
    """Unit tests of relay logic can run the fake under a MockClock: blocks cost no real time."""
    store = MemoryStore()
    start = trio.current_time()
    async with store.blocking_reader() as reader:
        assert await reader.read("s", "0", block_ms=60_000) == []
        await store.ensure_group("q", "pool")
        assert await reader.read_group("q", "pool", "w1", block_ms=30_000) is None
    assert trio.current_time() - start == pytest.approx(90)


async def test_a_closed_reader_refuses_reads(store: Store) -> None:
    async with store.blocking_reader() as reader:
        pass
    with pytest.raises(StoreError, match="closed"):
        await reader.read("s", "0", block_ms=10)


async def test_block_ms_must_not_be_negative(store: Store) -> None:
    async with store.blocking_reader() as reader:
        with pytest.raises(ValueError, match="block_ms"):
            await reader.read("s", "0", block_ms=-1)


# --- consumer groups ------------------------------------------------------------------------------


async def test_a_group_delivers_each_entry_to_one_consumer(store: Store) -> None:
    await store.ensure_group("q", "pool")
    a = await store.append("q", b"run-a")
    b = await store.append("q", b"run-b")
    c = await store.append("q", b"run-c")
    async with store.blocking_reader() as reader:
        assert await reader.read_group("q", "pool", "w1", block_ms=1000) == (a, b"run-a")
        await store.ensure_group("q", "pool")  # idempotent: does not rewind the group
        assert await reader.read_group("q", "pool", "w2", block_ms=1000) == (b, b"run-b")
        assert await reader.read_group("q", "pool", "w1", block_ms=1000) == (c, b"run-c")
        assert await reader.read_group("q", "pool", "w2", block_ms=50) is None
    assert await store.pending("q", "pool") == [(a, "w1"), (b, "w2"), (c, "w1")]
    await store.ack("q", "pool", b)
    await store.ack("q", "pool", b)  # acknowledging twice is harmless
    assert await store.pending("q", "pool") == [(a, "w1"), (c, "w1")]
    assert await store.pending("q", "pool", count=1) == [(a, "w1")]
    # an acknowledged or pending entry is never delivered again to the group
    async with store.blocking_reader() as reader:
        assert await reader.read_group("q", "pool", "w3", block_ms=50) is None


async def test_a_new_group_starts_at_the_beginning_of_the_stream(store: Store) -> None:
    early = await store.append("q", b"early")
    await store.ensure_group("q", "pool")
    async with store.blocking_reader() as reader:
        assert await reader.read_group("q", "pool", "w1", block_ms=1000) == (early, b"early")


async def test_ensure_group_creates_an_empty_stream(store: Store) -> None:
    await store.ensure_group("q", "pool")
    assert await store.last_id("q") is None
    assert await store.pending("q", "pool") == []


async def test_blocked_consumers_each_get_a_different_entry(store: Store) -> None:
    await store.ensure_group("q", "pool")
    got: dict[str, Entry | None] = {}

    async def consume(name: str) -> None:
        async with store.blocking_reader() as reader:
            got[name] = await reader.read_group("q", "pool", name, block_ms=20_000)

    with trio.fail_after(10):
        async with trio.open_nursery() as nursery:
            nursery.start_soon(consume, "w1")
            nursery.start_soon(consume, "w2")
            await trio.testing.wait_all_tasks_blocked()
            a = await store.append("q", b"a")
            b = await store.append("q", b"b")
    assert sorted(e for e in got.values() if e) == [(a, b"a"), (b, b"b")]
    assert sorted(await store.pending("q", "pool")) == sorted(
        (entry[0], name) for name, entry in got.items() if entry
    )


async def test_reading_from_a_missing_group_is_refused(store: Store) -> None:
    await store.append("q", b"x")
    async with store.blocking_reader() as reader:
        with pytest.raises(StoreError, match="NOGROUP"):
            await reader.read_group("q", "nobody", "w1", block_ms=10)
        with pytest.raises(StoreError, match="NOGROUP"):
            await reader.read_group("missing", "nobody", "w1", block_ms=10)
        assert [p for _, p in await reader.read("q", "0", block_ms=10)] == [b"x"]  # still usable
    with pytest.raises(StoreError, match="NOGROUP"):
        await store.pending("q", "nobody")
    await store.ack("q", "nobody", "1-0")  # like XACK: nothing to acknowledge, no error


async def test_reclaim_takes_over_what_a_consumer_left_pending(store: Store) -> None:
    await store.ensure_group("q", "g")
    ids = [await store.append("q", p) for p in (b"a", b"b", b"c")]
    async with store.blocking_reader() as reader:
        assert await reader.read_group("q", "g", "dead", block_ms=10) == (ids[0], b"a")
        assert await reader.read_group("q", "g", "dead", block_ms=10) == (ids[1], b"b")
    await store.ack("q", "g", ids[1])
    assert await store.reclaim("q", "g", "alive", min_idle=3600) == []  # not idle long enough
    assert await store.reclaim("q", "g", "alive", min_idle=0) == [(ids[0], b"a")]
    assert await store.pending("q", "g") == [(ids[0], "alive")]
    await store.ack("q", "g", ids[0])
    assert await store.reclaim("q", "g", "alive", min_idle=0) == []
    with pytest.raises(StoreError, match="NOGROUP"):
        await store.reclaim("q", "nobody", "alive", min_idle=0)
