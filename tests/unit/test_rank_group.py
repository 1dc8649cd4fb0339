"""The rank group's decisions, event by event on a hand clock: stop together, move together, the
bounded waits and their notes (``worker_shim/session/group.py``)."""

from __future__ import annotations

from typing import Any

import orjson
from hand_clock import HandClock

from protocol_specs.session.focus import GROUP_TAG
from protocol_specs.session.stacks import ranks_text
from worker_shim.session.group import (
    GROUP_WAIT,
    GroupAction,
    Note,
    RankGroup,
    RankState,
    Release,
    Send,
)

KEYS = {0: "100", 1: "101", 2: "102", 3: "103"}


def group(n: int = 4) -> tuple[RankGroup, HandClock]:
    clock = HandClock()
    g = RankGroup(clock)
    for rank in range(n):
        assert g.joined(KEYS[rank], rank) == []
    return g, clock


def stopped(
    rank: int, reason: str = "breakpoint", thread: int = 1
) -> tuple[str, dict[str, Any], bytes]:
    msg = {"seq": 5, "type": "event", "event": "stopped",
           "body": {"reason": reason, "threadId": thread, "allThreadsStopped": True}}  # fmt: skip
    return KEYS[rank], msg, orjson.dumps(msg)


def continued(rank: int) -> tuple[str, dict[str, Any], bytes]:
    msg = {"seq": 6, "type": "event", "event": "continued",
           "body": {"threadId": 1, "allThreadsContinued": True}}  # fmt: skip
    return KEYS[rank], msg, orjson.dumps(msg)


def sends(actions: list[GroupAction]) -> list[tuple[str, str, dict[str, Any]]]:
    return [(a.key, a.command, a.arguments) for a in actions if isinstance(a, Send)]


def released(actions: list[GroupAction]) -> list[str]:
    return [a.key for a in actions if isinstance(a, Release)]


def notes(actions: list[GroupAction]) -> list[Note]:
    return [a for a in actions if isinstance(a, Note)]


def states(g: RankGroup) -> list[RankState | None]:
    return [g.state(KEYS[r]) for r in range(len(g.members))]


def stop_all(g: RankGroup, first: int = 2) -> None:
    """Rank ``first`` stops at a breakpoint; the others stop on the group's pause, each on its
    own thread (10 + rank)."""
    g.on_event(*stopped(first, thread=10 + first))
    for rank in range(len(g.members)):
        if rank != first:
            g.on_event(*stopped(rank, "pause", thread=10 + rank))
    assert set(states(g)) == {RankState.STOPPED}


def test_one_rank_stops_every_other_is_paused_and_its_stop_goes_out_at_once() -> None:
    g, clock = group()
    actions = g.on_event(*stopped(2))
    assert released(actions) == [KEYS[2]]  # not held: the user sees the first stop at once
    assert sends(actions) == [(KEYS[r], "pause", {"threadId": 0}) for r in (0, 1, 3)]
    assert states(g) == [RankState.PAUSING, RankState.PAUSING, RankState.STOPPED,
                         RankState.PAUSING]  # fmt: skip
    assert g.next_deadline == clock.now + GROUP_WAIT
    # the others' stops come in: released as they come, nobody paused twice
    for rank in (0, 1, 3):
        actions = g.on_event(*stopped(rank, "pause"))
        assert released(actions) == [KEYS[rank]] and sends(actions) == []
    assert set(states(g)) == {RankState.STOPPED}
    assert g.next_deadline is None  # every rank in: nothing to name
    clock.advance(GROUP_WAIT)
    assert g.on_tick() == []


def test_a_rank_that_does_not_pause_in_time_is_named_to_the_stopped_ranks() -> None:
    g, clock = group()
    g.on_event(*stopped(2))
    g.on_event(*stopped(0, "pause"))
    clock.advance(GROUP_WAIT - 0.1)
    assert g.on_tick() == []
    clock.advance(0.1)
    [note] = g.on_tick()
    assert isinstance(note, Note)
    assert note.keys == (KEYS[0], KEYS[2])
    assert note.text == (
        "tether: ranks 1,3 still running (blocked outside Python, e.g. in a collective); "
        "they pause when they are back in Python"
    )
    assert g.next_deadline is None and g.on_tick() == []
    # back in Python later: it stops, released, still paused with the group
    actions = g.on_event(*stopped(3, "pause"))
    assert released(actions) == [KEYS[3]] and sends(actions) == []


def test_two_ranks_hit_breakpoints_at_once() -> None:
    g, _clock = group()
    first = g.on_event(*stopped(1))
    assert sends(first) == [(KEYS[r], "pause", {"threadId": 0}) for r in (0, 2, 3)]
    # rank 2's breakpoint stop was on its way before the pause: it is its stop, not a second pause
    second = g.on_event(*stopped(2))
    assert released(second) == [KEYS[2]] and sends(second) == []
    assert states(g)[1:3] == [RankState.STOPPED, RankState.STOPPED]


