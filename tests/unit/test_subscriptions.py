"""A subscription takes what follows on from its last delivery and re-reads Redis otherwise."""

from __future__ import annotations

import pytest
import trio

from relay import fanout
from relay.fanout import Fanout
from relay.store import MemoryStore


@pytest.fixture
def store() -> MemoryStore:
    return MemoryStore()


async def test_a_subscription_catches_up_then_takes_what_follows_without_reading(
    store: MemoryStore,
) -> None:
    old = await store.append("s", b"old")
    hub = Fanout(store)
    async with hub.subscribe("s", "0") as sub:
        assert await sub.next_batch() == [(old, b"old")]
        new = await store.append_once("s", "p", 1, b"new", notify_except=hub.id)
        hub.appended("s", new.prev, new.cursor, b"new")
        with trio.fail_after(1):
            assert await sub.next_batch() == [(new.cursor, b"new")]
        assert sub.reads == 1  # the catch-up only
        hub.appended("s", new.prev, new.cursor, b"new")  # the same again: known, ignored
        assert sub.cursor == new.cursor and not sub._held


async def test_a_gap_or_a_notice_without_payload_sends_it_back_to_redis(
    store: MemoryStore,
) -> None:
    hub = Fanout(store)
    async with hub.subscribe("s", "0") as sub:
        first = await store.append("s", b"1")  # appended elsewhere: no notice to this hub
        with trio.fail_after(1):
            assert await sub.next_batch() == [(first, b"1")]
        second = await store.append_once("s", "p", 1, b"2")
        third = await store.append_once("s", "p", 2, b"3")
        hub.appended("s", third.prev, third.cursor, b"3")  # the second was never noticed
        with trio.fail_after(1):
            assert await sub.next_batch() == [(second.cursor, b"2"), (third.cursor, b"3")]
        fourth = await store.append("s", b"4")
        hub.appended("s", third.cursor, fourth, None)  # a notice from another relay
        with trio.fail_after(1):
            assert await sub.next_batch() == [(fourth, b"4")]
        assert sub.reads == 3


async def test_a_slow_peer_holds_a_bounded_amount_then_reads_from_redis(
    store: MemoryStore, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(fanout, "MAX_HELD_ENTRIES", 3)
    hub = Fanout(store)
    start = await store.append("s", b"0")
    async with hub.subscribe("s", "0") as sub:
        assert await sub.next_batch() == [(start, b"0")]
        ids = []
        for n in range(1, 6):
            got = await store.append_once("s", "p", n, str(n).encode())
            hub.appended("s", got.prev, got.cursor, str(n).encode())
            ids.append(got.cursor)
            assert sub._stale is (n > 3)
        with trio.fail_after(1):
            batch = await sub.next_batch()
        assert [entry_id for entry_id, _ in batch] == ids


async def test_lost_notices_make_every_subscription_read_again(store: MemoryStore) -> None:
    hub = Fanout(store)
    async with hub.subscribe("a", "0") as a, hub.subscribe("b", "0") as b:
        one = await store.append("a", b"1")
        two = await store.append("b", b"2")
        hub.notice(None)
        with trio.fail_after(1):
            assert await a.next_batch() == [(one, b"1")]
            assert await b.next_batch() == [(two, b"2")]


async def test_the_process_watches_a_stream_while_it_has_subscriptions(store: MemoryStore) -> None:
    hub = Fanout(store)
    async with hub.subscribe("s", "0"), hub.subscribe("s", "0"):
        assert store._watchers == {"s": {hub.id}}
        assert len(hub) == 2
    assert store._watchers == {} and len(hub) == 0
