"""An in-process :class:`Store` with the same observable semantics as Redis (entry ids, exclusive
cursors, exact ``maxlen`` trimming, consumer groups with pending entries, ``WRONGTYPE``), blocking
reads built on trio events. Every method is a trio checkpoint, like real I/O."""

from __future__ import annotations

import bisect
import math
import time
from collections.abc import AsyncIterator, Callable, Mapping, Sequence
from contextlib import asynccontextmanager
from dataclasses import dataclass, field
from typing import TypeVar

import trio

from protocol_specs.link import START, Cursor
from protocol_specs.relay_link import AppendOutcome

from .base import (
    NO_CAP,
    NOTICE_PAYLOAD_BYTES,
    VERSION_FIELD,
    Appended,
    BlockingReader,
    Cap,
    Diversion,
    Entry,
    Notice,
    NoticeSink,
    Numbered,
    Published,
    StoreError,
    StreamId,
    check_read_args,
    format_id,
    meta_key,
    parse_id,
    transient_key,
)

__all__ = ["MemoryStore"]


@dataclass
class _Group:
    delivered: StreamId = START  # last id delivered to the group
    pending: dict[StreamId, str] = field(default_factory=dict)  # entry id -> consumer
    since: dict[StreamId, float] = field(default_factory=dict)  # entry id -> when delivered


@dataclass
class _Stream:
    ids: list[StreamId] = field(default_factory=list)
    payloads: list[bytes] = field(default_factory=list)
    #: the publish that wrote each entry: (producer, n), ("", 0) for a plain append
    origins: list[tuple[str, int]] = field(default_factory=list)
    last: StreamId = START  # last id ever generated: ids keep growing after trims
    groups: dict[str, _Group] = field(default_factory=dict)

    def after(self, cursor: StreamId, count: int) -> list[Entry]:
        start = bisect.bisect_right(self.ids, cursor)
        stop = start + count
        return [
            (format_id(i), p)
            for i, p in zip(self.ids[start:stop], self.payloads[start:stop], strict=True)
        ]

    def numbered_after(self, cursor: StreamId, count: int) -> list[Numbered]:
        start = bisect.bisect_right(self.ids, cursor)
        stop = start + count
        return [
            Numbered(format_id(i), p, *o)
            for i, p, o in zip(
                self.ids[start:stop],
                self.payloads[start:stop],
                self.origins[start:stop],
                strict=True,
            )
        ]


class _Hash(dict[str, bytes]):
    pass


class _List(list[bytes]):
    pass


class _ZSet(dict[str, float]):
    pass


class _Set(set[str]):
    pass


