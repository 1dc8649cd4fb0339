"""The memory store's streams: appends with Redis's entry ids and exact ``maxlen`` trimming,
reads after an exclusive cursor, blocking reads on trio events, notices to watching listeners, and
consumer groups with pending entries."""

from __future__ import annotations

import bisect
import math
import time
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager

import trio

from protocol_specs.link.link import START, Cursor

from .base import (
    NOTICE_PAYLOAD_BYTES,
    BlockingReader,
    Entry,
    Notice,
    NoticeSink,
    Numbered,
    StoreError,
    StreamId,
    check_read_args,
    format_id,
    parse_id,
)
from .memory_keyspace import MemoryKeyspace, _Group, _Stream

__all__ = ["MemoryStreams"]


class _MemoryReader:
    def __init__(self, store: MemoryStreams) -> None:
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


class MemoryStreams(MemoryKeyspace):
    """The streams of a :class:`~relay.store.memory.MemoryStore`, over its keyspace."""

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
