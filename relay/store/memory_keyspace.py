"""The memory store's keyspace: each key's value typed as Redis types it (``WRONGTYPE`` on a
mismatch), expiry on the store's clock, a trio event per key that wakes blocking reads when it
changes, and the commands on plain keys (hashes, strings, sets, sorted sets, TTLs).

:class:`~relay.store.memory_streams.MemoryStreams` adds the streams on top of it, and
:class:`~relay.store.memory.MemoryStore` the scripts' emulation on top of those."""

from __future__ import annotations

import bisect
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import TypeVar

import trio

from protocol_specs.link.link import START

from .base import (
    VERSION_FIELD,
    Entry,
    NoticeSink,
    Numbered,
    StoreError,
    StreamId,
    format_id,
)

__all__ = ["MemoryKeyspace"]


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


class MemoryKeyspace:
    """Every key of a :class:`~relay.store.memory.MemoryStore`, and the commands on plain keys."""

    def __init__(self, *, clock: Callable[[], float] = time.time) -> None:
        self._data: dict[str, _Value] = {}
        self._waiters: dict[str, trio.Event] = {}
        self._sinks: dict[str, NoticeSink] = {}
        self._watchers: dict[str, set[str]] = {}
        self._expiry: dict[str, float] = {}
        self._clock = clock

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

    async def hget_many(self, keys: Sequence[str], field: str) -> list[bytes | None]:
        await trio.lowlevel.checkpoint()
        out: list[bytes | None] = []
        for key in keys:
            h: Mapping[str, bytes] = self._get(key, _Hash) or {}
            out.append(h.get(field))
        return out

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
