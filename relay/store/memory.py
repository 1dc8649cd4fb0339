"""An in-process :class:`Store` with the same observable semantics as Redis (entry ids, exclusive
cursors, exact ``maxlen`` trimming, consumer groups with pending entries, ``WRONGTYPE``), blocking
reads built on trio events. Every method is a trio checkpoint, like real I/O.

It stands in three layers: the keyspace and the commands on plain keys (``memory_keyspace.py``),
the streams over it (``memory_streams.py``), and here what :class:`~relay.store.glide.GlideStore`
runs as Lua scripts (``scripts.py``): exactly-once appends, caps and the trimming of transient
entries, each one step with no checkpoint inside, as the server runs a script."""

from __future__ import annotations

import bisect
from collections.abc import Mapping, Sequence

import trio

from protocol_specs.link.relay import AppendOutcome

from .base import (
    NO_CAP,
    Appended,
    Cap,
    Diversion,
    Published,
    meta_key,
    parse_id,
    transient_key,
)
from .memory_keyspace import _Hash, _List, _Stream
from .memory_streams import MemoryStreams

__all__ = ["MemoryStore"]


class MemoryStore(MemoryStreams):
    """An in-process :class:`Store` for tests and ``memory://``; nothing survives the process."""

    def __repr__(self) -> str:
        return f"<MemoryStore keys={len(self._data)}>"

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

    async def aclose(self) -> None:
        await trio.lowlevel.checkpoint()
