"""The worker shim's core while the program is paused: unattended stops, pause reports, the
presence of IDEs, a program held for an IDE that never comes (no sockets, a hand-driven clock;
the harness is :mod:`test_shim_core`'s)."""

from __future__ import annotations

from typing import Any

from test_shim_core import RUN_DIR, WORKDIR, Harness, live

from protocol_specs.session.attention import HOLD_GRACE
from protocol_specs.session.session import StatusEvent
from protocol_specs.wire.wire import PresenceEntry
from worker_shim.session.actions import Say, Terminate
from worker_shim.session.watch import LOOKUP_TIMEOUT, PAUSE_REPORT_AFTER, STACK_FRAMES


def presence(attached: bool, epoch: int, origin: str = "a1", **kw: Any) -> PresenceEntry:
    return PresenceEntry(origin=origin, epoch=epoch, attached=attached, **kw)


def test_a_stop_with_an_ide_attached_is_only_reported_as_paused() -> None:
    h = live(on_unattended_stop="terminate", unattended_timeout=60)
    h.deliver(presence(True, 1))
    h.event("stopped", {"reason": "breakpoint", "threadId": 1})
    assert h.statuses() == [] and h.to_debugpy == []
    assert h.core.next_deadline == h.clock.now + PAUSE_REPORT_AFTER
    h.tick(h.clock.now + 0.1)  # a step would be over by now
    assert h.to_debugpy == []
    h.tick(h.clock.now + PAUSE_REPORT_AFTER)
    lookup = h.sent("stackTrace")
    assert lookup["arguments"] == {"threadId": 1, "levels": STACK_FRAMES}
    frame = {"id": 1, "name": "train_step", "line": 18, "column": 1}
    outer = {"id": 2, "name": "<module>", "line": 40, "source": {"path": "/usr/lib/x.py"}}
    h.respond(
        lookup,
        {"stackFrames": [{**frame, "source": {"path": f"{RUN_DIR}/train.py"}}, outer]},
    )
    [paused] = h.statuses()
    assert paused.event == StatusEvent.PAUSED
    assert paused.data == {
        "where": "train.py:18 in train_step",
        "reason": "breakpoint",
        "thread_id": 1,
        # the frames, for the web view: paths in the run directory relative to it
        "stack": [
            {"name": "train_step", "path": "train.py", "line": 18},
            {"name": "<module>", "path": "/usr/lib/x.py", "line": 40},
        ],
    }
    assert h.core.next_deadline is None  # attended: no policy deadline
    h.event("continued", {"threadId": 1, "allThreadsContinued": True})
    assert [s.event for s in h.statuses()] == [StatusEvent.PAUSED, StatusEvent.RESUMED]


def test_an_unattended_stop_is_announced_then_terminated_after_the_timeout() -> None:
    h = live(on_unattended_stop="terminate", unattended_timeout=60)
    stopped_at = h.clock.now
    h.event("stopped", {"reason": "exception", "threadId": 7, "text": "ValueError"})
    lookup = h.sent("stackTrace")
    assert lookup["arguments"]["threadId"] == 7
    # a stop on an exception: which one, and whether it is uncaught, is looked up as well
    info = {"exceptionId": "ValueError", "description": "boom", "breakMode": "unhandled"}
    assert h.sent("exceptionInfo")["arguments"] == {"threadId": 7}
    frame = {"id": 1, "name": "f", "line": 3, "column": 1, "source": {"path": f"{WORKDIR}/x.py"}}
    h.respond(lookup, {"stackFrames": [frame]})
    assert h.statuses() == []  # the report waits for both answers
    actions = h.respond(h.sent("exceptionInfo"), info)
    [notice] = h.statuses()
    assert notice.event == StatusEvent.UNATTENDED_STOP
    assert (
        "Run r1 stopped on an uncaught ValueError (boom) at x.py:3 in f and no IDE is attached."
        in notice.detail
    )
    assert "within 60 s, it will terminate" in notice.detail
    assert notice.data["policy"] == "terminate" and notice.data["where"] == "x.py:3 in f"
    assert notice.data["exception"] == {
        "id": "ValueError",
        "description": "boom",
        "break_mode": "unhandled",
    }
    assert any(isinstance(a, Say) for a in actions)
    assert h.core.next_deadline == stopped_at + PAUSE_REPORT_AFTER
    h.tick(stopped_at + PAUSE_REPORT_AFTER)
    h.respond(h.sent("stackTrace"), {"stackFrames": [frame]})
    h.respond(h.sent("exceptionInfo"), info)
    paused = h.statuses()[-1]  # what tether ls shows
    assert paused.event == StatusEvent.PAUSED
    assert paused.data["where"] == paused.detail == "uncaught ValueError at x.py:3 in f"
    assert h.core.next_deadline == stopped_at + 60
    actions = h.tick(stopped_at + 60)
    assert [s.event for s in h.statuses()][-1] == StatusEvent.UNATTENDED_STOP
    assert h.statuses()[-1].detail.startswith("Terminating: the program stayed paused")
    assert isinstance(actions[-1], Terminate)


