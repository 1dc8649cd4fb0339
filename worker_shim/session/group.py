"""The ranks of a run on one worker, stopped and moved together (``RunSpec.stop: "all"``).

Theory of operation
-------------------
A rank of a ``torch.distributed`` job that stops at a breakpoint leaves its peers running into
the next collective, where they wait until the process group's watchdog ends the job. So, as an
HPC debugger's process group does, the ranks of a run stop and move as one:

- **Stop together.** When a rank stops (a breakpoint, an exception, a step's end, a pause,
  ``breakpoint()``), every other rank that runs is sent ``pause`` (debugpy's adapter pauses every
  thread of the process whatever ``threadId`` says: it rewrites it to ``"*"``). A rank blocked
  outside Python (in a collective's native wait, a socket) stops only once it is back in Python:
  one that has not stopped within :data:`GROUP_WAIT` is named in a note to the stopped ranks'
  sessions and the worker's log.
- **Move together.** ``continue``, ``next``, ``stepIn``, ``stepOut`` and ``pause`` that an IDE
  sends one rank (it goes there as before) are sent by the worker, as its own request, to every
  other rank: a continue or a step for the thread that rank stopped on, a pause to each that runs.
  A rank still pausing, or still in a group step it has not ended (blocked in a collective), when
  the group moves is owed the move: it is sent once that rank's pause or step stop comes (that
  stop, over at once, and its ``continued`` are not shown: its session is not offered for it). A
  stop of another reason (a breakpoint, an exception) is the rank's own: shown, the group stops
  around it and the owed move is dropped; a pause, or a rank's own stop, drops every owed move
  (the ranks pausing stay paused). A group step is complete when every rank in it stopped: their
  ``stopped`` events are held until then, or until :data:`GROUP_WAIT` passed, and released
  together (the note naming the ranks that did not arrive; their stops are released when they
  come). A rank that joins a group that is stopped, stopping or stepping is paused.

debugpy answers each ``continue`` and step, asked by an IDE or by the worker, with a ``continued``
event, so each rank's session sees its own ``continued`` and ``stopped`` events.

Members are the ranks (:meth:`ProcessInfo.title
<protocol_specs.session.processes.ProcessInfo.title>` says ``rank N``: a DataLoader worker of a
rank inherits ``RANK`` but is not one) debugged on this worker, from when their session is live
until they exit.

**Across nodes** (a run with ``nodes > 1``, ``spans_nodes``): each node's worker has its own
group, and they act as one through the run's ``to_worker`` stream. The group says when the other
nodes must follow (:class:`Announce`: a member stopped on its own, an IDE moved or paused a
member), and takes their word (:meth:`RankGroup.remote_stop`, :meth:`~RankGroup.remote_move`,
:meth:`~RankGroup.remote_pause`) as it takes its own members': another node's stop or pause
pauses the members that run (their stops say which rank they stopped with), its move moves the
stopped ones (owed to those pausing or stepping). Until a move follows another node's stop, the
group is stopped: a member that joins is paused. A group step completes per node.
:mod:`worker_shim.session.node_group` reads and writes the stream's entries.

Sans-I/O: :class:`RankGroup` takes events (a rank's ``stopped`` / ``continued``, an IDE's run
control request for a rank, a tick) and returns :data:`GroupAction` s, which
:class:`worker_shim.session.processes.DebuggedProcesses` performs.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass, field
from enum import StrEnum
from typing import Any, Literal

import orjson

from protocol_specs.session.focus import GROUP_TAG
from protocol_specs.session.stacks import ranks_text

__all__ = [
    "GROUP_WAIT",
    "RUN_CONTROL",
    "Announce",
    "GroupAction",
    "Note",
    "RankGroup",
    "RankState",
    "Release",
    "Send",
]

#: seconds a rank has to stop after the group's first stop, or to end a group step
GROUP_WAIT = 2.0
#: the IDE's requests that move (or pause) a rank: the group's too
RUN_CONTROL = frozenset({"continue", "next", "stepIn", "stepOut", "pause"})
_STEPS = frozenset({"next", "stepIn", "stepOut"})
#: the ``stopped`` reason (debugpy's) of the stop an owed move waits for, by the rank's state
_OWED_STOP = {"pausing": "pause", "stepping": "step"}


class RankState(StrEnum):
    RUNNING = "running"
    PAUSING = "pausing"  #: sent ``pause``, not stopped yet
    STOPPED = "stopped"
    STEPPING = "stepping"  #: in a group step, not stopped yet


@dataclass(frozen=True)
class Send:
    """Send rank ``key``'s debugpy this request as the worker's own (no IDE asked it)."""

    key: str
    command: str
    arguments: dict[str, Any]


@dataclass(frozen=True)
class Release:
    """Hand debugpy's event ``msg`` (``raw``) on to rank ``key``'s session (published as ever)."""

    key: str
    msg: dict[str, Any]
    raw: bytes


@dataclass(frozen=True)
class Note:
    """Tell the sessions of ``keys`` (an ``important`` output) and the worker's log."""

    keys: tuple[str, ...]
    text: str


