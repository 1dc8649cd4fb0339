"""Every Redis key tether uses, and the data model behind them.

Per-run keys carry the run id in a ``{hash tag}`` so a Redis Cluster keeps all of a run's keys on one
shard (multi-key operations on one run stay legal there).

=============================  ======  =========================================  ============  ============
key                            type    contents                                   written by    read by
=============================  ======  =========================================  ============  ============
``tether:run:{R}``             hash    ``record``: the RunRecord as JSON          relay         relay
``tether:run:{R}:snapshot``    string  the working-directory snapshot (tar.gz)     relay         relay (claim)
``tether:run:{R}:to_worker``   stream  IDE -> worker entries (field ``p``)         relay (ide)   relay (worker)
``tether:run:{R}:to_ide``      stream  worker -> IDE entries and run status        relay         relay (ide)
``tether:run:{R}:<s>:meta``    hash    per producer: last number and its entry id; relay         relay
                                       ``bytes``: payload bytes held in stream <s>
``tether:run:{R}:<s>:transient``  list  ``"<id> <size>"`` of <s>'s transient entries relay         relay (trim)
``tether:runs``                zset    run ids scored by submit time               relay         CLI (list)
``tether:queue``               stream  one entry per queued run (``p`` = run id)   relay         pool claims
``tether:leases``              zset    running run ids scored by lease expiry      relay         relay sweeps
=============================  ======  =========================================  ============  ============

The queue is read through the consumer group :data:`POOL_GROUP`; an entry is acknowledged when the run
it names reaches a terminal state. Stream entries are msgpack (``protocol_specs.wire``).
Lifetimes: a run's keys expire ``RelayConfig.retention`` after it finished; transient entries are
deleted as soon as the reading side reported receiving them (``received`` frames).
"""

from __future__ import annotations

__all__ = ["LEASES", "POOL_GROUP", "QUEUE", "RUNS", "record", "run_keys", "snapshot", "stream"]

QUEUE = "tether:queue"
POOL_GROUP = "pool"
RUNS = "tether:runs"
LEASES = "tether:leases"


def record(run_id: str) -> str:
    return f"tether:run:{{{run_id}}}"


def snapshot(run_id: str) -> str:
    return f"tether:run:{{{run_id}}}:snapshot"


def stream(run_id: str, name: str) -> str:
    """``name`` is ``to_worker`` or ``to_ide`` (:class:`protocol_specs.wire.StreamName`)."""
    return f"tether:run:{{{run_id}}}:{name}"


def run_keys(run_id: str) -> list[str]:
    """Every key of one run (they expire together when its retention ends)."""
    out = [record(run_id), snapshot(run_id)]
    for name in ("to_worker", "to_ide"):
        base = stream(run_id, name)
        out += [base, f"{base}:meta", f"{base}:transient"]
    return out
