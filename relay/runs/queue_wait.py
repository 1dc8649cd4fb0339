"""Why a queued run waits: what holds its worker pool's slots, said where the run is shown.

A run queued for the local pool waits because every slot of the pools serving it holds a run: a
slot's attempt holds a lease (``keys.LEASES``) from its claim to its end, so the runs with a
lease on that backend are what holds the slots, and the slots waiting for a run on this relay
process (:meth:`relay.runs.claims.Claims.waiting`) are the free ones. :func:`explain` sets
:attr:`RunRecord.queued_why` on the records a relay answers with (``tether ls``, ``tether
status``, and the polls of ``tether run -f`` and ``tether debug`` while their run is queued);
the text is ``protocol_specs/runs/text.py``'s. It is never stored.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING

from protocol_specs.runs.runs import RunRecord, RunState
from protocol_specs.runs.text import slots_text

from ..store import keys

if TYPE_CHECKING:
    from .registry import Registry

__all__ = ["POOL_BACKENDS", "explain"]

#: the backends whose queued runs wait for a pool's slot (the others wait in a scheduler's queue)
POOL_BACKENDS = frozenset({"local"})
#: most slot holders read for one answer
MOST_HOLDERS = 256
_HOLDING = (RunState.STARTING, RunState.RUNNING, RunState.PAUSED)


def _waits_for_a_slot(record: RunRecord, now: float) -> bool:
    last = record.attempts[-1] if record.attempts else None
    return (
        record.state is RunState.QUEUED
        and record.spec.backend in POOL_BACKENDS
        and record.not_before <= now
        and not (last is not None and last.job)
    )


async def holders(registry: Registry, backend: str) -> list[RunRecord]:
    """The runs of ``backend`` holding a slot now (their attempt holds a lease), oldest first."""
    found = []
    for member in await registry.store.zrange_by_score(keys.LEASES, float("inf"), MOST_HOLDERS):
        if keys.lease_node(member):  # a multi-node run's other nodes: node 0's lists it
            continue
        run_id, attempt = keys.parse_lease(member)
        record = await registry.load(run_id)
        if (
            record is not None
            and record.spec.backend == backend
            and record.state in _HOLDING
            and record.attempt == attempt
        ):
            found.append(await registry.with_liveness(record))
    return sorted(found, key=lambda r: (r.attempts[-1].claimed_at or 0.0) if r.attempts else 0.0)


async def explain(
    registry: Registry,
    records: Sequence[RunRecord],
    *,
    free: Callable[[str], int],
    viewer: str | None,
) -> list[RunRecord]:
    """``records`` with :attr:`RunRecord.queued_why` set on those waiting for a pool's slot
    (``free(backend)``: the slots waiting for a run; ``viewer``: whose runs the text names,
    None for all). The slots' holders are read once per backend."""
    now = registry.clock()
    said: dict[str, str] = {}
    out = []
    for record in records:
        if _waits_for_a_slot(record, now):
            backend = record.spec.backend
            if backend not in said:
                said[backend] = slots_text(await holders(registry, backend), free(backend), viewer)
            if said[backend]:
                record = record.model_copy(update={"queued_why": said[backend]})
        out.append(record)
    return out