_Value = _Stream | _Hash | _ZSet | _List | _Set | bytes
_V = TypeVar("_V", _Stream, _Hash, _ZSet, _List, _Set, bytes)


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
        check_read_args(block_ms, count)
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
        check_read_args(block_ms, 1)
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
                    g.since[entry_id] = self._store._clock()
                    return format_id(entry_id), s.payloads[start]
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
        self,
        stream: str,
        payload: bytes,
        maxlen: int | None = None,
        notify_except: str = "",
        origin: tuple[str, int] = ("", 0),
    ) -> tuple[str, str]:
        """Append; ``(previous id, new id)``, and the notice to every watching listener."""
        s = self._get_or_create(stream, _Stream, _Stream)
        prev = format_id(s.last)
        now_ms = time.time_ns() // 1_000_000
        s.last = Cursor(now_ms) if now_ms > s.last.ms else Cursor(s.last.ms, s.last.seq + 1)
        s.ids.append(s.last)
        s.payloads.append(bytes(payload))
        s.origins.append(origin)
        if maxlen is not None and len(s.ids) > maxlen:
            drop = len(s.ids) - maxlen
            del s.ids[:drop], s.payloads[:drop], s.origins[:drop]
        self._notify(stream)
        entry_id = format_id(s.last)
        carried = len(payload) <= NOTICE_PAYLOAD_BYTES
        notice = Notice(stream, prev, entry_id, *((bytes(payload), *origin) if carried else ()))
        for listener in list(self._watchers.get(stream, ())):
            sink = self._sinks.get(listener)
            if sink is not None and listener != notify_except:
                sink(notice)
        return prev, entry_id

    async def read_after(self, stream: str, after: str, *, count: int = 100) -> list[Entry]:
        s, cursor = await self._range(stream, after, count)
        return s.after(cursor, count) if s else []

    async def read_numbered(self, stream: str, after: str, *, count: int = 100) -> list[Numbered]:
        s, cursor = await self._range(stream, after, count)
        return s.numbered_after(cursor, count) if s else []

    async def hget_many(self, keys: Sequence[str], field: str) -> list[bytes | None]:
        await trio.lowlevel.checkpoint()
        out: list[bytes | None] = []
        for key in keys:
            h: Mapping[str, bytes] = self._get(key, _Hash) or {}
            out.append(h.get(field))
        return out

    async def read_last(self, stream: str, count: int) -> list[Entry]:
        await trio.lowlevel.checkpoint()
        s = self._get(stream, _Stream)
        if s is None or count < 1:
            return []
        return s.after(START, len(s.ids))[-count:]

    async def _range(self, stream: str, after: str, count: int) -> tuple[_Stream | None, StreamId]:
        check_read_args(0, count)
        cursor = parse_id(after)
        await trio.lowlevel.checkpoint()
        return self._get(stream, _Stream), cursor

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
        await trio.lowlevel.checkpoint()
        return self._append_once(
            stream, producer, n, payload, transient, cap, notify_except, divert
        )

    def _append_once(
        self,
        stream: str,
        producer: str,
        n: int,
        payload: bytes | None,
        transient: bool,
        cap: Cap,
        notify_except: str,
        divert: Diversion | None = None,
    ) -> Appended:
        meta = self._get_or_create(meta_key(stream), _Hash, _Hash)
        last = int(meta.get(f"n:{producer}", b"0"))
        if n <= last:
            cursor = meta.get(f"c:{producer}", b"").decode() if n == last else ""
            return Appended(AppendOutcome.DUPLICATE, cursor=cursor)
        if n != last + 1:
            return Appended(AppendOutcome.GAP, last=last)
        if payload is None:
            meta[f"n:{producer}"], meta[f"c:{producer}"] = str(n).encode(), b""
            return Appended(AppendOutcome.SKIPPED)
        if divert is not None and divert.stream != stream:
            prev, entry_id = self._xadd_prev(
                divert.stream, payload, divert.maxlen or None, notify_except
            )
            meta[f"n:{producer}"], meta[f"c:{producer}"] = str(n).encode(), entry_id.encode()
            return Appended(AppendOutcome.STORED, cursor=entry_id, prev=prev)
        s = self._get(stream, _Stream)
        held = len(s.ids) if s else 0
        held_bytes = int(meta.get("bytes", b"0"))
        if (cap.entries and held >= cap.entries) or (
            cap.bytes and held_bytes + len(payload) > cap.bytes
        ):
            meta[f"n:{producer}"], meta[f"c:{producer}"] = str(n).encode(), b""
            return Appended(AppendOutcome.FULL, size=held)
        prev, entry_id = self._xadd_prev(stream, payload, None, notify_except, (producer, n))
        meta[f"n:{producer}"], meta[f"c:{producer}"] = str(n).encode(), entry_id.encode()
        meta["bytes"] = str(held_bytes + len(payload)).encode()
        if transient:
            listed = self._get_or_create(transient_key(stream), _List, _List)
            listed.append(f"{entry_id} {len(payload)}".encode())
        return Appended(AppendOutcome.STORED, cursor=entry_id, prev=prev)

    async def append_batch(
        self,
        stream: str,
        producer: str,
        entries: Sequence[Published],
        *,
        cap: Cap = NO_CAP,
        notify_except: str = "",
    ) -> list[Appended]:
        # one step, as Redis runs the script: no checkpoint between the entries
        got = [
            self._append_once(stream, producer, e.n, e.payload, e.transient, cap, notify_except)
            for e in entries
        ]
        await trio.lowlevel.checkpoint()
        return got

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
                    del s.ids[at], s.payloads[at], s.origins[at]
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
        return format_id(s.ids[-1]) if s and s.ids else None

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
            s.groups[group].since.pop(parsed, None)

    async def reclaim(
        self, stream: str, group: str, consumer: str, *, min_idle: float, count: int = 100
    ) -> list[Entry]:
        check_read_args(0, count)
        await trio.lowlevel.checkpoint()
        s = self._get(stream, _Stream)
        g = s.groups.get(group) if s else None
        if s is None or g is None:
            raise StoreError(f"NOGROUP no stream {stream!r} or no group {group!r} on it")
        now = self._clock()
        out: list[Entry] = []
        for entry_id in sorted(g.pending):
            if len(out) >= count:
                break
            if now - g.since.get(entry_id, now) < min_idle:
                continue
            at = bisect.bisect_left(s.ids, entry_id)
            if at >= len(s.ids) or s.ids[at] != entry_id:  # trimmed away meanwhile
                del g.pending[entry_id]
                g.since.pop(entry_id, None)
                continue
            g.pending[entry_id], g.since[entry_id] = consumer, now
            out.append((format_id(entry_id), s.payloads[at]))
        return out

    async def pending(self, stream: str, group: str, *, count: int = 100) -> list[tuple[str, str]]:
        check_read_args(0, count)
        await trio.lowlevel.checkpoint()
        s = self._get(stream, _Stream)
        g = s.groups.get(group) if s else None
        if g is None:
            raise StoreError(f"NOGROUP no stream {stream!r} or no group {group!r} on it")
        return [(format_id(i), g.pending[i]) for i in sorted(g.pending)[:count]]

    async def get_versioned(self, key: str, field: str) -> tuple[bytes | None, int]:
        await trio.lowlevel.checkpoint()
        h: Mapping[str, bytes] = self._get(key, _Hash) or {}
        return h.get(field), int(h.get(VERSION_FIELD, b"0"))

    async def set_versioned(self, key: str, field: str, value: bytes, version: int) -> bool:
        await trio.lowlevel.checkpoint()
        current: Mapping[str, bytes] = self._get(key, _Hash) or {}
        if int(current.get(VERSION_FIELD, b"0")) != version:
            return False
        h = self._get_or_create(key, _Hash, _Hash)
        h[field] = bytes(value)
        h[VERSION_FIELD] = str(version + 1).encode()
        self._notify(key)
        return True

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

    async def sadd(self, key: str, members: list[str]) -> None:
        await trio.lowlevel.checkpoint()
        if members:
            self._get_or_create(key, _Set, _Set).update(members)
            self._notify(key)

    async def sismember(self, key: str, members: list[str]) -> list[bool]:
        await trio.lowlevel.checkpoint()
        held: set[str] = self._get(key, _Set) or set()
        return [m in held for m in members]

    async def zadd(
        self,
        key: str,
        member: str,
        score: float,
        *,
        only_existing: bool = False,
        only_new: bool = False,
    ) -> bool:
        await trio.lowlevel.checkpoint()
        z = self._get(key, _ZSet)
        if only_existing and (z is None or member not in z):
            return False
        if only_new and z is not None and member in z:
            return False
        z = self._get_or_create(key, _ZSet, _ZSet)
        changed = z.get(member) != float(score)
        z[member] = float(score)
        self._notify(key)
        return changed

    async def zscore(self, key: str, member: str) -> float | None:
        await trio.lowlevel.checkpoint()
        z: Mapping[str, float] = self._get(key, _ZSet) or {}
        return z.get(member)

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

    async def zrange_desc(self, key: str, count: int, *, start: int = 0) -> list[str]:
        await trio.lowlevel.checkpoint()
        z: Mapping[str, float] = self._get(key, _ZSet) or {}
        ranked = sorted(z.items(), key=lambda item: (item[1], item[0]), reverse=True)
        return [member for member, _ in ranked[start : start + max(count, 0)]]

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
