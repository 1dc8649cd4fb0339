"""The relay link's state (``protocol_specs.link.link.LinkState``) stepped frame by frame, without sockets.

Publish numbering, answers (acks, duplicate acks, refusals, fatal errors), resume after a cut
(every unanswered publish re-sent in order, cursors kept and named in the next ``hello``), redelivered
entries dropped, ``received`` reports and heartbeats on a hand clock (the state takes the time).
"""

from __future__ import annotations

import math

import pytest

from protocol_specs.link.link import (
    Answered,
    Cursor,
    LinkClosed,
    LinkState,
    Moved,
    NewEntry,
    OutboxFull,
    Refusal,
    Refused,
)
from protocol_specs.runs.runs import RunRecord
from protocol_specs.runs.spec import RunSpec
from protocol_specs.wire import wire
from protocol_specs.wire.wire import (
    ErrorCode,
    IdeLink,
    Role,
    StreamName,
    TunnelLink,
    WorkerLink,
    WorkerTunnelLink,
)

RUN = RunRecord(id="r1", spec=RunSpec(command=["python", "x.py"], workdir="/w"))
HEARTBEAT = wire.encode_frame(wire.Heartbeat())


def welcome(heartbeat: float = 0.0) -> wire.Welcome:
    return wire.Welcome(run=RUN, tails={"to_ide": "5-0"}, heartbeat=heartbeat)


def entry(text: str) -> bytes:
    return wire.encode_entry(wire.DapEntry(body=text.encode()))


def decoded(frames: list[bytes]) -> list[wire.Frame]:
    return [wire.decode_frame(f) for f in frames]


def publishes(frames: list[bytes]) -> list[int]:
    return [f.n for f in decoded(frames) if isinstance(f, wire.Publish)]


def deliver(cursor: str, stream: StreamName = StreamName.TO_WORKER) -> wire.Deliver:
    return wire.Deliver(stream=stream, cursor=cursor, entry=entry(cursor))


def ack(n: int, *, duplicate: bool = False) -> wire.Ack:
    return wire.Ack(n=n, cursor=f"{n}-0", duplicate=duplicate)


def connected_worker(now: float = 0.0, **limits: float) -> LinkState:
    state = LinkState(link=WorkerLink(), run="r1", producer="w", **limits)  # type: ignore[arg-type]
    assert state.on_handshake(welcome(), now) is None
    return state


def hand_over(state: LinkState, frame: wire.Deliver) -> bool:
    event = state.receive(frame)
    assert event == NewEntry(frame)
    return state.handed_over(frame)


# --- handshake ------------------------------------------------------------------------------------


def test_hello_names_the_run_the_producer_and_the_cursors() -> None:
    state = LinkState(
        link=IdeLink(history=True), run="r1", producer="ide-1", cursor="7-1", client="vscode"
    )
    hello = state.hello(token="tok")
    assert (hello.role, hello.run, hello.producer, hello.client) == (
        Role.IDE,
        "r1",
        "ide-1",
        "vscode",
    )
    assert (hello.cursor, hello.link, hello.history_cursor, hello.token) == (
        "7-1",
        IdeLink(history=True),
        "0",
        "tok",
    )
    assert state.inbound is StreamName.TO_IDE
    assert not state.connected and state.due(0.0) == [] and state.wake_at() == math.inf


def test_welcome_counts_connections_and_keeps_the_first() -> None:
    state = LinkState(link=WorkerLink(), run="r1", producer="w")
    first, second = welcome(), welcome(heartbeat=5)
    assert state.on_handshake(first, 0.0) is None
    state.connection_lost()
    assert state.on_handshake(second, 1.0) is None
    assert (state.epoch, state.welcome, state.latest, state.connected) == (2, first, second, True)
    assert "epoch=2" in repr(state)


