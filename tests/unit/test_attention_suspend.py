"""The unattended-stop policy ``suspend`` (protocol_specs.session.attention), what the paused
processes' answers mean (worker_shim.session.suspend), and tether.on_suspend."""

from __future__ import annotations

from typing import Any

import pytest

import tether
from protocol_specs.session.attention import (
    HELD,
    HOLD_GRACE,
    Attention,
    Notice,
    Resume,
    Suspend,
    Terminate,
    UnattendedPolicy,
)
from protocol_specs.session.rank_values import RankValue, error_value
from protocol_specs.wire.wire import PresenceEntry
from worker_shim.session.suspend import NO_FUNCTION, outcome, suspended_text

SUSPEND = UnattendedPolicy.SUSPEND


def stopped(tid: int = 1) -> dict[str, Any]:
    return {"type": "event", "event": "stopped", "body": {"threadId": tid, "reason": "breakpoint"}}


def test_suspend_is_decided_at_the_deadline_once() -> None:
    a = Attention(SUSPEND, timeout=60)
    assert a.on_debugger_event(stopped(), now=10) == [Notice(1, "breakpoint", 70)]
    assert a.tick(now=69.9) == []
    assert a.tick(now=70) == [Suspend(1, 60)]
    assert a.suspending
    assert a.tick(now=500) == []
    a.suspended()
    assert not a.suspending and a.tick(now=1000) == []


@pytest.mark.parametrize(
    ("fallback", "then"),
    [
        (UnattendedPolicy.WAIT, []),
        (UnattendedPolicy.CONTINUE, [Resume(1)]),
        (UnattendedPolicy.TERMINATE, [Terminate]),
    ],
)
def test_the_fallback_acts_when_suspend_cannot_and_suspend_is_not_asked_again(
    fallback: UnattendedPolicy, then: list[Any]
) -> None:
    a = Attention(SUSPEND, timeout=60, fallback=fallback)
    a.on_debugger_event(stopped(), now=0)
    assert a.tick(now=60) == [Suspend(1, 60)]
    decisions = a.cannot_suspend(now=61)
    if then == [Terminate]:
        (decision,) = decisions
        assert (
            isinstance(decision, Terminate) and "--unattended-fallback terminate" in decision.detail
        )
    else:
        assert decisions == then
    assert a.policy is fallback and not a.suspending
    # the next unattended stop follows the fallback, never suspend again
    a.on_debugger_event({"type": "event", "event": "continued", "body": {}}, now=70)
    a.on_debugger_event(stopped(), now=80)
    assert all(not isinstance(d, Suspend) for d in a.tick(now=1e6))


def test_an_ide_attaching_clears_the_suspend_deadline() -> None:
    a = Attention(SUSPEND, timeout=60)
    a.on_debugger_event(stopped(), now=0)
    a.on_presence(PresenceEntry(origin="ad", epoch=1, attached=True), now=30)
    assert a.deadline is None and a.tick(now=1000) == []


def test_a_program_held_before_its_first_line_is_not_suspended() -> None:
    a = Attention(SUSPEND, timeout=5, fallback=UnattendedPolicy.CONTINUE)
    a.on_held(True, now=0)
    a.tick(now=HOLD_GRACE)
    assert a.tick(now=HOLD_GRACE + 5) == [Resume(HELD)]


def test_suspend_is_no_fallback_of_itself() -> None:
    with pytest.raises(ValueError, match="cannot be suspend"):
        Attention(SUSPEND, timeout=5, fallback=SUSPEND)


def test_the_answers_of_the_paused_processes() -> None:
    ran = RankValue(rank=0, repr="[True, 7]")
    none = RankValue(rank=1, repr="[False, None]")
    running = RankValue(rank=2, state="running")
    assert outcome([ran, none, running]).ok and outcome([ran]).step == 7
    assert outcome([none, running]).why == NO_FUNCTION
    failed = outcome([ran, error_value(1, "RuntimeError: its tether.on_suspend function raised")])
    assert not failed.ok and failed.why.startswith("RuntimeError")
    text = suspended_text("r1", 120, 7)
    assert (
        text
        == "Run r1 suspended after 2 min with no IDE: tether resume r1 continues it from step 7"
    )


def test_on_suspend_registers_the_last_function_and_none_clears_it() -> None:
    calls: list[str] = []
    try:
        assert tether._tether_suspend() is False
        tether.on_suspend(lambda: calls.append("a"))
        tether.on_suspend(lambda: calls.append("b"))
        assert tether._tether_suspend() is True and calls == ["b"]

        def broken() -> None:
            raise OSError("disk\nfull")

        tether.on_suspend(broken)
        with pytest.raises(
            RuntimeError, match=r"^its tether.on_suspend function raised OSError: disk full$"
        ):
            tether._tether_suspend()
        tether.on_suspend(None)
        assert tether._tether_suspend() is False
        with pytest.raises(TypeError):
            tether.on_suspend(3)  # type: ignore[arg-type]
    finally:
        tether.on_suspend(None)
