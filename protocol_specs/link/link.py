"""The relay link's state, without sockets: stream cursors, the outbox, answers, dedup, reports.

A cursor is a Redis stream entry id, ``"<ms>-<seq>"``: where a reader stands in a run's stream.
The relay hands one out with every delivered entry and every acknowledged publish; a link keeps
the newest per stream and resumes from it after a cut, so cursors are compared, not just echoed.

Theory of operation
-------------------
:class:`LinkState` is everything a run link (``ide`` or ``worker`` role) must remember across its
WebSocket connections, and every decision about what to send; ``relay.client.RunLink`` only moves
frames and sleeps until :meth:`LinkState.wake_at`. Like h11's ``Connection`` it takes frames and
the time, and returns frames to send or events to act on:

- *Outbox*: :meth:`~LinkState.publish` numbers entries ``n`` = 1, 2, 3, ... (per ``producer``,
  across connections) and keeps each encoded ``publish`` frame until the relay answers it: an
  ``ack`` (cumulative: every publish up to ``n``; ``duplicate`` when ``n`` was a re-send the relay
  had stored already) or a non-fatal ``error`` naming ``n`` (refused: the producer goes on).
- *Resume*: :meth:`~LinkState.hello` names the newest cursor per stream; after
  :meth:`~LinkState.on_handshake` accepts a welcome, :meth:`~LinkState.due` re-sends every
  unanswered publish, in order, from the oldest; the relay stores each ``(producer, n)`` once.
- *Dedup*: a delivered entry at or before its stream's cursor was handed over before a cut and is
  dropped (:meth:`~LinkState.receive` returns ``None``); the cursor moves only once an entry was
  handed over (:meth:`~LinkState.handed_over`).
- *Early entries* (a link's ``early``: the adapter's and the worker's ask for them): the relay hands a live entry over as soon
  as it arrives, before Redis has stored it (a ``deliver`` without a cursor), and sends a
  ``commit`` naming it, with its cursor, once it is stored. Such an entry may come again with its
  cursor (the relay re-read Redis, or this link reconnected before the commit), and a publish the
  producer re-sent after a cut may come early twice: every ``deliver`` names its ``(producer,
  n)``. The state keeps the early entries not yet stored, and per producer the highest number
  stored and handed over; what comes again only moves the cursor, or nothing. Entries with cursors
  come in stream order, which is each producer's order, so that number bounds what is left.
- *Reports*: ``received`` frames tell the relay how far each stream was read (it trims transient
  entries): ``report_after`` seconds after the first unreported entry, at once after
  ``report_every`` of them, or on :meth:`~LinkState.report_now`; only cursors that moved.
- *Heartbeats*: every ``heartbeat`` seconds (or the welcome's, if shorter); none if the welcome
  asks for none.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import NamedTuple

from ..wire import wire
from ..wire.wire import (
    AfterLink,
    AnyLink,
    ErrorCode,
    IdeLink,
    Role,
    StreamName,
    TunnelLink,
    WorkerLink,
    WorkerTunnelLink,
)

__all__ = [
    "PERMANENT_REFUSALS",
    "START",
    "Answered",
    "Cursor",
    "InvalidCursor",
    "LinkClosed",
    "LinkState",
    "Moved",
    "NewEntry",
    "OutboxFull",
    "Refusal",
    "Refused",
    "inbound_of",
]


class InvalidCursor(ValueError):
    """Text that is not a stream entry id."""


class Cursor(NamedTuple):
    """A stream entry id as numbers; ordered like the stream (a tuple compares field by field)."""

    ms: int
    seq: int = 0

    @classmethod
    def parse(cls, text: str) -> Cursor:
        """``"<ms>-<seq>"`` or ``"<ms>"``, like Redis (which answers "Invalid stream ID" otherwise)."""
        ms, sep, seq = text.partition("-")
        if not (ms.isascii() and ms.isdigit()) or (sep and not (seq.isascii() and seq.isdigit())):
            raise InvalidCursor(f"invalid stream id {text!r}")
        return cls(int(ms), int(seq) if sep else 0)

    def __str__(self) -> str:
        return f"{self.ms}-{self.seq}"


#: before the first entry of any stream (Redis's ``0-0``)
START = Cursor(0, 0)

#: handshake refusals that reconnecting cannot fix
PERMANENT_REFUSALS = frozenset(
    {
        ErrorCode.NO_SUCH_RUN,
        ErrorCode.UNAUTHORIZED,
        ErrorCode.UNSUPPORTED_VERSION,
        ErrorCode.HANDSHAKE_REQUIRED,
        ErrorCode.BAD_FRAME,
        ErrorCode.STALE_ATTEMPT,
        ErrorCode.FORBIDDEN,
        ErrorCode.TOO_MANY_FAILURES,
        ErrorCode.NO_SUCH_TUNNEL,
    }
)

_HEARTBEAT = wire.encode_frame(wire.Heartbeat())


class OutboxFull(Exception):
    """A publish the outbox has no room for (the caller should have waited for answers)."""


# --- what the state answers -----------------------------------------------------------------------


@dataclass(frozen=True)
class Refusal:
    """The relay did not welcome this connection; ``permanent``: reconnecting cannot fix it."""

    code: ErrorCode
    message: str
    permanent: bool


@dataclass(frozen=True)
class NewEntry:
    """A delivered entry not handed over before: hand it over, then call ``handed_over``."""

    frame: wire.Deliver


@dataclass(frozen=True)
class Moved:
    """The cursor moved without an entry to hand over (a ``commit``, or an entry that came again
    after it was taken early); ``report_due`` as for :meth:`LinkState.handed_over`."""

    report_due: bool


@dataclass(frozen=True)
class Answered:
    """The relay stored every publish up to ``n`` (the outbox has room again)."""

    n: int


@dataclass(frozen=True)
class Refused:
    """The relay refused publish ``n`` (answered all the same: the producer goes on)."""

    n: int
    error: wire.Error


@dataclass(frozen=True)
class LinkClosed:
    """The relay sent a fatal error and closes the connection; ``reason`` says why."""

    reason: str


LinkEvent = NewEntry | Moved | Answered | Refused | LinkClosed


# --- the state ------------------------------------------------------------------------------------


@dataclass(frozen=True)
class _Limits:
    outbox_entries: int
    outbox_bytes: int
    report_every: int
    report_after: float
    heartbeat: float


@dataclass
class _Connection:
    """What lasts one connection: the next publish to send, the report and heartbeat deadlines."""

    next_n: int
    heartbeat_every: float
    heartbeat_at: float
    report_at: float | None = None


@dataclass
class _Outbox:
    frames: dict[int, bytes] = field(default_factory=dict)  # in publish order
    size: int = 0


def inbound_of(link: AnyLink) -> StreamName:
    """The stream ``link`` reads."""
    match link:
        case IdeLink():
            return StreamName.TO_IDE
        case WorkerLink() | AfterLink():
            return StreamName.TO_WORKER
        case TunnelLink():
            return StreamName.TUNNEL_DOWN
        case WorkerTunnelLink():
            return StreamName.TUNNEL_UP


class LinkState:
    """One run link's bookkeeping, across its connections.

    ``link`` says what it is (``protocol_specs/wire/link_kind.py``: an IDE's with ``history`` asks the
    relay for the run's ``to_worker`` entries first); ``cursor`` is where reading the inbound
    stream starts. Times are the caller's clock (seconds).
    """

    def __init__(
        self,
        *,
        link: AnyLink,
        run: str,
        producer: str,
        cursor: str = "0",
        client: str = "",
        attempt: int = 0,
        outbox_entries: int = 10_000,
        outbox_bytes: int = 64 * 1024 * 1024,
        report_every: int = 100,
        report_after: float = 0.2,
        heartbeat: float = 10.0,
    ) -> None:
        self.link = link
        self.role: Role = link.role
        self.run = run
        self.producer = producer
        self.client = client
        self.attempt = attempt
        self._limits = _Limits(outbox_entries, outbox_bytes, report_every, report_after, heartbeat)
        self.inbound = inbound_of(link)
        #: the newest entry handed over per stream, as the relay wrote it ("0": none yet)
        self.cursors: dict[StreamName, str] = {name: "0" for name in StreamName}
        self.cursors[self.inbound] = cursor
        self._positions = {name: Cursor.parse(text) for name, text in self.cursors.items()}
        #: early entries handed over, by producer, whose commit (or stored copy) has not come
        self._early: dict[str, set[int]] = {}
        #: per producer, the highest number stored and handed over (by cursor order)
        self._stored: dict[str, int] = {}
        self.welcome: wire.Welcome | None = None  #: the first connection's
        self.latest: wire.Welcome | None = None  #: the current (or last) connection's
        self.epoch = 0  #: connections welcomed so far
        self.acked = ""  #: cursor of the last entry the relay stored for us
        self.errors: list[wire.Error] = []
        self.duplicates = 0  #: re-sent publishes the relay had already stored
        self.published = 0  #: the number of the last publish
        self.answered = 0  #: the highest publish number the relay answered
        self._outbox = _Outbox()
        self._connection: _Connection | None = None
        self._unreported = 0
        self._reported: dict[StreamName, str] = {}
        self._report_now = False

    def __repr__(self) -> str:
        state = "up" if self._connection else "down"
        return (
            f"<LinkState {self.role.value} run={self.run} {state} epoch={self.epoch} "
            f"published={self.published} answered={self.answered} outbox={self.unanswered}>"
        )

    @property
    def connected(self) -> bool:
        return self._connection is not None

    @property
    def unanswered(self) -> int:
        return len(self._outbox.frames)

    # --- connections ------------------------------------------------------------------------------

    def hello(self, token: str | None = None) -> wire.Hello:
        """The handshake for the next connection: resume after the newest cursors."""
        return wire.Hello(
            role=self.role,
            run=self.run,
            cursor=self.cursors[self.inbound],
            link=self.link,
            history_cursor=self.cursors[StreamName.TO_WORKER],
            producer=self.producer,
            client=self.client,
            attempt=self.attempt,
            token=token,
        )

    def on_handshake(self, frame: wire.Frame, now: float) -> Refusal | None:
        """The relay's answer to ``hello``: ``None`` when welcomed (the connection is up)."""
        if isinstance(frame, wire.Error):
            return Refusal(frame.code, frame.message, frame.code in PERMANENT_REFUSALS)
        if not isinstance(frame, wire.Welcome) or frame.run is None:
            return Refusal(ErrorCode.BAD_FRAME, f"expected 'welcome', got {frame.t!r}", True)
        self.welcome = self.welcome or frame
        self.latest = frame
        self.epoch += 1
        every = self._limits.heartbeat
        if frame.heartbeat > 0:
            every = min(every, frame.heartbeat)
        else:
            every = math.inf  # the relay wants no heartbeats on this link (WebSocket pings stay)
        # every unanswered publish goes again: the relay may not have stored it before the cut
        self._connection = _Connection(
            next_n=self.answered + 1, heartbeat_every=every, heartbeat_at=now + every
        )
        return None

    def connection_lost(self) -> None:
        self._connection = None

    # --- outbound ---------------------------------------------------------------------------------

    def has_room(self, size: int) -> bool:
        """Whether an entry of ``size`` bytes fits in the outbox now."""
        if not self._outbox.frames:
            return True  # one entry always fits, whatever its size
        return (
            len(self._outbox.frames) < self._limits.outbox_entries
            and self._outbox.size + size <= self._limits.outbox_bytes
        )

    def publish(self, entry: bytes) -> int:
        """Queue an encoded entry; returns its number. Raises :class:`OutboxFull` (see ``has_room``)."""
        if not self.has_room(len(entry)):
            raise OutboxFull(f"{self.unanswered} publishes ({self._outbox.size} bytes) unanswered")
        self.published += 1
        frame = wire.encode_frame(wire.Publish(n=self.published, entry=entry))
        self._outbox.frames[self.published] = frame
        self._outbox.size += len(frame)
        return self.published

    def report_now(self) -> None:
        """Send the ``received`` reports before anything published after this call."""
        self._report_now = True

    def due(self, now: float) -> list[bytes]:
        """The frames to send now, in order (nothing while no connection is up)."""
        conn = self._connection
        if conn is None:
            return []
        frames: list[bytes] = []
        if self._report_now:
            self._report_now = False
            frames += self._reports()
            conn.report_at = None
        while conn.next_n <= self.published:
            frame = self._outbox.frames.get(conn.next_n)
            if frame is not None:
                frames.append(frame)
            conn.next_n += 1
        if self._unreported and conn.report_at is None:
            conn.report_at = now + self._limits.report_after
        if conn.report_at is not None and (
            now >= conn.report_at or self._unreported >= self._limits.report_every
        ):
            frames += self._reports()
            conn.report_at = None
        if now >= conn.heartbeat_at:
            frames.append(_HEARTBEAT)
            conn.heartbeat_at = now + conn.heartbeat_every
        return frames

    def wake_at(self) -> float:
        """When :meth:`due` has something to send without any new publish or delivery."""
        conn = self._connection
        if conn is None:
            return math.inf
        if conn.report_at is None:
            return conn.heartbeat_at
        return min(conn.heartbeat_at, conn.report_at)

    def _reports(self) -> list[bytes]:
        self._unreported = 0
        frames = []
        for name, cursor in self.cursors.items():
            if cursor != "0" and self._reported.get(name) != cursor:
                frames.append(wire.encode_frame(wire.Received(stream=name, cursor=cursor)))
                self._reported[name] = cursor
        return frames

    def _answer(self, n: int) -> None:
        # the outbox is in publish order: answered numbers are at its front
        frames = self._outbox.frames
        while frames:
            number = next(iter(frames))
            if number > n:
                break
            self._outbox.size -= len(frames.pop(number))
        self.answered = max(self.answered, n)

    # --- inbound ----------------------------------------------------------------------------------

    def receive(self, frame: wire.Frame) -> LinkEvent | None:
        """What a frame from the relay means; ``None``: nothing to do (e.g. a redelivery)."""
        if isinstance(frame, wire.Deliver):
            producer, n = frame.producer, frame.n
            if not frame.cursor:  # early: not stored yet
                if (
                    n < 1
                    or n <= self._stored.get(producer, 0)
                    or n in self._early.get(producer, ())
                ):
                    return None  # malformed, or a re-sent publish handed over already
                return NewEntry(frame)
            if Cursor.parse(frame.cursor) <= self._positions[frame.stream]:
                return None  # already handed over before a reconnect
            if n and n in self._early.get(producer, ()):  # taken early; now it has its cursor
                self._was_stored(producer, n)
                return Moved(self._move(frame.stream, frame.cursor))
            return NewEntry(frame)
        if isinstance(frame, wire.Commit):
            self._was_stored(frame.producer, frame.n)
            if Cursor.parse(frame.cursor) <= self._positions[frame.stream]:
                return None
            return Moved(self._move(frame.stream, frame.cursor))
        if isinstance(frame, wire.Ack):
            if frame.cursor:
                self.acked = frame.cursor
            self.duplicates += frame.duplicate
            self._answer(frame.n)
            return Answered(frame.n)
        if isinstance(frame, wire.Error):
            self.errors.append(frame)
            if frame.fatal:
                return LinkClosed(f"the relay closed the connection: {frame.message}")
            if frame.n is not None:
                self._answer(frame.n)
                return Refused(frame.n, frame)
        return None

    def handed_over(self, frame: wire.Deliver) -> bool:
        """A :class:`NewEntry` was handed over: its cursor is ours now (an early one's: once its
        ``commit`` comes). Returns whether a report became due (the first unreported entry starts
        the clock; ``report_every`` sends at once)."""
        if not frame.cursor:
            self._early.setdefault(frame.producer, set()).add(frame.n)
            return False
        if frame.n:
            self._was_stored(frame.producer, frame.n)
        return self._move(frame.stream, frame.cursor)

    def _was_stored(self, producer: str, n: int) -> None:
        """``producer``'s ``n`` is stored and handed over, and with it every earlier number (a
        producer's entries are stored in order): none of them can come early any more."""
        self._stored[producer] = max(n, self._stored.get(producer, 0))
        early = self._early.get(producer)
        if early:
            early.difference_update([k for k in early if k <= n])
            if not early:
                del self._early[producer]

    def _move(self, stream: StreamName, cursor: str) -> bool:
        self.cursors[stream] = cursor
        self._positions[stream] = Cursor.parse(cursor)
        self._unreported += 1
        return self._unreported >= self._limits.report_every or self._unreported == 1
