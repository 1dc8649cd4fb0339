"""What the IDE is told about the run itself, rather than about the program: decided synchronously.

The IDE believes it talks to debugpy, so the run's lifecycle (queued, claimed, started, live,
retrying, ended) has no DAP message of its own. :class:`RunNews` turns it into what an IDE can
show: a line in the debug console per status change, a progress notification while the run
waits for a worker (when the client supports progress reporting), notices (an unattended stop,
a full buffer), the old program's threads going away when an attempt is retried, and
``exited``/``terminated`` once at the end. It also rebuilds what a freshly configured IDE must
see of a session already under way (:meth:`RunNews.greeting`).

Its methods return DAP messages without ``seq``: :class:`adapter.dap.core.AdapterCore` numbers them
and sends them to the IDE connected now. One :class:`RunNews` lives as long as the core; it is
:meth:`~RunNews.reset` for each IDE connection.
"""

from __future__ import annotations

from typing import Any

from protocol_specs.dap import models as dap
from protocol_specs.session.session import DebugSession, StatusEvent
from protocol_specs.wire.wire import StatusEntry

__all__ = [
    "WAITING_MESSAGE",
    "RunNews",
    "is_unattended_announcement",
    "remote_process",
    "replayed_stops",
    "stopped_body",
]

WAITING_MESSAGE = (
    "The run is waiting for a worker; this breakpoint is verified when the worker starts."
)

Message = dict[str, Any]


class RunNews:
    """The run's status, as told to one IDE connection at a time."""

    def __init__(self, run_id: str, session: DebugSession) -> None:
        self.run_id = run_id
        self.session = session
        #: the IDE was sent ``terminated`` (by debugpy or by us): never twice per connection
        self.terminated_sent = False
        self._progress_id: str | None = None
        self._status_said = ""

    def reset(self) -> None:
        """A new IDE connection: it has been told nothing yet."""
        self.terminated_sent = False
        self._progress_id = None
        self._status_said = ""

    # --- texts ------------------------------------------------------------------------------------

    def status_text(self) -> str:
        s = self.session
        run = f"Run {self.run_id}"
        match s.status:
            case None | StatusEvent.QUEUED:
                # "queued on slurm: waiting for a worker", "slurm job 42 submitted; pending in
                # the scheduler's queue": where it waits, said while the IDE shows progress
                detail = s.status_detail or "queued: waiting for a worker"
                return f"{run} is {detail}." if detail.startswith("queued") else f"{run}: {detail}."
            case StatusEvent.CLAIMED:
                return f"{run} was claimed by a worker ({s.status_detail}); starting."
            case StatusEvent.STARTED | StatusEvent.WAITING_FOR_IDE:
                if s.attempt > 1:
                    return f"{run}: attempt {s.attempt} started on a worker; applying breakpoints."
                return f"{run} started on a worker; applying breakpoints."
            case StatusEvent.DEBUGGER_LIVE:
                return f"{run} is live: the debugger is attached on the worker."
            case StatusEvent.EXITED if not s.finished:
                # an attempt that another follows (a retry) or that was preempted (the run may be
                # suspended): the relay's next status says which; the run has not finished
                return f"{run}: attempt {s.attempt} ended."
            case StatusEvent.EXITED:
                return f"{run} finished with exit code {s.exit_code}."
            case StatusEvent.START_FAILED:
                return f"{run} could not start: {s.status_detail}"
            case StatusEvent.CANCELLED:
                return f"{run} was cancelled: {s.status_detail}"
            case StatusEvent.WORKER_LOST:
                return f"{run} was lost: {s.status_detail}"
        return f"{run}: {s.status}"

    def waiting_text(self) -> str:
        """The ``message`` of a breakpoint the core answered itself (no debugger to verify it)."""
        if self.session.finished:
            return f"{self.status_text()} Breakpoints apply to a new run."
        return WAITING_MESSAGE

    def unverified(self, command: str, arguments: Any, bp_ids: list[int]) -> list[dict[str, Any]]:
        """The breakpoints of a ``setBreakpoints`` / ``setFunctionBreakpoints`` the core answers
        itself (``arguments`` parsed): what the worker last reported for each id, else not
        verified, saying why."""

        def one(bp_id: int, **where: Any) -> dict[str, Any]:
            known = self.session.verification.get(bp_id)
            if known is not None and not self.session.finished:
                return known
            return {"id": bp_id, "verified": False, "message": self.waiting_text(), **where}

        if command != "setBreakpoints":
            return [one(bp_id) for bp_id in bp_ids]
        source = arguments.source.model_dump(exclude_none=True)
        lines = arguments.lines_in_order()
        return [
            one(bp_id, line=line, source=source) for bp_id, line in zip(bp_ids, lines, strict=True)
        ]

    def not_live_text(self, command: str) -> str:
        return (
            f"{self.status_text()} No debugger is attached yet, so {command!r} cannot be answered."
        )

    # --- what to send -----------------------------------------------------------------------------

    def greeting(self, client_args: dict[str, Any], generation: int) -> list[Message]:
        """What a freshly configured IDE needs to see of the current state."""
        s = self.session
        if s.finished:
            return [*self.status_output(), *self.end_of_run()]
        if s.live:
            out: list[Message] = []
            if s.capabilities_delta:
                out.append(dap.event("capabilities", {"capabilities": s.capabilities_delta}))
            if s.process_event:
                out.append(dap.event("process", remote_process(s.process_event)))
            for tid in s.threads:
                out.append(dap.event("thread", {"reason": "started", "threadId": tid}))
            out.extend(dap.event("stopped", body) for body in replayed_stops(s))
            return out
        out = self.status_output()
        if client_args.get("supportsProgressReporting") is True:
            self._progress_id = f"tether-{self.run_id}-{generation}"
            progress = {"progressId": self._progress_id, "title": "tether"}
            out.append(dap.event("progressStart", {**progress, "message": self.status_text()}))
        return out

    def status_output(self) -> list[Message]:
        """The run's status in the debug console, once per change (``started`` and
        ``waiting_for_ide`` read the same, for one)."""
        text = f"tether: {self.status_text()}\n"
        if text == self._status_said:
            return []
        self._status_said = text
        return [dap.event("output", {"category": "console", "output": text})]

    def on_status(self, was_live: bool) -> list[Message]:
        """A lifecycle status was folded into the session (the IDE is configured)."""
        s = self.session
        out = self.status_output()
        if self._progress_id is not None:
            progress = {"progressId": self._progress_id, "message": self.status_text()}
            if s.live or s.finished:
                out.append(dap.event("progressEnd", progress))
                self._progress_id = None
            else:
                out.append(dap.event("progressUpdate", progress))
        if s.live and not was_live and s.capabilities_delta:
            out.append(dap.event("capabilities", {"capabilities": s.capabilities_delta}))
        if s.finished:
            out.extend(self.end_of_run())
        return out

    def on_retry(self, entry: StatusEntry, threads: list[int], stopped: bool) -> list[Message]:
        """An attempt ended and another follows (the IDE is configured): the old program's
        threads go, the session stays (the next attempt replays the same breakpoints)."""
        out: list[Message] = []
        if stopped:
            first = threads[0] if threads else 0
            out.append(dap.event("continued", {"threadId": first, "allThreadsContinued": True}))
        for tid in threads:
            out.append(dap.event("thread", {"reason": "exited", "threadId": tid}))
        text = f"tether: Run {self.run_id}: {entry.detail}\n"
        out.append(dap.event("output", {"category": "important", "output": text}))
        return out

    def on_notice(self, entry: StatusEntry) -> list[Message]:
        """News about the run that is not a step of its lifecycle (the IDE is configured)."""
        if is_unattended_announcement(entry):
            # An IDE is attached here right now, so the worker's report is stale by construction:
            # it decided during a relay link blip, and presence was re-announced when the link
            # came back (``relay_link_changed``). Telling this IDE "no IDE is attached" is false.
            # (What the worker then does, "Terminating: ...", is still said: it happens.)
            text = (
                "tether: the worker briefly lost sight of this IDE (a connection blip); "
                "it is attached again.\n"
            )
            return [dap.event("output", {"category": "console", "output": text})]
        text = f"tether: {entry.detail}\n"
        return [dap.event("output", {"category": "important", "output": text})]

    def end_of_run(self) -> list[Message]:
        """``exited`` (when the exit code is known) and ``terminated``, once per connection."""
        if self.terminated_sent:
            return []
        self.terminated_sent = True
        out: list[Message] = []
        if self.session.exit_code is not None:
            out.append(dap.event("exited", {"exitCode": self.session.exit_code}))
        out.append(dap.event("terminated"))
        return out


