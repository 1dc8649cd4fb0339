"""One connection of the shim to debugpy: what the main process's session (:class:`ShimCore
<worker_shim.session.core.ShimCore>`) and each child's (:class:`ChildSession
<worker_shim.session.child.ChildSession>`) both have, one :class:`DebugpyChannel` each.

Each connection to debugpy has its own ``seq`` space (debugpy's adapter numbers per client); a
request is remembered by that seq with who asked it (``origin``: the adapter instance whose IDE
sent it, and the seq that IDE gave it; ``None``: the shim's own request), so the answer goes back
under the asker's seq. What only the session knows (what its own requests' answers mean, what an
unattended stop's end of the run or of the hold is for it) it decides when the channel asks it
(:class:`ChannelOwner`). Sans-I/O: the methods return actions.

When a thread stops, the channel asks debugpy what the IDE is about to ask (threads, frames,
scopes, locals, the watches the IDE evaluated since the previous stop) and publishes the answers
as one :data:`~protocol_specs.session.prefetch.PREFETCH_EVENT` after the ``stopped`` event; the adapter
answers those requests from them (:mod:`protocol_specs.session.prefetch`).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from enum import StrEnum
from typing import Any, Protocol

import orjson

from protocol_specs.dap import models as dap
from protocol_specs.session.attention import HELD
from protocol_specs.session.prefetch import (
    PREFETCH_EVENT,
    RUNS_PROGRAM,
    STALES,
    Gathering,
    WatchList,
)
from protocol_specs.session.processes import MAIN, node_main, node_of
from protocol_specs.session.session import CONFIGURATION_COMMANDS, StatusEvent, is_transient
from protocol_specs.wire.wire import DapEntry, StatusEntry

from .actions import (
    BARRIER_EVENTS,
    Action,
    MovedAlone,
    Publish,
    Settle,
    Terminate,
    ToDebugpy,
    status_entry,
)
from .replay import ReplayPhase, next_phase
from .watch import STACK_FRAMES, Continue, LookUp, Watch

__all__ = [
    "DROPPED_EVENTS",
    "ChannelOwner",
    "DebugpyChannel",
    "LookUpAsk",
    "Sent",
    "StatusStamp",
]

#: debugpy's own events that are about the worker-side connection, not the program
DROPPED_EVENTS = frozenset(
    {"initialized", "debugpyWaitingForServer", "debugpySockets", "terminated"}
)


class LookUpAsk(StrEnum):
    """What the watch's look-up asks debugpy (:class:`~worker_shim.session.watch.LookUp`)."""

    WHERE = "stackTrace"  #: where the thread stopped: its frames
    EXCEPTION = "exceptionInfo"  #: the exception it stopped on


@dataclass
class Sent:
    command: str
    origin: str | None  #: None: the shim's own request, answered to the session only
    seq: int = 0  #: the seq its origin gave it


@dataclass(frozen=True)
class StatusStamp:
    """Makes the status entries of the process ``key``, stamped with the ``wall`` clock."""

    key: str
    wall: Callable[[], float]

    def __call__(self, event: StatusEvent, **fields: Any) -> StatusEntry:
        if self.key != MAIN:
            fields["process"] = self.key
        return status_entry(event, self.wall, **fields)


class ChannelOwner(Protocol):
    """What the session that has a channel decides for it."""

    def answered(self, seq: int, sent: Sent, msg: dict[str, Any]) -> list[Action]:
        """debugpy's answer ``msg`` to request ``seq`` (``sent``), neither the prefetch's nor a
        look-up's; one with an origin is already published back to it."""
        ...

    def stop_holding(self) -> list[Action]:
        """The program held for an IDE goes on without one (the unattended policy said so)."""
        ...

    def watch_terminates(self, step: Terminate) -> list[Action]:
        """The unattended policy ends the run."""
        ...


