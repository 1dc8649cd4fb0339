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
``tether:runs``                zset    run ids scored by submit time               relay         CLI (list)
``tether:queue``               stream  one entry per queued run (``p`` = run id)   relay         pool claims
=============================  ======  =========================================  ============  ============

The queue is read through the consumer group :data:`POOL_GROUP`; an entry is acknowledged when the run
it names reaches a terminal state. Stream entries are msgpack (``protocol_specs.wire``).
Lifetimes: until the run's retention expires (retention and trimming: the durability issue).
"""

from __future__ import annotations

__all__ = ["POOL_GROUP", "QUEUE", "RUNS", "record", "snapshot", "stream"]

QUEUE = "tether:queue"
POOL_GROUP = "pool"
RUNS = "tether:runs"


def record(run_id: str) -> str:
    return f"tether:run:{{{run_id}}}"


def snapshot(run_id: str) -> str:
    return f"tether:run:{{{run_id}}}:snapshot"


def stream(run_id: str, name: str) -> str:
    """``name`` is ``to_worker`` or ``to_ide`` (:class:`protocol_specs.wire.StreamName`)."""
    return f"tether:run:{{{run_id}}}:{name}"
