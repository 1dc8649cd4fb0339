"""The IDE session of one child process of the program: a core of its own, decided synchronously.

Theory of operation
-------------------
With subprocess debugging on, the worker debugs every Python process of the program and says
which one each entry is about (``process``: :func:`protocol_specs.session.processes.process_key` of its
pid). The IDE sees one debug session per process, as with debugpy locally: the main process's
session is :class:`adapter.dap.core.AdapterCore`; each child's is a :class:`ChildCore`, which is the
same core with these differences:

- it exists because its process does: it is live from its ``process_started`` status (the shim
  configured the process at once, no IDE waits for it) until ``process_exited`` or the end of the
  run, when its IDE session gets ``exited``/``terminated``. Nothing it is told is about the run's
  lifecycle: that is the main session's news.
- the IDE's handshake (``initialize``, ``attach``, ``configurationDone``) is answered here and
  never published: the worker attached to the process itself. What the IDE sends afterwards is
  published with ``process`` set and forwarded live.
- ``disconnect`` and ``terminate`` end the IDE's session only, never the run (nor the process).
- the worker configured the process before any IDE session existed for it: its stops name
  debugpy's ids of the worker's breakpoints, which the fold turns into the ids this session handed
  out for the same places (:data:`~protocol_specs.session.session.PLACES_EVENT`, sent for a child only).
- a rank of a ``torch.distributed`` job (``WORLD_SIZE`` > 1) that stops gets
  :data:`~protocol_specs.session.processes.COLLECTIVE_TIMEOUT_HINT` in its debug console, once per
  connection: its peers' collectives time out while it is paused.

Its requests share the adapter's ``seq`` space (:class:`adapter.dap.actions.Origin`), its breakpoint
ids and its fold (threads, stops, verification) are its own.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from protocol_specs.dap import models as dap
from protocol_specs.session.processes import COLLECTIVE_TIMEOUT_HINT, ProcessTable
from protocol_specs.session.session import PLACES_EVENT, DebugSession, StatusEvent
from protocol_specs.wire.wire import AnyEntry, StatusEntry, StreamName

from .actions import Action, CloseIde, IdePhase, Origin
from .core import AdapterCore
from .status import RunNews, remote_process, replayed_stops

__all__ = ["ChildCore", "ChildNews"]

Message = dict[str, Any]


class ChildNews(RunNews):
    """What a child's IDE session is told about its process (not about the run)."""

    def __init__(self, run_id: str, session: DebugSession, key: str, table: ProcessTable) -> None:
        super().__init__(run_id, session)
        self.key = key
        self.table = table
        #: why the session ended, when no exit code says it
        self.ended_because = ""
        self._hinted = False
        #: a line for the IDE that connects next (:meth:`ChildCore.tell`), said in its greeting
        self.told: dict[str, Any] | None = None

    def reset(self) -> None:
        super().reset()
        self._hinted = False

    @property
    def distributed(self) -> bool:
        """A rank of a ``torch.distributed`` job: its peers wait for it in their collectives."""
        info = self.table.info(self.key)
        return info is not None and (info.world_size or 0) > 1

    def status_text(self) -> str:
        s = self.session
        title = self.table.title(self.key)
        if s.finished:
            if s.exit_code is not None:
                return f"{title} exited with code {s.exit_code}."
            return f"{title} ended ({self.ended_because or 'it exited'})."
        return f"{title} is {'paused' if s.stopped else 'running'}."

    def waiting_text(self) -> str:
        return self.status_text()

    def not_live_text(self, command: str) -> str:
        return f"{self.status_text()} {command!r} cannot be answered."

    def greeting(self, client_args: dict[str, Any], generation: int) -> list[Message]:
        s = self.session
        out = self.status_output()
        if s.finished:
            return [*out, *self.end_of_run()]
        if s.process_event:
            out.append(dap.event("process", remote_process(s.process_event)))
        for tid in s.threads:
            out.append(dap.event("thread", {"reason": "started", "threadId": tid}))
        out.extend(dap.event("stopped", body) for body in replayed_stops(s))
        if s.stopped:
            out.extend(self.collective_hint())
        if self.told is not None:
            out.append(self.told)
            self.told = None
        return out

    def on_status(self, was_live: bool) -> list[Message]:
        out = self.status_output()
        if self.session.finished:
            out.extend(self.end_of_run())
        return out

    def collective_hint(self) -> list[Message]:
        """The warning for a paused rank of a ``torch.distributed`` job, once per connection."""
        if self._hinted or not self.distributed:
            return []
        self._hinted = True
        text = f"tether: {self.table.title(self.key)}: {COLLECTIVE_TIMEOUT_HINT}\n"
        return [dap.event("output", {"category": "important", "output": text})]