@dataclass(frozen=True)
class Announce:
    """Tell the other nodes' groups (a run across nodes): member ``rank`` stopped on its own
    (``op="stop"``), or an IDE moved it with ``command`` (``"move"``) or paused it
    (``"pause"``)."""

    op: Literal["stop", "move", "pause"]
    rank: int
    command: str = ""
    arguments: dict[str, Any] = field(default_factory=dict)


GroupAction = Send | Release | Note | Announce


@dataclass
class _Rank:
    key: str
    rank: int
    #: how many members are in each state (the group's, shared): no scan to know who waits
    counts: Counter[RankState] = field(repr=False)
    _state: RankState = RankState.RUNNING
    thread: int | None = None  #: the thread it stopped on
    held: tuple[dict[str, Any], bytes] | None = None  #: its ``stopped``, held for a group step
    quiet: bool = False  #: its next ``continued`` answers a move of a stop nobody was shown
    #: the rank the group paused or moved it along with (its next stop says so), None: its own
    along: int | None = None

    def __post_init__(self) -> None:
        self.counts[self._state] += 1

    @property
    def state(self) -> RankState:
        return self._state

    @state.setter
    def state(self, state: RankState) -> None:
        self.counts[self._state] -= 1
        self.counts[state] += 1
        self._state = state


