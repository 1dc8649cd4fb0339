"""The relay's half of a run link, without sockets or Redis: what it admits, in which order it
stores and answers publishes, which go to the peers early, and how acks and commits are batched.

The peer's half is :class:`protocol_specs.link.link.LinkState`; ``relay/links/links.py`` and
``relay/links/delivery.py`` are thin trio loops over this module: they read frames, call Redis
and the fanout, and perform the actions returned here.

Theory of operation
-------------------
A link's receiver hands each ``publish`` to :meth:`RelayLinkState.admit`, which decodes its
entry and decides, once and for the link's life per entry kind, whether the link may publish it
(``protocol_specs/access/permissions.py``'s table; a worker serving an ended attempt publishes nothing; a
tunnel's link carries only tunnel steps and a run's link none). The publish is queued for the
link's storer, which stores and answers the queue in order. How each publish reaches the peers:

- *early*: a DAP entry the link may publish is handed to the peers on this relay process at once,
  before Redis stored it, **only while nothing queued before it is held back** (it would
  overtake it);
- *held back*: any other entry the peers read from the link's stream (status, presence, control,
  tunnel steps) reaches them only once stored; while any is queued, nothing goes early;
- *stored first*: logs and metrics go to streams of their own, a worker's rank group entry
  (:class:`~protocol_specs.wire.stream_entries.GroupEntry`) to the run's ``to_worker`` (its
  peers do not read it), and refused or malformed publishes are never stored: none holds
  anything back.

The storer takes up to :data:`STORE_BATCH` queued publishes at once (:meth:`RelayLinkState.take`)
as steps, in order: a run of consecutive DAP (or tunnel) entries the link may publish is one
append to Redis (:class:`StoreRun`); every other entry is stored alone (:class:`StoreOne`); a
refused one is answered with an error and counted as answered (:class:`Answer`: :class:`Audit`,
:class:`Tell`, :class:`Skip`). The held-back publishes of a batch count until the whole batch is
done (:meth:`RelayLinkState.finished`). The receiver queues at most :data:`STORE_QUEUE` publishes
ahead of the storer: then it waits, and Redis sets the pace.

Acks are cumulative (``protocol_specs/link/link.py``): of a run of stored publishes only the last is
acked; a publish that was not stored (a duplicate, a full stream) first sends the ack of the
stored ones before it, then its own answer; a gap ends the link (:class:`Close`) and nothing
after it is answered (:meth:`RelayLinkState.answer_run`).

A peer that takes entries early is sent a ``commit`` for each once stored; :class:`Commits` keeps
only the latest per producer, and sends them :data:`COMMIT_AFTER` seconds after the first.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from enum import Enum, StrEnum
from typing import Protocol

from ..access.auth import Principal, Refusal
from ..access.permissions import Act, authorize
from ..runs.runs import RunRecord
from ..wire import wire
from ..wire.wire import (
    AfterLink,
    AnyLink,
    EntryKind,
    ErrorCode,
    Role,
    StreamName,
    TunnelLink,
    WireError,
    WorkerLink,
    WorkerTunnelLink,
)
from .link import inbound_of

__all__ = [
    "COMMIT_AFTER",
    "STORE_BATCH",
    "STORE_QUEUE",
    "Action",
    "Answer",
    "AppendOutcome",
    "AppendResult",
    "Attached",
    "Audit",
    "Batch",
    "Beat",
    "Close",
    "Commits",
    "EarlyCopy",
    "Queued",
    "Reach",
    "RelayLinkState",
    "Skip",
    "StatusStored",
    "Step",
    "StoreOne",
    "StoreRun",
    "Tell",
    "TunnelEnded",
    "streams_of",
]

#: publishes a link's receiver checks ahead of its storer (then it waits: Redis sets the pace)
STORE_QUEUE = 64
#: publishes the storer takes at once (consecutive DAP entries go to Redis in one step)
STORE_BATCH = 64
#: how long the commit of an early entry may wait to go out with later ones (seconds)
COMMIT_AFTER = 0.1

_PUBLISH: dict[EntryKind, Act] = {
    EntryKind.DAP: Act.PUBLISH_DAP,
    EntryKind.PRESENCE: Act.PUBLISH_PRESENCE,
    EntryKind.STATUS: Act.PUBLISH_STATUS,
    EntryKind.LOG: Act.PUBLISH_LOG,
    EntryKind.METRIC: Act.PUBLISH_METRIC,
    EntryKind.CONTROL: Act.PUBLISH_CONTROL,
    EntryKind.TUNNEL: Act.PUBLISH_TUNNEL,
    EntryKind.GROUP: Act.PUBLISH_GROUP,
}


# --- opening a link -------------------------------------------------------------------------------


def streams_of(link: AnyLink) -> tuple[StreamName, StreamName]:
    """The streams ``link`` publishes to and reads: ``(outbound, inbound)``."""
    inbound = inbound_of(link)
    first, second = _pair(link.tunnel)
    return (second if inbound is first else first), inbound


def _pair(tunnel: str) -> tuple[StreamName, StreamName]:
    """A run's two streams (a tunnel's: its own two)."""
    if tunnel:
        return StreamName.TUNNEL_UP, StreamName.TUNNEL_DOWN
    return StreamName.TO_WORKER, StreamName.TO_IDE


# --- what the state answers -----------------------------------------------------------------------


class Reach(Enum):
    """How a queued publish reaches the peers (see the module docstring)."""

    EARLY = "early"
    HELD_BACK = "held back"
    STORED_FIRST = "stored first"


class EarlyCopy(Protocol):
    """A peer's delivery that sends an early copy next (``relay/links/fanout.py``'s subscription)."""

    async def sent(self, limit: float) -> None: ...


@dataclass(eq=False, slots=True)
class Queued:
    """A publish as the receiver admitted it, waiting for the storer."""

    frame: wire.Publish
    entry: wire.AnyEntry | None  #: ``None``: malformed
    #: why it is not stored (answered with an error, in order); ``audit``: record the refusal
    refusal: Refusal | None
    reach: Reach
    audit: bool = False
    #: the loop's: the peers' deliveries that send its early copy next (its append waits for them)
    sending: tuple[EarlyCopy, ...] = ()

    def __repr__(self) -> str:
        how = "refused" if self.refusal else self.reach.value
        return f"<Queued n={self.frame.n} {how}>"


class AppendOutcome(StrEnum):
    """What storing one publish exactly once gave (``relay.store.Store.append_once``)."""

    STORED = "stored"
    DUPLICATE = "duplicate"  #: a re-send: stored before
    GAP = "gap"  #: it skips ahead of the producer's last answered number
    FULL = "full"  #: the stream is at its cap
    SKIPPED = "skipped"  #: a refused publish, counted as answered (never stored)


class AppendResult(Protocol):
    """What storing one publish gave (``relay.store.Appended``)."""

    @property
    def outcome(self) -> AppendOutcome: ...
    @property
    def cursor(self) -> str: ...
    @property
    def last(self) -> int: ...
    @property
    def size(self) -> int: ...


@dataclass(frozen=True, slots=True)
class Tell:
    """Send the peer ``frame`` (an ``ack``, or an ``error`` answering one publish), unless it is
    gone: then what it is owed it asks for again."""

    frame: wire.Ack | wire.Error


@dataclass(frozen=True, slots=True)
class Close:
    """End the link with a fatal error (told unless the peer is gone): nothing more is stored."""

    code: ErrorCode
    message: str


@dataclass(frozen=True, slots=True)
class Audit:
    """Record a refused publish in the run's audit trail."""

    request: str
    code: str
    message: str


