"""The relay's storage seam: a narrow async interface over Redis streams, hashes and a sorted set.

Theory of operation
-------------------
:class:`Store` is everything the relay asks of Redis, and nothing more. Two implementations share
one conformance suite (``tests/integration/test_store.py``), run against both:

- :class:`GlideStore`: valkey-glide (Rust core; trio support through anyio, detected with sniffio),
  for Redis >= 6.2 and Valkey. A glide client is *one* multiplexed connection, so:

  * one shared client serves every non-blocking command;
  * every :class:`BlockingReader` owns a dedicated client for ``XREAD BLOCK`` / ``XREADGROUP
    BLOCK``: a pending blocking command would stall (and time out) anything else sent on its
    connection;
  * a blocking read that is cancelled leaves its command pending on the server until the block
    expires, and glide keeps that connection busy meanwhile. The reader therefore closes its
    client on cancellation (and on a timeout or lost connection) and reconnects on its next read.

  glide gives blocking commands ``block_ms`` plus a margin on top of ``request_timeout``, so a
  block may be longer than the request timeout (``block_ms=0``, "forever", has no timeout).
- :class:`MemoryStore`: an in-process fake with the same observable semantics (entry ids, exclusive
  cursors, exact ``maxlen`` trimming, consumer groups with pending entries, ``WRONGTYPE``), blocking
  reads built on trio events. Every method is a trio checkpoint, like real I/O.

Notices: a listener (one per relay process, ``relay/fanout.py``) names the streams it watches
(:meth:`Store.watch`, a set per stream), and every append publishes a small notice (the stream, its
new entry's id and the id of the entry before it) from the same script to each watching listener's
own channel (``tether:appended:<listener>``), except the appender's own (it knows already). So one
subscriber connection per relay process wakes all its delivering connections, and a relay hears
only of the streams it delivers (:meth:`Store.listen`). Pub/sub is at most once: the listener
publishes its own numbered ticks on its channel and reports a gap (or a silence) as "notices may be
lost"; the listening side then re-reads from Redis. The previous id is kept in the stream's meta
hash (``last``) by every writer, so it stays right after entries are trimmed.

Stream entries carry their payload in one field, ``p``. Ids are strings ``"<ms>-<seq>"``; ``"0"`` is
the cursor before the first entry. Key names are the caller's business (``relay/keys.py``): this
module is generic.

Errors: anything the server refuses, and any lost connection or timeout, raises :class:`StoreError`
(the original glide exception is its ``__cause__``). Malformed arguments (negative ``block_ms``,
``count`` < 1, an unsupported URL) raise ``ValueError``.

Cancellation: a cancelled write may or may not have been applied (the bytes may already be on the
wire), so callers keep writes idempotent. A cancelled ``read_group`` may have delivered an entry to
that consumer server-side; it then sits in the group's pending list (:meth:`Store.pending`).
"""

from __future__ import annotations

import bisect
import copy
import logging
import math
import time
from collections.abc import AsyncIterator, Awaitable, Callable, Iterator, Mapping
from contextlib import AbstractAsyncContextManager, asynccontextmanager, contextmanager
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Protocol, TypeVar
from urllib.parse import parse_qs, unquote, urlsplit, urlunsplit

import trio

if TYPE_CHECKING:
    from glide import GlideClient, GlideClientConfiguration

__all__ = [
    "DEFAULT_REQUEST_TIMEOUT_MS",
    "PAYLOAD_FIELD",
    "Appended",
    "BlockingReader",
    "Cap",
    "Diversion",
    "Entry",
    "GlideStore",
    "MemoryStore",
    "Store",
    "StoreError",
    "meta_key",
    "open_store",
    "transient_key",
]

Entry = tuple[str, bytes]
"""A stream entry: its id and its payload."""

PAYLOAD_FIELD = "p"
_PAYLOAD_FIELD_BYTES = PAYLOAD_FIELD.encode()
DEFAULT_REQUEST_TIMEOUT_MS = 5000

_T = TypeVar("_T")

log = logging.getLogger("tether.store")


def meta_key(stream: str) -> str:
    """The hash :meth:`Store.append_once` keeps a stream's producers and byte count in."""
    return f"{stream}:meta"


def watchers_key(stream: str) -> str:
    """The set of listeners (relay processes) that deliver ``stream`` and want its notices."""
    return f"{stream}:watchers"


def transient_key(stream: str) -> str:
    """The list of a stream's transient entries (``"<id> <size>"``) not yet trimmed."""
    return f"{stream}:transient"


@dataclass(frozen=True)
class Cap:
    """Most entries and payload bytes a stream may hold; 0 means unlimited."""

    entries: int = 0
    bytes: int = 0


@dataclass(frozen=True)
class Diversion:
    """Where :meth:`Store.append_once` stores an entry other than its numbered stream."""

    stream: str
    maxlen: int = 0  #: 0: unbounded


@dataclass(frozen=True)
class Appended:
    outcome: str  #: ``stored``, ``duplicate``, ``gap``, ``full`` or ``skipped``
    cursor: str = ""  #: the entry's id (stored; duplicate of the last stored: its id, else "")
    prev: str = ""  #: stored: the id of the entry before it in its stream (``0-0``: the first)
    last: int = 0  #: the producer's last answered number (gap)
    size: int = 0  #: entries in the stream (full)


@dataclass(frozen=True)
class Notice:
    """An entry was appended to ``stream``: its id, and the id of the entry before it."""

    stream: str
    prev: str
    entry_id: str


#: what :meth:`Store.listen` hands over: a notice, or ``None`` for "notices may have been lost"
NoticeSink = Callable[["Notice | None"], None]