@pytest.mark.parametrize(
    ("frame", "permanent"),
    [
        (wire.Error(code=ErrorCode.NO_SUCH_RUN, message="gone", fatal=True), True),
        (wire.Error(code=ErrorCode.STALE_ATTEMPT, message="later", fatal=True), True),
        (wire.Error(code=ErrorCode.TOO_MANY_CONNECTIONS, message="busy", fatal=True), False),
        (wire.Error(code=ErrorCode.INTERNAL, message="oops", fatal=True), False),
    ],
)
def test_a_refused_handshake_says_whether_retrying_can_help(
    frame: wire.Error, permanent: bool
) -> None:
    state = LinkState(link=WorkerLink(), run="r1", producer="w")
    assert state.on_handshake(frame, 0.0) == Refusal(frame.code, frame.message, permanent)
    assert not state.connected and state.epoch == 0


def test_anything_but_a_welcome_with_a_run_is_a_bad_handshake() -> None:
    state = LinkState(link=WorkerLink(), run="r1", producer="w")
    refusal = state.on_handshake(wire.Heartbeat(), 0.0)
    assert refusal is not None and refusal.code is ErrorCode.BAD_FRAME and refusal.permanent
    assert state.on_handshake(wire.Welcome(), 0.0) is not None  # no run record
    assert state.epoch == 0


# --- outbox: numbering, answers -------------------------------------------------------------------


def test_publishes_are_numbered_and_sent_once_in_order() -> None:
    state = connected_worker()
    assert [state.publish(entry(t)) for t in "abc"] == [1, 2, 3]
    frames = decoded(state.due(0.0))
    assert [(f.n, wire.decode_entry(f.entry)) for f in frames if isinstance(f, wire.Publish)] == [
        (n, wire.DapEntry(body=t.encode())) for n, t in zip((1, 2, 3), "abc", strict=True)
    ]
    assert state.due(0.0) == []  # nothing new
    state.publish(entry("d"))
    assert publishes(state.due(0.0)) == [4]
    assert (state.published, state.answered, state.unanswered) == (4, 0, 4)


def test_publishes_wait_in_the_outbox_while_no_connection_is_up() -> None:
    state = LinkState(link=WorkerLink(), run="r1", producer="w")
    assert state.publish(entry("a")) == 1
    assert state.due(0.0) == []
    state.on_handshake(welcome(), 0.0)
    assert publishes(state.due(0.0)) == [1]


def test_acks_answer_every_publish_up_to_n() -> None:
    state = connected_worker()
    for t in "abcd":
        state.publish(entry(t))
    state.due(0.0)
    assert state.receive(ack(1)) == Answered(1)
    assert (state.answered, state.unanswered, state.acked) == (1, 3, "1-0")
    assert state.receive(ack(3)) == Answered(3)  # cumulative
    assert (state.answered, state.unanswered, state.acked) == (3, 1, "3-0")
    assert state.receive(ack(2)) == Answered(2)  # a late, lower ack changes nothing
    assert (state.answered, state.unanswered) == (3, 1)


def test_a_duplicate_ack_is_counted() -> None:
    state = connected_worker()
    state.publish(entry("a"))
    state.due(0.0)
    state.receive(ack(1, duplicate=True))
    assert (state.duplicates, state.answered, state.unanswered) == (1, 1, 0)


def test_a_refused_publish_is_answered_and_reported() -> None:
    state = connected_worker()
    state.publish(entry("a"))
    state.publish(entry("b"))
    state.due(0.0)
    error = wire.Error(code=ErrorCode.BUFFER_FULL, message="full", n=1)
    assert state.receive(error) == Refused(1, error)
    assert (state.answered, state.unanswered, state.errors) == (1, 1, [error])
    assert state.receive(ack(2)) == Answered(2)


def test_a_fatal_error_closes_the_connection_without_answering() -> None:
    state = connected_worker()
    state.publish(entry("a"))
    fatal = wire.Error(code=ErrorCode.LEASE_LOST, message="lease lost", fatal=True, n=1)
    assert state.receive(fatal) == LinkClosed("the relay closed the connection: lease lost")
    assert (state.answered, state.unanswered, state.errors) == (0, 1, [fatal])


