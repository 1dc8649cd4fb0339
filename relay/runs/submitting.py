"""Submitting a run: its record, indexes and queue entry, exactly once across lost answers and
relay deaths (``protocol_specs/runs/submits.py``).

A relay notes the run in ``tether:submitting`` before it writes anything of it, and takes the note
off once the run is in its queue; every step in between is idempotent. So a submit asked again
(its key names the same run) finishes what the first one left, and a note past its deadline is
finished by any relay's sweep (:func:`finish_submits`). A sweep's trial is submitted the same way
(its id chosen by the sweep).
"""

from __future__ import annotations

import logging
import secrets
import time
from dataclasses import asdict
from typing import Any

from protocol_specs.checkpoints.checkpoints import parse_source
from protocol_specs.runs.runs import Attempt, RunEvent, RunRecord, RunState
from protocol_specs.runs.spec import RunSpec
from protocol_specs.runs.submits import FINISH_AFTER
from protocol_specs.session.session import StatusEvent
from protocol_specs.snapshots.snapshots import Manifest
from protocol_specs.wire import wire
from protocol_specs.wire.wire import ErrorCode, StreamName

from ..snapshots.trees import Rooted
from ..store import keys
from .books import Books
from .checkpoints import read_book

__all__ = [
    "check_seed",
    "finish_submit",
    "finish_submits",
    "new_run_id",
    "snapshot_fields",
    "submit",
]

log = logging.getLogger("tether.relay")


def new_run_id() -> str:
    return f"{int(time.time()):x}{secrets.token_hex(3)}"


def snapshot_fields(snapshot: Manifest | Rooted) -> dict[str, Any]:
    """The fields a record names its snapshot by (``snapshot``, ``files``, ``size``; ``tree``)."""
    if isinstance(snapshot, Rooted):
        return asdict(snapshot)
    return {"snapshot": snapshot.id, "files": len(snapshot.entries), "size": snapshot.total_bytes}


async def submit(
    registry: Books,
    spec: RunSpec,
    snapshot: Manifest | Rooted,
    *,
    owner: str,
    rerun_of: str = "",
    run_id: str = "",
    trial: str = "",
) -> RunRecord | wire.Error:
    """Record and queue a run on ``snapshot``: a manifest (kept beside the record) or a root
    tree already checked (the record names it; the manifest is expanded at claim).
    ``run_id``: the run's id, chosen beforehand (a submit's key, or a sweep's trial: a run that
    exists already is answered as it is, its submit finished); ``trial``: the sweep's trial it
    is (``S#3``)."""
    if run_id and (there := await registry.load(run_id)) is not None:
        return await _again(registry, there, owner, snapshot)
    if spec.from_checkpoint and (refused := await check_seed(registry, spec, owner)):
        return refused
    cap = registry.config.max_active_runs
    store = registry.store
    active = await store.zrange_by_score(keys.user_active(owner), float("inf"), cap)
    if len(active) >= cap:
        return wire.Error(
            code=ErrorCode.TOO_MANY_RUNS,
            message=f"{owner} has {len(active)} runs queued or running, the most this relay "
            "allows; wait for some to finish or cancel some",
        )
    now = registry.clock()
    record = RunRecord(
        id=run_id or new_run_id(),
        trial=trial,
        spec=spec,
        created_at=now,
        updated_at=now,
        **snapshot_fields(snapshot),
        attempts=[Attempt(n=1, queued_at=now)],
        rerun_of=rerun_of,
        owner=owner,
    )
    # noted first: a relay that dies before the run is in its queue leaves it to a sweep
    await store.zadd(keys.SUBMITTING, record.id, now + FINISH_AFTER)
    while not await registry.create(record):
        if run_id:  # made meanwhile, by the same request asked again
            there = await registry.load(run_id)
            return record if there is None else await _again(registry, there, owner, snapshot)
        await store.zrem(keys.SUBMITTING, record.id)
        record = record.model_copy(update={"id": new_run_id()})
        await store.zadd(keys.SUBMITTING, record.id, now + FINISH_AFTER)
    if isinstance(snapshot, Manifest):
        await _keep_manifest(registry, record.id, snapshot)
    return await finish_submit(registry, record, fresh=True)