@dataclass(frozen=True, slots=True)
class Skip:
    """Count refused publish ``n`` as answered in Redis, so the producer's numbering has no gap."""

    n: int


@dataclass(frozen=True, slots=True)
class StatusStored:
    """A worker's status entry is stored: move the run along."""

    entry: wire.StatusEntry


@dataclass(frozen=True, slots=True)
class Attached:
    """The adapter on this link attached or detached its IDE: audit it and mark the run."""

    entry: wire.PresenceEntry


@dataclass(frozen=True, slots=True)
class TunnelEnded:
    """The worker's last word on its tunnel (its ``exit`` step) is stored: the tunnel is over."""


Action = Tell | Close | Audit | Skip | StatusStored | Attached | TunnelEnded


@dataclass(frozen=True, slots=True)
class StoreRun:
    """Store these DAP (or tunnel) entries in one step, then :meth:`RelayLinkState.answer_run`."""

    items: list[Queued]


@dataclass(frozen=True, slots=True)
class StoreOne:
    """Store this entry alone, then :meth:`RelayLinkState.answer_one`; ``recheck``: first make sure
    the worker's attempt is still the run's (:meth:`RelayLinkState.still_current`)."""

    item: Queued
    recheck: bool = False


@dataclass(frozen=True, slots=True)
class Answer:
    """Answer a refused publish without storing it: these actions, in order."""

    actions: list[Action]


