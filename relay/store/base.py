"""The store interface (:class:`Store`), what its calls return, and the helpers both
implementations share. See the package's docstring (``relay/store/__init__.py``) for the theory."""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from contextlib import AbstractAsyncContextManager
from dataclasses import dataclass
from typing import NamedTuple, Protocol

import trio

from protocol_specs.link.link import Cursor, InvalidCursor
from protocol_specs.link.relay import AppendOutcome

from .keys import NOTICE_CHANNEL, meta_key, transient_key, watchers_key

__all__ = [
    "DEFAULT_REQUEST_TIMEOUT_MS",
    "NOTICE_CHANNEL",
    "NOTICE_PAYLOAD_BYTES",
    "NO_CAP",
    "PAYLOAD_FIELD",
    "TICK_LATE_SECONDS",
    "TICK_SECONDS",
    "VERSION_FIELD",
    "Appended",
    "BlockingReader",
    "Cap",
    "Diversion",
    "Entry",
    "Notice",
    "NoticeSink",
    "Numbered",
    "Published",
    "Store",
    "StoreError",
    "StreamId",
    "check_read_args",
    "format_id",
    "meta_key",
    "notice_from",
    "parse_id",
    "transient_key",
    "watchers_key",
]

Entry = tuple[str, bytes]
"""A stream entry: its id and its payload."""


class Published(NamedTuple):
    """One entry for :meth:`Store.append_batch`: the producer's number, the payload, and whether
    it is transient."""

    n: int
    payload: bytes
    transient: bool = False


class Numbered(NamedTuple):
    """A stream entry and the publish that wrote it (:meth:`Store.append_once`'s ``producer`` and
    ``n``; ``""`` and 0 for an entry :meth:`Store.append` wrote)."""

    id: str
    payload: bytes
    producer: str = ""
    n: int = 0


PAYLOAD_FIELD = "p"
#: the fields :meth:`Store.append_once` names the publish in (``Numbered.producer``, ``.n``)
PRODUCER_FIELD = "o"
NUMBER_FIELD = "n"
#: the field of a hash that :meth:`Store.set_versioned` counts its writes in
VERSION_FIELD = "v"
DEFAULT_REQUEST_TIMEOUT_MS = 5000


@dataclass(frozen=True)
class Cap:
    """Most entries and payload bytes a stream may hold; 0 means unlimited."""

    entries: int = 0
    bytes: int = 0


#: no cap at all (the default of :meth:`Store.append_once`)
NO_CAP = Cap()


@dataclass(frozen=True)
class Diversion:
    """Where :meth:`Store.append_once` stores an entry other than its numbered stream."""

    stream: str
    maxlen: int = 0  #: 0: unbounded


@dataclass(frozen=True)
class Appended:
    outcome: AppendOutcome
    cursor: str = ""  #: the entry's id (stored; duplicate of the last stored: its id, else "")
    prev: str = ""  #: stored: the id of the entry before it in its stream (``0-0``: the first)
    last: int = 0  #: the producer's last answered number (gap)
    size: int = 0  #: entries in the stream (full)


@dataclass(frozen=True)
class Notice:
    """An entry was appended to ``stream``: its id, and the id of the entry before it; an entry of
    at most :data:`NOTICE_PAYLOAD_BYTES` comes with its payload and the publish that wrote it (so
    another relay process delivers it without reading it back)."""

    stream: str
    prev: str
    entry_id: str
    payload: bytes | None = None
    producer: str = ""
    n: int = 0


#: the largest entry whose notice carries it (a DAP message is mostly smaller; output chunks too)
NOTICE_PAYLOAD_BYTES = 16 * 1024


def notice_from(message: bytes) -> Notice | None:
    """A notice as the store's scripts publish it (``None``: not a notice)::

    n <prev> <id> <stream>
    p <prev> <id> <n> <len(producer)> <stream>\n<producer><payload>
    """
    if message[:2] == b"n ":
        prev, entry_id, stream = message[2:].decode().split(" ", 2)
        return Notice(stream, prev, entry_id)
    if message[:2] == b"p ":
        head, _, rest = message.partition(b"\n")
        _, prev, entry_id, n, size, stream = head.decode().split(" ", 5)
        return Notice(stream, prev, entry_id, rest[int(size) :], rest[: int(size)].decode(), int(n))
    return None


#: what :meth:`Store.listen` hands over: a notice, or ``None`` for "notices may have been lost"
NoticeSink = Callable[["Notice | None"], None]

#: how often a listener publishes a tick to prove its subscription is alive
TICK_SECONDS = 0.5
#: a listener whose own tick has not come back this long after it was sent reports possible loss
#: (long: an overloaded relay is slow to read its ticks, and every such report makes each of its
#: connections read Redis once; a dropped connection is caught by its id and by tick gaps anyway)
TICK_LATE_SECONDS = 30.0


