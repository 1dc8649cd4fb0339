"""A run's metrics as the relay answers them: the last value of each, for ``tether ls`` and
``status`` (``protocol_specs/metrics.py``)."""

from __future__ import annotations

from protocol_specs import wire
from protocol_specs.metrics import last_values, points_of
from protocol_specs.wire import StreamName

from . import keys
from .store import Store

__all__ = ["last_metrics"]


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