Step = StoreRun | StoreOne | Answer


@dataclass(frozen=True, slots=True)
class Batch:
    """What the storer took at once, as steps in order."""

    steps: list[Step]
    held_back: int  #: how many of them were held back


class Beat(Enum):
    """What a heartbeat asks of the relay."""

    IGNORE = "ignore"  #: not a worker's (its tokens are looked at again by the gate's recheck)
    CHECK = "check"  #: a tunnel's worker link: only whether the attempt is still the run's
    HOLD = "hold"  #: a worker keeping an ended attempt's directory: hold its tunnels
    RENEW = "renew"  #: a worker's run link: renew its attempt's lease


# --- the state ------------------------------------------------------------------------------------


@dataclass(eq=False)
class RelayLinkState:
    """One run link (``ide``, ``worker`` or ``tunnel`` role) as the relay serves it."""

    link: AnyLink  #: what the link is (``protocol_specs/wire/link_kind.py``)
    who: Principal
    record: RunRecord  #: as it was when the link opened
    #: which status events this link may publish (``relay/runs/worker_status.py``'s table)
    status_allowed: Callable[[str], bool] = lambda _event: True
    #: the cap of a run's stream ``(entries, bytes)``, as a ``buffer_full`` answer names it
    buffer_cap: tuple[int, int] = (0, 0)
    outbound: StreamName = field(init=False)
    inbound: StreamName = field(init=False)
    #: the last presence the adapter on this link reported
    presence: wire.PresenceEntry | None = field(default=None, init=False)
    #: publishes admitted and waiting for the storer
    queue: list[Queued] = field(default_factory=list, init=False)
    #: queued publishes that reach the peers only once stored: while any, nothing goes early
    held_back: int = field(default=0, init=False)
    #: a publish ended the link: nothing more is admitted or stored
    closing: bool = field(default=False, init=False)
    #: entry kind -> why this link may not publish it; decided once per kind (the holder and the
    #: run the decision rests on are fixed for the link's life)
    _refusals: dict[EntryKind, Refusal | None] = field(default_factory=dict, init=False, repr=False)

    def __post_init__(self) -> None:
        self.outbound, self.inbound = streams_of(self.link)

    @property
    def role(self) -> Role:
        return self.link.role

    @property
    def tunnel(self) -> str:
        """A tunnel's link: the tunnel (its streams instead of the run's); else ``""``."""
        return self.link.tunnel

    @property
    def streams(self) -> tuple[StreamName, StreamName]:
        """The link's two streams, in the order a ``welcome`` names their tails."""
        return _pair(self.link.tunnel)

    def __repr__(self) -> str:
        return (
            f"<RelayLinkState {self.link.kind.value} run={self.record.id} queued={len(self.queue)} "
            f"held_back={self.held_back}{' closing' if self.closing else ''}>"
        )

    # --- the receiver -----------------------------------------------------------------------------

    @property
    def has_room(self) -> bool:
        """Whether the receiver may admit another publish now (else it waits for the storer)."""
        return len(self.queue) < STORE_QUEUE

    def admit(self, frame: wire.Publish) -> Queued:
        """Check a publish as it arrives and queue it for the storer. A :attr:`Reach.EARLY` one
        goes to the peers on this process now (the loop hands it to them)."""
        try:
            entry = wire.decode_entry(frame.entry)
        except WireError as exc:
            item = Queued(frame, None, Refusal(exc.code, exc.message), Reach.STORED_FIRST)
        else:
            item = self._admit(frame, entry)
        self.queue.append(item)
        return item

    def _admit(self, frame: wire.Publish, entry: wire.AnyEntry) -> Queued:
        refusal = self._refusal(entry.k)
        if refusal is None and isinstance(entry, wire.StatusEntry):
            if not self.status_allowed(entry.event):
                problem = f"workers may not publish status {entry.event!r}"
                refusal = Refusal(ErrorCode.NOT_ALLOWED, problem)
        if refusal is not None:  # the storer answers it, in order
            return Queued(frame, entry, refusal, Reach.STORED_FIRST, audit=True)
        if isinstance(entry, wire.DapEntry) and not self.held_back:
            return Queued(frame, entry, None, Reach.EARLY)
        # streams of their own; a rank group's entry goes to the other nodes' ``to_worker``
        if isinstance(entry, wire.LogEntry | wire.MetricEntry | wire.GroupEntry):
            return Queued(frame, entry, None, Reach.STORED_FIRST)
        self.held_back += 1
        return Queued(frame, entry, None, Reach.HELD_BACK)

    def _refusal(self, kind: EntryKind) -> Refusal | None:
        if kind not in self._refusals:
            self._refusals[kind] = self._decide(kind)
        return self._refusals[kind]

    def _decide(self, kind: EntryKind) -> Refusal | None:
        """Why this link may not publish entries of ``kind`` (``None``: it may)."""
        on_tunnel = isinstance(self.link, TunnelLink | WorkerTunnelLink)
        if isinstance(self.link, AfterLink):
            problem = "a worker serving an ended attempt publishes nothing"
        elif on_tunnel != (kind is EntryKind.TUNNEL):  # a tunnel's link carries only its steps
            where = "a tunnel's link" if on_tunnel else "a run's link (only on a tunnel's)"
            problem = f"no {kind.value} entry on {where}"
        else:
            return authorize(self.who, _PUBLISH[kind], self.record, about_run=self.record.id)
        return Refusal(ErrorCode.NOT_ALLOWED, problem)

    def heartbeat(self) -> Beat:
        """What a heartbeat from the peer asks for."""
        match self.link:
            case WorkerLink():
                return Beat.RENEW
            case AfterLink():
                return Beat.HOLD
            case WorkerTunnelLink():
                return Beat.CHECK
            case _:  # not a worker's (its tokens are looked at again by the gate's recheck)
                return Beat.IGNORE

    def still_current(self, record: RunRecord | None) -> Refusal | None:
        """Why a worker's link must close now that the run is ``record`` (``None``: it may go on)."""
        return authorize(self.who, Act.OPEN_WORKER, record, about_run=self.record.id)

    def farewell(self) -> wire.PresenceEntry | None:
        """When the link is gone: the presence entry that says its IDE left, if it had one."""
        if self.presence is None or not self.presence.attached:
            return None
        # ``link_lost``: it may well be back in a moment (the worker waits a little)
        return self.presence.model_copy(update={"attached": False, "link_lost": True})

    # --- the storer -------------------------------------------------------------------------------

    def take(self) -> Batch | None:
        """The next publishes to store, as steps in order; ``None`` when none is left (or the
        link is closing). Call :meth:`finished` once they are done."""
        if not self.queue or self.closing:
            return None
        items = self.queue[:STORE_BATCH]
        del self.queue[:STORE_BATCH]
        steps: list[Step] = []
        run: list[Queued] = []
        for item in items:
            if item.refusal is None and isinstance(item.entry, wire.DapEntry | wire.TunnelEntry):
                run.append(item)
                continue
            if run:
                steps.append(StoreRun(run))
                run = []
            steps.append(self._single(item))
        if run:
            steps.append(StoreRun(run))
        return Batch(steps, sum(item.reach is Reach.HELD_BACK for item in items))

    def _single(self, item: Queued) -> Step:
        n, refusal = item.frame.n, item.refusal
        if refusal is None:
            return StoreOne(item, recheck=isinstance(item.entry, wire.StatusEntry))
        code = ErrorCode(refusal.code)
        actions: list[Action] = []
        if item.audit:
            assert item.entry is not None
            actions.append(Audit(f"publish {item.entry.k}", code, refusal.message))
        actions += [Tell(wire.Error(code=code, message=refusal.message, n=n)), Skip(n)]
        return Answer(actions)

    def finished(self, batch: Batch) -> None:
        """``batch`` is stored and answered (or the link ends): what it held back is not now."""
        self.held_back -= batch.held_back

    def close(self) -> None:
        """A publish ended the link (the peer was told): drop what is queued."""
        self.closing = True
        self.queue.clear()

    def answer_run(self, items: Sequence[Queued], results: Sequence[AppendResult]) -> list[Action]:
        """What to do once a :class:`StoreRun` was appended: one ``ack`` for each run of stored
        publishes (its last), every other answered on its own, in order; a gap ends the link."""
        actions: list[Action] = []
        for item, result in zip(items, results, strict=True):
            entry = item.entry
            if result.outcome is AppendOutcome.STORED and isinstance(entry, wire.TunnelEntry):
                if entry.op == "exit" and self.role is Role.WORKER:  # the worker's last word
                    actions.append(TunnelEnded())
        ack: wire.Ack | None = None
        for item, result in zip(items, results, strict=True):
            if result.outcome is AppendOutcome.STORED:
                ack = wire.Ack(n=item.frame.n, cursor=result.cursor)
                continue
            if ack is not None:
                actions.append(Tell(ack))
                ack = None
            actions += self._not_stored(item.frame.n, result)
            if isinstance(actions[-1], Close):
                return actions
        if ack is not None:
            actions.append(Tell(ack))
        return actions

    def answer_one(self, item: Queued, result: AppendResult) -> list[Action]:
        """What to do once a :class:`StoreOne` was appended."""
        n, entry = item.frame.n, item.entry
        if result.outcome is not AppendOutcome.STORED:
            return self._not_stored(n, result)
        actions: list[Action] = []
        if isinstance(entry, wire.StatusEntry):
            actions.append(StatusStored(entry))
        elif isinstance(entry, wire.PresenceEntry):
            if self.presence is None or self.presence.attached != entry.attached:
                actions.append(Attached(entry))
            self.presence = entry
        actions.append(Tell(wire.Ack(n=n, cursor=result.cursor)))
        return actions

    def _not_stored(self, n: int, result: AppendResult) -> list[Action]:
        """Publish ``n`` was not stored: a duplicate, a full stream, or a gap (the link ends)."""
        if result.outcome is AppendOutcome.GAP:
            message = f"publish {n} skips ahead of {result.last + 1}; resend from there"
            return [Close(ErrorCode.OUT_OF_ORDER, message)]
        if result.outcome is AppendOutcome.FULL:
            message = (
                f"run {self.record.id}: {self.outbound.value} holds {result.size} entries "
                f"(cap {self.buffer_cap[0]}) or its {self.buffer_cap[1]} bytes are used up; "
                "nobody has read them"
            )
            error = wire.Error(code=ErrorCode.BUFFER_FULL, message=message, n=n)
            return [Tell(error)]
        return [Tell(wire.Ack(n=n, cursor=result.cursor, duplicate=True))]


