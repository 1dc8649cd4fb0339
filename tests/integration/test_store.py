"""One conformance suite for the storage seam, run against the fake and every real server."""

from __future__ import annotations

import pytest
import trio
import trio.testing

from relay.store import Store


async def test_append_and_read_in_order(any_store: Store) -> None:
    first = await any_store.append("s", b"one")
    second = await any_store.append("s", b"two")
    assert await any_store.read_after("s", "0") == [(first, b"one"), (second, b"two")]
    assert await any_store.read_after("s", first) == [(second, b"two")]
    assert await any_store.read_after("s", second) == []
    assert await any_store.last_id("s") == second
    assert await any_store.last_id("missing") is None
    assert await any_store.read_after("missing", "0") == []


async def test_binary_payloads_survive(any_store: Store) -> None:
    payload = bytes(range(256)) * 3
    entry = await any_store.append("s", payload)
    assert await any_store.read_after("s", "0") == [(entry, payload)]


async def test_blocking_read_wakes_on_append(any_store: Store) -> None:
    got: list[tuple[str, bytes]] = []
    async with any_store.blocking_reader() as reader, trio.open_nursery() as nursery:

        async def wait() -> None:
            got.extend(await reader.read("s", "0", block_ms=5000))

        nursery.start_soon(wait)
        await trio.testing.wait_all_tasks_blocked()
        entry = await any_store.append("s", b"late")
    assert got == [(entry, b"late")]


async def test_blocking_read_times_out_empty(any_store: Store) -> None:
    async with any_store.blocking_reader() as reader:
        assert await reader.read("s", "0", block_ms=50) == []


async def test_a_cancelled_blocking_read_leaves_the_store_usable(any_store: Store) -> None:
    async with any_store.blocking_reader() as reader:
        with trio.move_on_after(0.05):
            await reader.read("s", "0", block_ms=3000)
    entry = await any_store.append("s", b"after")
    assert await any_store.read_after("s", "0") == [(entry, b"after")]


async def test_consumer_group_gives_each_entry_to_one_consumer(any_store: Store) -> None:
    await any_store.ensure_group("q", "pool")
    await any_store.ensure_group("q", "pool")  # idempotent
    a = await any_store.append("q", b"run-a")
    b = await any_store.append("q", b"run-b")
    async with any_store.blocking_reader() as reader:
        assert await reader.read_group("q", "pool", "w1", block_ms=100) == (a, b"run-a")
        assert await reader.read_group("q", "pool", "w2", block_ms=100) == (b, b"run-b")
        assert await reader.read_group("q", "pool", "w1", block_ms=50) is None
    await any_store.ack("q", "pool", a)


async def test_hashes_bytes_and_index(any_store: Store) -> None:
    await any_store.hset("h", {"record": "{}", "raw": b"\x00\xff"})
    assert await any_store.hgetall("h") == {"record": b"{}", "raw": b"\x00\xff"}
    assert await any_store.hgetall("missing") == {}
    await any_store.set_bytes("k", b"\x00snap")
    assert await any_store.get_bytes("k") == b"\x00snap"
    assert await any_store.get_bytes("missing") is None
    for member, score in [("old", 1.0), ("new", 3.0), ("mid", 2.0)]:
        await any_store.zadd("runs", member, score)
    assert await any_store.zrange_desc("runs", 2) == ["new", "mid"]
    await any_store.delete("h", "k")
    assert await any_store.hgetall("h") == {} and await any_store.get_bytes("k") is None


@pytest.mark.parametrize("maxlen", [3])
async def test_maxlen_trims_old_entries(any_store: Store, maxlen: int) -> None:
    for i in range(10):
        await any_store.append("s", str(i).encode(), maxlen=maxlen)
    entries = await any_store.read_after("s", "0", count=100)
    assert [payload for _, payload in entries] == [b"7", b"8", b"9"]
