"""Each run's audit trail (``tether audit RUN``): who submitted, attached, read the logs, cancelled,
reran, claimed an attempt, and every refused attempt, with token id, address and client."""

from __future__ import annotations

import time
from collections.abc import Callable

import msgpack

from protocol_specs import wire
from protocol_specs.auth import Principal

from . import keys
from .store import Store

__all__ = ["AuditTrail"]


class AuditTrail:
    def __init__(
        self, store: Store, *, entries: int, clock: Callable[[], float] = time.time
    ) -> None:
        self.store = store
        self.entries = entries
        self.clock = clock

    async def record(
        self,
        run_id: str,
        event: str,
        who: Principal | None,
        *,
        source: str = "",
        role: str = "",
        client: str = "",
        detail: str = "",
    ) -> None:
        """One entry in the run's trail (the oldest go past ``entries``)."""
        entry = wire.AuditEntry(
            at=self.clock(),
            event=event,
            user=who.user if who else "",
            token=who.token if who else "",
            role=role,
            source=source,
            client=client[:200],
            detail=detail[:500],
        )
        payload = msgpack.packb(entry.model_dump(), use_bin_type=True)
        await self.store.append(keys.audit(run_id), payload, maxlen=self.entries)

    async def read_last(self, run_id: str, count: int) -> list[wire.AuditEntry]:
        """The newest ``count`` entries, oldest first."""
        tail = await self.store.read_last(keys.audit(run_id), count)
        return [wire.AuditEntry.model_validate(msgpack.unpackb(p)) for _, p in tail]

    async def read(self, run_id: str) -> list[wire.AuditEntry]:
        entries: list[wire.AuditEntry] = []
        cursor = "0"
        while batch := await self.store.read_after(keys.audit(run_id), cursor, count=1000):
            for cursor, payload in batch:  # noqa: B007 (the last id is the next cursor)
                entries.append(wire.AuditEntry.model_validate(msgpack.unpackb(payload)))
        return entries
