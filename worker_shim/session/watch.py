"""Unattended stops and pause reports: what the shim says and does while the program is paused.

Theory of operation
-------------------
:class:`Watch` wraps :class:`protocol_specs.session.attention.Attention` (which decides about a stop with
no IDE attached) and adds the pause report for ``tether ls``: a stop that lasts
:data:`PAUSE_REPORT_AFTER` is reported ``paused`` (with where), and ``resumed`` when the program
goes on; short stops (stepping) are not reported.

What it reports goes out in the order it was decided, one report at a time (a FIFO). A report
that says where the program is waits for debugpy's answer to a one-frame ``stackTrace`` (a
:class:`LookUp` the core sends) and, for a stop on an exception, to ``exceptionInfo`` (which
exception, and whether it is uncaught: a post-mortem reads "uncaught ValueError at train.py:18 in
step"), for :data:`LOOKUP_TIMEOUT` at most; the reports behind it wait with it, so ``resumed``
never overtakes the ``paused`` before it.

Sans-I/O: the caller passes the time in (:meth:`Watch.step` after every fact and at
:attr:`Watch.next_deadline`) and performs what comes back.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import PurePath
from typing import Any

from protocol_specs.runs.runs import RunRecord
from protocol_specs.session import attention as att
from protocol_specs.session.session import StatusEvent
from protocol_specs.wire.wire import PresenceEntry, StatusEntry

from .actions import Action, Publish, Say, SuspendRun, Terminate

__all__ = [
    "LOOKUP_TIMEOUT",
    "PAUSE_REPORT_AFTER",
    "STACK_FRAMES",
    "Continue",
    "LookUp",
    "Watch",
    "stop_text",
    "where_text",
]

#: a stop shorter than this (a step) is not reported as the run being paused
PAUSE_REPORT_AFTER = 0.5
#: how long a report waits for debugpy to say where the program is
LOOKUP_TIMEOUT = 5.0
#: frames of the stopped thread a ``paused`` report carries (the web view shows them)
STACK_FRAMES = 20


@dataclass(frozen=True)
class LookUp:
    """Ask debugpy for the top frame of ``thread_id`` (answer with :meth:`Watch.found`) and, with
    ``exception``, its ``exceptionInfo`` (answer with :meth:`Watch.found_exception`)."""

    thread_id: int
    exception: bool = False


@dataclass(frozen=True)
class Continue:
    """Resume ``thread_id`` (the unattended stop timed out, policy ``continue``)."""

    thread_id: int


Step = Action | LookUp | Continue


@dataclass
class _Report:
    #: the thread to say where of first (None: nothing to look up)
    thread_id: int | None
    #: what to publish, given where (`` at train.py:18 in step``) and the exception's info
    make: Callable[[str, dict[str, Any]], list[Step]]
    exception: bool = False  #: the thread stopped on an exception: look that up too
    where: str | None = None
    info: dict[str, Any] | None = None
    #: the stopped thread's frames, as a report shows them (``stack_of``)
    stack: list[dict[str, Any]] | None = None

    @property
    def ready(self) -> bool:
        if self.thread_id is None:
            return True
        return self.where is not None and (self.info is not None or not self.exception)


class Watch:
    def __init__(
        self,
        record: RunRecord,
        run_dir: str,
        status: Callable[..., StatusEntry],
        *,
        name: str = "",
    ) -> None:
        """``name``: the process watched, for a child process (``rank 1 (pid 4242) on node-7``);
        the notice names it. ``status`` makes its status entries (with its ``process``)."""
        spec = record.spec
        self.name = name
        self.record = record
        self.roots = [run_dir, spec.workdir]  # debugpy maps paths to the latter
        self.status = status
        self.attention = att.Attention(
            att.UnattendedPolicy(spec.on_unattended_stop),
            spec.unattended_timeout,
            fallback=att.UnattendedPolicy(spec.unattended_fallback),
        )
        self._decisions: list[att.Decision] = []
        #: when the program last went from running to stopped (None: running)
        self._stopped_since: float | None = None
        self._paused_reported = False
        self._reports: deque[_Report] = deque()
        #: when the look-up for the report at the head gives up (None: none asked)
        self._lookup_until: float | None = None

    def __repr__(self) -> str:
        return (
            f"<Watch stopped_since={self._stopped_since} paused={self._paused_reported} "
            f"reports={len(self._reports)} {self.attention!r}>"
        )

    # --- facts ------------------------------------------------------------------------------------

    def presence(self, entry: PresenceEntry, now: float) -> None:
        self._decisions += self.attention.on_presence(entry, now)

    def held(self, held: bool, now: float) -> None:
        """The program is held before its first line for an IDE's configuration (or no more)."""
        if held != self.attention.held:
            self._decisions += self.attention.on_held(held, now)

    def knows_presence_of(self, run: Watch) -> None:
        """Start from what ``run``'s watch knows of the IDEs attached (a child process's watch,
        from its run's main one): presence entries say a change, once, so a process that starts
        after an IDE attached would otherwise think none is, and call its first stop unattended."""
        self.attention.presence = dict(run.attention.presence)

    def debugger_event(self, msg: dict[str, Any], now: float) -> None:
        self._decisions += self.attention.on_debugger_event(msg, now)
        if self.attention.stopped and self._stopped_since is None:
            self._stopped_since = now
        elif not self.attention.stopped:
            self._stopped_since = None

    def found(self, frames: list[Any]) -> None:
        """debugpy's ``stackFrames`` for the look-up asked last (empty: it would not say)."""
        if self._reports and self._lookup_until is not None:
            self._reports[0].where = where_text(frames, self.roots)
            self._reports[0].stack = stack_of(frames, self.roots)
            self._lookup_done()

    def found_exception(self, info: dict[str, Any]) -> None:
        """debugpy's ``exceptionInfo`` body for the look-up asked last (empty: it would not say)."""
        if self._reports and self._lookup_until is not None:
            self._reports[0].info = info
            self._lookup_done()

    def _lookup_done(self) -> None:
        if self._reports[0].ready:
            self._lookup_until = None

    def suspend_outcome(self, ok: bool, text: str, now: float) -> None:
        """How the run's suspend went (``text``: its notice): said by the watch that decided it;
        if it could not be done, the fallback acts there (every watch's policy is the fallback
        from now on)."""
        if self.attention.suspending:
            event = StatusEvent.UNATTENDED_STOP
            data = {"policy": "suspend", "suspended": ok}
            self._reports.append(
                _Report(
                    None,
                    lambda _w, _i: [Say(text), self._publish(event, detail=text, data=data)],
                )
            )
        if ok:
            self.attention.suspended()
        else:
            self._decisions += self.attention.cannot_suspend(now)

    # --- time -------------------------------------------------------------------------------------

    @property
    def next_deadline(self) -> float | None:
        times = [self.attention.next_wake, self._lookup_until]
        if self._stopped_since is not None and not self._paused_reported:
            times.append(self._stopped_since + PAUSE_REPORT_AFTER)
        return min((t for t in times if t is not None), default=None)

    def step(self, now: float) -> list[Step]:
        """Decide what is due at ``now`` and return what can go out; a :class:`LookUp` comes last
        (what follows waits for :meth:`found`, or for the look-up to time out)."""
        self._report_pause(now)
        for decision in [*self._decisions, *self.attention.tick(now)]:
            self._decide(decision)
        self._decisions = []
        if self._lookup_until is not None and now >= self._lookup_until:
            head = self._reports[0]
            head.where = "" if head.where is None else head.where
            head.info = {} if head.info is None else head.info
            self._lookup_until = None
        out: list[Step] = []
        while self._reports:
            head = self._reports[0]
            if not head.ready:
                if self._lookup_until is None:
                    self._lookup_until = now + LOOKUP_TIMEOUT
                    assert head.thread_id is not None
                    out.append(LookUp(head.thread_id, exception=head.exception))
                break
            self._reports.popleft()
            out += head.make(head.where or "", head.info or {})
        return out

    def _report_pause(self, now: float) -> None:
        """``paused`` (with where) once a stop lasted :data:`PAUSE_REPORT_AFTER`; ``resumed``."""
        since = self._stopped_since
        if since is None:
            if self._paused_reported:
                self._paused_reported = False
                self._reports.append(
                    _Report(None, lambda _where, _info: [self._publish(StatusEvent.RESUMED)])
                )
            return
        if self._paused_reported or now < since + PAUSE_REPORT_AFTER:
            return
        self._paused_reported = True
        tid, body = next(iter(self.attention.stopped.items()))
        reason = str(body.get("reason", ""))

        def paused(where: str, info: dict[str, Any]) -> list[Step]:
            text = stop_text(reason, where, info).removeprefix(" at ")
            data = {"where": text, "reason": reason, "thread_id": tid, **_exception(info)}
            if report.stack:
                data["stack"] = report.stack
            return [self._publish(StatusEvent.PAUSED, detail=text, data=data)]

        report = _Report(tid, paused, exception=reason == "exception")
        self._reports.append(report)

    def _decide(self, decision: att.Decision) -> None:
        rid = self.record.id
        if isinstance(decision, att.Notice):
            held = decision.thread_id == att.HELD  # nothing to look up: no code ran yet
            self._reports.append(
                _Report(
                    None if held else decision.thread_id,
                    lambda where, info: self._notice(decision, where, info),
                    exception=decision.reason == "exception",
                )
            )
        elif isinstance(decision, att.Suspend):
            waited = decision.waited
            self._reports.append(_Report(None, lambda _w, _i: [SuspendRun(waited)]))
        elif isinstance(decision, att.Resume):
            of = f" of {self.name}" if self.name else ""
            text = f"run {rid}: unattended stop{of} timed out; continuing"
            self._reports.append(
                _Report(None, lambda _w, _i: [Say(text), Continue(decision.thread_id)])
            )
        else:
            detail = decision.detail
            self._reports.append(
                _Report(
                    None,
                    lambda _w, _i: [
                        Say(f"run {rid}: {detail}; terminating"),
                        self._publish(
                            StatusEvent.UNATTENDED_STOP, detail=f"Terminating: {detail}."
                        ),
                        Terminate(),
                    ],
                )
            )

    def _notice(self, notice: att.Notice, where: str, info: dict[str, Any]) -> list[Step]:
        spec = self.record.spec
        policy = self.attention.policy
        if policy is att.UnattendedPolicy.WAIT:
            then = (
                "It stays paused until an IDE attaches (--on-unattended-stop wait): "
                "its slot and GPUs stay allocated meanwhile."
            )
        else:
            then = f"If no IDE attaches within {spec.unattended_timeout:g} s, it will {policy}."
            if policy is att.UnattendedPolicy.CONTINUE and notice.thread_id == att.HELD:
                then = then[:-1] + " without waiting for one."
        who = f"Run {self.record.id}" + (f": {self.name}" if self.name else "")
        if notice.thread_id == att.HELD:
            stop = "started and waits for an IDE before its first line,"
        elif info.get("exceptionId"):
            stop = f"stopped on {_article(stop_text(notice.reason, where, info, message=True))}"
        else:
            stop = f"is paused{where} ({notice.reason or 'stopped'})"
        detail = (
            f"{who} {stop} and no IDE is attached. {then} "
            f"Attach with: tether attach {self.record.id}"
        )
        data = {
            "policy": policy,
            "timeout": spec.unattended_timeout,
            "thread_id": notice.thread_id,
            "reason": notice.reason,
            "where": where.removeprefix(" at "),
            **_exception(info),
        }
        return [Say(detail), self._publish(StatusEvent.UNATTENDED_STOP, detail=detail, data=data)]

    def _publish(self, event: str, **fields: Any) -> Publish:
        return Publish(self.status(event, **fields))


