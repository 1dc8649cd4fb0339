"""Each run's audit trail (``tether audit RUN``): who submitted, attached, read the logs, cancelled,
reran, claimed an attempt, and every refusal that names the run, with token id, address and client.

Refusals are coalesced (``protocol_specs/access/audit.py``): per run, refuser and request, the first in a
window has an entry, the others are counted in ``keys.audit_refusals`` and written as one entry
when the next window opens (a trail read meanwhile shows the count as that entry already). The
count is a plain read and write of one hash field, not compare-and-set: two refusals of the same
refuser and request racing on two connections may be counted as one, or both get an entry; the
bound (a few entries per refuser, request and window) holds either way.
"""

from __future__ import annotations

import time
from collections.abc import Callable

import msgpack

from protocol_specs.access.audit import (
    WINDOW,
    AuditRole,
    Repeats,
    coalesce,
    refused_entry,
    refuser,
    repeated,
)
from protocol_specs.access.auth import Principal
from protocol_specs.runs.runs import RunRecord
from protocol_specs.wire import wire
from protocol_specs.wire.wire import AuditEvent

from ..store import Store, keys

__all__ = ["AuditTrail"]


class AuditTrail:
    def __init__(
        self,
        store: Store,
        *,
        entries: int,
        window: float = WINDOW,
        clock: Callable[[], float] = time.time,
    ) -> None:
        self.store = store
        self.entries = entries
        self.window = window
        self.clock = clock

    async def record(
        self,
        run_id: str,
        event: AuditEvent,
        who: Principal | None,
        *,
        source: str = "",
        role: AuditRole | None = None,
        client: str = "",
        detail: str = "",
    ) -> None:
        """One entry in the run's trail (the oldest go past ``entries``)."""
        entry = wire.AuditEntry(
            at=self.clock(),
            event=event,
            user=who.user if who else "",
            token=who.token if who else "",
            role=role or "",
            source=source,
            client=client[:200],
            detail=detail[:500],
        )
        await self._append(run_id, entry)

    async def refused(
        self,
        record: RunRecord,
        who: Principal | None,
        *,
        request: str,
        code: str,
        message: str,
        source: str,
        role: AuditRole,
        client: str = "",
        what: str = "",
    ) -> None:
        """A refusal that names ``record``'s run (the caller found it: a run that does not exist
        has no trail), in its trail, coalesced with the same refuser's repeats of ``request``."""
        entry = refused_entry(
            self.clock(),
            who,
            request=request,
            code=code,
            message=message,
            source=source,
            role=role,
            client=client,
            what=what,
        )
        key, field = keys.audit_refusals(record.id), refuser(who, request)
        raw = (await self.store.hget_many([key], field))[0]
        kept = Repeats.model_validate_json(raw) if raw else None
        written, kept = coalesce(kept, entry, self.window)
        await self.store.hset(key, {field: kept.model_dump_json()})
        # an ended run's keys expire: this one with them (``record`` may be older than its end)
        left = await self.store.ttl(keys.record(record.id))
        if left is not None:
            await self.store.expire(key, left)
        for one in written:
            await self._append(record.id, one)

    async def _append(self, run_id: str, entry: wire.AuditEntry) -> None:
        payload = msgpack.packb(entry.model_dump(), use_bin_type=True)
        await self.store.append(keys.audit(run_id), payload, maxlen=self.entries)

    async def read_last(self, run_id: str, count: int) -> list[wire.AuditEntry]:
        """The newest ``count`` entries, oldest first."""
        tail = await self.store.read_last(keys.audit(run_id), count)
        entries = [wire.AuditEntry.model_validate(msgpack.unpackb(p)) for _, p in tail]
        return (await self._with_counts(run_id, entries))[-count:] if count > 0 else []

    async def read(self, run_id: str) -> list[wire.AuditEntry]:
        entries: list[wire.AuditEntry] = []
        cursor = "0"
        while batch := await self.store.read_after(keys.audit(run_id), cursor, count=1000):
            for cursor, payload in batch:  # noqa: B007 (the last id is the next cursor)
                entries.append(wire.AuditEntry.model_validate(msgpack.unpackb(payload)))
        return await self._with_counts(run_id, entries)

    async def _with_counts(
        self, run_id: str, entries: list[wire.AuditEntry]
    ) -> list[wire.AuditEntry]:
        """The trail with the refusals counted but not yet written, each as the entry that will
        stand for them, in time order."""
        counted = []
        for raw in (await self.store.hgetall(keys.audit_refusals(run_id))).values():
            said = repeated(Repeats.model_validate_json(raw))
            if said is not None:
                counted.append(said)
        if not counted:
            return entries
        return sorted([*entries, *counted], key=lambda e: e.at)