class ChildCore(AdapterCore):
    """The session of the child process ``key`` (see the module docstring)."""

    def __init__(
        self,
        run_id: str,
        key: str,
        table: ProcessTable,
        *,
        shared: Origin,
        clock: Callable[[], float],
        request_timeout: float = 30.0,
    ) -> None:
        # a child core exists because its process does, configured by the worker already
        session = DebugSession(live=True)
        self.child_news = ChildNews(run_id, session, key, table)
        super().__init__(
            run_id,
            session=session,
            request_timeout=request_timeout,
            clock=clock,
            shared=shared,
            process=key,
            news=self.child_news,
        )

    def __repr__(self) -> str:
        return f"<ChildCore {self.process} {super().__repr__()[1:]}"

    # --- from the relay ---------------------------------------------------------------------------

    def on_delivery(
        self, stream: StreamName, entry: AnyEntry | Any, *, replaying: bool = False
    ) -> list[Action]:
        if isinstance(entry, StatusEntry):
            if entry.event == StatusEvent.PROCESS_STARTED:
                if not self.session.live:
                    # a new process under a key seen before (pids are reused): a new session
                    self.session = DebugSession(live=True)
                    self.child_news.session = self.session
                self.session.prefetch = entry.data.get("prefetch") is True
            elif entry.event == StatusEvent.PROCESS_EXITED:
                return self.ended(entry.exit_code, replaying=replaying)
            return []  # paused, resumed: the IDE learns the same from debugpy's events
        return super().on_delivery(stream, entry, replaying=replaying)

    def ended(
        self, exit_code: int | None = None, *, why: str = "", replaying: bool = False
    ) -> list[Action]:
        """The process exited, or the run ended (``why``): the IDE session ends too."""
        s = self.session
        if s.finished:
            return []
        s.live, s.finished, s.exit_code = False, True, exit_code
        s.threads.clear()
        s.stopped.clear()
        self.child_news.ended_because = why
        if replaying:
            return []
        actions = self._fail_pending(self.child_news.status_text())
        if self.phase is IdePhase.CONFIGURED:
            actions.extend(self._emit_all(self.news.on_status(was_live=True)))
        return actions

    def _on_event(self, msg: dict[str, Any]) -> list[Action]:
        if msg.get("event") == PLACES_EVENT:
            return []  # the worker's word on its own configuration, folded: never the IDE's
        actions = super()._on_event(msg)
        if actions and msg.get("event") == "stopped":
            actions.extend(self._emit_all(self.child_news.collective_hint()))
        return actions

    def tell(self, text: str) -> list[Action]:
        """One line for this session's debug console: now, or when an IDE connects to it."""
        msg = dap.event("output", {"category": "important", "output": text + "\n"})
        if self.phase is IdePhase.CONFIGURED:
            return [self._emit(msg)]
        self.child_news.told = msg
        return []

    # --- from the IDE -----------------------------------------------------------------------------

    def _note_initialize(self, msg: dict[str, Any]) -> list[Action]:
        # the worker attached to the process itself: the IDE's handshake is not published
        self.client_args = msg.get("arguments", {})
        return []

    def _disconnect(self, msg: dict[str, Any]) -> list[Action]:
        """Detach only, whatever ``terminateDebuggee`` says: the run goes on."""
        actions: list[Action] = [
            self._emit(dap.response(msg)),
            CloseIde(self.generation, "the IDE disconnected", flush=True),
        ]
        actions.extend(self.ide_disconnected(self.generation))
        return actions

    def _terminate(self, msg: dict[str, Any]) -> list[Action]:
        """The IDE's Stop on a child session: its session ends (``terminated``, then the IDE
        disconnects); the process and the run go on."""
        actions: list[Action] = [self._emit(dap.response(msg))]
        if not self.news.terminated_sent:
            self.news.terminated_sent = True
            actions.append(self._emit(dap.event("terminated")))
        return actions