#: how ``exceptionInfo``'s ``breakMode`` reads in a report
_BREAK_MODES = {"unhandled": "uncaught", "userUnhandled": "user-uncaught"}


def stop_text(reason: str, where: str, info: dict[str, Any], *, message: bool = False) -> str:
    """What a report says of a stop: ``where`` (`` at train.py:18 in step``), or for a stop on
    an exception with its ``exceptionInfo``: ``uncaught ValueError at train.py:18 in step``
    (``ValueError raised at ...`` for a stop on a raised one); ``message``: with the exception's
    message (``uncaught ValueError (boom) at ...``)."""
    name = str(info.get("exceptionId") or "")
    if reason != "exception" or not name:
        return where
    description = str(info.get("description") or "")[:200]
    if message and description:
        name = f"{name} ({description})"
    mode = _BREAK_MODES.get(str(info.get("breakMode")))
    return f"{mode} {name}{where}" if mode else f"{name} raised{where}"


def _article(text: str) -> str:
    return ("an " if text[:1] in "aeiouAEIOU" else "a ") + text


def _exception(info: dict[str, Any]) -> dict[str, Any]:
    """The ``exception`` field of a report's data (none without one)."""
    if not info.get("exceptionId"):
        return {}
    exception = {
        "id": str(info["exceptionId"]),
        "description": str(info.get("description") or "")[:1000],
        "break_mode": str(info.get("breakMode") or ""),
    }
    return {"exception": exception}


