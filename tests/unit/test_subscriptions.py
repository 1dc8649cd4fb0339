"""A subscription takes what follows on from its last delivery and re-reads Redis otherwise."""

from __future__ import annotations

import pytest
import trio

from relay.links import fanout
from relay.links.fanout import Fanout, Item
from relay.store import MemoryStore


def pairs(batch: list[Item]) -> list[tuple[str, bytes | None]]:
    return [(item.cursor, item.payload) for item in batch]


@pytest.fixture
def store() -> MemoryStore:
    return MemoryStore()


async def test_a_subscription_catches_up_then_takes_what_follows_without_reading(
    store: MemoryStore,
) -> None:
    old = await store.append("s", b"old")
    hub = Fanout(store)
    async with hub.subscribe("s", "0") as sub:
        assert pairs(await sub.next_batch()) == [(old, b"old")]
        new = await store.append_once("s", "p", 1, b"new", notify_except=hub.id)
        hub.appended("s", new.prev, new.cursor, b"new")
        with trio.fail_after(1):
            assert pairs(await sub.next_batch()) == [(new.cursor, b"new")]
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
            assert pairs(await sub.next_batch()) == [(first, b"1")]
        second = await store.append_once("s", "p", 1, b"2")
        third = await store.append_once("s", "p", 2, b"3")
        hub.appended("s", third.prev, third.cursor, b"3")  # the second was never noticed
        with trio.fail_after(1):
            assert pairs(await sub.next_batch()) == [(second.cursor, b"2"), (third.cursor, b"3")]
        fourth = await store.append("s", b"4")
        hub.appended("s", third.cursor, fourth, None)  # a notice from another relay
        with trio.fail_after(1):
            assert pairs(await sub.next_batch()) == [(fourth, b"4")]
        assert sub.reads == 3


async def test_a_slow_peer_holds_a_bounded_amount_then_reads_from_redis(
    store: MemoryStore, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(fanout, "MAX_HELD_ENTRIES", 3)
    hub = Fanout(store)
    start = await store.append("s", b"0")
    async with hub.subscribe("s", "0") as sub:
        assert pairs(await sub.next_batch()) == [(start, b"0")]
        ids = []
        for n in range(1, 6):
            got = await store.append_once("s", "p", n, str(n).encode())
            hub.appended("s", got.prev, got.cursor, str(n).encode())
            ids.append(got.cursor)
            assert sub._stale is (n > 3)
        with trio.fail_after(1):
            batch = await sub.next_batch()
        assert [item.cursor for item in batch] == ids


async def test_lost_notices_make_every_subscription_read_again(store: MemoryStore) -> None:
    hub = Fanout(store)
    async with hub.subscribe("a", "0") as a, hub.subscribe("b", "0") as b:
        one = await store.append("a", b"1")
        two = await store.append("b", b"2")
        hub.notice(None)
        with trio.fail_after(1):
            assert pairs(await a.next_batch()) == [(one, b"1")]
            assert pairs(await b.next_batch()) == [(two, b"2")]


async def test_the_process_watches_a_stream_while_it_has_subscriptions(store: MemoryStore) -> None:
    hub = Fanout(store)
    async with hub.subscribe("s", "0"), hub.subscribe("s", "0"):
        assert store._watchers == {"s": {hub.id}}
        assert len(hub) == 2
    assert store._watchers == {} and len(hub) == 0


# --- early entries: handed over before Redis stored them --------------------------------------------


async def _live(hub: Fanout, store: MemoryStore, stream: str = "s") -> None:
    """Let a new subscription of ``hub`` catch up (an empty read) so it is live."""
    await store.append(stream, b"start")


async def test_an_early_subscription_takes_a_publish_at_once_then_its_commit(
    store: MemoryStore,
) -> None:
    hub = Fanout(store)
    start = await store.append("s", b"start")
    async with hub.subscribe("s", "0", early=True) as sub, hub.subscribe("s", "0") as plain:
        assert pairs(await sub.next_batch()) == [(start, b"start")]
        assert pairs(await plain.next_batch()) == [(start, b"start")]
        hub.forward("s", "ide-a", 1, b"req")
        with trio.fail_after(1):
            assert await sub.next_batch() == [Item("", b"req", "ide-a", 1)]
        assert sub.cursor == start  # no cursor yet
        got = await store.append_once("s", "ide-a", 1, b"req", notify_except=hub.id)
        hub.appended("s", got.prev, got.cursor, b"req", "ide-a", 1)
        with trio.fail_after(1):
            assert await sub.next_batch() == [Item(got.cursor, None, "ide-a", 1)]
            # a connection that did not ask for early entries gets the stored entry, as ever
            assert await plain.next_batch() == [Item(got.cursor, b"req", "ide-a", 1)]
        assert sub.cursor == plain.cursor == got.cursor
        assert sub.reads == plain.reads == 1


async def test_a_stale_subscription_takes_nothing_early_and_rereads_what_was_published(
    store: MemoryStore,
) -> None:
    hub = Fanout(store)
    async with hub.subscribe("s", "0", early=True) as sub:
        hub.forward("s", "ide-a", 1, b"req")  # before the catch-up read: not taken
        got = await store.append_once("s", "ide-a", 1, b"req", notify_except=hub.id)
        hub.appended("s", got.prev, got.cursor, b"req", "ide-a", 1)
        with trio.fail_after(1):
            assert await sub.next_batch() == [Item(got.cursor, b"req", "ide-a", 1)]


async def test_an_early_entry_never_sent_before_a_reread_comes_stored_instead(
    store: MemoryStore,
) -> None:
    hub = Fanout(store)
    start = await store.append("s", b"start")
    async with hub.subscribe("s", "0", early=True) as sub:
        assert pairs(await sub.next_batch()) == [(start, b"start")]
        hub.forward("s", "ide-a", 1, b"req")  # held, not handed over yet...
        hub.lost("s")  # ...when notices may have been lost
        got = await store.append_once("s", "ide-a", 1, b"req", notify_except=hub.id)
        with trio.fail_after(1):
            assert await sub.next_batch() == [Item(got.cursor, b"req", "ide-a", 1)]


async def test_a_reread_turns_what_went_out_early_into_commits(store: MemoryStore) -> None:
    hub = Fanout(store)
    start = await store.append("s", b"start")
    async with hub.subscribe("s", "0", early=True) as sub:
        assert pairs(await sub.next_batch()) == [(start, b"start")]
        hub.forward("s", "ide-a", 1, b"one")
        hub.forward("s", "ide-a", 1, b"one")  # the producer sent it again after a cut
        hub.forward("s", "ide-a", 2, b"two")
        with trio.fail_after(1):
            assert pairs(await sub.next_batch()) == [("", b"one"), ("", b"two")]
        one = await store.append_once("s", "ide-a", 1, b"one", notify_except=hub.id)
        other = await store.append("s", b"elsewhere")  # another relay's append, not noticed
        two = await store.append_once("s", "ide-a", 2, b"two", notify_except=hub.id)
        hub.appended("s", two.prev, two.cursor, b"two", "ide-a", 2)  # does not follow on
        with trio.fail_after(1):
            assert await sub.next_batch() == [
                Item(one.cursor, None, "ide-a", 1),
                Item(other, b"elsewhere"),
                Item(two.cursor, None, "ide-a", 2),
            ]
        assert sub.cursor == two.cursor