def test_an_error_naming_no_publish_is_only_recorded() -> None:
    state = connected_worker()
    error = wire.Error(code=ErrorCode.NOT_ALLOWED, message="no")
    assert state.receive(error) is None
    assert state.errors == [error]


def test_the_outbox_is_bounded_by_entries_and_bytes_but_one_entry_always_fits() -> None:
    state = connected_worker(outbox_entries=2, outbox_bytes=1000)
    big = b"x" * 5000
    assert state.has_room(len(big))
    state.publish(big)  # alone in the outbox: fits, whatever its size
    assert not state.has_room(1)
    with pytest.raises(OutboxFull):
        state.publish(entry("a"))
    state.due(0.0)
    state.receive(ack(1))
    state.publish(entry("a"))
    state.publish(entry("b"))
    assert not state.has_room(1)  # two entries
    assert state.published == 3


# --- resume after a cut ---------------------------------------------------------------------------


def test_after_a_cut_unanswered_publishes_are_resent_in_order() -> None:
    state = connected_worker()
    for t in "abcd":
        state.publish(entry(t))
    assert publishes(state.due(0.0)) == [1, 2, 3, 4]
    state.receive(ack(2))
    state.connection_lost()
    state.publish(entry("e"))  # while down
    assert state.on_handshake(welcome(), 1.0) is None
    assert publishes(state.due(1.0)) == [3, 4, 5]
    state.receive(ack(4, duplicate=True))  # the relay had stored 3 and 4 before the cut
    state.receive(ack(5))
    assert (state.duplicates, state.answered, state.unanswered) == (1, 5, 0)
    state.connection_lost()
    state.on_handshake(welcome(), 2.0)
    assert publishes(state.due(2.0)) == []  # nothing unanswered


def test_after_a_cut_the_hello_resumes_after_the_last_entry_handed_over() -> None:
    state = LinkState(link=IdeLink(history=True), run="r1", producer="ide")
    state.on_handshake(welcome(), 0.0)
    hand_over(state, deliver("3-0", StreamName.TO_WORKER))  # history
    hand_over(state, deliver("4-1", StreamName.TO_IDE))
    state.connection_lost()
    hello = state.hello()
    assert (hello.cursor, hello.history_cursor) == ("4-1", "3-0")
    assert state.cursors == {
        StreamName.TO_IDE: "4-1",
        StreamName.TO_WORKER: "3-0",
        StreamName.LOGS: "0",
        StreamName.METRICS: "0",
        StreamName.TUNNEL_UP: "0",
        StreamName.TUNNEL_DOWN: "0",
    }


def test_a_tunnels_links_read_its_own_streams() -> None:
    user = LinkState(link=TunnelLink(tunnel="ab12"), run="r1", producer="t")
    worker = LinkState(link=WorkerTunnelLink(tunnel="ab12"), run="r1", producer="w", attempt=2)
    assert (user.inbound, worker.inbound) == (StreamName.TUNNEL_DOWN, StreamName.TUNNEL_UP)
    assert (user.hello().role, worker.hello().role) == (Role.TUNNEL, Role.WORKER)
    assert user.hello().link == TunnelLink(tunnel="ab12")
    assert worker.hello().link == WorkerTunnelLink(tunnel="ab12")


def test_an_entry_not_handed_over_is_delivered_again() -> None:
    # the cursor moves only once the entry reached the reader (it may be closing meanwhile)
    state = connected_worker()
    frame = deliver("2-0")
    assert state.receive(frame) == NewEntry(frame)
    assert state.hello().cursor == "0"
    assert state.receive(frame) == NewEntry(frame)


# --- dedup ----------------------------------------------------------------------------------------


def test_redelivered_entries_at_or_before_the_cursor_are_dropped() -> None:
    state = connected_worker()
    for cursor in ("1-0", "1-1", "2-0"):
        hand_over(state, deliver(cursor))
    state.connection_lost()
    state.on_handshake(welcome(), 1.0)
    # the relay resends from an older point: only what is newer goes through
    assert state.receive(deliver("1-1")) is None
    assert state.receive(deliver("2-0")) is None
    newer = deliver("10-0")  # numerically, not as text: "10-0" < "2-0" as strings
    assert state.receive(newer) == NewEntry(newer)