class StoreError(Exception):
    """The store refused a command or could not run it (server error, lost connection, timeout)."""


class BlockingReader(Protocol):
    """A dedicated connection for blocking reads; get one from :meth:`Store.blocking_reader`."""

    async def read(
        self, stream: str, after: str, *, block_ms: int = 1000, count: int = 100
    ) -> list[Entry]:
        """Entries after ``after`` (exclusive), waiting up to ``block_ms`` (0 = forever) for one.

        Returns ``[]`` on timeout. Same result as :meth:`Store.read_after` when entries exist.
        """
        ...

    async def read_group(
        self, stream: str, group: str, consumer: str, *, block_ms: int = 1000
    ) -> Entry | None:
        """The next entry never delivered to ``group``, now pending for ``consumer``; ``None`` on timeout.

        Raises :class:`StoreError` if the group does not exist (see :meth:`Store.ensure_group`).
        """
        ...


class Store(Protocol):
    # streams
    async def append(self, stream: str, payload: bytes, *, maxlen: int | None = None) -> str:
        """Add an entry (``XADD``); keep at most ``maxlen`` entries (exact trim). Returns its id."""
        ...

    async def read_after(self, stream: str, after: str, *, count: int = 100) -> list[Entry]:
        """Up to ``count`` entries with ids greater than ``after``, oldest first; never blocks."""
        ...

    async def read_numbered(self, stream: str, after: str, *, count: int = 100) -> list[Numbered]:
        """As :meth:`read_after`, with the publish that wrote each entry."""
        ...

    async def last_id(self, stream: str) -> str | None:
        """The id of the newest entry still in the stream, ``None`` if there is none."""
        ...

    async def read_last(self, stream: str, count: int) -> list[Entry]:
        """The newest ``count`` entries, oldest first (a page showing a log's tail)."""
        ...

    def blocking_reader(self) -> AbstractAsyncContextManager[BlockingReader]:
        """A reader with its own connection, closed when the context exits."""
        ...

    async def watch(self, stream: str, listener: str) -> None:
        """From now on, appends to ``stream`` notify ``listener`` (see :meth:`listen`)."""
        ...

    async def unwatch(self, stream: str, listener: str) -> None:
        """Undo :meth:`watch`."""
        ...

    async def listen(
        self,
        listener: str,
        sink: NoticeSink,
        *,
        task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED,
    ) -> None:
        """Call ``sink`` with a :class:`Notice` for every append to a stream ``listener`` watches,
        from now on, until cancelled (appends made with ``notify_except=listener`` excepted).

        ``task_status.started()`` once subscribed. ``sink(None)`` means some notices may have been
        lost (a dropped subscription): whoever relies on them must re-read what it watches.
        Raises :class:`StoreError` if the subscription cannot be made.
        """
        ...

    # consumer-group queue
    async def ensure_group(self, stream: str, group: str) -> None:
        """Create ``group`` at the start of ``stream`` (creating the stream); no-op if it exists."""
        ...

    async def ack(self, stream: str, group: str, entry_id: str) -> None:
        """Remove ``entry_id`` from the group's pending entries; unknown ids are ignored."""
        ...

    async def pending(self, stream: str, group: str, *, count: int = 100) -> list[tuple[str, str]]:
        """The group's delivered but unacknowledged entries, oldest first: ``(entry id, consumer)``."""
        ...

    async def reclaim(
        self, stream: str, group: str, consumer: str, *, min_idle: float, count: int = 100
    ) -> list[Entry]:
        """Up to ``count`` of the group's pending entries delivered over ``min_idle`` seconds ago
        and never acknowledged, oldest first, now pending for ``consumer`` (``XAUTOCLAIM``): what
        a consumer that died, or was cancelled, left behind. Entries deleted meanwhile are dropped
        from the pending list and not returned."""
        ...

    # exactly-once appends with a buffer cap, and trimming what the reader received
    async def append_once(
        self,
        stream: str,
        producer: str,
        n: int,
        payload: bytes | None,
        *,
        transient: bool = False,
        cap: Cap = NO_CAP,
        divert: Diversion | None = None,
        notify_except: str = "",
    ) -> Appended:
        """Append ``payload`` as producer ``producer``'s entry number ``n``, atomically.

        ``n`` must be the producer's last answered number + 1 (else :attr:`Appended.outcome` is
        ``duplicate`` for ``n`` at or below it, ``gap`` above it). ``payload=None`` answers ``n``
        without storing anything (``skipped``: the relay refused that entry). Bookkeeping lives in the hash
        :func:`meta_key` (``stream``); ``transient`` entries are also listed for :meth:`trim_received`.
        Refused with ``full`` (and ``n`` counted as answered) when the stream holds ``cap.entries``
        entries or ``cap.bytes`` payload bytes.

        ``divert``: store the entry in ``divert.stream`` (on a Redis Cluster: a stream in
        ``stream``'s hash slot) instead (trimmed to about ``divert.maxlen``
        entries, oldest first; no cap, no byte count), still numbered in ``stream``'s bookkeeping,
        so one producer's entries to several streams are deduplicated as one sequence.

        A stored entry is announced to the listeners watching the stream it went to (see
        :meth:`listen`), except ``notify_except``: the appender's own, which hands it over itself.
        An entry stored in ``stream`` itself keeps ``producer`` and ``n`` (:meth:`read_numbered`).
        """
        ...

    async def append_batch(
        self,
        stream: str,
        producer: str,
        entries: Sequence[Published],
        *,
        cap: Cap = NO_CAP,
        notify_except: str = "",
    ) -> list[Appended]:
        """:meth:`append_once` for each of ``producer``'s ``entries`` in order, in one atomic
        step (no diversion): what each one's call would have returned."""
        ...

    async def trim_received(self, stream: str, cursor: str, *, limit: int = 1000) -> int:
        """Delete up to ``limit`` transient entries with ids up to ``cursor``; returns how many."""
        ...

    async def buffered_bytes(self, stream: str) -> int:
        """Payload bytes of the entries :meth:`append_once` stored and :meth:`trim_received` kept."""
        ...

    # a versioned value: compare-and-set
    async def get_versioned(self, key: str, field: str) -> tuple[bytes | None, int]:
        """``field`` of the hash ``key`` and the hash's version: how many times
        :meth:`set_versioned` wrote it (0 if never, or if the key does not exist)."""
        ...

    async def set_versioned(self, key: str, field: str, value: bytes, version: int) -> bool:
        """Atomically: if the hash's version is still ``version``, set ``field`` to ``value`` and
        the version to ``version + 1``; True. Else write nothing; False (someone else wrote it
        since it was read: read again, decide again)."""
        ...

    # hashes, strings, sorted set
    async def hget_many(self, keys: Sequence[str], field: str) -> list[bytes | None]:
        """``field`` of each hash in ``keys`` (``None`` where missing), in one round trip (a
        pipeline, split by slot on a cluster; not atomic)."""
        ...

    async def hset(self, key: str, mapping: Mapping[str, bytes | str]) -> None: ...
    async def hgetall(self, key: str) -> dict[str, bytes]: ...
    async def set_bytes(self, key: str, value: bytes) -> None: ...
    async def get_bytes(self, key: str) -> bytes | None: ...
    async def sadd(self, key: str, members: list[str]) -> None:
        """Add ``members`` to the set ``key``."""
        ...

    async def sismember(self, key: str, members: list[str]) -> list[bool]:
        """For each of ``members``, whether it is in the set ``key`` (``SMISMEMBER``)."""
        ...

    async def zadd(
        self,
        key: str,
        member: str,
        score: float,
        *,
        only_existing: bool = False,
        only_new: bool = False,
    ) -> bool:
        """Set ``member``'s score; with ``only_existing`` never add, with ``only_new`` never
        change a member already there. True if anything changed."""
        ...

    async def zscore(self, key: str, member: str) -> float | None:
        """``member``'s score, ``None`` if it is not in the set."""
        ...

    async def zrem(self, key: str, member: str) -> bool:
        """Remove ``member``; True if it was there (one caller wins when several race)."""
        ...

    async def zrange_by_score(self, key: str, max_score: float, count: int) -> list[str]:
        """Up to ``count`` members with scores up to ``max_score``, lowest score first."""
        ...

    async def expire(self, key: str, seconds: float) -> None:
        """Delete ``key`` after ``seconds`` (millisecond precision); no-op for a missing key."""
        ...

    async def ttl(self, key: str) -> float | None:
        """Seconds until ``key`` expires; ``None`` if it does not exist or never expires."""
        ...

    async def zrange_desc(self, key: str, count: int, *, start: int = 0) -> list[str]:
        """The ``count`` members with the highest scores after the ``start`` highest, highest first
        (ties: member descending)."""
        ...

    async def delete(self, *keys: str) -> None: ...

    async def flushall(self) -> None:
        """Delete every key on the server (tests only: isolation between tests)."""
        ...

    async def aclose(self) -> None: ...


def check_read_args(block_ms: int, count: int) -> None:
    if block_ms < 0:
        raise ValueError(f"block_ms must be >= 0 (0 waits forever), not {block_ms}")
    if count < 1:
        raise ValueError(f"count must be >= 1, not {count}")


#: a stream entry id as numbers: ``(ms, seq)``
StreamId = Cursor


def parse_id(text: str) -> StreamId:
    """``"<ms>-<seq>"`` or ``"<ms>"``, like Redis (which answers "Invalid stream ID" otherwise)."""
    try:
        return Cursor.parse(text)
    except InvalidCursor as exc:
        raise StoreError(str(exc)) from None


def format_id(entry_id: StreamId) -> str:
    return str(Cursor(*entry_id))
