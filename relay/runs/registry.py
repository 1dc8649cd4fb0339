"""The run registry: run records in the store and everything that moves them along.

Theory of operation
-------------------
A run's record is one JSON value in its hash (``relay/store/keys.py``) with a version beside it.
Every change is *read, decide, write if unchanged*: :meth:`Registry.update` reads the record and its
version, lets a pure function decide the new record (the state machine in
``protocol_specs/runs/runs.py`` is the only authority on what may follow what), and writes it with
:meth:`~relay.store.Store.set_versioned`, a compare-and-set done by the server in one step. A
writer that lost the race (another relay process, or another task of this one, wrote first) reads
again and decides again on the newer record, so two events never overwrite each other: each is
applied to the record the other left, or refused by the state machine if it no longer fits
(a ``start`` after a ``cancel``; an exit reported by the worker of an attempt that is over).

The side effects of a change (lease removal, the queue entry's acknowledgement, status entries and
log markers, the retention of a finished run's keys) are performed after the write, by the writer
whose write won, once. A relay that dies between the write and its side effects leaves at most a
lease (the sweep finds it and the state machine ignores it), an unacknowledged queue entry
(claims skip a run that is not queued) or keys without their expiry.

Leases are per attempt (``run#attempt`` in :data:`keys.LEASES`), so a sweep that expires one
attempt's lease can never end the next attempt of the same run. A claim is provisional until its
worker confirms it (``protocol_specs/runs/claims.py``, performed by ``relay/runs/claiming.py``): a lease
that expires on an unconfirmed claim releases it (the run queued again at the same attempt), since
nothing of that attempt ran.
"""

from __future__ import annotations

import functools
import logging
import time
from collections.abc import Callable
from typing import Any

from protocol_specs.runs import claims, nodes, preemption
from protocol_specs.runs.runs import IllegalTransition, RunEvent, RunRecord, RunState
from protocol_specs.runs.spec import RunSpec
from protocol_specs.session.session import StatusEvent
from protocol_specs.snapshots.snapshots import Manifest
from protocol_specs.snapshots.trees import TreeError
from protocol_specs.wire import wire
from protocol_specs.wire.wire import ErrorCode, StreamName

from ..auth import TokenStore
from ..config import RelayConfig
from ..snapshots.blobs import BlobError
from ..snapshots.trees import Expand, Rooted
from ..store import Store, StoreError, keys
from . import claiming, submitting
from .books import Change
from .metrics import last_metrics
from .submitting import new_run_id, snapshot_fields
from .tunnels import expire_tunnels

__all__ = ["RECORD_FIELD", "Change", "Registry", "new_run_id", "snapshot_fields"]

log = logging.getLogger("tether.relay")

#: the field of a run's hash that holds its record
RECORD_FIELD = "record"
#: writers that may win in a row against one update before it gives up (each a round trip)
MAX_CONFLICTS = 100