def where_text(frames: list[Any], roots: list[str]) -> str:
    """`` at train.py:18 in train_step`` (the path relative to the first of ``roots`` it is under),
    or "" without a frame."""
    if not frames or not isinstance(frames[0], dict):
        return ""
    frame = frames[0]
    return f" at {_frame_path(frame, roots)}:{frame.get('line')} in {frame.get('name')}"


def stack_of(frames: list[Any], roots: list[str]) -> list[dict[str, Any]]:
    """The frames as a ``paused`` report carries them: ``{"name", "path", "line"}``, the path
    relative to the first of ``roots`` it is under, at most :data:`STACK_FRAMES`."""
    out = []
    for frame in frames[:STACK_FRAMES]:
        if isinstance(frame, dict):
            line = frame.get("line")
            out.append(
                {
                    "name": str(frame.get("name") or "")[:200],
                    "path": _frame_path(frame, roots)[:300],
                    "line": line if isinstance(line, int) else 0,
                }
            )
    return out


def _frame_path(frame: dict[str, Any], roots: list[str]) -> str:
    source = frame.get("source")
    path = str((source if isinstance(source, dict) else {}).get("path") or "")
    for root in roots:
        try:
            return str(PurePath(path).relative_to(root))
        except ValueError:
            continue
    return path
