"""The relay's half of a run link (``protocol_specs.link.relay``) stepped publish by publish, without
sockets or Redis: admission and its refusals, the order of held-back publishes, which go early, the
storer's steps, ack batching, and commits on a hand clock."""

from __future__ import annotations

import math
from dataclasses import dataclass

import pytest

from protocol_specs.access.auth import Principal, Scope
from protocol_specs.link.relay import (
    COMMIT_AFTER,
    STORE_BATCH,
    STORE_QUEUE,
    Action,
    Answer,
    AppendOutcome,
    Attached,
    Audit,
    Batch,
    Beat,
    Close,
    Commits,
    Reach,
    RelayLinkState,
    Skip,
    StatusStored,
    StoreOne,
    StoreRun,
    Tell,
    TunnelEnded,
    streams_of,
)
from protocol_specs.runs.runs import RunRecord
from protocol_specs.runs.spec import RunSpec
from protocol_specs.wire import wire
from protocol_specs.wire.wire import (
    AfterLink,
    AnyLink,
    ErrorCode,
    IdeLink,
    StatusEvent,
    StreamName,
    TunnelLink,
    WorkerLink,
    WorkerTunnelLink,
)

RECORD = RunRecord(id="r1", spec=RunSpec(command=["python", "x.py"], workdir="/w"), owner="alice")
ALICE = Principal(token="a1", kind="user", user="alice", scopes=frozenset({Scope.RUNS}))
WORKER = Principal(token="w1", kind="worker", user="alice", run="r1", attempt=1)
STORED, DUPLICATE, GAP, FULL = (
    AppendOutcome.STORED,
    AppendOutcome.DUPLICATE,
    AppendOutcome.GAP,
    AppendOutcome.FULL,
)


@dataclass(frozen=True)
class Got:
    """What an append gave (``relay.store.Appended``'s shape)."""

    outcome: AppendOutcome
    cursor: str = ""
    last: int = 0
    size: int = 0


def worker(link: AnyLink | None = None, **kwargs: object) -> RelayLinkState:
    return RelayLinkState(link or WorkerLink(), WORKER, RECORD, **kwargs)  # type: ignore[arg-type]


def ide(**kwargs: object) -> RelayLinkState:
    return RelayLinkState(IdeLink(), ALICE, RECORD, **kwargs)  # type: ignore[arg-type]


def publish(n: int, entry: wire.AnyEntry | None = None) -> wire.Publish:
    entry = entry if entry is not None else dap(n)
    return wire.Publish(n=n, entry=wire.encode_entry(entry))


def dap(n: int = 0) -> wire.DapEntry:
    return wire.DapEntry(body=b'{"seq": %d}' % n)


def status(event: str = StatusEvent.STARTED) -> wire.StatusEntry:
    return wire.StatusEntry(event=event)


def log_entry() -> wire.LogEntry:
    return wire.LogEntry(stream="stdout", data=b"hello\n")


def presence(attached: bool) -> wire.PresenceEntry:
    return wire.PresenceEntry(origin="a", epoch=1, attached=attached)


def reaches(state: RelayLinkState, *entries: wire.AnyEntry) -> list[Reach]:
    start = len(state.queue)
    return [state.admit(publish(start + i + 1, e)).reach for i, e in enumerate(entries)]


def answered(state: RelayLinkState, n: int) -> list[Action]:
    """The actions that answer the only (refused) publish ``n`` queued."""
    batch = state.take()
    assert batch is not None
    [step] = batch.steps
    assert isinstance(step, Answer)
    assert isinstance(step.actions[-1], Skip) and step.actions[-1].n == n
    return step.actions


# --- opening --------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("link", "streams"),
    [
        (IdeLink(), (StreamName.TO_WORKER, StreamName.TO_IDE)),
        (WorkerLink(), (StreamName.TO_IDE, StreamName.TO_WORKER)),
        (AfterLink(), (StreamName.TO_IDE, StreamName.TO_WORKER)),
        (TunnelLink(tunnel="t1"), (StreamName.TUNNEL_UP, StreamName.TUNNEL_DOWN)),
        (WorkerTunnelLink(tunnel="t1"), (StreamName.TUNNEL_DOWN, StreamName.TUNNEL_UP)),
    ],
)
def test_a_link_publishes_to_one_stream_and_reads_the_other(
    link: AnyLink, streams: tuple[StreamName, StreamName]
) -> None:
    assert streams_of(link) == streams
    assert RelayLinkState(link, ALICE, RECORD).streams == (
        (StreamName.TUNNEL_UP, StreamName.TUNNEL_DOWN)
        if link.tunnel
        else (StreamName.TO_WORKER, StreamName.TO_IDE)
    )