async def check_seed(registry: Books, spec: RunSpec, owner: str) -> wire.Error | None:
    """Why ``spec``'s ``--from-checkpoint RUN[:STEP]`` cannot seed a run of ``owner``'s (one
    line), or ``None``: the run is there, ``owner``'s, and has that checkpoint."""
    try:
        run, step = parse_source(spec.from_checkpoint)
    except ValueError as exc:
        return wire.Error(code=ErrorCode.BAD_SPEC, message=f"--from-checkpoint: {exc}")
    seed = await registry.load(run)
    why = ""
    if seed is None:
        why = f"there is no run {run}"
    elif seed.owner != owner:
        why = f"run {run} is not yours ({seed.owner}'s)"
    elif (latest := (book := await read_book(registry.store, run)).latest) is None:
        why = f"run {run} has no checkpoint (tether.save_checkpoint saves one)"
    elif step is not None and book.at_step(step) is None:
        kept = ", ".join(str(c.step) for c in book.kept)
        why = f"run {run} has no checkpoint of step {step} (it keeps steps {kept}; latest {latest.step})"
    if not why:
        return None
    return wire.Error(code=ErrorCode.BAD_SPEC, message=f"--from-checkpoint: {why}")


async def _again(
    registry: Books, there: RunRecord, owner: str, snapshot: Manifest | Rooted
) -> RunRecord:
    """A run asked for again (its id chosen by the asker): its submit finished, then answered."""
    if there.owner == owner and isinstance(snapshot, Manifest):
        await _keep_manifest(registry, there.id, snapshot)  # the first may have died before
    return await finish_submit(registry, there)


async def _keep_manifest(registry: Books, run_id: str, manifest: Manifest) -> None:
    await registry.store.set_bytes(keys.manifest(run_id), manifest.model_dump_json().encode())


async def finish_submit(registry: Books, record: RunRecord, *, fresh: bool = False) -> RunRecord:
    """The rest of ``record``'s submit, each step idempotent: its indexes, the ``queued`` note in
    its logs (``fresh``: a submit's own; else only if none was written), its queue entry while it
    is queued at its first attempt, never claimed (one entry too many is skipped by the claim),
    then the submit's note off. Returns the record as it is."""
    store, at = registry.store, record.created_at
    await store.zadd(keys.RUNS, record.id, at)
    await store.zadd(keys.user_runs(record.owner), record.id, at)
    if not record.finished:
        await store.zadd(keys.user_active(record.owner), record.id, at)
    if record.state is RunState.QUEUED and record.attempt == 1 and not record.worker:
        if fresh or not await _noted_queued(registry, record.id):
            detail = f"queued on {record.spec.backend}: waiting for a worker"
            await registry.append_status(
                record.id, StatusEvent.QUEUED, record, logs=True, detail=detail
            )
        await registry.enqueue(record)
        await registry.changed(record)
    await store.zrem(keys.SUBMITTING, record.id)
    return record


async def _noted_queued(registry: Books, run_id: str) -> bool:
    """Whether the run's ``to_ide`` stream holds a ``queued`` status entry already."""
    stream = keys.stream(run_id, StreamName.TO_IDE)
    for _id, raw in await registry.store.read_after(stream, "0", count=20):
        try:
            entry = wire.decode_entry(raw)
        except wire.WireError:
            continue
        if isinstance(entry, wire.StatusEntry) and entry.event == StatusEvent.QUEUED:
            return True
    return False


async def finish_submits(registry: Books) -> None:
    """Finish the submits whose relay died before the run was in its queue (any relay's sweep:
    the one whose ``ZREM`` takes the note). A run whose snapshot's manifest was never kept
    cannot run: it ends ``lost``, saying so."""
    store = registry.store
    for run_id in await store.zrange_by_score(keys.SUBMITTING, registry.clock(), 100):
        if not await store.zrem(keys.SUBMITTING, run_id):
            continue  # another relay took it
        record = await registry.load(run_id)
        if record is None:
            continue  # its relay died before the record was written: nothing was submitted
        if not record.tree and await store.get_bytes(keys.manifest(run_id)) is None:
            detail = "its submit was cut off before its snapshot was kept: submit it again"
            await registry.transition(run_id, RunEvent.SUBMIT_CUT, detail=detail)
            continue
        log.info("run %s: its submit was cut off; finished by this relay's sweep", run_id)
        await finish_submit(registry, record)