def test_a_continue_from_one_session_continues_every_rank_on_its_stopped_thread() -> None:
    g, _clock = group()
    stop_all(g)
    actions = g.on_request(KEYS[2], "continue", {"threadId": 12})
    assert sends(actions) == [(KEYS[r], "continue", {"threadId": 10 + r}) for r in (0, 1, 3)]
    assert set(states(g)) == {RankState.RUNNING}
    # debugpy's continued events are each rank's own: handed on
    for rank in range(4):
        assert released(g.on_event(*continued(rank))) == [KEYS[rank]]
    # a new stop stops the group again
    assert len(sends(g.on_event(*stopped(0)))) == 3


def test_a_continue_while_some_ranks_are_still_pausing_moves_them_when_they_stop() -> None:
    g, clock = group()
    g.on_event(*stopped(2, thread=12))
    g.on_event(*stopped(0, "pause", thread=10))
    actions = g.on_request(KEYS[2], "continue", {"threadId": 12})
    assert sends(actions) == [(KEYS[0], "continue", {"threadId": 10})]
    assert g.next_deadline is None  # the group runs: nobody to name
    # ranks 1 and 3 stop on the pause they were sent: released, and continued at once
    # (a stop over at once: not shown, nor the continue's continued, so no session is offered)
    actions = g.on_event(*stopped(1, "pause", thread=11))
    assert released(actions) == []
    assert sends(actions) == [(KEYS[1], "continue", {"threadId": 11})]
    assert g.on_event(*continued(1)) == []
    assert released(g.on_event(*continued(1))) == [KEYS[1]]  # only that one
    assert set(states(g)) - {RankState.PAUSING} == {RankState.RUNNING}
    clock.advance(GROUP_WAIT)
    assert g.on_tick() == []


def test_a_pause_from_one_session_pauses_every_running_rank() -> None:
    g, _clock = group()
    actions = g.on_request(KEYS[1], "pause", {"threadId": 1})
    assert sends(actions) == [(KEYS[r], "pause", {"threadId": 0}) for r in (0, 2, 3)]
    assert set(states(g)) == {RankState.PAUSING}
    # rank 1's own stop (the IDE's pause): no second pause to anyone
    assert sends(g.on_event(*stopped(1, "pause"))) == []


def test_a_group_step_holds_the_stops_until_every_rank_ended_the_step() -> None:
    g, _clock = group()
    stop_all(g)
    actions = g.on_request(KEYS[2], "next", {"threadId": 12, "granularity": "line"})
    assert sends(actions) == [
        (KEYS[r], "next", {"threadId": 10 + r, "granularity": "line"}) for r in (0, 1, 3)
    ]
    assert set(states(g)) == {RankState.STEPPING}
    for rank in (2, 0, 3):
        assert released(g.on_event(*continued(rank))) == [KEYS[rank]]  # continued: at once
        assert g.on_event(*stopped(rank, "step")) == []  # held
    actions = g.on_event(*stopped(1, "step"))
    assert released(actions) == [KEYS[r] for r in range(4)]  # all together, in rank order
    assert notes(actions) == [] and g.next_deadline is None
    assert set(states(g)) == {RankState.STOPPED}


def test_a_step_where_one_rank_never_arrives_is_released_with_a_note() -> None:
    g, clock = group()
    stop_all(g)
    g.on_request(KEYS[0], "stepOut", {"threadId": 10})
    for rank in (0, 1, 2):
        assert g.on_event(*stopped(rank, "step")) == []
    clock.advance(GROUP_WAIT)
    actions = g.on_tick()
    assert released(actions) == [KEYS[0], KEYS[1], KEYS[2]]
    [note] = notes(actions)
    assert note.keys == (KEYS[0], KEYS[1], KEYS[2])
    assert note.text.startswith("tether: rank 3 did not end the step within 2 s")
    # it arrives later: its stop goes out at once
    assert released(g.on_event(*stopped(3, "step"))) == [KEYS[3]]


def test_a_rank_exiting_while_the_group_is_stopped_or_stepping() -> None:
    g, _clock = group()
    stop_all(g)
    assert g.left(KEYS[3]) == []
    g.on_request(KEYS[0], "next", {"threadId": 10})
    assert g.on_event(*stopped(0, "step")) == [] and g.on_event(*stopped(1, "step")) == []
    # rank 2 exits during the step: the step is complete without it
    actions = g.left(KEYS[2])
    assert released(actions) == [KEYS[0], KEYS[1]] and g.next_deadline is None
    assert g.left(KEYS[2]) == []  # said twice (exited, then the connection closed)
    # a continue goes to the ranks that are left
    assert [s[0] for s in sends(g.on_request(KEYS[0], "continue", {}))] == [KEYS[1]]


def test_a_rank_that_joins_a_stopped_group_is_paused() -> None:
    g, _clock = group(2)
    g.on_event(*stopped(0))
    assert sends(g.joined(KEYS[2], 2)) == [(KEYS[2], "pause", {"threadId": 0})]
    assert g.joined(KEYS[3], 3) != []  # the group is still stopping: paused too