@pytest.mark.parametrize(
    ("link", "who", "may"),
    [
        (IdeLink(history=True, early=True), ALICE, {"dap", "presence"}),
        (WorkerLink(early=True), WORKER, {"dap", "status", "log", "metric"}),
        (AfterLink(), WORKER, set()),
        (TunnelLink(tunnel="t1"), ALICE, {"tunnel"}),
        (WorkerTunnelLink(tunnel="t1"), WORKER, {"tunnel"}),
    ],
)
def test_each_kind_of_link_is_admitted_and_publishes_only_its_entries(
    link: AnyLink, who: Principal, may: set[str]
) -> None:
    """Every legal kind opens a state whose role is its own, and publishes what it may."""
    state = RelayLinkState(link, who, RECORD)
    assert state.role is link.role and state.tunnel == link.tunnel
    entries: list[wire.AnyEntry] = [
        dap(),
        presence(True),
        status(),
        log_entry(),
        wire.MetricEntry(points=[(1, 0.0, {"loss": 1.0})]),
        wire.ControlEntry(action="terminate"),
        wire.TunnelEntry(op="data"),
    ]
    allowed = {e.k for n, e in enumerate(entries, 1) if state.admit(publish(n, e)).refusal is None}
    assert allowed == may


# --- admission ------------------------------------------------------------------------------------


def test_a_malformed_publish_is_answered_with_an_error_and_skipped_without_an_audit() -> None:
    state = ide()
    item = state.admit(wire.Publish(n=1, entry=b"\xc1 not msgpack"))
    assert item.entry is None and item.reach is Reach.STORED_FIRST
    assert state.held_back == 0
    actions = answered(state, 1)
    assert not any(isinstance(a, Audit) for a in actions)
    [tell, _skip] = actions
    assert isinstance(tell, Tell) and isinstance(tell.frame, wire.Error)
    assert tell.frame.n == 1 and not tell.frame.fatal


def test_a_publish_the_table_refuses_is_audited_refused_and_skipped_in_order() -> None:
    state = ide()  # an IDE may not publish status entries
    state.admit(publish(1, status()))
    assert state.held_back == 0  # never stored: it holds nothing back
    audit, tell, skip = answered(state, 1)
    assert isinstance(audit, Audit) and audit.request == "publish status"
    assert isinstance(tell, Tell) and isinstance(tell.frame, wire.Error)
    assert (tell.frame.code, tell.frame.n) == (ErrorCode(audit.code), 1)
    assert skip == Skip(1)


def test_a_worker_may_publish_only_the_status_events_its_table_allows() -> None:
    state = worker(status_allowed=lambda event: event == StatusEvent.STARTED)
    assert state.admit(publish(1, status(StatusEvent.STARTED))).refusal is None
    refused = state.admit(publish(2, status("run_finished")))
    assert refused.refusal is not None
    assert refused.refusal.message == "workers may not publish status 'run_finished'"
    batch = state.take()
    assert batch is not None
    one, answer = batch.steps
    assert isinstance(one, StoreOne) and one.recheck  # a status: is the attempt still the run's?
    assert isinstance(answer, Answer) and isinstance(answer.actions[0], Audit)


def test_a_worker_serving_an_ended_attempt_publishes_nothing() -> None:
    state = worker(AfterLink())
    entries: list[wire.AnyEntry] = [dap(), status(), log_entry()]
    for n, entry in enumerate(entries, 1):
        refusal = state.admit(publish(n, entry)).refusal
        assert refusal is not None
        assert refusal.message == "a worker serving an ended attempt publishes nothing"


def test_a_tunnels_link_carries_only_tunnel_steps_and_a_runs_link_none() -> None:
    tunnel = RelayLinkState(TunnelLink(tunnel="t1"), ALICE, RECORD)
    assert tunnel.admit(publish(1, dap())).refusal is not None
    assert tunnel.admit(publish(2, wire.TunnelEntry(op="data", data=b"x"))).refusal is None
    run = ide()
    refusal = run.admit(publish(1, wire.TunnelEntry(op="data"))).refusal
    assert refusal is not None and refusal.message == (
        "no tunnel entry on a run's link (only on a tunnel's)"
    )


def test_the_receiver_waits_once_the_storer_is_store_queue_behind() -> None:
    state = ide()
    for n in range(1, STORE_QUEUE):
        state.admit(publish(n))
        assert state.has_room
    state.admit(publish(STORE_QUEUE))
    assert not state.has_room
    assert state.take() is not None
    assert state.has_room


# --- early delivery and held-back ordering --------------------------------------------------------


def test_dap_entries_go_early_while_nothing_before_them_is_held_back() -> None:
    state = worker()
    assert reaches(state, dap(), dap()) == [Reach.EARLY, Reach.EARLY]
    assert state.held_back == 0


