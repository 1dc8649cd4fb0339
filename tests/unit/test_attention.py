"""The unattended-stop policy (protocol_specs.session.attention), driven with plain facts and times."""

from __future__ import annotations

from typing import Any

import pytest

from protocol_specs.session.attention import (
    HELD,
    HOLD_GRACE,
    Attention,
    Notice,
    Resume,
    Terminate,
    UnattendedPolicy,
)
from protocol_specs.wire.wire import PresenceEntry


def stopped(tid: int = 1, reason: str = "breakpoint") -> dict[str, Any]:
    return {"type": "event", "event": "stopped", "body": {"threadId": tid, "reason": reason}}


CONTINUED = {"type": "event", "event": "continued", "body": {"threadId": 1}}


def here(origin: str, epoch: int, attached: bool) -> PresenceEntry:
    return PresenceEntry(origin=origin, epoch=epoch, attached=attached)


def test_a_stop_with_nobody_attached_is_noticed_and_waits_for_ever() -> None:
    a = Attention(UnattendedPolicy.WAIT, timeout=60)
    assert a.on_debugger_event(stopped(), now=10) == [Notice(1, "breakpoint", None)]
    assert a.tick(now=1e9) == []
    assert a.on_debugger_event(stopped(2), now=11) == []  # still the same unattended stop


@pytest.mark.parametrize(
    ("policy", "action"),
    [(UnattendedPolicy.CONTINUE, Resume(1)), (UnattendedPolicy.TERMINATE, Terminate)],
)
def test_the_policy_acts_at_the_deadline(policy: UnattendedPolicy, action: Any) -> None:
    a = Attention(policy, timeout=60)
    assert a.on_debugger_event(stopped(), now=10) == [Notice(1, "breakpoint", 70)]
    assert a.tick(now=69.9) == []
    (decision,) = a.tick(now=70)
    assert decision == action if isinstance(action, Resume) else isinstance(decision, action)
    assert a.tick(now=71) == []  # once


def test_an_attached_ide_means_no_notice_and_leaving_starts_the_clock() -> None:
    a = Attention(UnattendedPolicy.CONTINUE, timeout=30)
    assert a.on_presence(here("ad1", 1, True), now=0) == []
    assert a.on_debugger_event(stopped(), now=5) == []
    assert a.on_presence(here("ad1", 2, False), now=8) == [Notice(1, "breakpoint", 38)]
    assert a.on_presence(here("ad1", 3, True), now=20) == []  # back in time
    assert a.deadline is None and a.tick(now=100) == []


def test_resuming_clears_the_deadline_and_the_next_stop_starts_a_new_one() -> None:
    a = Attention(UnattendedPolicy.TERMINATE, timeout=30)
    a.on_debugger_event(stopped(), now=0)
    assert a.on_debugger_event(CONTINUED, now=10) == []
    assert a.deadline is None
    assert a.on_debugger_event(stopped(reason="step"), now=50) == [Notice(1, "step", 80)]


def test_stale_presence_is_ignored() -> None:
    a = Attention(UnattendedPolicy.WAIT, timeout=0)
    a.on_presence(here("ad1", 4, True), now=0)
    # the relay's late record of the old connection leaving (epoch 3) changes nothing
    a.on_presence(here("ad1", 3, False), now=1)
    assert a.attended(now=0)
    # the relay's record of the current connection leaving (same epoch) wins
    a.on_presence(here("ad1", 4, False), now=2)
    assert not a.attended(now=0)
    # another adapter counts on its own
    a.on_presence(here("ad2", 1, True), now=3)
    assert a.attended(now=0)


def test_thread_exits_and_termination_end_a_stop() -> None:
    a = Attention(UnattendedPolicy.CONTINUE, timeout=10)
    a.on_debugger_event(stopped(7), now=0)
    exited = {"type": "event", "event": "thread", "body": {"threadId": 7, "reason": "exited"}}
    assert a.on_debugger_event(exited, now=1) == []
    assert a.deadline is None
    a.on_debugger_event(stopped(8), now=2)
    a.on_debugger_event({"type": "event", "event": "terminated"}, now=3)
    assert a.tick(now=100) == []
    assert a.on_debugger_event({"type": "event", "event": "output"}, now=4) == []