def is_unattended_announcement(entry: StatusEntry) -> bool:
    """The worker's "paused and no IDE is attached" notice (it names the policy that follows),
    as opposed to its later report of acting on it."""
    return entry.event == StatusEvent.UNATTENDED_STOP and "policy" in entry.data


def stopped_body(session: DebugSession, body: dict[str, Any]) -> dict[str, Any]:
    """A ``stopped`` body with the breakpoint ids the IDE holds (the adapter's, not debugpy's;
    none it was never given): live, and replayed to an IDE that attaches while the program is
    paused."""
    hit = body.get("hitBreakpointIds")
    if "hitBreakpointIds" not in body:
        return body
    ids = session.hit_ids(hit if isinstance(hit, list) else [])
    if not ids:
        return {k: v for k, v in body.items() if k != "hitBreakpointIds"}
    return {**body, "hitBreakpointIds": ids}


def replayed_stops(session: DebugSession) -> list[dict[str, Any]]:
    """The ``stopped`` bodies that show an IDE attaching to a paused program its stops: each stop
    once, on the thread it named. debugpy stops every thread at once (``allThreadsStopped``) and
    says so in one event, for the thread that stopped; an event for each other thread (a
    DataLoader's queue feeders, say) would move the IDE's focus to the last, a thread nobody
    stopped (VS Code focuses the thread of each ``stopped`` that does not ``preserveFocusHint``)."""
    out = []
    for tid, body in session.stopped.items():
        own = body.get("threadId")
        implied = isinstance(own, int) and own != tid and session.stopped.get(own) == body
        if implied and body.get("allThreadsStopped"):
            continue  # stopped with ``own``: that thread's event says so
        out.append(stopped_body(session, {**body, "threadId": tid}))
    return out


def remote_process(body: dict[str, Any]) -> dict[str, Any]:
    """debugpy's ``process`` event, true to where the process runs: on a worker, not here."""
    return {**body, "isLocalProcess": False}