def test_an_unattended_stop_continues_after_the_timeout() -> None:
    h = live(on_unattended_stop="continue", unattended_timeout=10)
    h.event("stopped", {"reason": "breakpoint", "threadId": 3})
    h.respond(h.sent("stackTrace"), {"stackFrames": []})  # debugpy will not say where
    assert "paused (breakpoint)" in h.statuses()[0].detail
    h.tick(h.clock.now + PAUSE_REPORT_AFTER)
    h.respond(h.sent("stackTrace"), {"stackFrames": []})
    h.tick(h.clock.now + 10)
    resume = h.sent("continue")
    assert resume["arguments"] == {"threadId": 3}
    h.respond(resume, {"allThreadsContinued": True})  # the shim's own: nothing published
    assert [m["type"] for m in h.dap()] == ["event"]  # the stop; the answer stays here


def test_an_ide_attaching_clears_the_deadline() -> None:
    h = live(on_unattended_stop="terminate", unattended_timeout=60)
    h.event("stopped", {"reason": "breakpoint", "threadId": 1})
    h.respond(h.sent("stackTrace"), {"stackFrames": []})
    h.tick(h.clock.now + PAUSE_REPORT_AFTER)
    h.respond(h.sent("stackTrace"), {"stackFrames": []})
    h.deliver(presence(True, 1))
    assert h.core.next_deadline is None
    assert h.tick(h.clock.now + 100) == []


def test_a_look_up_debugpy_does_not_answer_times_out_and_resumed_waits_for_paused() -> None:
    h = live(on_unattended_stop="wait")
    h.deliver(presence(True, 1))
    h.event("stopped", {"reason": "pause", "threadId": 1})
    h.tick(h.clock.now + PAUSE_REPORT_AFTER)
    late = h.sent("stackTrace")
    h.event("continued", {"threadId": 1})
    assert h.statuses() == []  # ``resumed`` waits behind ``paused``
    assert h.core.next_deadline == h.clock.now + LOOKUP_TIMEOUT
    h.tick(h.clock.now + LOOKUP_TIMEOUT)
    assert [(s.event, s.detail) for s in h.statuses()] == [
        (StatusEvent.PAUSED, ""),
        (StatusEvent.RESUMED, ""),
    ]
    assert h.respond(late, {"stackFrames": []}) == []  # too late: ignored


def test_a_lost_link_counts_as_attached_for_a_grace_period() -> None:
    h = live(on_unattended_stop="wait")
    h.deliver(presence(True, 1))
    h.deliver(presence(False, 1, link_lost=True))
    h.event("stopped", {"reason": "breakpoint", "threadId": 1})
    h.tick(h.clock.now + PAUSE_REPORT_AFTER)
    h.respond(h.sent("stackTrace"), {"stackFrames": []})
    assert [s.event for s in h.statuses()] == [StatusEvent.PAUSED]
    deadline = h.core.next_deadline
    assert deadline is not None
    h.tick(deadline)
    h.respond(h.sent("stackTrace"), {"stackFrames": []})
    assert [s.event for s in h.statuses()] == [StatusEvent.PAUSED, StatusEvent.UNATTENDED_STOP]


def test_when_debugpy_is_gone_reports_say_nowhere() -> None:
    h = live(on_unattended_stop="wait")
    h.event("stopped", {"reason": "breakpoint", "threadId": 1})
    h.perform(h.core.debugpy_closed())
    [notice] = h.statuses()
    assert "is paused (breakpoint)" in notice.detail
    h.ide("threads", None, 5)
    assert [m["command"] for m in h.to_debugpy] == ["stackTrace"]  # nothing sent after the close


def test_a_program_held_for_an_ide_that_never_comes_ends_or_goes_on_by_the_policy() -> None:
    """``tether debug`` on the local pool, ended with Ctrl-C before an IDE attached: the run
    does not hold its slot for ever."""
    ends = Harness(on_unattended_stop="terminate", unattended_timeout=300)
    ends.perform(ends.core.start(1))
    assert ends.core.next_deadline == ends.clock.now + HOLD_GRACE  # an IDE may be attaching
    ends.tick(ends.clock.now + HOLD_GRACE)
    # no IDE came: the hold is an unattended stop, announced with the run's policy
    notice = ends.statuses()[-1]
    assert notice.event == StatusEvent.UNATTENDED_STOP
    assert "started and waits for an IDE before its first line" in notice.detail
    assert "If no IDE attaches within 300 s, it will terminate." in notice.detail
    actions = ends.tick(ends.clock.now + 300)
    assert any(isinstance(a, Terminate) for a in actions)
    assert "stayed waiting for an IDE" in ends.statuses()[-1].detail
    goes_on = Harness(on_unattended_stop="continue", unattended_timeout=300)
    goes_on.perform(goes_on.core.start(1))
    goes_on.tick(goes_on.clock.now + HOLD_GRACE)
    assert goes_on.to_debugpy == []
    goes_on.tick(goes_on.clock.now + 300)
    assert goes_on.sent("initialize")  # no longer held: configured as a run without an IDE
