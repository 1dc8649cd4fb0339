"""The relay's storage seam: a narrow async interface over Redis Streams, hashes and a sorted set.

Two implementations share one conformance suite (``tests/integration/test_store.py``):

- :class:`GlideStore`: valkey-glide (Rust core, trio support through anyio), for Redis >= 6.2 and
  Valkey. One shared client serves non-blocking commands; every blocking reader gets a dedicated
  client, because a glide client is one multiplexed connection that a pending ``XREAD BLOCK`` would
  stall, and a cancelled blocking read leaves that connection busy until the block expires, so the
  reader's client is closed on cancellation.
- :class:`MemoryStore`: an in-process fake with the same semantics, for unit tests of logic.

Stream entries carry their payload in one field, ``p``. Key names are chosen by callers
(``relay/keys.py``); this module is generic.
"""

from __future__ import annotations

import fnmatch
import itertools
import time
from collections.abc import AsyncIterator
from contextlib import AbstractAsyncContextManager, asynccontextmanager
from dataclasses import dataclass, field
from typing import Any, Protocol
from urllib.parse import unquote, urlparse

import trio

__all__ = ["BlockingReader", "GlideStore", "MemoryStore", "Store", "StoreError", "open_store"]

Entry = tuple[str, bytes]


class StoreError(Exception):
    pass


class BlockingReader(Protocol):
    async def read(
        self, stream: str, after: str, *, block_ms: int = 1000, count: int = 100
    ) -> list[Entry]: ...

    async def read_group(
        self, stream: str, group: str, consumer: str, *, block_ms: int = 1000
    ) -> Entry | None: ...


class Store(Protocol):
    async def append(self, stream: str, payload: bytes, *, maxlen: int | None = None) -> str: ...
    async def read_after(self, stream: str, after: str, *, count: int = 100) -> list[Entry]: ...
    async def last_id(self, stream: str) -> str | None: ...
    def blocking_reader(self) -> AbstractAsyncContextManager[BlockingReader]: ...
    async def ensure_group(self, stream: str, group: str) -> None: ...
    async def ack(self, stream: str, group: str, entry_id: str) -> None: ...
    async def hset(self, key: str, mapping: dict[str, bytes | str]) -> None: ...
    async def hgetall(self, key: str) -> dict[str, bytes]: ...
    async def set_bytes(self, key: str, value: bytes) -> None: ...
    async def get_bytes(self, key: str) -> bytes | None: ...
    async def zadd(self, key: str, member: str, score: float) -> None: ...
    async def zrange_desc(self, key: str, count: int) -> list[str]: ...
    async def delete(self, *keys: str) -> None: ...
    async def flushall(self) -> None: ...
    async def aclose(self) -> None: ...


def _parse_id(entry_id: str) -> tuple[int, int]:
    ms, _, seq = entry_id.partition("-")
    return int(ms), int(seq or 0)


# --- valkey-glide ---------------------------------------------------------------------------------


def _text(value: Any) -> str:
    return value.decode() if isinstance(value, bytes) else str(value)


def _entries(reply: Any) -> list[Entry]:
    """Parse stream entries: glide's ``{id: [[field, value], ...]}`` or RESP's ``[[id, [f, v, ...]], ...]``."""
    items = (
        reply.items() if isinstance(reply, dict) else ((item[0], item[1]) for item in reply or [])
    )
    out: list[Entry] = []
    for entry_id, fields in items:
        if fields and isinstance(fields[0], list | tuple):
            pairs = {_text(f): v for f, v in fields}
        else:
            pairs = {_text(f): v for f, v in zip(fields[::2], fields[1::2], strict=False)}
        payload = pairs.get("p", b"")
        out.append(
            (_text(entry_id), payload if isinstance(payload, bytes) else _text(payload).encode())
        )
    return out


def _stream_reply(reply: Any, stream: str) -> list[Entry]:
    """XREAD/XREADGROUP replies: a map (RESP3) or a list of [name, entries] pairs."""
    if not reply:
        return []
    if isinstance(reply, dict):
        for name, entries in reply.items():
            if _text(name) == stream:
                return _entries(entries)
        return []
    for name, entries in reply:
        if _text(name) == stream:
            return _entries(entries)
    return []


class _GlideReader:
    def __init__(self, client: Any) -> None:
        self._client = client

    async def read(
        self, stream: str, after: str, *, block_ms: int = 1000, count: int = 100
    ) -> list[Entry]:
        reply = await self._client.custom_command(
            ["XREAD", "COUNT", str(count), "BLOCK", str(block_ms), "STREAMS", stream, after]
        )
        return _stream_reply(reply, stream)

    async def read_group(
        self, stream: str, group: str, consumer: str, *, block_ms: int = 1000
    ) -> Entry | None:
        reply = await self._client.custom_command(
            [
                "XREADGROUP",
                "GROUP",
                group,
                consumer,
                "COUNT",
                "1",
                "BLOCK",
                str(block_ms),
                "STREAMS",
                stream,
                ">",
            ]
        )
        entries = _stream_reply(reply, stream)
        return entries[0] if entries else None


