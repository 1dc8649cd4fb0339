"""Preempting, pausing and resuming runs on the relay: the decisions are
``protocol_specs/runs/preemption.py``'s; this performs them on the registry.

A preempt marks the run's current attempt and tells its worker (a ``preempt`` control entry in
``to_worker``, for that attempt: every node's worker reads it), which warns the program and ends
it after the grace; the attempt's end is then classified by ``Registry.attempt_ended``. A pause of a
queued run suspends it at once: its queue entry is acknowledged and its delayed start dropped, so
no worker claims it. A resume queues the next attempt.
"""

from __future__ import annotations

import logging

from protocol_specs.runs import preemption
from protocol_specs.runs.runs import RunRecord, RunState
from protocol_specs.session.session import StatusEvent
from protocol_specs.wire import wire
from protocol_specs.wire.wire import ErrorCode, StreamName

from ..store import keys
from .registry import Registry

__all__ = ["preempt", "resume"]

log = logging.getLogger("tether.relay")


def _refused(record: RunRecord, message: str) -> wire.Error:
    code = ErrorCode.RUN_FINISHED if record.finished else ErrorCode.WRONG_STATE
    return wire.Error(code=code, message=message)


async def preempt(
    registry: Registry,
    record: RunRecord,
    *,
    then: preemption.Then,
    grace: float | None,
    detail: str,
) -> RunRecord | wire.Error:
    """Preempt ``record``'s run (``then``: what follows its attempt's end); the record after, or
    the refusal in one line."""
    if why := preemption.refusal(record, then):
        return _refused(record, why)
    now = registry.clock()
    change = await registry.update(
        record.id, lambda r: preemption.preempt(r, then, at=now, detail=detail)
    )
    if change is None:  # it moved meanwhile
        latest = await registry.load(record.id) or record
        return _refused(latest, preemption.refusal(latest, then) or f"run {record.id} moved on")
    before, after, _ = change
    if after.state is RunState.SUSPENDED:  # it was queued: nothing of it runs
        await registry.store.zrem(keys.DELAYED, after.id)
        if before.queue_entry:
            await registry.ack(before.spec.backend, before.queue_entry)
        text = preemption.what_follows(before, after)
        await registry.append_status(after.id, StatusEvent.SUSPENDED, after, logs=True, detail=text)
        return after
    seconds = after.spec.preempt_grace if grace is None else grace
    control = wire.ControlEntry(
        action="preempt",
        attempt=after.attempt,
        detail=detail,
        data={"grace": seconds, "then": then},
    )
    await registry.store.append(
        keys.stream(after.id, StreamName.TO_WORKER), wire.encode_entry(control)
    )
    ends = f"the program has {seconds:g} s" if seconds > 0 else "the program is ended now"
    text = f"preempting attempt {after.attempt}: {detail}; {ends}"
    log.info("run %s: %s", after.id, text)
    await registry.append_status(
        after.id,
        StatusEvent.PREEMPTING,
        after,
        logs=True,
        detail=text,
        data={"grace": seconds, "then": then},
    )
    return after


async def resume(
    registry: Registry, record: RunRecord, *, from_start: bool
) -> RunRecord | wire.Error:
    """Queue the next attempt of ``record``'s suspended run; the record after, or the refusal."""
    if why := preemption.resume_refusal(record, from_start=from_start):
        return _refused(record, why)
    now = registry.clock()
    change = await registry.update(
        record.id, lambda r: preemption.resume(r, at=now, from_start=from_start)
    )
    if change is None:
        latest = await registry.load(record.id) or record
        why = preemption.resume_refusal(latest, from_start=from_start)
        return _refused(latest, why or f"run {record.id} moved on")
    after = change.after
    text = f"resumed: {preemption.next_attempt(after)}"
    await registry.append_status(after.id, StatusEvent.QUEUED, after, logs=True, detail=text)
    await registry.enqueue(after)
    return after