class DebugpyChannel:
    """The seq numbering, the map of sent requests, the replay phase, the stop-time prefetch and
    the watch's look-ups of one connection to debugpy (``key``: the process it debugs,
    :data:`~protocol_specs.session.processes.MAIN` for the program tether started)."""

    def __init__(
        self, owner: ChannelOwner, *, key: str, clock: Callable[[], float], watch: Watch
    ) -> None:
        """``clock`` is monotonic (the watch's deadlines)."""
        self.owner = owner
        self.key = key
        self.clock = clock
        self.watch = watch
        self.phase = ReplayPhase.FOLDING
        self.closed = False
        self.seq = 0  #: the seq of the last request or response sent on this connection
        self._sent: dict[int, Sent] = {}
        self._lookups: dict[int, LookUpAsk] = {}  #: the watch's look-ups in flight, by seq
        self._watches = WatchList()  #: watch expressions the IDE evaluated since the last stop
        self._gathering: Gathering | None = None  #: the prefetch of the stop now, in flight
        self._prefetch_sent: dict[int, tuple[str, dict[str, Any]]] = {}

    def __repr__(self) -> str:
        return f"phase={self.phase.value} seq={self.seq} sent={len(self._sent)}"

    @property
    def live(self) -> bool:
        return self.phase is ReplayPhase.LIVE

    def enter(self, phase: ReplayPhase, why: str) -> None:
        self.phase = next_phase(self.phase, phase, why)

    def answer(self, request: dict[str, Any], error: str = "") -> list[Action]:
        """Answer a reverse request of debugpy on this connection: success, or the ``error``."""
        self.seq += 1
        if error:
            return [ToDebugpy(dap.error_response(request, error, seq=self.seq), self.key)]
        return [ToDebugpy(dap.response(request, {}, seq=self.seq), self.key)]

    def send(
        self, command: str, arguments: Any, *, origin: str | None = None, seq: int = 0
    ) -> list[Action]:
        """Send debugpy a request (none once the connection closed); it is numbered :attr:`seq`."""
        if self.closed:
            return []
        self.seq += 1
        self._sent[self.seq] = Sent(command, origin, seq)
        return [ToDebugpy(dap.request(command, arguments, seq=self.seq), self.key)]

    def move(self, command: str, arguments: Any) -> list[Action]:
        """The worker's own run control request (a rank group's move or pause of this process):
        as an IDE's (:meth:`forward`), one that runs the program ends the prefetch of the stop
        now. What the prefetch would still ask queues in the stopped thread before the move, and
        debugpy's ``continued`` waits for it: with 16 ranks moved at once, each rank's session
        was told hundreds of milliseconds late."""
        ended = self._prefetch_publish() if command in RUNS_PROGRAM else []
        return self.send(command, arguments) + ended

    def prefetch_asked(self, seq: Any) -> tuple[str, dict[str, Any]] | None:
        """The stop's prefetch request ``seq`` (command, arguments), while unanswered."""
        return self._prefetch_sent.get(seq) if isinstance(seq, int) else None

    def claim(self, seq: int) -> Sent | None:
        """Request ``seq``'s answer is taken by someone else (a cross-rank evaluation,
        :mod:`worker_shim.session.rank_eval`): it is forgotten here."""
        return self._sent.pop(seq, None)

    def close(self) -> None:
        """debugpy closed the connection: nothing more is answered, nor sent."""
        self.closed = True
        self._sent.clear()
        if self._lookups:  # the look-ups in flight are answered with nothing
            self._lookups.clear()
            self.watch.found([])
            self.watch.found_exception({})

    def forward(self, entry: DapEntry, msg: dict[str, Any]) -> list[Action]:
        """The IDE's request ``msg`` (from ``entry``) for this process, live: to debugpy, unless
        the adapter answered it itself. One that runs the program ends the prefetch of the stop
        now: it asks debugpy nothing more (what it would ask would only queue before the step in
        the stopped thread), and what it gathered goes out after the request went to debugpy."""
        command, arguments = msg["command"], msg.get("arguments")
        self._watches.note(command, arguments)
        ended = self._prefetch_publish() if command in RUNS_PROGRAM else []
        if entry.local and command not in CONFIGURATION_COMMANDS:
            return ended  # a request the adapter answered (the handshake, a prefetched answer)
        return self.send(command, arguments, origin=entry.origin, seq=msg["seq"]) + ended

    # --- from debugpy -----------------------------------------------------------------------------

    def on_response(self, msg: dict[str, Any]) -> list[Action]:
        """debugpy's response ``msg``: published back under the asker's seq if an IDE asked, the
        prefetch's and the watch's taken here, and the session told
        (:meth:`ChannelOwner.answered`)."""
        request_seq = msg.get("request_seq")
        if not isinstance(request_seq, int):
            return []
        sent = self._sent.pop(request_seq, None)
        if sent is None:
            return []
        actions: list[Action] = []
        if sent.origin is not None:
            body = orjson.dumps({**msg, "request_seq": sent.seq})
            transient = is_transient(msg, sent.command)
            entry = DapEntry(origin=sent.origin, body=body, transient=transient, process=self.key)
            actions += [Settle(), Publish(entry)]
        else:
            prefetched = self._prefetch_answered(request_seq, msg)
            if prefetched is not None:
                return prefetched
            looked_up = self._looked_up(request_seq, msg)
            if looked_up is not None:
                return looked_up
        return actions + self.owner.answered(request_seq, sent, msg)

    def publish_event(self, msg: dict[str, Any], raw: bytes, *, output: bool) -> list[Action]:
        """debugpy's event ``msg`` (``raw``), once the session took what it needs of it: published
        (but those about the shim's own connection, and telemetry), the watch told, a stop's
        prefetch started. ``output``: the main session's output holding counts it."""
        name = msg.get("event")
        if name in DROPPED_EVENTS:
            return []
        body = msg.get("body")
        if name == "output" and isinstance(body, dict) and body.get("category") == "telemetry":
            return []
        actions = self._prefetch_before(str(name))
        if name in BARRIER_EVENTS:
            actions.append(Settle())
        self.watch.debugger_event(msg, self.clock())
        entry = DapEntry(body=raw, transient=is_transient(msg), process=self.key)
        actions.append(Publish(entry, output=output))
        if name == "stopped":
            actions += self._prefetch_start(body)
        return actions + self.watch_step()

    # --- the watch --------------------------------------------------------------------------------

    def watch_step(self) -> list[Action]:
        """Perform what the unattended-stop watch decided: look up where a thread stopped,
        continue it, stop holding the program, or end the run (the last two the session's)."""
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
                    actions += self.owner.stop_holding()
                elif isinstance(step, Continue):
                    arguments = {"threadId": step.thread_id}
                    actions += self.send("continue", arguments)
                    if self.key != node_main(node_of(self.key)):  # a rank's group moves too
                        actions.append(MovedAlone(self.key, "continue", arguments))
                elif isinstance(step, Terminate):
                    actions += self.owner.watch_terminates(step)
                else:
                    actions.append(step)
            if not again:
                return actions

    def suspend_outcome(self, ok: bool, text: str) -> list[Action]:
        """How the run's suspend went (:meth:`Watch.suspend_outcome`), and what follows."""
        self.watch.suspend_outcome(ok, text, self.clock())
        return self.watch_step()

    def _look_up(self, step: LookUp) -> list[Action]:
        levels = STACK_FRAMES
        actions = self.send(LookUpAsk.WHERE, {"threadId": step.thread_id, "levels": levels})
        self._lookups[self.seq] = LookUpAsk.WHERE
        if step.exception:
            actions += self.send(LookUpAsk.EXCEPTION, {"threadId": step.thread_id})
            self._lookups[self.seq] = LookUpAsk.EXCEPTION
        return actions

    def _looked_up(self, seq: int, msg: dict[str, Any]) -> list[Action] | None:
        """debugpy's answer ``msg`` to the watch's look-up ``seq`` (None: it is not one)."""
        asked = self._lookups.pop(seq, None)
        if asked is None:
            return None
        body = msg.get("body") if msg.get("success") else None
        body = body if isinstance(body, dict) else {}
        if asked is LookUpAsk.WHERE:
            frames = body.get("stackFrames")
            self.watch.found(frames if isinstance(frames, list) else [])
        else:
            self.watch.found_exception(body)
        return self.watch_step()

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
            self.seq += 1
            self._sent[self.seq] = Sent(command, None)
            self._prefetch_sent[self.seq] = (command, arguments)
            message = dap.request(command, arguments, seq=self.seq)
            actions.append(ToDebugpy(message, self.key, prefetch=True))
        return actions

    def _prefetch_publish(self) -> list[Action]:
        gathering, self._gathering = self._gathering, None
        if gathering is None:
            return []
        event = {"seq": 1, "type": "event", "event": PREFETCH_EVENT, "body": gathering.body()}
        entry = DapEntry(body=orjson.dumps(event), transient=True, process=self.key)
        return [Publish(entry)]
