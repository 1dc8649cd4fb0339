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
    "BlockingReader",
    "Entry",
    "GlideStore",
    "MemoryStore",
    "Store",
    "StoreError",
    "open_store",
]

Entry = tuple[str, bytes]
"""A stream entry: its id and its payload."""

PAYLOAD_FIELD = "p"
_PAYLOAD_FIELD_BYTES = PAYLOAD_FIELD.encode()
DEFAULT_REQUEST_TIMEOUT_MS = 5000

_T = TypeVar("_T")


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

    # hashes, strings, sorted set
    async def hset(self, key: str, mapping: Mapping[str, bytes | str]) -> None: ...
    async def hgetall(self, key: str) -> dict[str, bytes]: ...
    async def set_bytes(self, key: str, value: bytes) -> None: ...
    async def get_bytes(self, key: str) -> bytes | None: ...
    async def zadd(self, key: str, member: str, score: float) -> None: ...

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

    async def append(self, stream: str, payload: bytes, *, maxlen: int | None = None) -> str:
        import glide

        options = None
        if maxlen is not None:
            options = glide.StreamAddOptions(trim=glide.TrimByMaxLen(exact=True, threshold=maxlen))
        with _glide_errors(f"XADD {stream}"):
            entry_id = await self._client.xadd(stream, [(PAYLOAD_FIELD, payload)], options)
        assert entry_id is not None  # None only with NOMKSTREAM
        return _text(entry_id)

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

    async def zadd(self, key: str, member: str, score: float) -> None:
        with _glide_errors(f"ZADD {key}"):
            await self._client.zadd(key, {member: float(score)})

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


# --- in-memory fake -------------------------------------------------------------------------------

_Id = tuple[int, int]


def _parse_id(text: str) -> _Id:
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


class _ZSet(dict[str, float]):
    pass


_Value = _Stream | _Hash | _ZSet | bytes
_V = TypeVar("_V", _Stream, _Hash, _ZSet, bytes)


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
        cursor = _parse_id(after)
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

    def __init__(self) -> None:
        self._data: dict[str, _Value] = {}
        self._waiters: dict[str, trio.Event] = {}

    def __repr__(self) -> str:
        return f"<MemoryStore keys={len(self._data)}>"

    def _get(self, key: str, kind: type[_V]) -> _V | None:
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
        s = self._get_or_create(stream, _Stream, _Stream)
        now_ms = time.time_ns() // 1_000_000
        s.last = (now_ms, 0) if now_ms > s.last[0] else (s.last[0], s.last[1] + 1)
        s.ids.append(s.last)
        s.payloads.append(bytes(payload))
        if maxlen is not None and len(s.ids) > maxlen:
            drop = len(s.ids) - maxlen
            del s.ids[:drop], s.payloads[:drop]
        self._notify(stream)
        return _format_id(s.last)

    async def read_after(self, stream: str, after: str, *, count: int = 100) -> list[Entry]:
        _check_read_args(0, count)
        cursor = _parse_id(after)
        await trio.lowlevel.checkpoint()
        s = self._get(stream, _Stream)
        return s.after(cursor, count) if s else []

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

    async def ensure_group(self, stream: str, group: str) -> None:
        await trio.lowlevel.checkpoint()
        self._get_or_create(stream, _Stream, _Stream).groups.setdefault(group, _Group())

    async def ack(self, stream: str, group: str, entry_id: str) -> None:
        parsed = _parse_id(entry_id)
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

    async def zadd(self, key: str, member: str, score: float) -> None:
        await trio.lowlevel.checkpoint()
        self._get_or_create(key, _ZSet, _ZSet)[member] = float(score)
        self._notify(key)

    async def zrange_desc(self, key: str, count: int) -> list[str]:
        await trio.lowlevel.checkpoint()
        z: Mapping[str, float] = self._get(key, _ZSet) or {}
        ranked = sorted(z.items(), key=lambda item: (item[1], item[0]), reverse=True)
        return [member for member, _ in ranked[: max(count, 0)]]

    async def delete(self, *keys: str) -> None:
        await trio.lowlevel.checkpoint()
        for key in keys:
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