def test_a_single_rank_and_other_processes_are_left_alone() -> None:
    g, _clock = group(1)
    actions = g.on_event(*stopped(0))
    assert released(actions) == [KEYS[0]] and g.next_deadline is None
    assert g.on_request(KEYS[0], "continue", {}) == []
    # a process that is not a rank (a DataLoader worker): its events pass, its requests are its own
    msg = {"seq": 1, "type": "event", "event": "stopped", "body": {"threadId": 1}}
    assert g.on_event("999", msg, b"{}") == [Release("999", msg, b"{}")]
    assert g.on_request("999", "continue", {}) == []
    # not a run control request
    assert g.on_request(KEYS[0], "evaluate", {"expression": "x"}) == []


def test_a_continue_the_group_did_not_send_marks_the_rank_running() -> None:
    """The unattended policy continues a rank on its own: its ``continued`` says so."""
    g, _clock = group(2)
    stop_all(g, first=0)
    g.on_event(*continued(1))
    assert states(g) == [RankState.STOPPED, RankState.RUNNING]
    assert sends(g.on_request(KEYS[0], "continue", {})) == []


def test_ranks_text() -> None:
    assert ranks_text([3]) == "rank 3"
    assert ranks_text([3, 1, 3]) == "ranks 1,3"
    assert ranks_text([2, 0, 1, 5]) == "ranks 0-2,5"


def test_a_continue_reaches_a_rank_still_in_the_step_before_once_its_step_ends() -> None:
    """Rank 3 never ended the group's step (blocked in a collective): the continue is owed to it,
    and its late step stop does not stop the running group again."""
    g, clock = group()
    stop_all(g)
    g.on_request(KEYS[0], "next", {"threadId": 10})
    for rank in (0, 1, 2):
        g.on_event(*stopped(rank, "step", thread=10 + rank))
    clock.advance(GROUP_WAIT)
    g.on_tick()  # the step is released without rank 3
    assert states(g)[3] is RankState.STEPPING
    actions = g.on_request(KEYS[0], "continue", {"threadId": 10})
    assert sends(actions) == [(KEYS[r], "continue", {"threadId": 10 + r}) for r in (1, 2)]
    actions = g.on_event(*stopped(3, "step", thread=13))
    assert released(actions) == []  # over at once: not shown, nobody paused
    assert sends(actions) == [(KEYS[3], "continue", {"threadId": 13})]
    assert g.on_event(*continued(3)) == []
    assert set(states(g)) == {RankState.RUNNING}


def test_a_pause_drops_the_moves_owed_to_ranks_still_pausing() -> None:
    g, _clock = group()
    g.on_event(*stopped(2, thread=12))
    g.on_event(*stopped(0, "pause", thread=10))
    g.on_request(KEYS[2], "continue", {"threadId": 12})  # ranks 1 and 3 are owed it
    actions = g.on_request(KEYS[2], "pause", {"threadId": 12})
    assert sends(actions) == [(KEYS[0], "pause", {"threadId": 10})]
    for rank in (1, 3):  # their stops are the group's pause: shown, not continued
        actions = g.on_event(*stopped(rank, "pause", thread=10 + rank))
        assert released(actions) == [KEYS[rank]] and sends(actions) == []
    assert states(g) == [RankState.PAUSING, RankState.STOPPED, RankState.PAUSING,
                         RankState.STOPPED]  # fmt: skip


def test_a_breakpoint_hit_before_the_groups_pause_landed_is_shown_and_stops_the_group() -> None:
    g, _clock = group()
    g.on_event(*stopped(2, thread=12))
    g.on_event(*stopped(0, "pause", thread=10))
    g.on_request(KEYS[2], "continue", {"threadId": 12})  # ranks 1 and 3 are owed it
    actions = g.on_event(*stopped(1, "breakpoint", thread=11))
    [shown] = [a for a in actions if isinstance(a, Release)]
    assert shown.key == KEYS[1] and GROUP_TAG not in shown.msg["body"]  # its own stop
    assert sends(actions) == [(KEYS[r], "pause", {"threadId": 10 + r}) for r in (0, 2)]
    # rank 3's stop on the first pause: shown, with rank 1, not continued
    actions = g.on_event(*stopped(3, "pause", thread=13))
    [shown] = [a for a in actions if isinstance(a, Release)]
    assert shown.msg["body"][GROUP_TAG] == {"with": 1} and sends(actions) == []
    assert states(g)[1] is states(g)[3] is RankState.STOPPED


def test_a_rank_that_joins_during_a_group_step_is_paused() -> None:
    g, _clock = group(3)
    stop_all(g, first=0)
    g.on_request(KEYS[0], "next", {"threadId": 10})  # no rank ended the step yet
    assert sends(g.joined(KEYS[3], 3)) == [(KEYS[3], "pause", {"threadId": 0})]
    actions: list[GroupAction] = []
    for rank in range(3):
        actions += g.on_event(*stopped(rank, "step", thread=10 + rank))
    assert released(actions) == [KEYS[0], KEYS[1], KEYS[2]]
    assert states(g)[3] is RankState.PAUSING  # not left running while the group is stopped
    assert released(g.on_event(*stopped(3, "pause"))) == [KEYS[3]]
    assert set(states(g)) == {RankState.STOPPED}
