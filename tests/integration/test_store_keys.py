"""The storage seam's conformance suite, part three: hashes, strings, sets, sorted sets, expiry,
and a key of another type refused.

The ``store`` fixture (tests/conftest.py) runs each test on the fake (``memory``) and on each
real server (``bundled`` valkey always, ``system`` redis-server when installed); real-server
cases carry the ``redis`` marker.
"""

from __future__ import annotations

import pytest
import trio
import trio.testing

from relay.store import MemoryStore, Store, StoreError

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


async def test_hget_many_reads_one_field_of_many_hashes_in_order(store: Store) -> None:
    keys = [f"tether:run:{{r{i}}}" for i in range(300)]  # spread over a cluster's slots
    for i, key in enumerate(keys):
        if i % 3:
            await store.hset(key, {"record": f"v{i}".encode()})
    got = await store.hget_many(keys, "record")
    assert got == [None if i % 3 == 0 else f"v{i}".encode() for i in range(300)]
    assert await store.hget_many([], "record") == []
    assert await store.hget_many(["tether:run:{r1}"], "other") == [None]