# --- delivering -----------------------------------------------------------------------------------


class Commits:
    """The commits a delivering connection owes its peer for entries it sent early: only the
    latest of each producer goes (the peer needs them only to move its cursor, and a live session
    would pay a frame per message), :data:`COMMIT_AFTER` seconds after the first is owed."""

    __slots__ = ("_after", "_owed", "due", "stream")

    def __init__(self, stream: StreamName, after: float = COMMIT_AFTER) -> None:
        self.stream = stream
        self._after = after
        self._owed: dict[str, wire.Commit] = {}
        self.due = math.inf  #: when :meth:`take` gives the owed commits

    def __bool__(self) -> bool:
        return bool(self._owed)

    def __repr__(self) -> str:
        return f"<Commits {self.stream.value} owed={len(self._owed)} due={self.due}>"

    def owe(self, cursor: str, producer: str, n: int, now: float) -> None:
        """``producer``'s ``n``, sent early, is stored at ``cursor``."""
        self._owed[producer] = wire.Commit(
            stream=self.stream, cursor=cursor, producer=producer, n=n
        )
        self.due = min(self.due, now + self._after)

    def take(self, now: float) -> list[wire.Commit]:
        """The commits to send now (none before they are due)."""
        if not self._owed or now < self.due:
            return []
        commits = list(self._owed.values())
        self._owed.clear()
        self.due = math.inf
        return commits