def test_nothing_overtakes_a_held_back_entry() -> None:
    state = worker()
    got = reaches(state, dap(), status(), dap(), dap())
    # the status reaches the peers only once stored: the DAP entries after it wait for it
    assert got == [Reach.EARLY, Reach.HELD_BACK, Reach.HELD_BACK, Reach.HELD_BACK]
    assert state.held_back == 3


def test_logs_metrics_and_refusals_hold_nothing_back() -> None:
    state = worker()
    metric = wire.MetricEntry(points=[(1, 0.0, {"loss": 1.0})])
    got = reaches(state, log_entry(), metric, presence(True), dap())  # a worker's presence: refused
    assert got == [Reach.STORED_FIRST, Reach.STORED_FIRST, Reach.STORED_FIRST, Reach.EARLY]
    assert [item.refusal is None for item in state.queue] == [True, True, False, True]
    assert state.held_back == 0


def test_entries_go_early_again_once_the_batch_that_held_them_back_is_done() -> None:
    state = worker()
    reaches(state, status(), dap())
    batch = state.take()
    assert batch is not None and batch.held_back == 2
    # taken, but not stored yet: a DAP entry now would still overtake them
    assert reaches(state, dap()) == [Reach.HELD_BACK]
    state.finished(batch)
    assert state.held_back == 1  # the one queued after the batch
    later = state.take()
    assert later is not None
    state.finished(later)
    assert state.held_back == 0
    assert reaches(state, dap()) == [Reach.EARLY]


# --- the storer's steps ---------------------------------------------------------------------------


def test_the_storer_takes_consecutive_dap_entries_as_one_append_in_order() -> None:
    state = worker()
    reaches(state, dap(), dap(), status(), dap(), log_entry(), dap(), dap())
    batch = state.take()
    assert batch is not None
    shape = [
        ("run", [i.frame.n for i in s.items])
        if isinstance(s, StoreRun)
        else ("one", [s.item.frame.n])
        if isinstance(s, StoreOne)
        else ("answer", [])
        for s in batch.steps
    ]
    assert shape == [
        ("run", [1, 2]),
        ("one", [3]),
        ("run", [4]),
        ("one", [5]),
        ("run", [6, 7]),
    ]
    assert state.take() is None


def test_the_storer_takes_at_most_store_batch_at_once() -> None:
    state = ide()
    for n in range(1, STORE_BATCH + 2):
        state.admit(publish(n))
    first = state.take()
    assert first is not None
    [run] = first.steps
    assert isinstance(run, StoreRun) and len(run.items) == STORE_BATCH
    second = state.take()
    assert second is not None
    [rest] = second.steps
    assert isinstance(rest, StoreRun) and [i.frame.n for i in rest.items] == [STORE_BATCH + 1]


def test_a_closing_link_stores_nothing_more() -> None:
    state = ide()
    reaches(state, dap(), dap())
    state.close()
    assert state.take() is None
    assert not state.queue
    state.admit(publish(3))  # what the receiver had in hand as the link ended
    assert state.take() is None


# --- answers and ack batching ---------------------------------------------------------------------


def run_of(state: RelayLinkState, count: int) -> list[object]:
    reaches(state, *[dap() for _ in range(count)])
    batch = state.take()
    assert isinstance(batch, Batch)
    [run] = batch.steps
    assert isinstance(run, StoreRun)
    return run.items  # type: ignore[return-value]


def acks(actions: list[Action]) -> list[tuple[int, bool]]:
    return [
        (a.frame.n, a.frame.duplicate)
        for a in actions
        if isinstance(a, Tell) and isinstance(a.frame, wire.Ack)
    ]


def test_a_run_of_stored_publishes_is_answered_with_one_ack_for_its_last() -> None:
    state = worker()
    items = run_of(state, 5)
    got = [Got(STORED, f"1-{i}") for i in range(5)]
    actions = state.answer_run(items, got)  # type: ignore[arg-type]
    assert actions == [Tell(wire.Ack(n=5, cursor="1-4"))]


def test_a_duplicate_splits_the_ack_so_answers_stay_in_order() -> None:
    state = worker()
    items = run_of(state, 4)
    got = [
        Got(STORED, "1-0"),
        Got(STORED, "1-1"),
        Got(DUPLICATE, "0-9"),
        Got(STORED, "1-2"),
    ]
    actions = state.answer_run(items, got)  # type: ignore[arg-type]
    assert acks(actions) == [(2, False), (3, True), (4, False)]


def test_a_full_stream_refuses_that_publish_and_the_rest_go_on() -> None:
    state = worker(buffer_cap=(10, 4096))
    items = run_of(state, 3)
    got = [Got(STORED, "1-0"), Got(FULL, size=10), Got(STORED, "1-1")]
    actions = state.answer_run(items, got)  # type: ignore[arg-type]
    assert acks(actions) == [(1, False), (3, False)]
    [error] = [a.frame for a in actions if isinstance(a, Tell) and isinstance(a.frame, wire.Error)]
    assert (error.code, error.n, error.fatal) == (ErrorCode.BUFFER_FULL, 2, False)
    assert "holds 10 entries (cap 10) or its 4096 bytes are used up" in error.message
    assert actions.index(Tell(error)) == 1


