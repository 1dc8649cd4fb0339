"""A run's metrics as the relay answers them: the last value of each, for ``tether ls`` and
``status`` (``protocol_specs/metrics.py``)."""

from __future__ import annotations

from protocol_specs import wire
from protocol_specs.metrics import Point, last_values, points_of
from protocol_specs.wire import StreamName

from . import keys
from .store import Store

__all__ = ["last_metrics", "newest_points"]


async def last_metrics(store: Store, run_id: str) -> dict[str, float]:
    """The last value of each metric in the run's newest metric entry (the very newest entry
    may be the run's ``finished`` marker)."""
    stream = keys.stream(run_id, StreamName.METRICS)
    for _id, payload in reversed(await store.read_last(stream, 2)):
        try:
            entry = wire.decode_entry(payload)
        except wire.WireError:
            continue
        if values := last_values(points_of([entry])):
            return values
    return {}


async def newest_points(store: Store, run_id: str, entries: int = 2000) -> list[Point]:
    """The points of the run's newest ``entries`` metric entries, oldest first (a page's
    charts)."""
    decoded = []
    for _id, payload in await store.read_last(keys.stream(run_id, StreamName.METRICS), entries):
        try:
            decoded.append(wire.decode_entry(payload))
        except wire.WireError:
            continue
    return points_of(decoded)
