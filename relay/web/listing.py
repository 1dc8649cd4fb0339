"""One page of the web view's runs list, read from the run indexes (``relay/keys.py``).

A page is :data:`~protocol_specs.web.PAGE_SIZE` runs, newest first, from a position in the index
(the user's own, or every run for an admin). Without a filter it costs one range read and a record
read per row. A state or tag filter reads records in batches until the page is full, at most
:data:`~protocol_specs.web.MAX_SCAN` of them; the page then ends where the reading stopped, and its
"older" link goes on from there. Records are read concurrently: on one multiplexed connection to
Redis, a batch of reads costs about one round trip.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import trio

from protocol_specs.auth import Principal
from protocol_specs.runs import RunRecord
from protocol_specs.web import MAX_SCAN, PAGE_SIZE, ListQuery

from .. import keys
from ..registry import Registry

__all__ = ["Page", "list_page", "load_many"]

#: ids read at once while a filter looks for matching runs
_BATCH = 500
#: record reads in flight at once
_IN_FLIGHT = 100


@dataclass(frozen=True)
class Page:
    runs: list[RunRecord]
    #: where the next (older) page starts; ``None``: this is the last
    next_start: int | None
    #: run ids looked at to fill it
    scanned: int


async def load_many(registry: Registry, run_ids: Sequence[str]) -> list[RunRecord | None]:
    """The records of ``run_ids`` in order (``None`` for one gone), read concurrently."""
    out: list[RunRecord | None] = [None] * len(run_ids)
    limit = trio.CapacityLimiter(_IN_FLIGHT)

    async def one(i: int, run_id: str) -> None:
        async with limit:
            record = await registry.load(run_id)
            out[i] = None if record is None else await registry.with_liveness(record)

    async with trio.open_nursery() as nursery:
        for i, run_id in enumerate(run_ids):
            nursery.start_soon(one, i, run_id)
    return out


async def list_page(registry: Registry, who: Principal, query: ListQuery) -> Page:
    """The page ``query`` asks for, of the runs ``who`` may see (a user: their own only; an
    owner filter naming someone else gives them an empty page, as if that user had no runs)."""
    if not who.admin and query.owner and query.owner != who.user:
        return Page([], None, 0)
    owner = query.owner if who.admin else who.user
    index = keys.user_runs(owner) if owner else keys.RUNS
    batch = _BATCH if query.filtered else PAGE_SIZE
    found: list[RunRecord] = []
    at = query.start
    scanned = 0
    while True:
        ids = await registry.store.zrange_desc(index, batch, start=at)
        records = await load_many(registry, ids)
        for i, record in enumerate(records):
            if record is None or not query.matches(record.state, record.spec.tags, record.owner):
                continue
            found.append(record)
            if len(found) == PAGE_SIZE:
                return Page(found, at + i + 1, scanned + i + 1)
        at += len(ids)
        scanned += len(ids)
        if len(ids) < batch:
            return Page(found, None, scanned)
        if scanned >= MAX_SCAN:
            return Page(found, at, scanned)