def test_a_gap_ends_the_link_after_acking_what_came_before_it() -> None:
    state = worker()
    items = run_of(state, 4)
    got = [Got(STORED, "1-0"), Got(GAP, last=1), Got(STORED, "1-1"), Got(STORED, "1-2")]
    actions = state.answer_run(items, got)  # type: ignore[arg-type]
    assert actions == [
        Tell(wire.Ack(n=1, cursor="1-0")),
        Close(ErrorCode.OUT_OF_ORDER, "publish 2 skips ahead of 2; resend from there"),
    ]


def test_a_workers_tunnel_exit_ends_the_tunnel_before_it_is_acked() -> None:
    def exits(link: AnyLink) -> list[Action]:
        state = RelayLinkState(link, WORKER if link.role == "worker" else ALICE, RECORD)
        reaches(state, wire.TunnelEntry(op="data"), wire.TunnelEntry(op="exit"))
        batch = state.take()
        assert batch is not None
        [run] = batch.steps
        assert isinstance(run, StoreRun)
        return state.answer_run(run.items, [Got(STORED, "1-0"), Got(STORED, "1-1")])

    assert exits(WorkerTunnelLink(tunnel="t")) == [TunnelEnded(), Tell(wire.Ack(n=2, cursor="1-1"))]
    assert exits(TunnelLink(tunnel="t")) == [Tell(wire.Ack(n=2, cursor="1-1"))]


def test_a_stored_status_moves_the_run_then_is_acked() -> None:
    state = worker()
    item = state.admit(publish(1, status()))
    actions = state.answer_one(item, Got(STORED, "3-0"))
    assert actions == [StatusStored(status()), Tell(wire.Ack(n=1, cursor="3-0"))]
    assert state.answer_one(item, Got(DUPLICATE, "3-0")) == [
        Tell(wire.Ack(n=1, cursor="3-0", duplicate=True))
    ]


def test_presence_is_audited_only_when_the_ide_attaches_or_detaches() -> None:
    state = ide()
    seen = []
    for n, attached in enumerate([True, True, False, False, True], 1):
        actions = state.answer_one(state.admit(publish(n, presence(attached))), Got(STORED))
        seen.append([a.entry.attached for a in actions if isinstance(a, Attached)])
    assert seen == [[True], [], [False], [], [True]]


def test_a_link_that_goes_while_its_ide_is_attached_says_it_left() -> None:
    state = ide()
    assert state.farewell() is None
    state.answer_one(state.admit(publish(1, presence(True))), Got(STORED))
    gone = state.farewell()
    assert gone is not None and (gone.attached, gone.link_lost) == (False, True)
    state.answer_one(state.admit(publish(2, presence(False))), Got(STORED))
    assert state.farewell() is None


@pytest.mark.parametrize(
    ("state", "beat"),
    [
        (ide(), Beat.IGNORE),
        (worker(), Beat.RENEW),
        (worker(AfterLink()), Beat.HOLD),
        (worker(WorkerTunnelLink(tunnel="t")), Beat.CHECK),
        (RelayLinkState(TunnelLink(tunnel="t"), ALICE, RECORD), Beat.IGNORE),
    ],
)
def test_what_a_heartbeat_asks_for(state: RelayLinkState, beat: Beat) -> None:
    assert state.heartbeat() is beat


def test_a_worker_whose_attempt_ended_must_go() -> None:
    state = worker()
    assert state.still_current(RECORD) is None
    assert state.still_current(RECORD.model_copy(update={"attempt": 2})) is not None
    assert state.still_current(None) is not None


# --- commits on a hand clock ----------------------------------------------------------------------


def test_commits_wait_commit_after_from_the_first_and_only_the_latest_per_producer_goes() -> None:
    commits = Commits(StreamName.TO_IDE)
    assert not commits and commits.due == math.inf
    commits.owe("1-0", "w", 1, now=10.0)
    commits.owe("1-1", "w", 2, now=10.05)
    commits.owe("1-2", "x", 7, now=10.06)
    assert commits.due == pytest.approx(10.0 + COMMIT_AFTER)  # the first sets the deadline
    assert commits.take(10.09) == []
    got = commits.take(10.0 + COMMIT_AFTER)
    assert [(c.producer, c.n, c.cursor) for c in got] == [("w", 2, "1-1"), ("x", 7, "1-2")]
    assert all(c.stream is StreamName.TO_IDE for c in got)
    assert not commits and commits.due == math.inf and commits.take(99.0) == []
