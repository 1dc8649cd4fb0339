"""What every debug session the shim holds with debugpy shares, the main one's (:class:`ShimCore
<worker_shim.session.core.ShimCore>`) and each child's (:class:`ChildCore
<worker_shim.session.child.ChildCore>`).

Each connection to debugpy has its own ``seq`` space (debugpy's adapter numbers per client); a
request is remembered by that seq with who asked it (``origin``: the adapter instance whose IDE
sent it, and the seq that IDE gave it; ``None``: the shim's own request), so the answer goes back
under the asker's seq. Sans-I/O: the methods return actions.

When a thread stops, the channel asks debugpy what the IDE is about to ask (threads, frames,
scopes, locals, the watches the IDE evaluated since the previous stop) and publishes the answers
as one :data:`~protocol_specs.prefetch.PREFETCH_EVENT` after the ``stopped`` event; the adapter
answers those requests from them (:mod:`protocol_specs.prefetch`).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import orjson

from protocol_specs import dap_models as dap
from protocol_specs.attention import HELD
from protocol_specs.prefetch import PREFETCH_EVENT, RUNS_PROGRAM, STALES, Gathering, WatchList
from protocol_specs.processes import MAIN
from protocol_specs.session import CONFIGURATION_COMMANDS, StatusEvent
from protocol_specs.wire import DapEntry, StatusEntry

from .actions import Action, Publish, Terminate, ToDebugpy, status_entry
from .replay import ReplayPhase, next_phase
from .watch import STACK_FRAMES, Continue, LookUp, Watch

__all__ = ["DebugpyChannel", "Sent"]


@dataclass
class Sent:
    command: str
    origin: str | None  #: None: the shim's own request, answered to the core only
    seq: int = 0  #: the seq its origin gave it


class DebugpyChannel:
    """The seq numbering, the map of sent requests, the replay phase and the status stamp of one
    connection to debugpy (``key``: the process it debugs, :data:`~protocol_specs.processes.MAIN`
    for the program tether started)."""

    key: str = MAIN
    phase: ReplayPhase
    wall: Callable[[], float]
    clock: Callable[[], float]
    watch: Watch

    def _open_channel(self, wall: Callable[[], float]) -> None:
        self.wall = wall
        self.phase = ReplayPhase.FOLDING
        self.closed = False
        self._seq = 0
        self._sent: dict[int, Sent] = {}
        #: the watch's look-ups in flight: seq -> ``stackTrace`` or ``exceptionInfo``
        self._lookups: dict[int, str] = {}
        self._watches = WatchList()  #: watch expressions the IDE evaluated since the last stop
        self._gathering: Gathering | None = None  #: the prefetch of the stop now, in flight
        self._prefetch_sent: dict[int, tuple[str, dict[str, Any]]] = {}

    @property
    def live(self) -> bool:
        return self.phase is ReplayPhase.LIVE

    def answer(self, request: dict[str, Any], error: str = "") -> list[Action]:
        """Answer a reverse request of debugpy on this connection: success, or the ``error``."""
        self._seq += 1
        if error:
            return [ToDebugpy(dap.error_response(request, error, seq=self._seq), self.key)]
        return [ToDebugpy(dap.response(request, {}, seq=self._seq), self.key)]

    def _send(
        self, command: str, arguments: Any, *, origin: str | None = None, seq: int = 0
    ) -> list[Action]:
        if self.closed:
            return []
        self._seq += 1
        self._sent[self._seq] = Sent(command, origin, seq)
        return [ToDebugpy(dap.request(command, arguments, seq=self._seq), self.key)]

    def _watch_step(self) -> list[Action]:
        """Perform what the unattended-stop watch decided: look up where a thread stopped,
        continue it, or end the run (:meth:`_terminated_by_watch`)."""
        actions: list[Action] = []
        while True:
            again = False
            for step in self.watch.step(self.clock()):
                if isinstance(step, LookUp):
                    if self.closed:
                        self.watch.found([])  # debugpy is gone: it says nothing
                        self.watch.found_exception({})
                        again = True
                    else:
                        actions += self._look_up(step)
                elif isinstance(step, Continue) and step.thread_id == HELD:
                    actions += self._stop_holding()
                elif isinstance(step, Continue):
                    actions += self._send("continue", {"threadId": step.thread_id})
                elif isinstance(step, Terminate):
                    actions += self._terminated_by_watch(step)
                else:
                    actions.append(step)
            if not again:
                return actions

    def _terminated_by_watch(self, step: Terminate) -> list[Action]:
        raise NotImplementedError

    def _stop_holding(self) -> list[Action]:
        """The program held for an IDE goes on without one (the unattended policy said so)."""
        return []

    def _look_up(self, step: LookUp) -> list[Action]:
        levels = STACK_FRAMES
        actions = self._send("stackTrace", {"threadId": step.thread_id, "levels": levels})
        self._lookups[self._seq] = "stackTrace"
        if step.exception:
            actions += self._send("exceptionInfo", {"threadId": step.thread_id})
            self._lookups[self._seq] = "exceptionInfo"
        return actions

    def _looked_up(self, seq: int, msg: dict[str, Any]) -> list[Action] | None:
        """debugpy's answer ``msg`` to the watch's look-up ``seq`` (None: it is not one)."""
        command = self._lookups.pop(seq, None)
        if command is None:
            return None
        body = msg.get("body") if msg.get("success") else None
        body = body if isinstance(body, dict) else {}
        if command == "stackTrace":
            frames = body.get("stackFrames")
            self.watch.found(frames if isinstance(frames, list) else [])
        else:
            self.watch.found_exception(body)
        return self._watch_step()

    def _lookups_lost(self) -> None:
        """debugpy is gone: the look-ups in flight are answered with nothing."""
        if self._lookups:
            self._lookups.clear()
            self.watch.found([])
            self.watch.found_exception({})

    def _forward(self, entry: DapEntry, msg: dict[str, Any]) -> list[Action]:
        """The IDE's request ``msg`` (from ``entry``) for this process, live: to debugpy, unless
        the adapter answered it itself. One that runs the program ends the prefetch of the stop
        now: it asks debugpy nothing more (what it would ask would only queue before the step in
        the stopped thread), and what it gathered goes out after the request went to debugpy."""
        command, arguments = msg["command"], msg.get("arguments")
        self._watches.note(command, arguments)
        ended = self._prefetch_publish() if command in RUNS_PROGRAM else []
        if entry.local and command not in CONFIGURATION_COMMANDS:
            return ended  # a request the adapter answered (the handshake, a prefetched answer)
        return self._send(command, arguments, origin=entry.origin, seq=msg["seq"]) + ended

    # --- the stop-time prefetch ---------------------------------------------------------------

    def _prefetch_before(self, event: str) -> list[Action]:
        """debugpy sent ``event``: a stop's prefetch still gathering goes out first, with what it
        has, if the event makes answers stale (the adapter must not keep them past it)."""
        if self._gathering is None or event not in STALES:
            return []
        return self._prefetch_publish()

    def _prefetch_start(self, body: Any) -> list[Action]:
        """A thread stopped (its ``stopped`` event is published): ask what the IDE will."""
        thread = body.get("threadId") if isinstance(body, dict) else None
        if self.closed:
            return []
        if not isinstance(thread, int):  # nothing to ask about: say so (the adapter waits)
            self._gathering = Gathering(0, [])
            return self._prefetch_publish()
        self._gathering = Gathering(thread, self._watches.take())
        return self._prefetch_send(self._gathering.start())

    def _prefetch_answered(self, seq: int, msg: dict[str, Any]) -> list[Action] | None:
        """debugpy's answer to request ``seq`` if it was the prefetch's (else ``None``)."""
        asked = self._prefetch_sent.pop(seq, None)
        if asked is None:
            return None
        if self._gathering is None:
            return []  # the stop's prefetch went out already
        actions = self._prefetch_send(self._gathering.answered(*asked, msg))
        if self._gathering.done:
            actions += self._prefetch_publish()
        return actions

    def _prefetch_send(self, requests: list[tuple[str, dict[str, Any]]]) -> list[Action]:
        if self.closed:
            return []  # nobody answers: the stop's prefetch never goes out, the adapter asks
        actions: list[Action] = []
        for command, arguments in requests:
            self._seq += 1
            self._sent[self._seq] = Sent(command, None)
            self._prefetch_sent[self._seq] = (command, arguments)
            message = dap.request(command, arguments, seq=self._seq)
            actions.append(ToDebugpy(message, self.key, prefetch=True))
        return actions

    def _prefetch_publish(self) -> list[Action]:
        gathering, self._gathering = self._gathering, None
        if gathering is None:
            return []
        event = {"seq": 1, "type": "event", "event": PREFETCH_EVENT, "body": gathering.body()}
        entry = DapEntry(body=orjson.dumps(event), transient=True, process=self.key)
        return [Publish(entry)]

    def _enter(self, phase: ReplayPhase, why: str) -> None:
        self.phase = next_phase(self.phase, phase, why)

    def _status(self, event: StatusEvent, **fields: Any) -> StatusEntry:
        if self.key != MAIN:
            fields["process"] = self.key
        return status_entry(event, self.wall, **fields)