def test_dedup_is_per_stream_and_starts_at_the_given_cursor() -> None:
    state = LinkState(link=IdeLink(history=True), run="r1", producer="ide", cursor="5-0")
    state.on_handshake(welcome(), 0.0)
    assert state.receive(deliver("4-0", StreamName.TO_IDE)) is None
    assert state.receive(deliver("5-0", StreamName.TO_IDE)) is None
    assert state.receive(deliver("4-0", StreamName.TO_WORKER)) is not None
    assert state.receive(deliver("5-1", StreamName.TO_IDE)) is not None


# --- received reports -----------------------------------------------------------------------------


def received(frames: list[bytes]) -> list[tuple[str, str]]:
    return [(f.stream.value, f.cursor) for f in decoded(frames) if isinstance(f, wire.Received)]


# --- early entries: handed over before Redis stored them -------------------------------------------


def early(producer: str, n: int, cursor: str = "") -> wire.Deliver:
    return wire.Deliver(
        stream=StreamName.TO_WORKER, cursor=cursor, entry=entry(f"{producer}{n}"),
        producer=producer, n=n,
    )  # fmt: skip


def commit(producer: str, n: int, cursor: str) -> wire.Commit:
    return wire.Commit(stream=StreamName.TO_WORKER, cursor=cursor, producer=producer, n=n)


def test_the_hello_asks_for_early_entries_only_when_told() -> None:
    assert LinkState(link=WorkerLink(), run="r1", producer="w").hello().link == WorkerLink()
    hello = LinkState(link=WorkerLink(early=True), run="r1", producer="w").hello()
    assert hello.link == WorkerLink(early=True)


def test_an_early_entry_is_handed_over_and_its_commit_moves_the_cursor() -> None:
    state = connected_worker()
    assert not hand_over(state, early("a", 1))  # no cursor: nothing to report yet
    assert state.cursors[StreamName.TO_WORKER] == "0"
    assert state.receive(commit("a", 1, "4-0")) == Moved(report_due=True)
    assert state.cursors[StreamName.TO_WORKER] == "4-0"
    assert state.receive(commit("a", 1, "4-0")) is None  # nothing new


def test_an_early_entry_that_comes_again_stored_only_moves_the_cursor() -> None:
    state = connected_worker()
    hand_over(state, early("a", 1))
    hand_over(state, early("a", 2))
    # the link reconnected before the commits: the relay re-reads them from Redis
    assert state.receive(early("a", 1, cursor="4-0")) == Moved(report_due=True)
    assert state.receive(early("a", 2, cursor="4-1")) == Moved(report_due=False)
    assert state.cursors[StreamName.TO_WORKER] == "4-1"
    fresh = early("a", 3, cursor="4-2")
    assert state.receive(fresh) == NewEntry(fresh)


def test_a_publish_sent_again_after_a_cut_is_not_handed_over_twice() -> None:
    state = connected_worker()
    hand_over(state, early("a", 1))
    assert state.receive(early("a", 1)) is None  # before its commit
    state.receive(commit("a", 1, "4-0"))
    assert state.receive(early("a", 1)) is None  # after it: stored already
    assert state.receive(early("a", 0)) is None  # unnumbered: never valid early


def test_an_earlier_entry_of_a_producer_still_comes_after_a_later_one_went_early() -> None:
    """The relay did not send ``a``'s publish 1 early (this link's subscription was catching up),
    but sent 2: 1 must still be handed over when it comes stored."""
    state = connected_worker()
    hand_over(state, early("a", 2))
    one = early("a", 1, cursor="4-0")
    assert state.receive(one) == NewEntry(one)
    state.handed_over(one)
    assert state.receive(early("a", 2, cursor="4-1")) == Moved(report_due=False)
    assert state.receive(early("a", 2)) is None