class Registry:
    """Run records, their transitions, leases, retries and the queue's entries, on one store."""

    def __init__(
        self,
        store: Store,
        config: RelayConfig,
        *,
        clock: Callable[[], float] = time.time,
        expand: Expand | None = None,
    ) -> None:
        self.store = store
        self.config = config
        self.clock = clock
        #: a root tree's manifest and trees (``relay/snapshots/trees.py``): for runs recorded by
        #: their tree
        self.expand = expand
        #: the backends whose queue this process has used (their consumer group exists)
        self.backends: set[str] = set()
        #: the worker tokens claims mint and releases revoke
        self.tokens = TokenStore(store, clock=clock)

    # --- records ----------------------------------------------------------------------------------

    async def load(self, run_id: str) -> RunRecord | None:
        return (await self._read(run_id))[0]

    async def _read(self, run_id: str) -> tuple[RunRecord | None, int]:
        raw, version = await self.store.get_versioned(keys.record(run_id), RECORD_FIELD)
        return (RunRecord.model_validate_json(raw) if raw else None), version

    async def update(self, run_id: str, decide: Callable[[RunRecord], RunRecord]) -> Change | None:
        """Apply ``decide`` to the run's record atomically (see the module's docstring).

        ``decide`` is pure: it returns the new record, or raises :class:`IllegalTransition` to
        change nothing (logged; ``None`` is returned, as for a run that does not exist), or returns
        the record it was given to write nothing (the change's ``before`` is its ``after``). It may
        be called several times, each time on a newer record.
        """
        for _ in range(MAX_CONFLICTS):
            record, version = await self._read(run_id)
            if record is None:
                return None
            try:
                updated = decide(record)
            except IllegalTransition as exc:
                log.info("run %s: %s", run_id, exc)
                return None
            if updated is record:
                return Change(record, record, version)
            stored = _encode(updated)
            if await self.store.set_versioned(keys.record(run_id), RECORD_FIELD, stored, version):
                await self.changed(updated)
                return Change(record, updated, version + 1)
        raise StoreError(f"run {run_id}: {MAX_CONFLICTS} other writers came first; giving up")

    async def changed(self, record: RunRecord) -> None:
        """Tell the web view's live pages (``keys.CHANGES``) that ``record`` was written. A failure
        costs them this change (they show it once reloaded): it never fails the write itself."""
        try:
            payload = record.redacted().model_dump_json().encode()
            await self.store.append(keys.CHANGES, payload, maxlen=keys.CHANGES_KEPT)
        except StoreError as exc:
            log.warning("run %s: could not announce its change: %s", record.id, exc)

    async def create(self, record: RunRecord) -> bool:
        """Store a new run's record; False if the id is taken."""
        return await self.store.set_versioned(
            keys.record(record.id), RECORD_FIELD, _encode(record), 0
        )

    async def with_liveness(self, record: RunRecord) -> RunRecord:
        """``record`` as answered: :attr:`RunRecord.silent_for` set when its worker's heartbeats
        are late, :attr:`RunRecord.metrics` to its newest metric entry's values."""
        if values := await last_metrics(self.store, record.id):
            record = record.model_copy(update={"metrics": values})
        if record.state not in (RunState.STARTING, RunState.RUNNING, RunState.PAUSED):
            return record
        expires = await self.store.zscore(keys.LEASES, keys.lease(record.id, record.attempt))
        if expires is None:
            return record
        silent = self.clock() - (expires - self.config.lease)
        if silent <= 2 * self.config.heartbeat:
            return record
        return record.model_copy(update={"silent_for": round(silent, 1)})

    # --- entries the registry writes --------------------------------------------------------------

    async def append_status(
        self, run_id: str, event: str, record: RunRecord, *, logs: bool = False, **extra: Any
    ) -> None:
        """A status entry in the run's ``to_ide`` stream (and, with ``logs``, its logs stream)."""
        data = {"attempt": record.attempt, **extra.pop("data", {})}
        entry = wire.StatusEntry(
            event=event, state=record.state.value, at=self.clock(), data=data, **extra
        )
        payload = wire.encode_entry(entry)
        await self.store.append(keys.stream(run_id, StreamName.TO_IDE), payload)
        if logs:
            await self.log_marker(run_id, payload)

    async def log_marker(self, run_id: str, payload: bytes) -> None:
        await self.store.append(
            keys.stream(run_id, StreamName.LOGS), payload, maxlen=self.config.log_entries
        )

    async def tell_worker(self, run_id: str, attempt: int, detail: str) -> None:
        """Ask the worker of ``attempt`` (should it be, or come back) to stop its program."""
        control = wire.ControlEntry(action="terminate", detail=detail, attempt=attempt)
        await self.store.append(
            keys.stream(run_id, StreamName.TO_WORKER), wire.encode_entry(control)
        )

    async def tell_rendezvous(self, run_id: str, attempt: int, rendezvous: dict[str, Any]) -> None:
        """Tell the other nodes of a multi-node run's ``attempt`` where node 0's program waits
        for them (``{"addr": str, "port": int}``); they start their programs then."""
        control = wire.ControlEntry(action="rendezvous", attempt=attempt, data=rendezvous)
        await self.store.append(
            keys.stream(run_id, StreamName.TO_WORKER), wire.encode_entry(control)
        )

    # --- transitions ------------------------------------------------------------------------------

    async def transition(
        self,
        run_id: str,
        event: RunEvent,
        *,
        about: int | None = None,
        attempt_fields: dict[str, Any] | None = None,
        mark: Callable[[RunRecord], RunRecord] | None = None,
        **changes: Any,
    ) -> RunRecord | None:
        """Apply ``event`` (about attempt ``about``, if given; ``attempt_fields`` also go into the
        current attempt's entry; ``mark`` (a node's row, ``protocol_specs/runs/nodes.py``) is
        applied to the record first); ``None`` if it isn't legal now."""
        now = self.clock()

        def decide(record: RunRecord) -> RunRecord:
            marked = mark(record) if mark is not None else record
            updated = marked.advance(event, at=now, about=about, **changes)
            return updated.with_attempt(**attempt_fields) if attempt_fields else updated

        change = await self.update(run_id, decide)
        if change is None:
            return None
        await self.settle(change.before, change.after)
        return change.after

    async def attempt_ended(
        self,
        run_id: str,
        event: RunEvent,
        *,
        about: int | None = None,
        exit_code: int | None = None,
        detail: str = "",
        mark: Callable[[RunRecord], RunRecord] | None = None,
        node_detail: str = "",
    ) -> RunRecord | None:
        """The current attempt failed (``exit_error``) or was lost (``lease_expired``,
        ``job_lost``): retried if the spec allows another attempt, else the run ends. A lease that
        expired on a claim never confirmed releases it instead (queued again, same attempt).
        ``mark``: the node whose news it is, marked in the record first (``nodes.py``);
        ``node_detail``: ``detail``'s stead for a run that spans nodes."""
        now = self.clock()

        def decide(record: RunRecord) -> RunRecord:
            record.check_attempt(event, about)
            said = node_detail if node_detail and nodes.multi(record) else detail
            record = mark(record) if mark is not None else record
            if event is RunEvent.LEASE_EXPIRED:
                return claims.lease_expired(record, at=now, about=about, detail=said)
            return record.attempt_over(event, at=now, about=about, exit_code=exit_code, detail=said)

        change = await self.update(run_id, decide)
        if change is None:
            return None
        before, updated, _ = change
        if updated.attempt == before.attempt and updated.state is RunState.QUEUED:
            why = "was never confirmed, and its lease expired"
            await claiming.released(self, before, updated, why)
            return updated
        await self.settle(before, updated)
        if updated.finished:
            return updated
        delay = max(updated.not_before - now, 0.0)
        outcome = "failed" if event is RunEvent.EXIT_ERROR else "lost"
        if before.preempted:
            outcome, text = "preempted", preemption.what_follows(before, updated)
        elif outcome == "failed" and not nodes.multi(before):
            what = f"exited with code {exit_code}"
        else:
            what = f"{'failed' if outcome == 'failed' else 'was lost'}: {updated.detail}"
        if outcome != "preempted":
            text = (
                f"attempt {before.attempt} {what}; attempt {updated.attempt} of "
                f"{before.spec.max_retries + 1} starts in {delay:g} s"
            )
        log.info("run %s: %s", run_id, text)
        # the previous attempt's worker, should it come back, stops its program
        await self.tell_worker(run_id, before.attempt, text)
        if updated.state is RunState.SUSPENDED:
            await self.append_status(run_id, StatusEvent.SUSPENDED, updated, logs=True, detail=text)
            return updated
        await self.append_status(
            run_id,
            StatusEvent.RETRYING,
            updated,
            logs=True,
            detail=text,
            exit_code=exit_code,
            data={"previous": before.attempt, "delay": delay, "outcome": outcome},
        )
        await self.store.zadd(keys.DELAYED, run_id, updated.not_before)
        if delay == 0:
            await self.requeue_due()
        return updated

    async def settle(self, before: RunRecord, after: RunRecord) -> None:
        """The side effects of a change this process won: an attempt that ended (the run finished,
        or was retried or released) gives up its lease and its queue entry; a finished run leaves
        the user's active runs, gets its log marker, and its keys their retention."""
        attempt_over = (
            after.finished
            or after.attempt != before.attempt
            or (after.state is RunState.SUSPENDED and before.state is not RunState.SUSPENDED)
        )
        if attempt_over or (before.state is not after.state and after.state is RunState.QUEUED):
            nodes = before.spec.resources.nodes
            for member in keys.leases(before.id, before.attempt, nodes):
                await self.store.zrem(keys.LEASES, member)
            await self.store.zrem(keys.LEASES, before.id)  # a lease of before per-attempt leases
            if before.queue_entry:  # a record from before entries were acknowledged at claim
                await self.ack(before.spec.backend, before.queue_entry)
        if not after.finished:
            return
        if before.spec.resources.nodes > 1 and after.state is not RunState.CANCELLED:
            # the other nodes' programs end with it (a cancel tells every worker itself)
            await self.tell_worker(after.id, before.attempt, after.detail or after.state.value)
        await self.store.zrem(keys.user_active(after.owner), after.id)
        finished = wire.StatusEntry(
            event=StatusEvent.FINISHED,
            state=after.state.value,
            at=after.updated_at,
            exit_code=after.exit_code,
            detail=after.detail,
            data={"attempt": after.attempt},
        )
        await self.log_marker(after.id, wire.encode_entry(finished))
        await self.store.append(  # a metrics follower's end too
            keys.stream(after.id, StreamName.METRICS),
            wire.encode_entry(finished),
            maxlen=self.config.metric_entries,
        )
        for key in keys.run_keys(after.id):
            await self.store.expire(key, self.config.retention)
        await expire_tunnels(self.store, after, self.config.retention)

    # --- submission -------------------------------------------------------------------------------

    async def submit(
        self,
        spec: RunSpec,
        snapshot: Manifest | Rooted,
        *,
        owner: str,
        rerun_of: str = "",
        run_id: str = "",
        trial: str = "",
    ) -> RunRecord | wire.Error:
        """Record and queue a run on ``snapshot`` (``relay/runs/submitting.py``)."""
        return await submitting.submit(
            self, spec, snapshot, owner=owner, rerun_of=rerun_of, run_id=run_id, trial=trial
        )

    async def live_digests(self) -> set[str]:
        """Every blob digest a run still in the store names in its snapshot (finished runs' keys
        expire after the retention; their ids are then dropped from the run indexes too)."""
        import orjson

        live: set[str] = set()
        roots: set[str] = set()  #: trees expanded already (reruns share theirs)
        for run_id in await self.store.zrange_desc(keys.RUNS, 10**9):
            raw = await self.store.get_bytes(keys.manifest(run_id))
            if raw is None:
                record = await self.load(run_id)
                if record is None:  # expired: forget it everywhere
                    await self.store.zrem(keys.RUNS, run_id)
                elif record.tree and self.expand is not None and record.tree not in roots:
                    roots.add(record.tree)  # its files and its trees
                    try:
                        manifest, trees = await self.expand(record.tree)
                    except (BlobError, TreeError) as exc:
                        log.warning("run %s: its snapshot cannot be read: %s", run_id, exc)
                        continue
                    live.update(manifest.digests, trees)
                continue
            for entry in orjson.loads(raw).get("entries", []):
                if isinstance(entry, dict) and entry.get("digest"):
                    live.add(str(entry["digest"]))
        return live

    async def manifest_of(self, run_id: str) -> Manifest:
        """The run's manifest: as kept, or expanded from its root tree (:class:`BlobError` or
        :class:`TreeError` if the relay lost part of it)."""
        raw = await self.store.get_bytes(keys.manifest(run_id))
        if raw:
            return Manifest.model_validate_json(raw)
        record = await self.load(run_id)
        if record is None or not record.tree or self.expand is None:
            return Manifest()
        return (await self.expand(record.tree))[0]

    async def snapshot_lost(self, record: RunRecord, detail: str) -> None:
        """A claimed attempt whose snapshot the relay cannot read any more: it fails to start."""
        failed = await self.transition(
            record.id, RunEvent.START_FAILED, about=record.attempt, detail=detail
        )
        if failed is not None:
            await self.append_status(
                record.id, StatusEvent.START_FAILED, failed, logs=True, detail=detail
            )

    async def list_runs(self, limit: int, user: str = "") -> list[RunRecord]:
        """The newest runs (``user``: that user's only)."""
        runs = []
        key = keys.user_runs(user) if user else keys.RUNS
        for run_id in await self.store.zrange_desc(key, limit):
            record = await self.load(run_id)
            if record is not None:
                runs.append(await self.with_liveness(record))
        return runs

    async def cancel(self, run_id: str, detail: str) -> RunRecord | None:
        record = await self.transition(run_id, RunEvent.CANCEL, detail=detail)
        if record is None:
            return await self.load(run_id)
        await self.store.zrem(keys.DELAYED, run_id)
        await self.append_status(run_id, StatusEvent.CANCELLED, record, detail=detail)
        await self.tell_worker(run_id, record.attempt, detail)
        return record

    # --- the queue --------------------------------------------------------------------------------

    async def ensure_group(self, backend: str) -> None:
        if backend not in self.backends:
            await self.store.ensure_group(keys.queue(backend), keys.POOL_GROUP)
            self.backends.add(backend)

    async def enqueue(self, record: RunRecord) -> None:
        await self.ensure_group(record.spec.backend)
        await self.store.append(keys.queue(record.spec.backend), record.id.encode())

    async def ack(self, backend: str, entry_id: str) -> None:
        await self.store.ack(keys.queue(backend), keys.POOL_GROUP, entry_id)

    async def requeue(self, backend: str, entry_id: str, run_id: str) -> None:
        """Put a run back at the end of ``backend``'s queue in place of the entry ``entry_id``
        that was taken but not handed over (appended first: a crash in between leaves a spare
        entry, which a claim skips, rather than none)."""
        await self.store.append(keys.queue(backend), run_id.encode())
        await self.ack(backend, entry_id)

    async def claimed(
        self, run_id: str, worker: str, *, mint: bool = True, from_queue: bool = True
    ) -> claiming.Claimed | None:
        """Claim a queued run for ``worker`` (``relay/runs/claiming.py``), with a worker token for
        the attempt (``mint``); ``None`` if it is not queued (any more)."""
        return await claiming.claim(self, run_id, worker, mint=mint, from_queue=from_queue)

    async def release(self, record: RunRecord, why: str) -> RunRecord | None:
        """A claim (``record``, as claimed) whose answer never reached its worker: the run queued
        again for the same attempt, unless the claim was confirmed or is no longer current."""
        return await claiming.release(self, record, f"could not be answered: {why}")

    async def report(self, frame: wire.Report) -> RunRecord | wire.Error:
        """A scheduler backend's news about an attempt it launched (see :class:`wire.Report`)."""
        if frame.event == "running":
            at = self.clock()
            ran = await self.update(frame.run, lambda record: _job_running(record, frame, at))
            got = ran.after if ran is not None else await self.load(frame.run)
            return got or wire.Error(code=ErrorCode.NO_SUCH_RUN, message=f"no run {frame.run!r}")
        if frame.event == "job":
            change = await self.update(
                frame.run, lambda record: _job_started(record, frame.attempt, frame.job)
            )
            if change is None:
                record = await self.load(frame.run)
                if record is None:
                    return wire.Error(code=ErrorCode.NO_SUCH_RUN, message=f"no run {frame.run!r}")
                return record  # news about an attempt that is over: nothing to do
            record = change.after
            await self.append_status(
                record.id,
                StatusEvent.QUEUED,
                record,
                logs=True,
                detail=f"{frame.detail}; pending in the scheduler's queue",
                data={"job": frame.job},
            )
            return record
        detail = frame.detail or f"scheduler job {frame.job} ended without the worker"
        updated = await self.attempt_ended(
            frame.run, RunEvent.JOB_LOST, about=frame.attempt, detail=detail
        )
        if updated is not None and updated.finished:
            await self.append_status(updated.id, StatusEvent.WORKER_LOST, updated, detail=detail)
        if updated is not None:
            return updated
        record = await self.load(frame.run)
        if record is None:
            return wire.Error(code=ErrorCode.NO_SUCH_RUN, message=f"no run {frame.run!r}")
        return record

    # --- leases and delayed attempts --------------------------------------------------------------

    async def renew_lease(self, run_id: str, attempt: int, node: int = 0) -> bool:
        """Push the lease of ``run_id``'s ``attempt`` (its node ``node``'s) forward; False if
        there is none (expired)."""
        expires = self.clock() + self.config.lease
        if await self.store.zadd(
            keys.LEASES, keys.lease(run_id, attempt, node), expires, only_existing=True
        ):
            return True
        if node:
            return False
        # a lease written before leases named their attempt
        return await self.store.zadd(keys.LEASES, run_id, expires, only_existing=True)

    async def sweep(self) -> list[str]:
        """Release the claims left unconfirmed past their deadline (``relay/runs/claiming.py``);
        handle the attempts whose worker lease expired (retried, or the run marked lost); queue
        retried runs that are due. Returns the ids of the runs whose lease expired.

        Every relay sweeps; the one whose ``ZREM`` removes a lease (or a delayed run) handles it.
        """
        await claiming.sweep(self)
        await submitting.finish_submits(self)
        lost = []
        now = self.clock()
        for member in await self.store.zrange_by_score(keys.LEASES, now, 100):
            if not await self.store.zrem(keys.LEASES, member):
                continue  # another relay took it
            run_id, attempt = keys.parse_lease(member)
            node = keys.lease_node(member)
            detail = (
                f"the worker stopped renewing its lease for over {self.config.lease:g} s "
                "(its host is down, or it has been cut off from the relay)"
            )
            record = await self.attempt_ended(
                run_id,
                RunEvent.LEASE_EXPIRED,
                about=attempt,
                detail=detail,
                mark=functools.partial(nodes.lost, node=node),
                node_detail=nodes.lost_detail(node, self.config.lease),
            )
            if record is None or (record.state is RunState.QUEUED and record.attempt == attempt):
                continue  # nothing ended, or a claim never confirmed was released
            log.warning("run %s: the worker of attempt %s is lost: lease expired", run_id, attempt)
            if record.finished:
                await self.append_status(
                    run_id, StatusEvent.WORKER_LOST, record, detail=record.detail
                )
                if not nodes.multi(record):  # a multi-node run's nodes were told (``settle``)
                    await self.tell_worker(run_id, record.attempt, "the run was marked lost")
            lost.append(run_id)
        await self.requeue_due()
        return lost

    async def requeue_due(self) -> None:
        """Queue the retried runs whose backoff is over, and the runs of pools' claims that were
        released but not queued again (their relay died in between: ``relay/runs/claiming.py``)."""
        now = self.clock()
        for run_id in await self.store.zrange_by_score(keys.DELAYED, now, 100):
            if not await self.store.zrem(keys.DELAYED, run_id):
                continue
            record = await self.load(run_id)
            if record is not None and record.state is RunState.QUEUED:
                await self.enqueue(record)
            elif record is not None and claims.unconfirmed(record, None):
                # not released yet: looked at again after the claims' sweep has had its turn
                await self.store.zadd(keys.DELAYED, run_id, now + self.config.sweep_interval)


def _job_started(record: RunRecord, attempt: int, job: str) -> RunRecord:
    record.check_attempt(RunEvent.CLAIM, attempt)
    if record.finished:
        raise IllegalTransition(RunEvent.CLAIM, record.state)
    return record.with_attempt(job=job)


def _job_running(record: RunRecord, frame: wire.Report, at: float) -> RunRecord:
    """The attempt's job runs: news about another job (an earlier one of the attempt, a late
    look) or another attempt changes nothing."""
    record.check_attempt(RunEvent.CLAIM, frame.attempt)
    last = record.attempts[-1] if record.attempts else None
    if (
        record.finished
        or last is None
        or (last.n, last.job) != (frame.attempt, frame.job)
        or last.job_running_at is not None  # said already
    ):
        raise IllegalTransition(RunEvent.CLAIM, record.state)
    return record.with_attempt(job_running_at=at)


def _encode(record: RunRecord) -> bytes:
    if record.silent_for or record.metrics:
        record = record.model_copy(update={"silent_for": 0.0, "metrics": {}})
    return record.model_dump_json().encode()
