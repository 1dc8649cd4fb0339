"""One page of the web view's runs list, read from the run indexes (``relay/store/keys.py``).

A page is :data:`~protocol_specs.web.web.PAGE_SIZE` runs, newest first, from a position in the index
(the user's own, or every run for an admin). Without a filter it costs one range read and a record
read per row. A state or tag filter reads records in batches until the page is full, at most
:data:`~protocol_specs.web.web.MAX_SCAN` of them; the page then ends where the reading stopped, and its
"older" link goes on from there. Records are read in pipelines (one round trip a batch), and a
record is made a model only once its stored JSON showed it belongs.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from functools import partial
from typing import Any

import orjson

from protocol_specs.access.auth import Principal
from protocol_specs.runs.runs import RunRecord, RunState
from protocol_specs.web.web import MAX_SCAN, PAGE_SIZE, ListQuery

from ..runs.registry import RECORD_FIELD, Registry
from ..store import keys

__all__ = ["Page", "list_page", "load_many"]

#: ids read at once while a filter looks for matching runs
_BATCH = 500


@dataclass(frozen=True)
class Page:
    runs: list[RunRecord]
    #: where the next (older) page starts; ``None``: this is the last
    next_start: int | None
    #: run ids looked at to fill it
    scanned: int


async def load_many(
    registry: Registry, run_ids: Sequence[str], keep: Callable[[Any], bool] | None = None
) -> list[RunRecord | None]:
    """The records of ``run_ids`` in order (``None`` for one gone, or one ``keep`` refuses: it
    looks at the stored JSON, so a record that does not belong costs no model), read in one
    pipeline."""
    raws = await registry.store.hget_many([keys.record(i) for i in run_ids], RECORD_FIELD)
    out: list[RunRecord | None] = []
    for raw in raws:
        if raw is None or (keep is not None and not keep(orjson.loads(raw))):
            out.append(None)
        else:
            out.append(RunRecord.model_validate_json(raw))
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
        records = await load_many(registry, ids, partial(_belongs, query))
        for i, record in enumerate(records):
            if record is None:
                continue
            found.append(record)
            if len(found) == PAGE_SIZE:
                return Page(await _live(registry, found), at + i + 1, scanned + i + 1)
        at += len(ids)
        scanned += len(ids)
        if len(ids) < batch:
            return Page(await _live(registry, found), None, scanned)
        if scanned >= MAX_SCAN:
            return Page(await _live(registry, found), at, scanned)


def _belongs(query: ListQuery, stored: Any) -> bool:
    """Whether a stored record (its JSON) is one ``query`` lists."""
    try:
        state = RunState(stored["state"])
        tags = stored["spec"].get("tags") or []
    except (KeyError, TypeError, ValueError, AttributeError):
        return False
    return query.matches(state, tags, str(stored.get("owner", "")))


async def _live(registry: Registry, records: list[RunRecord]) -> list[RunRecord]:
    """The page's records with whether each one's worker went silent."""
    return [await registry.with_liveness(record) for record in records]