def test_entries_of_other_producers_and_the_relay_are_not_confused() -> None:
    state = connected_worker()
    hand_over(state, early("a", 1))
    b1 = early("b", 1)
    assert state.receive(b1) == NewEntry(b1)
    relay_own = deliver("4-0")  # names no publish
    assert state.receive(relay_own) == NewEntry(relay_own)


def test_a_report_goes_out_report_after_seconds_after_the_first_entry() -> None:
    state = connected_worker(report_after=0.2, report_every=100)
    assert state.wake_at() == math.inf  # no heartbeats wanted, nothing to report
    assert hand_over(state, deliver("1-0"))  # the first entry: wake the sender (start the clock)
    assert not hand_over(state, deliver("2-0"))
    assert state.due(10.0) == []
    assert state.wake_at() == pytest.approx(10.2)
    assert state.due(10.1) == []
    assert received(state.due(10.2)) == [("to_worker", "2-0")]
    assert state.wake_at() == math.inf
    assert state.due(20.0) == []  # nothing new: no report


def test_a_report_goes_out_at_once_after_report_every_entries() -> None:
    state = connected_worker(report_after=5.0, report_every=3)
    wakes = [hand_over(state, deliver(f"{i}-0")) for i in (1, 2, 3)]
    assert wakes == [True, False, True]
    assert received(state.due(0.0)) == [("to_worker", "3-0")]


def test_report_now_goes_before_later_publishes_and_only_names_moved_cursors() -> None:
    state = LinkState(link=IdeLink(history=True), run="r1", producer="ide")
    state.on_handshake(welcome(), 0.0)
    hand_over(state, deliver("1-0", StreamName.TO_WORKER))
    hand_over(state, deliver("2-0", StreamName.TO_IDE))
    state.report_now()
    state.publish(entry("a"))
    frames = decoded(state.due(0.0))
    assert [type(f) for f in frames] == [wire.Received, wire.Received, wire.Publish]
    assert received(state.due(1.0)) == []  # the timer was cleared with it
    hand_over(state, deliver("3-0", StreamName.TO_IDE))
    state.report_now()
    assert received(state.due(1.0)) == [("to_ide", "3-0")]  # to_worker did not move


def test_report_now_waits_for_a_connection() -> None:
    state = LinkState(link=WorkerLink(), run="r1", producer="w")
    state.on_handshake(welcome(), 0.0)
    hand_over(state, deliver("1-0"))
    state.connection_lost()
    state.report_now()
    assert state.due(0.0) == []
    state.on_handshake(welcome(), 1.0)
    assert received(state.due(1.0)) == [("to_worker", "1-0")]


# --- heartbeats -----------------------------------------------------------------------------------


def test_heartbeats_follow_the_shorter_of_policy_and_welcome() -> None:
    state = LinkState(link=WorkerLink(), run="r1", producer="w", heartbeat=10.0)
    state.on_handshake(welcome(heartbeat=4.0), 100.0)
    assert state.wake_at() == 104.0
    assert state.due(103.9) == []
    assert state.due(104.0) == [HEARTBEAT]
    assert state.wake_at() == 108.0
    state.connection_lost()
    state.on_handshake(welcome(heartbeat=30.0), 200.0)
    assert state.wake_at() == 210.0


def test_no_heartbeats_when_the_welcome_asks_for_none() -> None:
    state = connected_worker(heartbeat=10.0)
    assert state.due(1e6) == [] and state.wake_at() == math.inf


def test_the_report_timer_and_heartbeat_share_the_wake_up() -> None:
    state = LinkState(link=WorkerLink(), run="r1", producer="w", heartbeat=1.0, report_after=0.2)
    state.on_handshake(welcome(heartbeat=1.0), 0.0)
    hand_over(state, deliver("1-0"))
    assert state.due(0.5) == []
    assert state.wake_at() == pytest.approx(0.7)
    frames = state.due(1.0)
    assert received(frames) == [("to_worker", "1-0")] and frames[-1] == HEARTBEAT


def test_cursor_order_is_numeric() -> None:
    assert Cursor.parse("10-0") > Cursor.parse("9-5") > Cursor.parse("9")