class GlideStore:
    def __init__(self, client: Any, config_factory: Any) -> None:
        self._client = client
        self._config_factory = config_factory

    @classmethod
    async def connect(cls, url: str) -> GlideStore:
        import glide

        glide.Logger.set_logger_config(glide.LogLevel.ERROR)
        parsed = urlparse(url)
        if parsed.scheme == "unix":
            address = glide.NodeAddress(unix_socket_path=unquote(parsed.path))
            db = None
        elif parsed.scheme in ("redis", "rediss", "valkey"):
            address = glide.NodeAddress(parsed.hostname or "127.0.0.1", parsed.port or 6379)
            db = int(parsed.path.strip("/") or 0) or None
        else:
            raise StoreError(f"unsupported Redis URL {url!r}: use redis://, rediss:// or unix://")
        credentials = (
            glide.ServerCredentials(
                password=unquote(parsed.password), username=parsed.username or None
            )
            if parsed.password
            else None
        )

        def config() -> Any:
            return glide.GlideClientConfiguration(
                [address],
                use_tls=parsed.scheme == "rediss",
                credentials=credentials,
                database_id=db,
                request_timeout=5000,
            )

        try:
            client = await glide.GlideClient.create(config())
        except Exception as exc:
            raise StoreError(f"cannot connect to Redis at {url}: {exc}") from exc
        return cls(client, config)

    async def _cmd(self, *args: str | bytes) -> Any:
        return await self._client.custom_command(list(args))

    async def append(self, stream: str, payload: bytes, *, maxlen: int | None = None) -> str:
        trim: list[str] = ["MAXLEN", str(maxlen)] if maxlen else []
        return _text(await self._cmd("XADD", stream, *trim, "*", "p", payload))

    async def read_after(self, stream: str, after: str, *, count: int = 100) -> list[Entry]:
        return _entries(
            await self._cmd(
                "XRANGE", stream, f"({after}" if after != "0" else "-", "+", "COUNT", str(count)
            )
        )

    async def last_id(self, stream: str) -> str | None:
        reply = await self._cmd("XREVRANGE", stream, "+", "-", "COUNT", "1")
        entries = _entries(reply)
        return entries[0][0] if entries else None

    @asynccontextmanager
    async def blocking_reader(self) -> AsyncIterator[BlockingReader]:
        import glide

        client = await glide.GlideClient.create(self._config_factory())
        try:
            yield _GlideReader(client)
        finally:
            with trio.CancelScope(shield=True):
                await client.close()

    async def ensure_group(self, stream: str, group: str) -> None:
        try:
            await self._cmd("XGROUP", "CREATE", stream, group, "0", "MKSTREAM")
        except Exception as exc:
            if "BUSYGROUP" not in str(exc):
                raise

    async def ack(self, stream: str, group: str, entry_id: str) -> None:
        await self._cmd("XACK", stream, group, entry_id)

    async def hset(self, key: str, mapping: dict[str, bytes | str]) -> None:
        args: list[str | bytes] = []
        for k, v in mapping.items():
            args += [k, v]
        await self._cmd("HSET", key, *args)

    async def hgetall(self, key: str) -> dict[str, bytes]:
        reply = await self._cmd("HGETALL", key)
        if isinstance(reply, dict):
            return {_text(k): v for k, v in reply.items()}
        return {_text(k): v for k, v in zip(reply[::2], reply[1::2], strict=False)}

    async def set_bytes(self, key: str, value: bytes) -> None:
        await self._cmd("SET", key, value)

    async def get_bytes(self, key: str) -> bytes | None:
        reply = await self._cmd("GET", key)
        return reply if reply is None or isinstance(reply, bytes) else str(reply).encode()

    async def zadd(self, key: str, member: str, score: float) -> None:
        await self._cmd("ZADD", key, repr(float(score)), member)

    async def zrange_desc(self, key: str, count: int) -> list[str]:
        return [_text(m) for m in await self._cmd("ZRANGE", key, "0", str(count - 1), "REV")]

    async def delete(self, *keys: str) -> None:
        if keys:
            await self._cmd("DEL", *keys)

    async def flushall(self) -> None:
        await self._cmd("FLUSHALL")

    async def aclose(self) -> None:
        with trio.CancelScope(shield=True):
            await self._client.close()


# --- in-memory fake -------------------------------------------------------------------------------


@dataclass
class _Group:
    last: tuple[int, int] = (0, 0)
    pending: dict[str, str] = field(default_factory=dict)  # entry id -> consumer


@dataclass
class _Stream:
    entries: list[tuple[tuple[int, int], bytes]] = field(default_factory=list)
    groups: dict[str, _Group] = field(default_factory=dict)


