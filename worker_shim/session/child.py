"""One child process's debug session: the shim's own connection to debugpy for it, configured at once.

Theory of operation
-------------------
debugpy announces each new Python process of the program (``startDebugging`` / ``debugpyAttach``,
:mod:`worker_shim.session.processes`); the child is held before its user code until a client
configures it. :class:`ChildSession` is that client, on a connection of its own to debugpy's
adapter, and it never waits for an IDE:

1. ``initialize`` (the main session's arguments), then ``attach`` with the configuration debugpy
   gave (its ``subProcessId``) and the run's path mappings;
2. on ``initialized``: the run's latest configuration (``configuration()``, asked at that moment,
   so a child that starts hours later gets the breakpoints set meanwhile), then
   ``configurationDone`` at once. These are the shim's own requests: their answers stay here (no
   IDE asked them), but for which place each of debugpy's breakpoint ids is
   (:data:`~protocol_specs.session.session.PLACES_EVENT`): the process stops at them before any IDE
   session exists for it, and the session it gets later names them by its own ids;
3. live: requests for this process (``DapEntry.process`` = its key) are forwarded with this
   connection's own ``seq`` and answered back under the asker's; requests that come earlier wait.

Everything it publishes carries ``process=key``. Its stops are watched like the main's
(:class:`~worker_shim.session.watch.Watch`, the notice naming the process). Its end (``exited`` then
``terminated``, or the connection closing) is one ``process_exited`` status; after
``terminated`` it says ``disconnect`` and closes its connection.

Sans-I/O, like :class:`worker_shim.session.core.ShimCore`: every method returns actions.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from typing import Any

import orjson

from protocol_specs.runs.runs import RunRecord
from protocol_specs.session.processes import ProcessInfo
from protocol_specs.session.session import BreakpointSet, StatusEvent, places_event
from protocol_specs.wire.wire import MAX_DAP_BODY_BYTES, DapEntry, PresenceEntry

from .actions import Action, CloseChild, Publish, Settle, Terminate
from .channel import DebugpyChannel, Sent, StatusStamp
from .core import request_of
from .replay import ReplayPhase
from .watch import Watch

__all__ = ["ChildSession", "announces_child", "message_of"]

log = logging.getLogger("tether.worker")


class ChildSession:
    def __init__(
        self,
        info: ProcessInfo,
        *,
        title: str,
        record: RunRecord,
        run_dir: str,
        initialize: dict[str, Any],
        attach: dict[str, Any],
        configuration: Callable[[], list[BreakpointSet]],
        clock: Callable[[], float],
        wall: Callable[[], float],
    ) -> None:
        """``attach``: the arguments to attach with (debugpy's configuration for the child, with
        the run's path mappings); ``configuration()``: what to replay once debugpy is ready."""
        self.info = info
        self.key = info.key
        self.title = title
        self.clock = clock
        self._status = StatusStamp(self.key, wall)
        self.watch = Watch(record, run_dir, self._status, name=title)
        self.channel = DebugpyChannel(self, key=self.key, clock=clock, watch=self.watch)
        self._initialize = initialize
        self._attach = attach
        self._configuration = configuration
        self._answered: set[str] = set()
        #: the configuration this core sent itself, by seq, until debugpy answers it
        self._replayed: dict[int, BreakpointSet] = {}
        self._initialized = False
        self._queued: list[DapEntry] = []
        self.exit_code: int | None = None
        self.ended = False  #: ``process_exited`` was published

    def __repr__(self) -> str:
        return f"<ChildSession {self.key} {self.channel!r} ended={self.ended} {self.watch!r}>"

    @property
    def phase(self) -> ReplayPhase:
        return self.channel.phase

    @property
    def live(self) -> bool:
        return self.channel.live

    def start(self) -> list[Action]:
        """The connection is open: the handshake's first step."""
        self.channel.enter(ReplayPhase.INITIALIZING, "connected")
        return self.channel.send("initialize", self._initialize)

    # --- from the relay ---------------------------------------------------------------------------

    def on_request(self, entry: DapEntry) -> list[Action]:
        """A ``to_worker`` request for this process."""
        if self.phase is not ReplayPhase.LIVE:
            self._queued.append(entry)  # forwarded once live
            return []
        msg = request_of(entry)
        if msg is None:
            return []
        return self.channel.forward(entry, msg)

    def presence(self, entry: PresenceEntry) -> list[Action]:
        self.watch.presence(entry, self.clock())
        return self.channel.watch_step()

    # --- from debugpy -----------------------------------------------------------------------------

    def on_message(self, msg: dict[str, Any], raw: bytes) -> list[Action]:
        """One message debugpy sent on this connection (reverse requests are answered by
        :class:`worker_shim.session.processes.DebuggedProcesses`)."""
        kind = msg.get("type")
        if kind == "response":
            return self.channel.on_response(msg)
        if kind == "event":
            return self._on_event(msg, raw)
        return []

    def connection_closed(self) -> list[Action]:
        """The connection ended (or could not be opened): the process's session is over."""
        self.channel.close()
        self._replayed.clear()
        self._queued.clear()
        if self.phase not in (ReplayPhase.LIVE, ReplayPhase.ENDED):
            self.channel.enter(ReplayPhase.ENDED, "debugpy closed the connection")
        return [*self._exited(), *self.channel.watch_step()]

    def answered(self, seq: int, sent: Sent, msg: dict[str, Any]) -> list[Action]:
        """debugpy's answer to request ``seq`` (:class:`~worker_shim.session.channel.ChannelOwner`):
        for one of this core's own, the places of the breakpoints it replayed, and the handshake."""
        if sent.origin is not None:
            return []
        replayed = self._replayed.pop(seq, None)
        places = places_event(replayed, msg) if replayed is not None else None
        body = orjson.dumps(places) if places is not None else b""
        if len(body) > MAX_DAP_BODY_BYTES:  # more than one entry holds: its stops name no id
            log.warning(
                "child %s: too many breakpoints in one request to say their places", self.key
            )
        elif body:
            entry = DapEntry(body=body, process=self.key)
            return [Publish(entry), *self._own_answered(sent, msg)]
        return self._own_answered(sent, msg)

    def _own_answered(self, sent: Sent, msg: dict[str, Any]) -> list[Action]:
        """debugpy's answer to a request of this core's own (the handshake, the replay)."""
        if sent.command == "disconnect":
            return [CloseChild(self.key)]
        if not msg.get("success") and sent.command in ("initialize", "configurationDone"):
            log.warning("child %s: debugpy refused %s: %s", self.key, sent.command, msg)
        self._answered.add(sent.command)
        if sent.command == "initialize" and self.phase is ReplayPhase.INITIALIZING:
            self.channel.enter(ReplayPhase.ATTACHING, "initialize answered")
            actions = self.channel.send("attach", self._attach)
            if self._initialized:
                actions += self._configure()
            return actions
        if {
            "attach",
            "configurationDone",
        } <= self._answered and self.phase is ReplayPhase.FINISHING:
            self.channel.enter(ReplayPhase.LIVE, "configurationDone and attach answered")
            actions = []
            queued, self._queued = self._queued, []
            for entry in queued:
                actions += self.on_request(entry)
            return actions
        return []

    def _on_event(self, msg: dict[str, Any], raw: bytes) -> list[Action]:
        name = msg.get("event")
        body = msg.get("body")
        if name == "initialized":
            self._initialized = True
            if self.phase is ReplayPhase.ATTACHING:
                return self._configure()
        if name == "exited" and isinstance(body, dict) and isinstance(body.get("exitCode"), int):
            self.exit_code = body["exitCode"]
        if name == "terminated":
            # the process is gone: its end, then this connection's
            return [*self._exited(), *self.channel.send("disconnect", {})]
        return self.channel.publish_event(msg, raw, output=False)

    def _configure(self) -> list[Action]:
        """The run's latest configuration and ``configurationDone``, all at once: debugpy takes
        them in order, and nobody waits on their answers."""
        self.channel.enter(ReplayPhase.CONFIGURING, "debugpy initialized")
        actions: list[Action] = []
        for bset in self._configuration():
            sent = self.channel.send(bset.command, bset.arguments)
            if sent:
                self._replayed[self.channel.seq] = bset
            actions += sent
        self.channel.enter(ReplayPhase.FINISHING, "configuration sent")
        return actions + self.channel.send("configurationDone", None)

    def reconfigure(self, plan: list[BreakpointSet]) -> list[Action]:
        """Configure the process anew (its focus changed): ``plan`` sent as this session's own
        requests, the places of the breakpoints it sets said as at the start."""
        actions: list[Action] = []
        for bset in plan:
            sent = self.channel.send(bset.command, bset.arguments)
            if sent:
                self._replayed[self.channel.seq] = bset
            actions += sent
        return actions

    def _exited(self) -> list[Action]:
        if self.ended:
            return []
        self.ended = True
        status = self._status(StatusEvent.PROCESS_EXITED, exit_code=self.exit_code)
        return [Settle(), Publish(status)]

    # --- time -------------------------------------------------------------------------------------

    @property
    def next_deadline(self) -> float | None:
        return self.watch.next_deadline

    def on_tick(self) -> list[Action]:
        return self.channel.watch_step()

    def watch_terminates(self, step: Terminate) -> list[Action]:
        """The unattended policy ends the run (a
        :class:`~worker_shim.session.channel.ChannelOwner`'s decision)."""
        return [step]  # the whole run ends (the run's policy), once: the shim decides

    def stop_holding(self) -> list[Action]:
        """Never held for an IDE (:class:`~worker_shim.session.channel.ChannelOwner`)."""
        return []

    # --- plumbing ---------------------------------------------------------------------------------


def message_of(raw: bytes) -> dict[str, Any] | None:
    """A debugpy message as an object (None: not one)."""
    try:
        msg = orjson.loads(raw)
    except orjson.JSONDecodeError:
        return None
    return msg if isinstance(msg, dict) else None


def announces_child(msg: dict[str, Any]) -> bool:
    """debugpy announces a child process to debug (``startDebugging``, ``debugpyAttach``)."""
    return (msg.get("type") == "request" and msg.get("command") == "startDebugging") or (
        msg.get("type") == "event" and msg.get("event") == "debugpyAttach"
    )