@dataclass
class RankGroup:
    """The ranks of the run on this worker (see the module docstring)."""

    clock: Callable[[], float]
    wait: float = GROUP_WAIT
    members: dict[str, _Rank] = field(default_factory=dict)
    #: when the ranks not stopped yet are named (a group stop or step under way)
    deadline: float | None = None
    #: a group step is under way: its ranks' ``stopped`` events are held
    stepping: bool = False
    #: how many members are in each state: a rank's stop costs O(1), a group stop O(n)
    counts: Counter[RankState] = field(default_factory=Counter)
    #: the group moves owed to ranks pausing or stepping (by key), sent once they stop: a dict, so
    #: that a group stop drops them without a scan of the members
    owed: dict[str, tuple[str, dict[str, Any]]] = field(default_factory=dict)
    #: its ranks are on one node of several: it announces its own stops and moves
    spans_nodes: bool = False
    #: the rank on another node the group stopped (or paused) with, no move since: None when
    #: no other node stopped it
    held_by: int | None = None

    def __repr__(self) -> str:
        states = " ".join(f"{r.rank}:{r.state.value}" for r in self._ranks())
        return f"<RankGroup {states} stepping={self.stepping} deadline={self.deadline}>"

    def state(self, key: str) -> RankState | None:
        member = self.members.get(key)
        return member.state if member else None

    # --- membership -------------------------------------------------------------------------------

    def joined(self, key: str, rank: int) -> list[GroupAction]:
        """Rank ``rank``'s session (process ``key``) is live. The group is stopped, stopping or in
        a step: it is paused too (else a step would complete with it running)."""
        old = self.members.pop(key, None)
        self.owed.pop(key, None)
        if old is not None:
            old.counts[old.state] -= 1
        held = self.held_by is not None
        if (
            self.counts[RankState.STOPPED]
            or self.counts[RankState.PAUSING]
            or self.stepping
            or held
        ):
            stopped = next((r for r in self.members.values() if r.state is RankState.STOPPED), None)
            member = self.members[key] = _Rank(key, rank, self.counts)
            return self._pause([member], along=stopped.rank if stopped else self.held_by)
        self.members[key] = _Rank(key, rank, self.counts)
        return []

    def left(self, key: str) -> list[GroupAction]:
        """Process ``key`` exited (or its connection ended): a group step waits no more for it."""
        member = self.members.pop(key, None)
        if member is None:
            return []
        self.counts[member.state] -= 1
        self.owed.pop(key, None)
        return self._settle()

    # --- from debugpy -----------------------------------------------------------------------------

    def on_event(self, key: str, msg: dict[str, Any], raw: bytes) -> list[GroupAction]:
        """debugpy's event ``msg`` on rank ``key``'s connection (``stopped`` and ``continued``
        matter; every event is released, a group step's ``stopped`` once the step is complete)."""
        member = self.members.get(key)
        name = msg.get("event")
        if member is None or name not in ("stopped", "continued"):
            return [Release(key, msg, raw)]
        if name == "continued":
            if member.quiet:  # the answer to a move its session never saw the stop of
                member.quiet = False
                return []
            if member.state is RankState.STOPPED:
                member.state = RankState.RUNNING  # a continue the group did not send
            return [Release(key, msg, raw)]
        body = msg.get("body")
        thread = body.get("threadId") if isinstance(body, dict) else None
        member.thread = thread if isinstance(thread, int) else member.thread
        was, member.state = member.state, RankState.STOPPED
        owed = self.owed.pop(key, None)
        reason = body.get("reason") if isinstance(body, dict) else None
        if owed is not None and reason == _OWED_STOP.get(was):
            # the group moved while it was pausing or stepping: it moves now, and its session
            # is not told of a stop that is over at once (nor offered for it)
            command, arguments = owed
            member.state = RankState.STEPPING if command in _STEPS else RankState.RUNNING
            member.quiet = True
            return [self._send(member, command, arguments)]
        told: list[GroupAction] = []
        if was is RankState.RUNNING or owed is not None:
            # a stop of its own (a breakpoint, an exception; one that came before the group's
            # move reached it drops that move), not the group's: the group stops around it
            member.along = None
            self._drop_owed(along=member.rank)
            told = self._announce("stop", member.rank)
        elif member.along is not None and isinstance(body, dict):
            # the session is told which rank it stopped with (the adapter offers it or not)
            msg = {**msg, "body": {**body, GROUP_TAG: {"with": member.along}}}
            raw = orjson.dumps(msg)
        if self.stepping and was is RankState.STEPPING and owed is None:
            member.held = (msg, raw)
            return self._settle()
        pause = self._pause(self._running(), along=member.rank) if self._anyone_running() else []
        return [*told, Release(key, msg, raw), *pause, *self._settle()]

    # --- from the IDE -----------------------------------------------------------------------------

    def on_request(self, key: str, command: str, arguments: Any) -> list[GroupAction]:
        """An IDE's request ``command`` for rank ``key``, forwarded to it as ever: the same move
        for every other rank."""
        member = self.members.get(key)
        if member is None or command not in RUN_CONTROL:
            return []
        args = dict(arguments) if isinstance(arguments, dict) else {}
        if command == "pause":
            self._drop_owed(along=member.rank)  # the ranks pausing stay paused
            if member.state is RankState.RUNNING:
                member.state, member.along = RankState.PAUSING, None
            told = self._announce("pause", member.rank)
            return [*told, *self._pause(self._running(), along=member.rank)]
        told = self._announce("move", member.rank, command, args)
        released = self._release_held()  # a move ends the step before it
        member.state = RankState.STEPPING if command in _STEPS else RankState.RUNNING
        member.along = None
        self.owed.pop(key, None)
        return [*told, *released, *self._move(self._others(key), command, args, member.rank)]

    # --- from the other nodes (a run across nodes) ------------------------------------------------

    def remote_stop(self, along: int) -> list[GroupAction]:
        """Rank ``along``, on another node, stopped on its own: the group stops around it, as
        around a member's own stop (the moves owed are dropped, the members that run paused)."""
        self.held_by = along
        self._drop_owed(along=along)
        return self._pause(self._running(), along=along)

    def remote_pause(self, along: int) -> list[GroupAction]:
        """An IDE paused rank ``along``, on another node: the members that run are paused."""
        return self.remote_stop(along)

    def remote_move(self, command: str, arguments: Any, along: int) -> list[GroupAction]:
        """An IDE moved rank ``along``, on another node, with ``command``: every member gets
        the same move (a stopped one now, one pausing or stepping once it stops)."""
        if command not in RUN_CONTROL - {"pause"}:
            return []
        args = dict(arguments) if isinstance(arguments, dict) else {}
        return [*self._release_held(), *self._move(self._ranks(), command, args, along)]

    def _move(
        self, ranks: list[_Rank], command: str, args: dict[str, Any], along: int
    ) -> list[GroupAction]:
        """The group moves with rank ``along`` (the step before it is over): ``ranks`` that are
        stopped are sent the move, those pausing or stepping are owed it."""
        self.stepping, self.deadline, self.held_by = command in _STEPS, None, None
        moving = RankState.STEPPING if self.stepping else RankState.RUNNING
        actions: list[GroupAction] = []
        for other in ranks:
            if other.state is RankState.STOPPED:
                actions.append(self._send(other, command, args))
                other.state, other.along = moving, along
            elif other.state in (RankState.PAUSING, RankState.STEPPING):
                # not stopped yet (a step of its own not ended: blocked in a collective): it
                # moves once it stops, else its stop would stop the moving group again
                self.owed[other.key], other.along = (command, args), along
        if self.stepping:
            self.deadline = self.clock() + self.wait
        return actions

    # --- time -------------------------------------------------------------------------------------

    @property
    def next_deadline(self) -> float | None:
        return self.deadline

    def on_tick(self) -> list[GroupAction]:
        """The wait for the ranks not stopped yet is over: they are named; a group step's held
        stops are released."""
        if self.deadline is None or self.clock() < self.deadline:
            return []
        self.deadline = None
        late = [r for r in self._ranks() if r.state in (RankState.PAUSING, RankState.STEPPING)]
        if self.stepping:
            self.stepping = False
            actions = self._release_held()
            told = tuple(a.key for a in actions if isinstance(a, Release))
            text = (
                f"tether: {ranks_text(r.rank for r in late)} did not end the step within "
                f"{self.wait:g} s (blocked outside Python, e.g. in a collective); they stop "
                "when they are back in Python"
            )
            return [*actions, Note(told, text)] if late else actions
        if not late:
            return []
        stopped = tuple(r.key for r in self._ranks() if r.state is RankState.STOPPED)
        text = (
            f"tether: {ranks_text(r.rank for r in late)} still running (blocked outside "
            "Python, e.g. in a collective); they pause when they are back in Python"
        )
        return [Note(stopped, text)]

    # --- plumbing ---------------------------------------------------------------------------------

    def _announce(
        self,
        op: Literal["stop", "move", "pause"],
        rank: int,
        command: str = "",
        args: dict[str, Any] | None = None,
    ) -> list[GroupAction]:
        """What the other nodes' groups are told (nothing on a run of one node)."""
        return [Announce(op, rank, command, args or {})] if self.spans_nodes else []

    def _ranks(self) -> list[_Rank]:
        return sorted(self.members.values(), key=lambda r: (r.rank, r.key))

    def _others(self, key: str) -> list[_Rank]:
        return [r for r in self._ranks() if r.key != key]

    def _running(self) -> list[_Rank]:
        return [r for r in self._ranks() if r.state is RankState.RUNNING]

    def _anyone_running(self) -> bool:
        return self.counts[RankState.RUNNING] > 0

    def _drop_owed(self, *, along: int) -> None:
        """The group stops: the moves owed to ranks not stopped yet are not sent (a rank pausing
        stays paused, its stop shown, said to come with rank ``along``)."""
        for key in self.owed:
            member = self.members[key]
            if member.state is RankState.PAUSING:
                member.along = along
        self.owed.clear()

    def _pause(self, ranks: list[_Rank], *, along: int | None) -> list[GroupAction]:
        actions: list[GroupAction] = []
        for member in ranks:
            member.state, member.along = RankState.PAUSING, along
            # debugpy pauses every thread whatever the id says (its adapter sends "*")
            actions.append(self._send(member, "pause", {"threadId": member.thread or 0}))
        if actions and self.deadline is None:
            self.deadline = self.clock() + self.wait
        return actions

    def _send(self, member: _Rank, command: str, arguments: dict[str, Any]) -> Send:
        if command != "pause":
            arguments = {**arguments, "threadId": member.thread or 0}
        return Send(member.key, command, arguments)

    def _settle(self) -> list[GroupAction]:
        """After a rank stopped or left: a group step whose ranks are all in is released; a stop
        with no rank still pausing needs no deadline."""
        if self.stepping and not self.counts[RankState.STEPPING]:
            self.stepping, self.deadline = False, None
            return self._release_held()
        if not self.stepping and not self.counts[RankState.PAUSING]:
            self.deadline = None
        return []

    def _release_held(self) -> list[GroupAction]:
        actions: list[GroupAction] = []
        for member in self._ranks():
            if member.held is not None:
                (msg, raw), member.held = member.held, None
                actions.append(Release(member.key, msg, raw))
        return actions
