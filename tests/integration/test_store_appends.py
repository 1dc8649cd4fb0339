"""The storage seam's conformance suite, part two: exactly-once appends (each producer's numbers
stored once and in order), caps, the trimming of transient entries, and the notices appends
send to the listeners watching their stream.

The ``store`` fixture (tests/conftest.py) runs each test on the fake (``memory``) and on each
real server (``bundled`` valkey always, ``system`` redis-server when installed); real-server
cases carry the ``redis`` marker.
"""

from __future__ import annotations

import math
from functools import partial

import trio
import trio.testing

from protocol_specs.link.relay import AppendOutcome
from relay.store import Cap, Diversion, Notice, Numbered, Published, Store, meta_key, transient_key
from relay.store.base import NOTICE_PAYLOAD_BYTES

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
