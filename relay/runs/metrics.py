"""A run's metrics as the relay reads them back: the last value of each (``tether ls``,
``status``), the newest points (the web view's charts), the points after a cursor (a sweep's
rounds). Entries were checked when the worker published them (``protocol_specs/runs/metrics.py``):
reading them back takes their points straight from msgpack (a page of a thousand entries decodes
in milliseconds, where the full model would take a good part of a second on the relay's loop);
anything that is not a metric entry, or not as it should be, is skipped."""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

import msgpack

from protocol_specs.runs.metrics import Point, last_values
from protocol_specs.wire.wire import StreamName

from ..store import Entry, Store, keys

__all__ = ["PAGE_ENTRIES", "last_metrics", "metric_points", "newest_points", "points_after"]

#: metric entries a page's charts read (the newest), and a sweep's round reads at most per trial
PAGE_ENTRIES = 1000


def metric_points(payloads: Iterable[bytes]) -> list[Point]:
    """The points of stored metric entries, in order."""
    points: list[Point] = []
    for payload in payloads:
        try:
            raw = msgpack.unpackb(payload, raw=False, strict_map_key=False)
        except Exception:  # not msgpack: not ours to read
            continue
        if isinstance(raw, dict) and raw.get("k") == "metric":
            points.extend(_points(raw.get("points")))
    return points


def _points(raw: Any) -> list[Point]:
    out: list[Point] = []
    if not isinstance(raw, list):
        return out
    for point in raw:
        if isinstance(point, list) and len(point) == 3 and isinstance(point[2], dict):
            step, at, values = point
            if isinstance(step, int) and isinstance(at, int | float):
                out.append((step, float(at), values))
    return out


async def last_metrics(store: Store, run_id: str) -> dict[str, float]:
    """The last value of each metric in the run's newest metric entry (the very newest entry
    may be the run's ``finished`` marker)."""
    stream = keys.stream(run_id, StreamName.METRICS)
    for _id, payload in reversed(await store.read_last(stream, 2)):
        if values := last_values(metric_points([payload])):
            return values
    return {}


async def newest_points(store: Store, run_id: str, entries: int = PAGE_ENTRIES) -> list[Point]:
    """The points of the run's newest ``entries`` metric entries, oldest first (a page's
    charts)."""
    stored = await store.read_last(keys.stream(run_id, StreamName.METRICS), entries)
    return metric_points(payload for _id, payload in stored)


async def points_after(
    store: Store, run_id: str, cursor: str, entries: int = PAGE_ENTRIES
) -> tuple[list[Point], str]:
    """The points of up to ``entries`` metric entries after ``cursor``, and the cursor after
    them (a sweep reads the rest on its next round)."""
    stream = keys.stream(run_id, StreamName.METRICS)
    read: list[Entry] = []
    while len(read) < entries and (
        batch := await store.read_after(stream, read[-1][0] if read else cursor, count=500)
    ):
        read.extend(batch)
    if not read:
        return [], cursor
    return metric_points(payload for _id, payload in read), read[-1][0]