#: a listener's pub/sub channel is this prefix and its id
NOTICE_CHANNEL = "tether:appended:"
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

    async def last_id(self, stream: str) -> str | None:
        """The id of the newest entry still in the stream, ``None`` if there is none."""
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

    # exactly-once appends with a buffer cap, and trimming what the reader received
    async def append_once(
        self,
        stream: str,
        producer: str,
        n: int,
        payload: bytes | None,
        *,
        transient: bool = False,
        cap: Cap = Cap(),
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

        ``divert``: store the entry in ``divert.stream`` instead (trimmed to about ``divert.maxlen``
        entries, oldest first; no cap, no byte count), still numbered in ``stream``'s bookkeeping,
        so one producer's entries to several streams are deduplicated as one sequence.

        A stored entry is announced to the listeners watching the stream it went to (see
        :meth:`listen`), except ``notify_except``: the appender's own, which hands it over itself.
        """
        ...

    async def trim_received(self, stream: str, cursor: str, *, limit: int = 1000) -> int:
        """Delete up to ``limit`` transient entries with ids up to ``cursor``; returns how many."""
        ...

    async def buffered_bytes(self, stream: str) -> int:
        """Payload bytes of the entries :meth:`append_once` stored and :meth:`trim_received` kept."""
        ...

    # hashes, strings, sorted set
    async def hset(self, key: str, mapping: Mapping[str, bytes | str]) -> None: ...
    async def hgetall(self, key: str) -> dict[str, bytes]: ...
    async def set_bytes(self, key: str, value: bytes) -> None: ...
    async def get_bytes(self, key: str) -> bytes | None: ...
    async def zadd(
        self, key: str, member: str, score: float, *, only_existing: bool = False
    ) -> bool:
        """Set ``member``'s score; with ``only_existing`` never add. True if anything changed."""
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

    async def zrange_desc(self, key: str, count: int) -> list[str]:
        """The ``count`` members with the highest scores, highest first (ties: member descending)."""
        ...

    async def delete(self, *keys: str) -> None: ...

    async def flushall(self) -> None:
        """Delete every key on the server (tests only: isolation between tests)."""
        ...

    async def aclose(self) -> None: ...


def _check_read_args(block_ms: int, count: int) -> None:
    if block_ms < 0:
        raise ValueError(f"block_ms must be >= 0 (0 waits forever), not {block_ms}")
    if count < 1:
        raise ValueError(f"count must be >= 1, not {count}")


# --- valkey-glide ---------------------------------------------------------------------------------

_glide_logging_configured = False


def _quiet_glide() -> None:
    """glide's core logs warnings (e.g. ``timeout_watchdog``) to stderr; keep only errors."""
    global _glide_logging_configured
    if not _glide_logging_configured:
        import glide

        glide.Logger.set_logger_config(glide.LogLevel.ERROR)
        _glide_logging_configured = True


def _redact(url: str) -> str:
    parts = urlsplit(url)
    if parts.password is None:
        return url
    netloc = f"{parts.username or ''}:***@{parts.hostname}"
    if parts.port is not None:
        netloc += f":{parts.port}"
    return urlunsplit(parts._replace(netloc=netloc))


def _database(text: str, url: str) -> int | None:
    if not text:
        return None
    if not (text.isascii() and text.isdigit()):
        raise ValueError(f"database number must be a non-negative integer in {_redact(url)!r}")
    return int(text)


def _glide_config(url: str, request_timeout_ms: int) -> GlideClientConfiguration:
    """``redis://[user:password@]host[:port][/db]``, ``rediss://`` (TLS), ``unix:///path[?db=N]``."""
    import glide

    parts = urlsplit(url)
    if parts.scheme == "unix":
        if parts.netloc or not parts.path.startswith("/"):
            raise ValueError(
                f"unix socket URL needs an absolute path (unix:///...): {_redact(url)!r}"
            )
        address = glide.NodeAddress(unix_socket_path=unquote(parts.path))
        database = _database(parse_qs(parts.query).get("db", [""])[0], url)
    elif parts.scheme in ("redis", "rediss", "valkey", "valkeys"):
        address = glide.NodeAddress(parts.hostname or "localhost", parts.port or 6379)
        database = _database(parts.path.strip("/"), url)
    else:
        raise ValueError(
            f"unsupported store URL {_redact(url)!r}: "
            "use redis://host:port[/db], rediss://..., unix:///path/to.sock or memory://"
        )
    credentials = None
    if parts.password is not None:
        credentials = glide.ServerCredentials(
            password=unquote(parts.password), username=unquote(parts.username or "") or None
        )
    return glide.GlideClientConfiguration(
        [address],
        use_tls=parts.scheme in ("rediss", "valkeys"),
        credentials=credentials,
        database_id=database,
        request_timeout=request_timeout_ms,
    )


@contextmanager
def _glide_errors(what: str) -> Iterator[None]:
    import glide

    try:
        yield
    except glide.GlideError as exc:
        raise StoreError(f"{what}: {exc}".strip()) from exc


def _text(value: bytes | str) -> str:
    return value.decode() if isinstance(value, bytes) else value


def _entries(reply: Mapping[bytes, list[list[bytes]] | None] | None) -> list[Entry]:
    """glide's stream reply ``{id: [[field, value], ...]}`` (server order) -> ``[(id, payload)]``.

    An entry without the ``p`` field (written by someone else) gets an empty payload: the caller's
    decoder reports it, and the cursor still moves past it.
    """
    if not reply:
        return []
    out: list[Entry] = []
    for entry_id, fields in reply.items():
        payload = b""
        for name, value in fields or ():
            if name == _PAYLOAD_FIELD_BYTES:
                payload = value
                break
        out.append((_text(entry_id), payload))
    return out


class _GlideReader:
    """A :class:`BlockingReader` owning one glide client; reconnects after a discarded client."""

    def __init__(self, config: GlideClientConfiguration) -> None:
        self._config = config
        self._client: GlideClient | None = None
        self._closed = False

    def __repr__(self) -> str:
        state = "closed" if self._closed else "connected" if self._client else "idle"
        return f"<GlideReader {state}>"

    async def connect(self) -> GlideClient:
        if self._closed:
            raise StoreError("blocking reader is closed")
        if self._client is None:
            import glide

            with _glide_errors("cannot open a blocking-read connection"):
                self._client = await glide.GlideClient.create(self._config)
        return self._client

    async def aclose(self) -> None:
        self._closed = True
        await self._discard()

    async def _discard(self) -> None:
        client, self._client = self._client, None
        if client is not None:
            with trio.CancelScope(shield=True):
                await client.close()

    async def _blocking(self, what: str, command: Callable[[GlideClient], Awaitable[_T]]) -> _T:
        import glide

        client = await self.connect()
        try:
            return await command(client)
        except glide.RequestError as exc:
            if isinstance(exc, glide.TimeoutError | glide.ConnectionError):
                await self._discard()  # the command may still be pending on the connection
            # else the server refused it (NOGROUP, WRONGTYPE...): the connection is idle again
            raise StoreError(f"{what}: {exc}") from exc
        except glide.GlideError as exc:
            await self._discard()
            raise StoreError(f"{what}: {exc}") from exc
        except BaseException:
            # Cancelled: the server still blocks on our command and glide keeps the connection
            # busy until it answers; a fresh connection is cheaper than waiting out the block.
            await self._discard()
            raise

    async def read(
        self, stream: str, after: str, *, block_ms: int = 1000, count: int = 100
    ) -> list[Entry]:
        import glide

        _check_read_args(block_ms, count)
        options = glide.StreamReadOptions(block_ms=block_ms, count=count)
        reply = await self._blocking(
            f"XREAD {stream} after {after}", lambda c: c.xread({stream: after}, options)
        )
        return _entries(reply.get(stream.encode())) if reply else []

    async def read_group(
        self, stream: str, group: str, consumer: str, *, block_ms: int = 1000
    ) -> Entry | None:
        import glide

        _check_read_args(block_ms, 1)
        options = glide.StreamReadGroupOptions(block_ms=block_ms, count=1)
        reply = await self._blocking(
            f"XREADGROUP {group} {stream}",
            lambda c: c.xreadgroup({stream: ">"}, group, consumer, options),
        )
        entries = _entries(reply.get(stream.encode())) if reply else []
        return entries[0] if entries else None


#: KEYS: stream, meta, transient list. ARGV: producer, n, payload, transient (0/1), max entries,
#: max bytes, skip (0/1), diverted maxlen; KEYS[4]: the stream to store in (KEYS[1] unless
#: diverted), KEYS[5] its meta hash, KEYS[6] its watchers; ARGV[9] the notice channel prefix,
#: ARGV[10] the listener not to notify. Returns {outcome, cursor-or-number, prev}: 1 stored,
#: 0 duplicate, -1 gap, -2 full, 2 skipped. A stored entry's notice goes to its watchers.
_APPEND_ONCE = """
local function notify(prev, id)
  local text = 'n ' .. prev .. ' ' .. id .. ' ' .. KEYS[4]
  for _, listener in ipairs(redis.call('SMEMBERS', KEYS[6])) do
    if listener ~= ARGV[10] then redis.call('PUBLISH', ARGV[9] .. listener, text) end
  end
end
local last = tonumber(redis.call('HGET', KEYS[2], 'n:' .. ARGV[1]) or '0')
local n = tonumber(ARGV[2])
if n <= last then
  if n == last then return {0, redis.call('HGET', KEYS[2], 'c:' .. ARGV[1]) or ''} end
  return {0, ''}
end
if n ~= last + 1 then return {-1, tostring(last)} end
if ARGV[7] == '1' then
  redis.call('HSET', KEYS[2], 'n:' .. ARGV[1], n, 'c:' .. ARGV[1], '')
  return {2, ''}
end
if KEYS[4] ~= KEYS[1] then
  local did
  if tonumber(ARGV[8]) > 0 then
    did = redis.call('XADD', KEYS[4], 'MAXLEN', '~', ARGV[8], '*', 'p', ARGV[3])
  else
    did = redis.call('XADD', KEYS[4], '*', 'p', ARGV[3])
  end
  redis.call('HSET', KEYS[2], 'n:' .. ARGV[1], n, 'c:' .. ARGV[1], did)
  local dprev = redis.call('HGET', KEYS[5], 'last') or '0-0'
  redis.call('HSET', KEYS[5], 'last', did)
  notify(dprev, did)
  return {1, did, dprev}
end
local size = string.len(ARGV[3])
local max_entries = tonumber(ARGV[5])
local max_bytes = tonumber(ARGV[6])
local held = redis.call('XLEN', KEYS[1])
local bytes = tonumber(redis.call('HGET', KEYS[2], 'bytes') or '0')
if (max_entries > 0 and held >= max_entries) or (max_bytes > 0 and bytes + size > max_bytes) then
  redis.call('HSET', KEYS[2], 'n:' .. ARGV[1], n, 'c:' .. ARGV[1], '')
  return {-2, tostring(held)}
end
local id = redis.call('XADD', KEYS[1], '*', 'p', ARGV[3])
local prev = redis.call('HGET', KEYS[2], 'last') or '0-0'
redis.call('HSET', KEYS[2], 'n:' .. ARGV[1], n, 'c:' .. ARGV[1], id, 'last', id)
redis.call('HINCRBY', KEYS[2], 'bytes', size)
if ARGV[4] == '1' then redis.call('RPUSH', KEYS[3], id .. ' ' .. size) end
notify(prev, id)
return {1, id, prev}
"""

#: KEYS: stream, meta, watchers. ARGV: payload, exact maxlen (-1: none), notice channel prefix.
#: Returns the entry's id.
_APPEND = """
local id
if tonumber(ARGV[2]) >= 0 then
  id = redis.call('XADD', KEYS[1], 'MAXLEN', ARGV[2], '*', 'p', ARGV[1])
else
  id = redis.call('XADD', KEYS[1], '*', 'p', ARGV[1])
end
local prev = redis.call('HGET', KEYS[2], 'last') or '0-0'
redis.call('HSET', KEYS[2], 'last', id)
local text = 'n ' .. prev .. ' ' .. id .. ' ' .. KEYS[1]
for _, listener in ipairs(redis.call('SMEMBERS', KEYS[3])) do
  redis.call('PUBLISH', ARGV[3] .. listener, text)
end
return id
"""

#: KEYS: stream, meta, transient list. ARGV: cursor ms, cursor seq, limit. Returns entries deleted.
_TRIM_RECEIVED = """
local cms = tonumber(ARGV[1])
local cseq = tonumber(ARGV[2])
local head = redis.call('LRANGE', KEYS[3], 0, tonumber(ARGV[3]) - 1)
local removed = 0
local freed = 0
for _, item in ipairs(head) do
  local ms, seq, size = string.match(item, '^(%d+)-(%d+) (%d+)$')
  ms = tonumber(ms)
  seq = tonumber(seq)
  if ms > cms or (ms == cms and seq > cseq) then break end
  redis.call('XDEL', KEYS[1], ms .. '-' .. seq)
  freed = freed + tonumber(size)
  removed = removed + 1
end
if removed > 0 then
  redis.call('LTRIM', KEYS[3], removed, -1)
  redis.call('HINCRBY', KEYS[2], 'bytes', -freed)
end
return removed
"""


def _appended(reply: object) -> Appended:
    assert isinstance(reply, list) and len(reply) in (2, 3)
    code, value = int(reply[0]), _text(reply[1])
    if code == 1:
        return Appended("stored", cursor=value, prev=_text(reply[2]))
    if code == 0:
        return Appended("duplicate", cursor=value)
    if code == 2:
        return Appended("skipped")
    if code == -1:
        return Appended("gap", last=int(value))
    return Appended("full", size=int(value))


class GlideStore:
    """A :class:`Store` on a Redis-compatible server through valkey-glide. Use :func:`open_store`."""

    def __init__(self, client: GlideClient, config: GlideClientConfiguration, url: str) -> None:
        self._client = client
        self._config = config
        self._url = _redact(url)

    def __repr__(self) -> str:
        return f"<GlideStore {self._url}>"

    @classmethod
    async def connect(
        cls, url: str, *, request_timeout_ms: int = DEFAULT_REQUEST_TIMEOUT_MS
    ) -> GlideStore:
        import glide

        config = _glide_config(url, request_timeout_ms)
        _quiet_glide()
        with _glide_errors(f"cannot connect to {_redact(url)}"):
            client = await glide.GlideClient.create(config)
        return cls(client, config, url)

    async def _script(
        self, what: str, source: str, keys: list[str], args: list[str | bytes]
    ) -> object:
        import glide

        script = _SCRIPTS.get(source)
        if script is None:
            script = _SCRIPTS[source] = glide.Script(source)  # type: ignore[no-untyped-call]
        with _glide_errors(what):
            return await self._client.invoke_script(script, keys=keys, args=args)  # type: ignore[arg-type]

    async def append_once(
        self,
        stream: str,
        producer: str,
        n: int,
        payload: bytes | None,
        *,
        transient: bool = False,
        cap: Cap = Cap(),
        divert: Diversion | None = None,
        notify_except: str = "",
    ) -> Appended:
        reply = await self._script(
            f"append to {stream}",
            _APPEND_ONCE,
            [
                stream,
                meta_key(stream),
                transient_key(stream),
                divert.stream if divert else stream,
                meta_key(divert.stream if divert else stream),
                watchers_key(divert.stream if divert else stream),
            ],
            [
                producer,
                str(n),
                payload or b"",
                "1" if transient else "0",
                str(cap.entries),
                str(cap.bytes),
                "1" if payload is None else "0",
                str(divert.maxlen if divert else 0),
                NOTICE_CHANNEL,
                notify_except,
            ],
        )
        return _appended(reply)

    async def trim_received(self, stream: str, cursor: str, *, limit: int = 1000) -> int:
        ms, seq = parse_id(cursor)
        reply = await self._script(
            f"trim {stream}",
            _TRIM_RECEIVED,
            [stream, meta_key(stream), transient_key(stream)],
            [str(ms), str(seq), str(limit)],
        )
        assert isinstance(reply, int)
        return reply

    async def buffered_bytes(self, stream: str) -> int:
        with _glide_errors(f"HGET {meta_key(stream)}"):
            value = await self._client.hget(meta_key(stream), "bytes")
        return int(value or 0)

    async def append(self, stream: str, payload: bytes, *, maxlen: int | None = None) -> str:
        reply = await self._script(
            f"XADD {stream}",
            _APPEND,
            [stream, meta_key(stream), watchers_key(stream)],
            [payload, str(-1 if maxlen is None else maxlen), NOTICE_CHANNEL],
        )
        assert isinstance(reply, bytes | str)
        return _text(reply)

    async def read_after(self, stream: str, after: str, *, count: int = 100) -> list[Entry]:
        import glide

        _check_read_args(0, count)
        with _glide_errors(f"XRANGE {stream} after {after}"):
            reply = await self._client.xrange(
                stream, glide.ExclusiveIdBound(after), glide.MaxId(), count=count
            )
        return _entries(reply)

    async def last_id(self, stream: str) -> str | None:
        import glide

        with _glide_errors(f"XREVRANGE {stream}"):
            reply = await self._client.xrevrange(stream, glide.MaxId(), glide.MinId(), count=1)
        return _text(next(iter(reply))) if reply else None

    @asynccontextmanager
    async def blocking_reader(self) -> AsyncIterator[BlockingReader]:
        reader = _GlideReader(self._config)
        try:
            await reader.connect()
            yield reader
        finally:
            await reader.aclose()

    async def watch(self, stream: str, listener: str) -> None:
        with _glide_errors(f"SADD {watchers_key(stream)}"):
            await self._client.sadd(watchers_key(stream), [listener])

    async def unwatch(self, stream: str, listener: str) -> None:
        with _glide_errors(f"SREM {watchers_key(stream)}"):
            await self._client.srem(watchers_key(stream), [listener])

    async def listen(
        self,
        listener: str,
        sink: NoticeSink,
        *,
        task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED,
    ) -> None:
        import glide

        modes = glide.GlideClientConfiguration.PubSubChannelModes
        config = copy.copy(self._config)
        config.pubsub_subscriptions = glide.GlideClientConfiguration.PubSubSubscriptions(
            channels_and_patterns={modes.Exact: {NOTICE_CHANNEL + listener}},
            callback=None,
            context=None,
        )
        with _glide_errors("cannot subscribe to append notices"):
            subscriber = await glide.GlideClient.create(config)
        ticks = _Ticks(listener, sink)
        try:
            async with trio.open_nursery() as nursery:
                with _glide_errors("CLIENT ID"):
                    ticks.connection(await subscriber.custom_command(["CLIENT", "ID"]))
                nursery.start_soon(self._tick, ticks, subscriber)
                task_status.started()
                while True:
                    message = await subscriber.get_pubsub_message()
                    ticks.received(_text(message.message))
        finally:
            with trio.CancelScope(shield=True):
                await subscriber.close()

    async def _tick(self, ticks: _Ticks, subscriber: GlideClient) -> None:
        """Every ``TICK_SECONDS``: has the subscriber connection been replaced (glide reconnects
        and resubscribes by itself, and whatever was published meanwhile is gone)? Then publish a
        numbered tick to ourselves, and say "maybe lost" when our own ticks are late."""
        while True:
            try:
                with _glide_errors("CLIENT ID"):
                    ticks.connection(await subscriber.custom_command(["CLIENT", "ID"]))
                with _glide_errors("PUBLISH tick"):
                    await self._client.publish(ticks.next(), NOTICE_CHANNEL + ticks.nonce)
            except StoreError as exc:
                log.debug("append notices: %s", exc)
            ticks.check_late(trio.current_time())
            await trio.sleep(TICK_SECONDS)

    async def ensure_group(self, stream: str, group: str) -> None:
        import glide

        options = glide.StreamGroupOptions(make_stream=True)
        try:
            await self._client.xgroup_create(stream, group, "0", options)
        except glide.RequestError as exc:
            if "BUSYGROUP" not in str(exc):
                raise StoreError(f"XGROUP CREATE {stream} {group}: {exc}") from exc
        except glide.GlideError as exc:
            raise StoreError(f"XGROUP CREATE {stream} {group}: {exc}") from exc

    async def ack(self, stream: str, group: str, entry_id: str) -> None:
        with _glide_errors(f"XACK {stream} {group} {entry_id}"):
            await self._client.xack(stream, group, [entry_id])

    async def pending(self, stream: str, group: str, *, count: int = 100) -> list[tuple[str, str]]:
        import glide

        _check_read_args(0, count)
        with _glide_errors(f"XPENDING {stream} {group}"):
            reply = await self._client.xpending_range(
                stream, group, glide.MinId(), glide.MaxId(), count
            )
        out: list[tuple[str, str]] = []
        for row in reply:  # [entry id, consumer, idle ms, delivery count]
            entry_id, consumer = row[0], row[1]
            assert isinstance(entry_id, bytes) and isinstance(consumer, bytes)
            out.append((entry_id.decode(), consumer.decode()))
        return out

    async def hset(self, key: str, mapping: Mapping[str, bytes | str]) -> None:
        if not mapping:
            return  # HSET without fields is a syntax error; "set nothing" is a no-op
        with _glide_errors(f"HSET {key}"):
            await self._client.hset(key, dict(mapping))

    async def hgetall(self, key: str) -> dict[str, bytes]:
        with _glide_errors(f"HGETALL {key}"):
            reply = await self._client.hgetall(key)
        return {_text(name): value for name, value in reply.items()}

    async def set_bytes(self, key: str, value: bytes) -> None:
        with _glide_errors(f"SET {key}"):
            await self._client.set(key, value)

    async def get_bytes(self, key: str) -> bytes | None:
        with _glide_errors(f"GET {key}"):
            return await self._client.get(key)

    async def zadd(
        self, key: str, member: str, score: float, *, only_existing: bool = False
    ) -> bool:
        import glide

        condition = glide.ConditionalChange.ONLY_IF_EXISTS if only_existing else None
        with _glide_errors(f"ZADD {key}"):
            changed = await self._client.zadd(
                key, {member: float(score)}, existing_options=condition, changed=True
            )
        return changed > 0

    async def zrem(self, key: str, member: str) -> bool:
        with _glide_errors(f"ZREM {key}"):
            return await self._client.zrem(key, [member]) > 0

    async def zrange_by_score(self, key: str, max_score: float, count: int) -> list[str]:
        import glide

        if count < 1:
            return []
        query = glide.RangeByScore(
            glide.InfBound.NEG_INF, glide.ScoreBoundary(max_score), glide.Limit(0, count)
        )
        with _glide_errors(f"ZRANGE {key} BYSCORE"):
            members = await self._client.zrange(key, query)
        return [_text(m) for m in members]

    async def expire(self, key: str, seconds: float) -> None:
        with _glide_errors(f"PEXPIRE {key}"):
            await self._client.pexpire(key, max(1, round(seconds * 1000)))

    async def ttl(self, key: str) -> float | None:
        with _glide_errors(f"PTTL {key}"):
            ms = await self._client.pttl(key)
        return ms / 1000 if ms >= 0 else None

    async def zrange_desc(self, key: str, count: int) -> list[str]:
        import glide

        if count < 1:
            return []
        with _glide_errors(f"ZRANGE {key} REV"):
            members = await self._client.zrange(key, glide.RangeByIndex(0, count - 1), reverse=True)
        return [_text(m) for m in members]

    async def delete(self, *keys: str) -> None:
        if keys:
            with _glide_errors(f"DEL {' '.join(keys)}"):
                await self._client.delete(list(keys))

    async def flushall(self) -> None:
        with _glide_errors("FLUSHALL"):
            await self._client.flushall()

    async def aclose(self) -> None:
        with trio.CancelScope(shield=True):
            await self._client.close()


_SCRIPTS: dict[str, object] = {}


class _Ticks:
    """A listener's own ticks (``t <nonce> <k>``) and how it reads the channel's messages.

    Notices travel on a pub/sub connection that may drop and come back (glide resubscribes by
    itself); anything published meanwhile is gone. A new connection id, a tick of ours that
    arrives out of sequence, or one not back ``TICK_LATE_SECONDS`` after it was sent, means that
    may have happened: the sink gets ``None``.
    """

    def __init__(self, nonce: str, sink: NoticeSink) -> None:
        self.nonce = nonce
        self.sink = sink
        self.sent = 0
        self.seen = 0
        self.waiting_since: float | None = None  #: when the oldest tick not seen yet was sent
        self.late = False
        self.connection_id: object = None

    def connection(self, connection_id: object) -> None:
        if self.connection_id is not None and connection_id != self.connection_id:
            log.info("append notices: the subscription was reconnected; re-reading")
            self.sink(None)
        self.connection_id = connection_id

    def next(self) -> str:
        self.sent += 1
        if self.waiting_since is None:
            self.waiting_since = trio.current_time()
        return f"t {self.nonce} {self.sent}"

    def check_late(self, now: float) -> None:
        since = self.waiting_since
        if not self.late and since is not None and now - since > TICK_LATE_SECONDS:
            self.late = True
            log.warning("append notices are late; connections re-read what they deliver")
            self.sink(None)

    def received(self, text: str) -> None:
        kind, _, rest = text.partition(" ")
        if kind == "n":
            prev, entry_id, stream = rest.split(" ", 2)
            self.sink(Notice(stream, prev, entry_id))
        elif kind == "t":
            nonce, _, k = rest.partition(" ")
            if nonce != self.nonce:
                return  # another relay process's tick
            number = int(k)
            if number != self.seen + 1 or self.late:
                self.sink(None)
            self.seen, self.late = number, False
            if number >= self.sent:
                self.waiting_since = None


# --- in-memory fake -------------------------------------------------------------------------------

_Id = tuple[int, int]


def parse_id(text: str) -> _Id:
    """``"<ms>-<seq>"`` or ``"<ms>"``, like Redis (which answers "Invalid stream ID" otherwise)."""
    ms, sep, seq = text.partition("-")
    if not (ms.isascii() and ms.isdigit()) or (sep and not (seq.isascii() and seq.isdigit())):
        raise StoreError(f"invalid stream id {text!r}")
    return int(ms), int(seq) if sep else 0


def _format_id(entry_id: _Id) -> str:
    return f"{entry_id[0]}-{entry_id[1]}"


@dataclass
class _Group:
    delivered: _Id = (0, 0)  # last id delivered to the group
    pending: dict[_Id, str] = field(default_factory=dict)  # entry id -> consumer


@dataclass
class _Stream:
    ids: list[_Id] = field(default_factory=list)
    payloads: list[bytes] = field(default_factory=list)
    last: _Id = (0, 0)  # last id ever generated: ids keep growing after trims
    groups: dict[str, _Group] = field(default_factory=dict)

    def after(self, cursor: _Id, count: int) -> list[Entry]:
        start = bisect.bisect_right(self.ids, cursor)
        stop = start + count
        return [
            (_format_id(i), p)
            for i, p in zip(self.ids[start:stop], self.payloads[start:stop], strict=True)
        ]


class _Hash(dict[str, bytes]):
    pass


class _List(list[bytes]):
    pass


class _ZSet(dict[str, float]):
    pass


_Value = _Stream | _Hash | _ZSet | _List | bytes
_V = TypeVar("_V", _Stream, _Hash, _ZSet, _List, bytes)


class _MemoryReader:
    def __init__(self, store: MemoryStore) -> None:
        self._store = store
        self._closed = False

    def __repr__(self) -> str:
        return f"<MemoryReader {'closed' if self._closed else 'open'}>"

    def _check_open(self) -> None:
        if self._closed:
            raise StoreError("blocking reader is closed")

    async def read(
        self, stream: str, after: str, *, block_ms: int = 1000, count: int = 100
    ) -> list[Entry]:
        _check_read_args(block_ms, count)
        self._check_open()
        cursor = parse_id(after)
        await trio.lowlevel.checkpoint()
        with trio.move_on_after(block_ms / 1000 if block_ms else math.inf):
            while True:
                s = self._store._get(stream, _Stream)
                entries = s.after(cursor, count) if s else []
                if entries:
                    return entries
                await self._store._changed(stream)
        return []

    async def read_group(
        self, stream: str, group: str, consumer: str, *, block_ms: int = 1000
    ) -> Entry | None:
        _check_read_args(block_ms, 1)
        self._check_open()
        await trio.lowlevel.checkpoint()
        with trio.move_on_after(block_ms / 1000 if block_ms else math.inf):
            while True:
                s = self._store._get(stream, _Stream)
                g = s.groups.get(group) if s else None
                if s is None or g is None:
                    raise StoreError(f"NOGROUP no stream {stream!r} or no group {group!r} on it")
                start = bisect.bisect_right(s.ids, g.delivered)
                if start < len(s.ids):
                    entry_id = g.delivered = s.ids[start]
                    g.pending[entry_id] = consumer
                    return _format_id(entry_id), s.payloads[start]
                await self._store._changed(stream)
        return None


class MemoryStore:
    """An in-process :class:`Store` for tests and ``memory://``; nothing survives the process."""

    def __init__(self, *, clock: Callable[[], float] = time.time) -> None:
        self._data: dict[str, _Value] = {}
        self._waiters: dict[str, trio.Event] = {}
        self._sinks: dict[str, NoticeSink] = {}
        self._watchers: dict[str, set[str]] = {}
        self._expiry: dict[str, float] = {}
        self._clock = clock

    def __repr__(self) -> str:
        return f"<MemoryStore keys={len(self._data)}>"

    def _expire_if_due(self, key: str) -> None:
        deadline = self._expiry.get(key)
        if deadline is not None and self._clock() >= deadline:
            del self._expiry[key]
            self._data.pop(key, None)

    def _get(self, key: str, kind: type[_V]) -> _V | None:
        self._expire_if_due(key)
        value = self._data.get(key)
        if value is None:
            return None
        if not isinstance(value, kind):
            raise StoreError(f"WRONGTYPE {key!r} holds a {type(value).__name__.strip('_')}")
        return value

    def _get_or_create(self, key: str, kind: type[_V], default: Callable[[], _V]) -> _V:
        value = self._get(key, kind)
        if value is None:
            value = self._data[key] = default()
        return value

    async def _changed(self, key: str) -> None:
        """Wait until ``key`` is written or deleted."""
        event = self._waiters.get(key)
        if event is None:
            event = self._waiters[key] = trio.Event()
        await event.wait()

    def _notify(self, key: str) -> None:
        event = self._waiters.pop(key, None)
        if event is not None:
            event.set()

    async def append(self, stream: str, payload: bytes, *, maxlen: int | None = None) -> str:
        await trio.lowlevel.checkpoint()
        return self._xadd(stream, payload, maxlen)

    def _xadd(self, stream: str, payload: bytes, maxlen: int | None = None) -> str:
        return self._xadd_prev(stream, payload, maxlen)[1]

    def _xadd_prev(
        self, stream: str, payload: bytes, maxlen: int | None = None, notify_except: str = ""
    ) -> tuple[str, str]:
        """Append; ``(previous id, new id)``, and the notice to every watching listener."""
        s = self._get_or_create(stream, _Stream, _Stream)
        prev = _format_id(s.last)
        now_ms = time.time_ns() // 1_000_000
        s.last = (now_ms, 0) if now_ms > s.last[0] else (s.last[0], s.last[1] + 1)
        s.ids.append(s.last)
        s.payloads.append(bytes(payload))
        if maxlen is not None and len(s.ids) > maxlen:
            drop = len(s.ids) - maxlen
            del s.ids[:drop], s.payloads[:drop]
        self._notify(stream)
        entry_id = _format_id(s.last)
        for listener in list(self._watchers.get(stream, ())):
            sink = self._sinks.get(listener)
            if sink is not None and listener != notify_except:
                sink(Notice(stream, prev, entry_id))
        return prev, entry_id

    async def read_after(self, stream: str, after: str, *, count: int = 100) -> list[Entry]:
        _check_read_args(0, count)
        cursor = parse_id(after)
        await trio.lowlevel.checkpoint()
        s = self._get(stream, _Stream)
        return s.after(cursor, count) if s else []

    async def append_once(
        self,
        stream: str,
        producer: str,
        n: int,
        payload: bytes | None,
        *,
        transient: bool = False,
        cap: Cap = Cap(),
        divert: Diversion | None = None,
        notify_except: str = "",
    ) -> Appended:
        await trio.lowlevel.checkpoint()
        meta = self._get_or_create(meta_key(stream), _Hash, _Hash)
        last = int(meta.get(f"n:{producer}", b"0"))
        if n <= last:
            cursor = meta.get(f"c:{producer}", b"").decode() if n == last else ""
            return Appended("duplicate", cursor=cursor)
        if n != last + 1:
            return Appended("gap", last=last)
        if payload is None:
            meta[f"n:{producer}"], meta[f"c:{producer}"] = str(n).encode(), b""
            return Appended("skipped")
        if divert is not None and divert.stream != stream:
            prev, entry_id = self._xadd_prev(
                divert.stream, payload, divert.maxlen or None, notify_except
            )
            meta[f"n:{producer}"], meta[f"c:{producer}"] = str(n).encode(), entry_id.encode()
            return Appended("stored", cursor=entry_id, prev=prev)
        s = self._get(stream, _Stream)
        held = len(s.ids) if s else 0
        held_bytes = int(meta.get("bytes", b"0"))
        if (cap.entries and held >= cap.entries) or (
            cap.bytes and held_bytes + len(payload) > cap.bytes
        ):
            meta[f"n:{producer}"], meta[f"c:{producer}"] = str(n).encode(), b""
            return Appended("full", size=held)
        prev, entry_id = self._xadd_prev(stream, payload, None, notify_except)
        meta[f"n:{producer}"], meta[f"c:{producer}"] = str(n).encode(), entry_id.encode()
        meta["bytes"] = str(held_bytes + len(payload)).encode()
        if transient:
            listed = self._get_or_create(transient_key(stream), _List, _List)
            listed.append(f"{entry_id} {len(payload)}".encode())
        return Appended("stored", cursor=entry_id, prev=prev)

    async def trim_received(self, stream: str, cursor: str, *, limit: int = 1000) -> int:
        upto = parse_id(cursor)
        await trio.lowlevel.checkpoint()
        listed = self._get(transient_key(stream), _List)
        s = self._get(stream, _Stream)
        if not listed:
            return 0
        removed = freed = 0
        for item in listed[:limit]:
            text, size = item.decode().split(" ")
            entry_id = parse_id(text)
            if entry_id > upto:
                break
            if s is not None:
                at = bisect.bisect_left(s.ids, entry_id)
                if at < len(s.ids) and s.ids[at] == entry_id:
                    del s.ids[at], s.payloads[at]
            freed += int(size)
            removed += 1
        del listed[:removed]
        meta = self._get_or_create(meta_key(stream), _Hash, _Hash)
        meta["bytes"] = str(int(meta.get("bytes", b"0")) - freed).encode()
        return removed

    async def buffered_bytes(self, stream: str) -> int:
        await trio.lowlevel.checkpoint()
        meta: Mapping[str, bytes] = self._get(meta_key(stream), _Hash) or {}
        return int(meta.get("bytes", b"0"))

    async def last_id(self, stream: str) -> str | None:
        await trio.lowlevel.checkpoint()
        s = self._get(stream, _Stream)
        return _format_id(s.ids[-1]) if s and s.ids else None

    @asynccontextmanager
    async def blocking_reader(self) -> AsyncIterator[BlockingReader]:
        reader = _MemoryReader(self)
        try:
            yield reader
        finally:
            reader._closed = True

    async def watch(self, stream: str, listener: str) -> None:
        await trio.lowlevel.checkpoint()
        self._watchers.setdefault(stream, set()).add(listener)

    async def unwatch(self, stream: str, listener: str) -> None:
        await trio.lowlevel.checkpoint()
        watching = self._watchers.get(stream)
        if watching is not None:
            watching.discard(listener)
            if not watching:
                del self._watchers[stream]

    async def listen(
        self,
        listener: str,
        sink: NoticeSink,
        *,
        task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED,
    ) -> None:
        self._sinks[listener] = sink
        try:
            task_status.started()
            await trio.sleep_forever()
        finally:
            if self._sinks.get(listener) is sink:
                del self._sinks[listener]

    async def ensure_group(self, stream: str, group: str) -> None:
        await trio.lowlevel.checkpoint()
        self._get_or_create(stream, _Stream, _Stream).groups.setdefault(group, _Group())

    async def ack(self, stream: str, group: str, entry_id: str) -> None:
        parsed = parse_id(entry_id)
        await trio.lowlevel.checkpoint()
        s = self._get(stream, _Stream)
        if s is not None and group in s.groups:
            s.groups[group].pending.pop(parsed, None)

    async def pending(self, stream: str, group: str, *, count: int = 100) -> list[tuple[str, str]]:
        _check_read_args(0, count)
        await trio.lowlevel.checkpoint()
        s = self._get(stream, _Stream)
        g = s.groups.get(group) if s else None
        if g is None:
            raise StoreError(f"NOGROUP no stream {stream!r} or no group {group!r} on it")
        return [(_format_id(i), g.pending[i]) for i in sorted(g.pending)[:count]]

    async def hset(self, key: str, mapping: Mapping[str, bytes | str]) -> None:
        await trio.lowlevel.checkpoint()
        if not mapping:
            return
        h = self._get_or_create(key, _Hash, _Hash)
        for name, value in mapping.items():
            h[name] = value.encode() if isinstance(value, str) else bytes(value)
        self._notify(key)

    async def hgetall(self, key: str) -> dict[str, bytes]:
        await trio.lowlevel.checkpoint()
        return dict(self._get(key, _Hash) or {})

    async def set_bytes(self, key: str, value: bytes) -> None:
        await trio.lowlevel.checkpoint()
        self._data[key] = bytes(value)  # SET replaces a value of any type
        self._notify(key)

    async def get_bytes(self, key: str) -> bytes | None:
        await trio.lowlevel.checkpoint()
        return self._get(key, bytes)

    async def zadd(
        self, key: str, member: str, score: float, *, only_existing: bool = False
    ) -> bool:
        await trio.lowlevel.checkpoint()
        z = self._get(key, _ZSet)
        if only_existing and (z is None or member not in z):
            return False
        z = self._get_or_create(key, _ZSet, _ZSet)
        changed = z.get(member) != float(score)
        z[member] = float(score)
        self._notify(key)
        return changed

    async def zrem(self, key: str, member: str) -> bool:
        await trio.lowlevel.checkpoint()
        z = self._get(key, _ZSet)
        if z is None or member not in z:
            return False
        del z[member]
        if not z:
            del self._data[key]
        return True

    async def zrange_by_score(self, key: str, max_score: float, count: int) -> list[str]:
        await trio.lowlevel.checkpoint()
        z: Mapping[str, float] = self._get(key, _ZSet) or {}
        ranked = sorted((score, member) for member, score in z.items() if score <= max_score)
        return [member for _, member in ranked[: max(count, 0)]]

    async def expire(self, key: str, seconds: float) -> None:
        await trio.lowlevel.checkpoint()
        self._expire_if_due(key)
        if key in self._data:
            self._expiry[key] = self._clock() + max(seconds, 0.001)

    async def ttl(self, key: str) -> float | None:
        await trio.lowlevel.checkpoint()
        self._expire_if_due(key)
        deadline = self._expiry.get(key)
        return None if deadline is None or key not in self._data else deadline - self._clock()

    async def zrange_desc(self, key: str, count: int) -> list[str]:
        await trio.lowlevel.checkpoint()
        z: Mapping[str, float] = self._get(key, _ZSet) or {}
        ranked = sorted(z.items(), key=lambda item: (item[1], item[0]), reverse=True)
        return [member for member, _ in ranked[: max(count, 0)]]

    async def delete(self, *keys: str) -> None:
        await trio.lowlevel.checkpoint()
        for key in keys:
            self._expiry.pop(key, None)
            if self._data.pop(key, None) is not None:
                self._notify(key)

    async def flushall(self) -> None:
        await trio.lowlevel.checkpoint()
        for key in list(self._data):
            del self._data[key]
            self._notify(key)

    async def aclose(self) -> None:
        await trio.lowlevel.checkpoint()


@asynccontextmanager
async def open_store(
    url: str, *, request_timeout_ms: int = DEFAULT_REQUEST_TIMEOUT_MS
) -> AsyncIterator[Store]:
    """Open the store at ``url``; it is closed when the context exits.

    ``redis://[user:password@]host[:port][/db]``, ``rediss://`` (TLS), ``unix:///path/to.sock[?db=N]``
    or ``memory://`` (a fresh, empty :class:`MemoryStore` for each call). ``request_timeout_ms``
    bounds each non-blocking command (blocking reads get their ``block_ms`` on top).
    """
    store: Store
    if urlsplit(url).scheme == "memory":
        store = MemoryStore()
    else:
        store = await GlideStore.connect(url, request_timeout_ms=request_timeout_ms)
    try:
        yield store
    finally:
        await store.aclose()