class _MemoryReader:
    def __init__(self, store: MemoryStore) -> None:
        self._store = store

    async def read(
        self, stream: str, after: str, *, block_ms: int = 1000, count: int = 100
    ) -> list[Entry]:
        with trio.move_on_after(block_ms / 1000):
            while True:
                entries = self._store._after(stream, _parse_id(after), count)
                if entries:
                    return entries
                await self._store._changed.wait()
        return []

    async def read_group(
        self, stream: str, group: str, consumer: str, *, block_ms: int = 1000
    ) -> Entry | None:
        with trio.move_on_after(block_ms / 1000):
            while True:
                s = self._store._streams.get(stream)
                g = s.groups.get(group) if s else None
                if s is None or g is None:
                    raise StoreError(f"NOGROUP no group {group!r} on {stream!r}")
                for entry_id, payload in s.entries:
                    if entry_id > g.last:
                        g.last = entry_id
                        text = f"{entry_id[0]}-{entry_id[1]}"
                        g.pending[text] = consumer
                        return text, payload
                await self._store._changed.wait()
        return None


class MemoryStore:
    def __init__(self) -> None:
        self._streams: dict[str, _Stream] = {}
        self._hashes: dict[str, dict[str, bytes]] = {}
        self._strings: dict[str, bytes] = {}
        self._zsets: dict[str, dict[str, float]] = {}
        self._changed = trio.Event()
        self._seq = itertools.count()

    def _notify(self) -> None:
        self._changed.set()
        self._changed = trio.Event()

    def _after(self, stream: str, after: tuple[int, int], count: int) -> list[Entry]:
        s = self._streams.get(stream)
        if s is None:
            return []
        return [(f"{i[0]}-{i[1]}", p) for i, p in s.entries if i > after][:count]

    async def append(self, stream: str, payload: bytes, *, maxlen: int | None = None) -> str:
        s = self._streams.setdefault(stream, _Stream())
        ms = int(time.time() * 1000)
        last = s.entries[-1][0] if s.entries else (0, 0)
        entry_id = (ms, 0) if ms > last[0] else (last[0], last[1] + 1)
        s.entries.append((entry_id, bytes(payload)))
        if maxlen is not None and len(s.entries) > maxlen:
            del s.entries[: len(s.entries) - maxlen]
        self._notify()
        return f"{entry_id[0]}-{entry_id[1]}"

    async def read_after(self, stream: str, after: str, *, count: int = 100) -> list[Entry]:
        return self._after(stream, _parse_id(after), count)

    async def last_id(self, stream: str) -> str | None:
        s = self._streams.get(stream)
        if not s or not s.entries:
            return None
        i = s.entries[-1][0]
        return f"{i[0]}-{i[1]}"

    @asynccontextmanager
    async def blocking_reader(self) -> AsyncIterator[BlockingReader]:
        yield _MemoryReader(self)

    async def ensure_group(self, stream: str, group: str) -> None:
        self._streams.setdefault(stream, _Stream()).groups.setdefault(group, _Group())

    async def ack(self, stream: str, group: str, entry_id: str) -> None:
        s = self._streams.get(stream)
        if s and group in s.groups:
            s.groups[group].pending.pop(entry_id, None)

    async def hset(self, key: str, mapping: dict[str, bytes | str]) -> None:
        h = self._hashes.setdefault(key, {})
        for k, v in mapping.items():
            h[k] = v.encode() if isinstance(v, str) else bytes(v)

    async def hgetall(self, key: str) -> dict[str, bytes]:
        return dict(self._hashes.get(key, {}))

    async def set_bytes(self, key: str, value: bytes) -> None:
        self._strings[key] = bytes(value)

    async def get_bytes(self, key: str) -> bytes | None:
        return self._strings.get(key)

    async def zadd(self, key: str, member: str, score: float) -> None:
        self._zsets.setdefault(key, {})[member] = score

    async def zrange_desc(self, key: str, count: int) -> list[str]:
        z = self._zsets.get(key, {})
        return [m for m, _ in sorted(z.items(), key=lambda kv: (kv[1], kv[0]), reverse=True)][
            :count
        ]

    async def delete(self, *keys: str) -> None:
        for key in keys:
            for space in (self._streams, self._hashes, self._strings, self._zsets):
                space.pop(key, None)

    def keys(self, pattern: str = "*") -> list[str]:
        every = [*self._streams, *self._hashes, *self._strings, *self._zsets]
        return sorted(k for k in every if fnmatch.fnmatchcase(k, pattern))

    async def flushall(self) -> None:
        self.__init__()  # type: ignore[misc]

    async def aclose(self) -> None:
        return None


@asynccontextmanager
async def open_store(url: str) -> AsyncIterator[Store]:
    """``redis://host:port[/db]``, ``rediss://``, ``unix:///path/to.sock`` or ``memory://``."""
    if url.startswith("memory:"):
        yield MemoryStore()
        return
    store = await GlideStore.connect(url)
    try:
        yield store
    finally:
        await store.aclose()