def lost(origin: str, epoch: int) -> PresenceEntry:
    """The departure the relay writes when an adapter's relay link closes."""
    return PresenceEntry(origin=origin, epoch=epoch, attached=False, link_lost=True)


def test_a_lost_link_is_given_a_grace_before_the_stop_counts_as_unattended() -> None:
    """A relay blip closes the adapter's link; the relay records the IDE as gone. If the adapter
    is back within the grace, nobody is told of an unattended stop (the false alarm)."""
    a = Attention(UnattendedPolicy.CONTINUE, timeout=5, link_grace=30)
    a.on_presence(here("ad1", 1, True), now=0)
    assert a.on_debugger_event(stopped(), now=1) == []
    assert a.on_presence(lost("ad1", 1), now=2) == []
    assert a.next_wake == 32 and a.tick(now=10) == []
    assert a.on_presence(here("ad1", 2, True), now=12) == []  # the link is back
    assert a.tick(now=100) == [] and a.next_wake is None


def test_a_lost_link_that_stays_lost_counts_once_the_grace_is_over() -> None:
    a = Attention(UnattendedPolicy.CONTINUE, timeout=5, link_grace=30)
    a.on_presence(here("ad1", 1, True), now=0)
    a.on_debugger_event(stopped(), now=1)
    a.on_presence(lost("ad1", 1), now=2)
    assert a.tick(now=31.9) == []
    assert a.tick(now=32) == [Notice(1, "breakpoint", 37)]
    assert a.next_wake == 37
    assert a.tick(now=37) == [Resume(1)]


def test_an_ide_leaving_on_purpose_has_no_grace() -> None:
    a = Attention(UnattendedPolicy.CONTINUE, timeout=5, link_grace=30)
    a.on_presence(here("ad1", 1, True), now=0)
    a.on_debugger_event(stopped(), now=1)
    assert a.on_presence(here("ad1", 2, False), now=2) == [Notice(1, "breakpoint", 7)]


def test_an_expired_grace_never_keeps_waking_the_worker() -> None:
    a = Attention(UnattendedPolicy.WAIT, timeout=5, link_grace=30)
    a.on_presence(here("ad1", 1, True), now=0)
    a.on_presence(here("ad2", 1, True), now=0)
    a.on_debugger_event(stopped(), now=1)
    a.on_presence(lost("ad2", 1), now=2)
    assert a.next_wake == 32
    assert a.tick(now=40) == []  # ad1 is still attached
    assert a.next_wake is None


@pytest.mark.parametrize(
    ("policy", "action"),
    [(UnattendedPolicy.CONTINUE, Resume(HELD)), (UnattendedPolicy.TERMINATE, Terminate)],
)
def test_a_program_held_for_an_ide_nobody_attaches_is_an_unattended_stop(
    policy: UnattendedPolicy, action: Any
) -> None:
    a = Attention(policy, timeout=300)
    assert a.on_held(True, now=10) == []  # an IDE may be attaching as the run starts
    assert a.next_wake == 10 + HOLD_GRACE
    assert a.tick(now=10 + HOLD_GRACE) == [Notice(HELD, "waiting for an IDE", 320)]
    assert a.tick(now=319) == []
    (decision,) = a.tick(now=320)
    if isinstance(action, Resume):
        assert decision == action
    else:
        assert isinstance(decision, Terminate) and "waiting for an IDE" in decision.detail


def test_a_held_program_whose_ide_attaches_or_configures_is_not_unattended() -> None:
    a = Attention(UnattendedPolicy.TERMINATE, timeout=300)
    a.on_presence(here("ide-1", 1, True), now=5)
    assert a.on_held(True, now=10) == []  # an IDE is attached: it configures the debugger
    assert a.tick(now=1e9) == []
    b = Attention(UnattendedPolicy.TERMINATE, timeout=300)
    b.on_held(True, now=10)
    assert b.on_held(False, now=15) == [] and b.deadline is None  # configured: it runs
    assert b.tick(now=1e9) == []
