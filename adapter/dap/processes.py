"""One IDE session per debugged process: which core an entry or a connection is for, and which
children the IDE is offered; decided synchronously.

Theory of operation
-------------------
:class:`Processes` holds the main process's core (:class:`adapter.dap.core.AdapterCore`) and a
:class:`adapter.dap.children.ChildCore` per child process, created on its ``process_started`` status
or its first entry. Deliveries are dispatched by ``entry.process``: the main's (``""``) and
every status about the run go to the main core (notices too: they name the process, and the
terminal hears of them there); a child's to its core. The end of the run, or of an attempt, ends
every child's session. The statuses about processes are folded into a
:class:`~protocol_specs.session.processes.ProcessTable`, which names them.

IDE connections: a new connection waits in a :class:`_Lobby` (its ``initialize`` answered
locally, as debugpy would) until it says which session it is for. ``attach`` with
``subProcessId`` binds it to that child's core: an extra session beside the main one, and a
second connection for the same child takes that session over. Any other ``attach`` (or any other
request) binds it to the main core, taking the main session over as before. The connection keeps
its number (``generation``) and the ``seq`` it was numbered up to.

Offers (:class:`~protocol_specs.session.processes.ProcessMode`, the run's ``processes``): ``stopped``
offers a child to the main IDE when it first stops, ``all`` when it starts, ``main`` never; each
child at most once per main IDE connection, and not while an IDE is attached to it. A main IDE
that (re)configures is offered every child that is paused (``stopped``) or alive (``all``). The
offer is the standard ``startDebugging`` reverse request (debugpy's ``debugpyAttach`` event for a
client without it, :meth:`AdapterCore.offer`), with the main IDE's attach arguments, the process's
name, its pid as ``subProcessId`` and this adapter's address.

Focus and many ranks (:mod:`adapter.dap.focus`): a rank outside the focus is not offered; the
``tetherFocus`` request, answered here in any session, sets the focus and offers each focused rank
at once; in a group of more than 8 ranks, a rank paused along with another is not offered
(``stopped`` mode), the other's session is told of it in one line.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from protocol_specs.dap import models as dap
from protocol_specs.session.focus import FOCUS_COMMAND, OFFER_ALL_UP_TO, summary_text
from protocol_specs.session.processes import (
    COLLECTIVE_TIMEOUT_HINT,
    MAIN,
    ProcessMode,
    ProcessState,
    ProcessTable,
)
from protocol_specs.session.session import NOTICES, StatusEvent
from protocol_specs.wire.wire import AnyEntry, DapEntry, StatusEntry, StreamName

from .actions import Action, CloseIde, IdePhase, Say, ToIde
from .checks import check_request, garbage_note
from .children import ChildCore
from .core import ADAPTER_CAPABILITIES, AdapterCore
from .focus import RankFocus, is_group_stop, rank_of

__all__ = ["DEFAULT_PORT", "LOCALHOST", "Processes"]

LOCALHOST = "127.0.0.1"
#: the adapter's port when nobody said (``tether debug``'s default)
DEFAULT_PORT = 5678
#: what the main IDE's attach arguments lose in a child's configuration (as in debugpy's
#: ``notify_of_subprocess``: they describe how the main session was started)
NOT_INHERITED = frozenset(
    {"processId", "listen", "request", "restart", "preLaunchTask", "postDebugTask"}
)
#: run statuses after which no process of the attempt before is left
_ATTEMPT_OVER = frozenset({StatusEvent.STARTED, StatusEvent.RETRYING})


class _Lobby:
    """A connection that has not said yet which session it is for."""

    def __init__(self, generation: int) -> None:
        self.generation = generation
        self.seq = 0  #: messages it was sent
        self.initialize: dict[str, Any] | None = None  #: its (answered) initialize request

    def emit(self, message: dict[str, Any]) -> ToIde:
        self.seq += 1
        return ToIde({**message, "seq": self.seq}, self.generation)


@dataclass
class _Offers:
    """What one main IDE connection was offered."""

    generation: int
    offered: set[str] = field(default_factory=set)  #: the children offered
    #: ``startDebugging`` requests it has yet to answer: seq -> the child's name
    unanswered: dict[int, str] = field(default_factory=dict)
    refused: bool = False  #: it refused one (said once)


class Processes:
    """The sessions of a run's processes in one adapter (see the module docstring)."""

    def __init__(
        self,
        main: AdapterCore,
        *,
        mode: ProcessMode | str = ProcessMode.STOPPED,
        port: int = 0,
        focus: list[int] | None = None,
    ) -> None:
        self.main = main
        self.mode = ProcessMode(mode)
        #: this adapter's port, named in offers (0: the port the main IDE says it attached to)
        self.port = port
        self.table = ProcessTable()
        self.children: dict[str, ChildCore] = {}
        self._lobby: dict[int, _Lobby] = {}
        self._bound: dict[int, str] = {}  #: connection -> the process its session is for
        self._offers = _Offers(0)
        self._hinted: set[str] = set()  #: processes the terminal heard the collective hint for
        #: the ranks in focus (``tether attach --ranks``, ``tetherFocus``), large groups' summaries
        self.focus = RankFocus(self.table, main.clock, focus, pending=focus is not None)
        main.shared.attached = self._attached

    def __repr__(self) -> str:
        return (
            f"<Processes mode={self.mode.value} children={sorted(self.children)} "
            f"lobby={len(self._lobby)} bound={self._bound}>"
        )

    def cores(self) -> list[AdapterCore]:
        return [self.main, *self.children.values()]

    def core_of(self, generation: int) -> AdapterCore | None:
        """The core a connection is bound to, while it is that core's connection."""
        key = self._bound.get(generation)
        core = self.main if key == MAIN else self.children.get(key or "")
        if core is None or core.generation != generation or core.phase is IdePhase.NONE:
            return None
        return core

    def _attached(self) -> bool:
        return any(core.phase is not IdePhase.NONE for core in self.cores())

    # --- IDE connections --------------------------------------------------------------------------

    def connected(self) -> int:
        """A new IDE connection (its number): it waits in the lobby for now."""
        generation = self.main.shared.next_generation()
        self._lobby[generation] = _Lobby(generation)
        return generation

    def ide_disconnected(self, generation: int) -> list[Action]:
        self._lobby.pop(generation, None)
        key = self._bound.pop(generation, None)
        core = self.main if key == MAIN else self.children.get(key or "")
        if core is None:
            return []
        actions = core.ide_disconnected(generation)
        if isinstance(core, ChildCore) and core.session.finished and core.phase is IdePhase.NONE:
            del self.children[core.process]  # nobody will attach to it again
        return actions

    def on_ide_message(self, generation: int, msg: dict[str, Any]) -> list[Action]:
        lobby = self._lobby.get(generation)
        if lobby is not None:
            return self._in_lobby(lobby, msg)
        core = self.core_of(generation)
        if core is None:
            return []
        if core is self.main and msg.get("type") == "response":
            return self._offer_answered(msg)
        if msg.get("type") == "request" and msg.get("command") == FOCUS_COMMAND:
            return self._focus_request(core, msg)
        if core is not self.main or core.phase is IdePhase.CONFIGURED:
            return core.on_ide_message(msg)
        actions = core.on_ide_message(msg)
        if self.main.configured:  # just configured: the children it may attach to now
            if self.focus.pending:
                actions.append(self.focus.record(self.main.shared))
            actions.extend(self._offer_known())
        return actions

    def _focus_request(self, core: AdapterCore, msg: dict[str, Any]) -> list[Action]:
        """``tetherFocus`` in any session: the focus is set (and recorded for the worker), each
        focused rank alive and not offered yet is offered now. With ``"add": true`` the ranks
        asked for join the focus (no focus stays no focus) and only they are offered: how the
        Ranks view opens one rank without narrowing what every IDE of the run sees."""
        arguments = msg.get("arguments")
        try:
            asked = self.focus.request(arguments)
        except ValueError as exc:
            return [core.emit(dap.error_response(msg, str(exc), show_user=True))]
        ranks = self.focus.ranks
        actions: list[Action] = [self.focus.record(self.main.shared)]
        offered: list[str] = []
        focused = set(asked or ())
        for child in list(self.children.values()):
            rank = rank_of(self.table, child.process)
            if rank is None or rank not in focused or not self._offerable(child):
                continue
            offer = self._offer(child)
            if offer:
                offered.append(self.table.title(child.process))
                actions.extend(offer)
        # after the offers: each connection's messages go out in the order they are numbered
        return [*actions, core.emit(dap.response(msg, {"ranks": ranks, "offered": offered}))]

    def on_ide_garbage(self, generation: int, reason: str) -> list[Action]:
        lobby = self._lobby.get(generation)
        if lobby is not None:
            return [lobby.emit(garbage_note(reason))]
        core = self.core_of(generation)
        return core.on_ide_garbage(reason) if core is not None else []

    def _in_lobby(self, lobby: _Lobby, msg: dict[str, Any]) -> list[Action]:
        if msg.get("type") != "request":
            return []
        checked = check_request(msg)
        if isinstance(checked, str):
            return [lobby.emit(garbage_note(checked))]
        if checked.get("type") == "response":
            return [lobby.emit(checked)]
        command = checked["command"]
        if command == "initialize":
            lobby.initialize = checked
            return [lobby.emit(dap.response(checked, ADAPTER_CAPABILITIES))]
        if command in ("disconnect", "terminate"):
            # it never attached: it leaves without taking any session over
            why = "the IDE disconnected before it attached"
            return [lobby.emit(dap.response(checked)), CloseIde(lobby.generation, why, flush=True)]
        core: AdapterCore = self.main
        if command == "attach" and "subProcessId" in checked.get("arguments", {}):
            key = self._child_key(checked["arguments"]["subProcessId"])
            child = self.children.get(key)
            if child is None:
                text = (
                    f"No process {key[:40]} in run {self.main.run_id}: it exited, or it is not a "
                    "debugged process of this run."
                )
                return [lobby.emit(dap.error_response(checked, text, show_user=True))]
            core = child
        del self._lobby[lobby.generation]
        self._bound[lobby.generation] = core.process
        actions = core.ide_connected(lobby.generation, greeted=lobby.initialize, sent=lobby.seq)
        return actions + self.on_ide_message(lobby.generation, checked)

    # --- from the relay ---------------------------------------------------------------------------

    def on_delivery(
        self, stream: StreamName, entry: AnyEntry | Any, *, replaying: bool = False
    ) -> list[Action]:
        """Fold one delivered entry into the core of its process."""
        key = entry.process if isinstance(entry, DapEntry | StatusEntry) else MAIN
        said: list[Action] = []
        if stream is StreamName.TO_WORKER and isinstance(entry, DapEntry):
            self.focus.fold(entry)  # any adapter's focus, the last one wins
        if isinstance(entry, StatusEntry):
            if entry.event in (StatusEvent.PROCESS_STARTED, StatusEvent.PROCESS_EXITED):
                self.focus.processes_changed()
            self.table.apply(entry)
            if entry.event in NOTICES:
                key = MAIN  # news for the person, named by the process
            elif entry.event == StatusEvent.PAUSED and not replaying:
                said = self._collective_hint(key)
        if key == MAIN:
            return said + self._main_delivery(stream, entry, replaying)
        child = self.children.get(key)
        if child is None:
            if stream is not StreamName.TO_IDE or self.table.state(key) is ProcessState.EXITED:
                return []  # a request for a process that is gone, or the news of its end
            child = self.children[key] = ChildCore(
                self.main.run_id,
                key,
                self.table,
                shared=self.main.shared,
                clock=self.main.clock,
                request_timeout=self.main.request_timeout,
            )
        actions = said + child.on_delivery(stream, entry, replaying=replaying)
        if child.session.finished and child.phase is IdePhase.NONE:
            del self.children[key]  # nobody attached: forget it (a pool may start thousands)
        elif not replaying and stream is StreamName.TO_IDE:
            if self._wanted(child):
                actions.extend(self._offer(child))
            elif isinstance(entry, DapEntry) and (stop := is_group_stop(entry)) is not None:
                actions.extend(self._summarize(child, stop))
        return actions

    def _summarize(self, child: ChildCore, stop: dict[str, Any]) -> list[Action]:
        """A rank a large group stop paused, not offered: the session of the rank it paused
        with hears of it (with the others, once they are all paused)."""
        rank = rank_of(self.table, child.process)
        with_rank = self.focus.summarized(rank, stop)
        if rank is None or with_rank is None or self.mode is not ProcessMode.STOPPED:
            return []
        return self._tell_summary(with_rank, self.focus.hold(rank, with_rank))

    def _tell_summary(self, with_rank: int, ranks: list[int]) -> list[Action]:
        if not ranks:
            return []
        text = summary_text(ranks, with_rank, self.main.run_id)
        for child in self.children.values():
            if rank_of(self.table, child.process) == with_rank:
                return child.tell(text)
        return [Say(text)]  # its session is gone: the terminal hears it

    def _collective_hint(self, key: str) -> list[Action]:
        """The terminal hears once per process that a paused rank stalls its peers."""
        info = self.table.info(key)
        if info is None or (info.world_size or 0) < 2 or key in self._hinted:
            return []
        self._hinted.add(key)
        if len(self._hinted) > OFFER_ALL_UP_TO:
            return []  # many ranks: the terminal heard it for the first ones
        return [Say(f"{self.table.title(key)} is paused: {COLLECTIVE_TIMEOUT_HINT}")]

    def _main_delivery(
        self, stream: StreamName, entry: AnyEntry | Any, replaying: bool
    ) -> list[Action]:
        was_finished = self.main.session.finished
        actions = self.main.on_delivery(stream, entry, replaying=replaying)
        if self.main.session.finished and not was_finished:
            actions.extend(self._end_children("the run ended", replaying))
        elif isinstance(entry, StatusEntry) and entry.event in _ATTEMPT_OVER:
            actions.extend(self._end_children("its attempt of the run ended", replaying))
        return actions

    def _end_children(self, why: str, replaying: bool) -> list[Action]:
        actions: list[Action] = []
        for key, child in list(self.children.items()):
            actions.extend(child.ended(why=why, replaying=replaying))
            if child.phase is IdePhase.NONE:
                del self.children[key]
        return actions

    # --- offers -----------------------------------------------------------------------------------

    def _offerable(self, child: ChildCore) -> bool:
        return (
            self.mode is not ProcessMode.MAIN
            and not child.session.finished
            and child.phase is IdePhase.NONE  # else an IDE is attached to it already
        )

    def _wanted(self, child: ChildCore) -> bool:
        """Whether the main IDE should be offered ``child`` now (the run's mode says when, the
        focus which ranks, the size of the group whether a rank paused with another is)."""
        if not self._offerable(child):
            return False
        rank = rank_of(self.table, child.process)
        if not self.focus.shows(rank):
            return False
        if self.mode is ProcessMode.ALL:
            return True
        stops = list(child.session.stopped.values())
        return bool(stops) and self.focus.summarized(rank, stops[-1]) is None

    def _offer_known(self) -> list[Action]:
        actions: list[Action] = []
        for child in list(self.children.values()):
            if self._wanted(child):
                actions.extend(self._offer(child))
        return actions

    def _offer(self, child: ChildCore) -> list[Action]:
        """Offer the main IDE a session for ``child``: ``startDebugging`` (a reverse request),
        or debugpy's ``debugpyAttach`` event for a client that did not say it supports that."""
        main = self.main
        if main.phase is not IdePhase.CONFIGURED:
            return []  # offered when it configures
        if self._offers.generation != main.generation:
            self._offers = _Offers(main.generation)
        if child.process in self._offers.offered:
            return []
        self._offers.offered.add(child.process)
        configuration = self.configuration(child.process)
        if main.client_args.get("supportsStartDebuggingRequest") is True:
            arguments = {"request": "attach", "configuration": configuration}
            sent = main.emit(dap.request("startDebugging", arguments))
            self._offers.unanswered[sent.message["seq"]] = configuration["name"]
            return [sent]
        return [main.emit(dap.event("debugpyAttach", configuration))]

    def _offer_answered(self, msg: dict[str, Any]) -> list[Action]:
        """The main IDE's answer to ``startDebugging``: swallowed (the core never sees it); a
        refusal is said in its debug console, once per connection (every child would fail
        alike)."""
        offers = self._offers
        if offers.generation != self.main.generation:
            return []
        name = offers.unanswered.pop(msg.get("request_seq", -1), None)
        if name is None or msg.get("success") is not False or offers.refused:
            return []
        offers.refused = True
        why = msg.get("message") or "no reason given"
        text = (
            f"tether: the IDE did not open a debug session for {name} ({why}); an attach "
            'configuration for this adapter with "subProcessId": <its pid> opens one.\n'
        )
        return [self.main.emit(dap.event("output", {"category": "important", "output": text}))]

    def _child_key(self, said: Any) -> str:
        """The key of the child an attach's ``subProcessId`` names: offers carry the pid, which
        is the key on node 0 but not on node K >= 1 (``n1``, ``n1:PID``), whose pid is found in
        the table (a pid on two nodes at once names neither: the key itself still does)."""
        key = str(said)
        if key in self.children:
            return key
        owners = [k for k in self.children if (info := self.table.info(k)) and info.pid == said]
        return owners[0] if len(owners) == 1 else key

    def configuration(self, key: str) -> dict[str, Any]:
        """The attach configuration a child is offered with (``startDebugging``)."""
        inherited = {k: v for k, v in self.main.attach_args.items() if k not in NOT_INHERITED}
        info = self.table.info(key)
        pid = info.pid if info is not None else int(key) if key.isdigit() else key
        return {
            **inherited,
            "request": "attach",
            "name": self.table.title(key),
            "subProcessId": pid,
            "connect": {"host": LOCALHOST, "port": self._port()},
        }

    def _port(self) -> int:
        if self.port:
            return self.port
        connect = self.main.attach_args.get("connect")
        said = connect.get("port") if isinstance(connect, dict) else None
        said = said if said is not None else self.main.attach_args.get("port")
        return said if isinstance(said, int) and not isinstance(said, bool) else DEFAULT_PORT

    # --- the relay link and time ------------------------------------------------------------------

    def relay_link_changed(self, up: bool, detail: str) -> list[Action]:
        actions = self.main.relay_link_changed(up, detail)
        for child in self.children.values():
            # presence is the adapter's (published once above); the news is every console's
            actions.extend(a for a in child.relay_link_changed(up, detail) if isinstance(a, ToIde))
        return actions

    def publish_refused(self, process: str, origin_seq: int | None, message: str) -> list[Action]:
        core = self.children.get(process, self.main) if process != MAIN else self.main
        return core.publish_refused(origin_seq, message)

    @property
    def next_deadline(self) -> float | None:
        deadlines = [d for core in self.cores() if (d := core.next_deadline) is not None]
        if self.focus.deadline is not None:
            deadlines.append(self.focus.deadline)
        return min(deadlines, default=None)

    def on_tick(self) -> list[Action]:
        actions = [action for core in self.cores() for action in core.on_tick()]
        for with_rank, ranks in self.focus.due().items():
            actions.extend(self._tell_summary(with_rank, ranks))
        return actions
