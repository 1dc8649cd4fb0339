"""The relay: a trio WebSocket server that keeps runs and their DAP traffic in Redis.

Each connection starts with a ``hello`` frame naming its role (see ``protocol_specs/wire.py`` and
``protocol_specs/relay-protocol.md``):

- ``ide`` / ``worker`` connections are bound to one run. What they publish is appended to the run's
  outbound stream and acknowledged only after Redis stored it; a reader task delivers the run's inbound
  stream from the peer's cursor on, so a peer can be on any relay process. The reader is woken by
  ``relay/fanout.py`` (one Redis subscription per process): an append made here is handed over with
  its payload, one made elsewhere is read from Redis.
- ``control`` connections submit, cancel and inspect runs, and let the worker pool claim queued runs.

The relay keeps no state of its own beyond Redis, so any number of relay processes can serve one Redis
and a relay can be killed at any moment:

- publishes are stored exactly once per producer (``Store.append_once``: a Lua script numbers each
  producer's entries), so a peer re-sending after a reconnect never duplicates anything;
- deliveries are read from Redis after the cursor the peer names, so nothing is skipped;
- worker leases are a sorted set every relay sweeps; the relay whose ``ZREM`` wins marks the run lost.

A malformed frame gets an ``error`` frame and the connection goes on; only a failed handshake closes
it. If Redis fails under a connection, the peer gets ``internal`` and the connection closes (the peer
reconnects and resends). One connection's failure never reaches another's handler (each runs in its
own task under ``websockets``' server nursery).
"""

from __future__ import annotations

import logging
import secrets
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from ssl import SSLContext
from typing import Any

import msgpack
import trio
from websockets.exceptions import ConnectionClosed
from websockets.trio.server import Server, ServerConnection, serve

from protocol_specs import wire
from protocol_specs.auth import (
    AuthThrottle,
    Principal,
    Refusal,
    Scope,
    check_token,
    may_control,
    may_open,
    may_see,
)
from protocol_specs.runs import (
    Attempt,
    IllegalTransition,
    RunEvent,
    RunRecord,
    RunSpec,
    RunState,
    retry_delay,
)
from protocol_specs.session import StatusEvent
from protocol_specs.snapshots import Manifest
from protocol_specs.wire import ErrorCode, Role, StreamName, WireError

from . import keys
from .auth import TokenStore
from .blobs import BlobError, BlobStore, MemoryBlobStore, Upload
from .fanout import Fanout
from .store import Cap, Diversion, Store, StoreError

__all__ = ["Relay", "RelayConfig", "serve_relay"]

log = logging.getLogger("tether.relay")

HANDSHAKE_TIMEOUT = 10.0
#: the shortest pause between two looks at the open connections' tokens
MIN_RECHECK = 0.2
#: transient entries one ``trim_received`` call deletes at most
TRIM_BATCH = 1000
SERVER_NAME = "tether-relay/1"

#: status events a worker may publish, and the run transition each one makes
_WORKER_STATUS: dict[str, RunEvent | None] = {
    StatusEvent.STARTED: RunEvent.START,
    StatusEvent.WAITING_FOR_IDE: None,
    StatusEvent.DEBUGGER_LIVE: None,
    StatusEvent.EXITED: None,  # EXIT_OK or EXIT_ERROR by exit code
    StatusEvent.START_FAILED: RunEvent.START_FAILED,
    StatusEvent.UNATTENDED_STOP: None,
    StatusEvent.BUFFER_FULL: None,
    StatusEvent.PAUSED: RunEvent.PAUSE,
    StatusEvent.RESUMED: RunEvent.RESUME,
}


def new_run_id() -> str:
    return f"{int(time.time()):x}{secrets.token_hex(3)}"


@dataclass(frozen=True)
class RelayConfig:
    """What an operator tunes; the defaults suit a relay on the open internet."""

    #: most entries / bytes one of a run's streams may hold before publishes are refused
    buffer_cap: Cap = field(default_factory=lambda: Cap(entries=100_000, bytes=256 * 1024 * 1024))
    #: a worker that does not renew its lease (heartbeats) for this long loses its run
    lease: float = 90.0
    #: how long a finished run's keys stay in Redis
    retention: float = 7 * 24 * 3600.0
    #: WebSocket pings: a peer that misses a pong for ``ping_timeout`` is disconnected
    ping_interval: float = 15.0
    ping_timeout: float = 15.0
    #: a run's logs stream keeps about this many output chunks (each at most 16 KiB), oldest dropped
    log_entries: int = 20_000
    #: connections one user may have open to one relay process at once
    max_connections: int = 64
    #: connections one worker token may have open at once
    max_worker_connections: int = 8
    #: runs one user may have queued or running at once
    max_active_runs: int = 1000
    #: failed authentications from one address: the first ``auth_free`` in a minute are refused
    #: after ``auth_delay`` s, each further one after twice as long as the last (up to 10 s)
    auth_free: int = 5
    auth_delay: float = 0.2
    #: entries kept in a run's audit stream
    audit_entries: int = 10_000
    #: an open connection's token is looked at again (revoked? expired?) after this many seconds
    recheck: float = 10.0

    @property
    def sweep_interval(self) -> float:
        return max(self.lease / 6, 0.05)


class Relay:
    """Connection handlers bound to one :class:`~relay.store.Store` and one blob store."""

    def __init__(
        self,
        store: Store,
        *,
        blobs: BlobStore | None = None,
        config: RelayConfig | None = None,
        clock: Callable[[], float] = time.time,
    ) -> None:
        self.store = store
        self.blobs: BlobStore = blobs if blobs is not None else MemoryBlobStore()
        self.config = config or RelayConfig()
        self.clock = clock
        #: where background work (webhooks) runs; set by :func:`serve_relay`
        self.background: trio.Nursery | None = None
        self._groups: set[str] = set()
        self.tokens = TokenStore(store, clock=clock)
        self.throttle = AuthThrottle(free=self.config.auth_free, base=self.config.auth_delay)
        #: open connections per user (or per worker token) on this relay process
        self.connections: dict[str, int] = {}
        #: the delivering connections of this process, woken by appends (see ``relay/fanout.py``)
        self.fanout = Fanout(store)
        #: open connections by the token they presented (looked at again by ``recheck_forever``)
        self.holders: dict[str, set[ServerConnection]] = {}

    # --- records ----------------------------------------------------------------------------------

    async def load(self, run_id: str) -> RunRecord | None:
        fields = await self.store.hgetall(keys.record(run_id))
        raw = fields.get("record")
        return RunRecord.model_validate_json(raw) if raw else None

    async def save(self, record: RunRecord) -> None:
        await self.store.hset(keys.record(record.id), {"record": record.model_dump_json()})

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

    async def transition(self, run_id: str, event: RunEvent, **changes: Any) -> RunRecord | None:
        """Apply ``event`` to the run's record; ``None`` (and a log line) if it isn't legal now.

        Keeps the current attempt's times and outcome; when the run (or the attempt) ends, drops
        its lease and acknowledges its queue entry; a finished run's keys get their retention.
        """
        record = await self.load(run_id)
        if record is None:
            return None
        now = self.clock()
        try:
            updated = record.apply(event, at=now, **changes)
        except IllegalTransition as exc:
            log.info("run %s: %s", run_id, exc)
            return None
        if event is RunEvent.CLAIM:
            updated = updated.with_attempt(claimed_at=now, worker=updated.worker)
        elif event is RunEvent.START:
            updated = updated.with_attempt(started_at=now)
        elif updated.finished:
            updated = updated.with_attempt(
                ended_at=now,
                outcome=updated.state.value,
                exit_code=updated.exit_code,
                detail=updated.detail,
            )
        if updated.state is not RunState.PAUSED:
            updated = updated.model_copy(update={"paused_at": ""})
        await self.save(updated)
        if updated.finished or event is RunEvent.RETRY:
            await self.store.zrem(keys.LEASES, run_id)
            if record.queue_entry:
                await self.store.ack(
                    keys.queue(record.spec.backend), keys.POOL_GROUP, record.queue_entry
                )
        if updated.finished:
            await self.store.zrem(keys.user_active(updated.owner), run_id)
            await self.log_marker(
                run_id,
                wire.encode_entry(
                    wire.StatusEntry(
                        event=StatusEvent.FINISHED,
                        state=updated.state.value,
                        at=now,
                        exit_code=updated.exit_code,
                        detail=updated.detail,
                        data={"attempt": updated.attempt},
                    )
                ),
            )
            for key in keys.run_keys(run_id):
                await self.store.expire(key, self.config.retention)
        return updated

    async def attempt_ended(
        self, run_id: str, event: RunEvent, *, exit_code: int | None = None, detail: str = ""
    ) -> RunRecord | None:
        """The current attempt failed (``exit_error``) or was lost (``lease_expired``,
        ``job_lost``): retry it if the spec allows another attempt, else end the run."""
        record = await self.load(run_id)
        if record is None or record.finished:
            return None
        if record.state is RunState.QUEUED and event is not RunEvent.JOB_LOST:
            return None  # nothing of this run is running: news about an earlier attempt
        delay = retry_delay(record.attempt, record.spec.max_retries, record.spec.retry_backoff)
        if delay is None:
            return await self.transition(run_id, event, exit_code=exit_code, detail=detail)
        now = self.clock()
        outcome = "failed" if event is RunEvent.EXIT_ERROR else "lost"
        ended = record.with_attempt(
            ended_at=now, outcome=outcome, exit_code=exit_code, detail=detail
        )
        attempts = [*ended.attempts, Attempt(n=record.attempt + 1, queued_at=now)]
        await self.save(ended.model_copy(update={"attempts": attempts}))
        updated = await self.transition(
            run_id,
            RunEvent.RETRY,
            attempt=record.attempt + 1,
            worker="",
            exit_code=None,
            queue_entry="",
            not_before=now + delay,
            detail=detail,
        )
        if updated is None:
            return None
        what = f"exited with code {exit_code}" if outcome == "failed" else f"was lost: {detail}"
        text = (
            f"attempt {record.attempt} {what}; attempt {updated.attempt} of "
            f"{record.spec.max_retries + 1} starts in {delay:g} s"
        )
        log.info("run %s: %s", run_id, text)
        # the previous attempt's worker, should it come back, stops its program
        control = wire.ControlEntry(action="terminate", detail=text, attempt=record.attempt)
        await self.store.append(
            keys.stream(run_id, StreamName.TO_WORKER), wire.encode_entry(control)
        )
        await self.append_status(
            run_id,
            StatusEvent.RETRYING,
            updated,
            logs=True,
            detail=text,
            exit_code=exit_code,
            data={"previous": record.attempt, "delay": delay, "outcome": outcome},
        )
        await self.store.zadd(keys.DELAYED, run_id, now + delay)
        if delay == 0:
            await self.requeue_due()
        return updated

    async def enqueue(self, record: RunRecord) -> None:
        await self.store.append(keys.queue(record.spec.backend), record.id.encode())

    async def _ensure_group(self, backend: str) -> None:
        if backend not in self._groups:
            await self.store.ensure_group(keys.queue(backend), keys.POOL_GROUP)
            self._groups.add(backend)

    async def submit(
        self, spec: RunSpec, manifest: Manifest, *, owner: str, rerun_of: str = ""
    ) -> RunRecord | wire.Error:
        cap = self.config.max_active_runs
        active = await self.store.zrange_by_score(keys.user_active(owner), float("inf"), cap)
        if len(active) >= cap:
            return wire.Error(
                code=ErrorCode.TOO_MANY_RUNS,
                message=f"{owner} has {len(active)} runs queued or running, the most this relay "
                "allows; wait for some to finish or cancel some",
            )
        missing = await self.blobs.missing(manifest.digests)
        if missing:
            return wire.Error(
                code=ErrorCode.MISSING_BLOBS,
                message=f"the relay lacks {len(missing)} of the snapshot's blobs "
                f"(first: {missing[0][:12]}); upload them before submitting",
            )
        now = self.clock()
        record = RunRecord(
            id=new_run_id(),
            spec=spec,
            created_at=now,
            updated_at=now,
            snapshot=manifest.id,
            files=len(manifest.entries),
            size=manifest.total_bytes,
            attempts=[Attempt(n=1, queued_at=now)],
            rerun_of=rerun_of,
            owner=owner,
        )
        await self.store.set_bytes(keys.manifest(record.id), manifest.model_dump_json().encode())
        await self.save(record)
        await self.store.zadd(keys.RUNS, record.id, now)
        await self.store.zadd(keys.user_runs(owner), record.id, now)
        await self.store.zadd(keys.user_active(owner), record.id, now)
        await self.append_status(
            record.id,
            StatusEvent.QUEUED,
            record,
            logs=True,
            detail=f"queued on {spec.backend}: waiting for a worker",
        )
        await self._ensure_group(spec.backend)
        await self.enqueue(record)
        return record

    async def manifest_of(self, run_id: str) -> Manifest:
        raw = await self.store.get_bytes(keys.manifest(run_id))
        return Manifest.model_validate_json(raw) if raw else Manifest()

    async def rerun(self, run_id: str, owner: str) -> RunRecord | wire.Error:
        record = await self.load(run_id)
        if record is None:
            return wire.Error(code=ErrorCode.NO_SUCH_RUN, message=f"no run {run_id!r}")
        return await self.submit(
            record.spec, await self.manifest_of(run_id), owner=owner, rerun_of=run_id
        )

    async def list_runs(self, limit: int, user: str = "") -> list[RunRecord]:
        """The newest runs (``user``: that user's only)."""
        runs = []
        key = keys.user_runs(user) if user else keys.RUNS
        for run_id in await self.store.zrange_desc(key, limit):
            record = await self.load(run_id)
            if record is not None:
                runs.append(record)
        return runs

    async def cancel(self, run_id: str, detail: str) -> RunRecord | None:
        record = await self.transition(run_id, RunEvent.CANCEL, detail=detail)
        if record is None:
            return await self.load(run_id)
        await self.store.zrem(keys.DELAYED, run_id)
        await self.append_status(run_id, StatusEvent.CANCELLED, record, detail=detail)
        control = wire.ControlEntry(action="terminate", detail=detail, attempt=record.attempt)
        await self.store.append(
            keys.stream(run_id, StreamName.TO_WORKER), wire.encode_entry(control)
        )
        return record

    async def next_queued(self, backend: str, consumer: str) -> tuple[str, str]:
        """Block until ``backend``'s queue has an entry; ``(entry id, run id)``."""
        await self._ensure_group(backend)
        async with self.store.blocking_reader() as reader:
            while True:
                got = await reader.read_group(
                    keys.queue(backend), keys.POOL_GROUP, consumer, block_ms=1000
                )
                if got is not None:
                    return got[0], got[1].decode()

    async def claim(self, worker: str, backend: str = "local") -> tuple[RunRecord, Manifest]:
        """Block until a queued run of ``backend`` can be taken by ``worker``; mark it claimed."""
        while True:
            entry_id, run_id = await self.next_queued(backend, worker)
            claimed = await self._claimed(run_id, worker, entry_id)
            if claimed is None:  # cancelled while queued, or unknown: nothing to run
                await self.store.ack(keys.queue(backend), keys.POOL_GROUP, entry_id)
                continue
            return claimed, await self.manifest_of(run_id)

    async def claim_run(
        self, worker: str, run_id: str, attempt: int
    ) -> tuple[RunRecord, Manifest] | wire.Error:
        """Take ``run_id`` for its attempt ``attempt`` (a worker its scheduler job started)."""
        record = await self.load(run_id)
        if record is None:
            return wire.Error(code=ErrorCode.NO_SUCH_RUN, message=f"no run {run_id!r}")
        if record.finished:
            return wire.Error(
                code=ErrorCode.RUN_FINISHED, message=f"run {run_id} is {record.state.value}"
            )
        if record.attempt != attempt or record.state is not RunState.QUEUED:
            return wire.Error(
                code=ErrorCode.STALE_ATTEMPT,
                message=f"run {run_id} is at attempt {record.attempt} ({record.state.value}); "
                f"attempt {attempt} is not to be started",
            )
        claimed = await self._claimed(run_id, worker, "")
        if claimed is None:
            return wire.Error(code=ErrorCode.STALE_ATTEMPT, message=f"run {run_id} was taken")
        return claimed, await self.manifest_of(run_id)

    async def dispatch(self, backend: str, dispatcher: str) -> RunRecord:
        """Block until a run is queued for ``backend``; hand it to that backend's dispatcher."""
        while True:
            entry_id, run_id = await self.next_queued(backend, dispatcher)
            await self.store.ack(keys.queue(backend), keys.POOL_GROUP, entry_id)
            record = await self.load(run_id)
            if record is not None and record.state is RunState.QUEUED:
                return record

    async def _claimed(self, run_id: str, worker: str, entry_id: str) -> RunRecord | None:
        record = await self.transition(run_id, RunEvent.CLAIM, worker=worker, queue_entry=entry_id)
        if record is None:
            return None
        await self.store.zadd(keys.LEASES, run_id, self.clock() + self.config.lease)
        await self.append_status(run_id, StatusEvent.CLAIMED, record, detail=worker)
        return record

    async def report(self, frame: wire.Report) -> RunRecord | wire.Error:
        """A scheduler backend's news about an attempt it launched (see :class:`wire.Report`)."""
        record = await self.load(frame.run)
        if record is None:
            return wire.Error(code=ErrorCode.NO_SUCH_RUN, message=f"no run {frame.run!r}")
        if record.attempt != frame.attempt or record.finished:
            return record  # news about an attempt that is over: nothing to do
        if frame.event == "job":
            record = record.with_attempt(job=frame.job)
            await self.save(record)
            await self.append_status(
                record.id,
                StatusEvent.QUEUED,
                record,
                logs=True,
                detail=f"{frame.detail}; pending in the scheduler's queue",
                data={"job": frame.job},
            )
            return record
        await self.store.zrem(keys.LEASES, record.id)
        detail = frame.detail or f"scheduler job {frame.job} ended without the worker"
        updated = await self.attempt_ended(record.id, RunEvent.JOB_LOST, detail=detail)
        if updated is not None and updated.finished:
            await self.append_status(record.id, StatusEvent.WORKER_LOST, updated, detail=detail)
        return updated or record

    async def renew_lease(self, run_id: str) -> bool:
        """Push the worker's lease on ``run_id`` forward; False if it already expired."""
        return await self.store.zadd(
            keys.LEASES, run_id, self.clock() + self.config.lease, only_existing=True
        )

    async def sweep(self) -> list[str]:
        """Handle the runs whose worker lease expired (retried, or marked lost); queue retried runs
        that are due. Returns the ids of the runs whose lease expired.

        Every relay sweeps; the one whose ``ZREM`` removes a lease (or a delayed run) handles it.
        """
        lost = []
        now = self.clock()
        for run_id in await self.store.zrange_by_score(keys.LEASES, now, 100):
            if not await self.store.zrem(keys.LEASES, run_id):
                continue  # another relay took it
            detail = (
                f"the worker stopped renewing its lease for over {self.config.lease:g} s "
                "(its host is down, or it has been cut off from the relay)"
            )
            before = await self.load(run_id)
            record = await self.attempt_ended(run_id, RunEvent.LEASE_EXPIRED, detail=detail)
            if record is None or before is None:
                continue
            log.warning("run %s: worker %s lost: lease expired", run_id, before.worker)
            if record.finished:
                await self.append_status(run_id, StatusEvent.WORKER_LOST, record, detail=detail)
                control = wire.ControlEntry(
                    action="terminate", detail="the run was marked lost", attempt=before.attempt
                )
                await self.store.append(
                    keys.stream(run_id, StreamName.TO_WORKER), wire.encode_entry(control)
                )
            lost.append(run_id)
        await self.requeue_due()
        return lost

    async def requeue_due(self) -> None:
        """Queue the retried runs whose backoff is over."""
        for run_id in await self.store.zrange_by_score(keys.DELAYED, self.clock(), 100):
            if not await self.store.zrem(keys.DELAYED, run_id):
                continue
            record = await self.load(run_id)
            if record is not None and record.state is RunState.QUEUED:
                await self._ensure_group(record.spec.backend)
                await self.enqueue(record)

    async def _webhook(self, record: RunRecord, entry: wire.StatusEntry) -> None:
        from .webhook import WebhookError, post_json

        payload = {
            "event": entry.event,
            "run": record.id,
            "name": record.spec.name,
            "command": record.spec.command,
            "detail": entry.detail,
            "data": entry.data,
            "at": entry.at,
        }
        try:
            status = await post_json(record.spec.webhook, payload)
        except WebhookError as exc:
            log.warning("run %s: webhook failed: %s", record.id, exc)
            return
        if not 200 <= status < 300:
            log.warning("run %s: webhook answered HTTP %d", record.id, status)

    async def sweep_forever(self) -> None:
        while True:
            try:
                await self.sweep()
            except StoreError as exc:
                log.warning("lease sweep failed: %s", exc)
            await trio.sleep(self.config.sweep_interval)

    async def worker_status(self, run_id: str, entry: wire.StatusEntry) -> None:
        """Move the run record along with a status the worker published."""
        if entry.event == StatusEvent.UNATTENDED_STOP:
            record = await self.load(run_id)
            if record is not None and record.spec.webhook and self.background is not None:
                self.background.start_soon(self._webhook, record, entry)
            return
        if entry.event == StatusEvent.EXITED:
            if entry.exit_code != 0:
                await self.attempt_ended(
                    run_id, RunEvent.EXIT_ERROR, exit_code=entry.exit_code, detail=entry.detail
                )
                return
            event = RunEvent.EXIT_OK
        elif entry.event == StatusEvent.PAUSED:
            where = str(entry.data.get("where") or entry.detail)
            await self.transition(run_id, RunEvent.PAUSE, paused_at=where[:300])
            return
        else:
            maybe = _WORKER_STATUS.get(entry.event)
            if maybe is None:
                return
            event = maybe
        record = await self.transition(
            run_id, event, exit_code=entry.exit_code, detail=entry.detail
        )
        if record is not None and event is RunEvent.START:
            text = f"attempt {record.attempt} started on {record.worker}"
            marker = wire.StatusEntry(
                event=StatusEvent.STARTED,
                state=record.state.value,
                at=self.clock(),
                detail=text,
                data={"attempt": record.attempt, "worker": record.worker},
            )
            await self.log_marker(run_id, wire.encode_entry(marker))

    # --- connections ------------------------------------------------------------------------------

    async def audit(
        self,
        run_id: str,
        event: str,
        who: Principal | None,
        ws: ServerConnection | None = None,
        *,
        role: str = "",
        client: str = "",
        detail: str = "",
    ) -> None:
        """One entry in the run's audit trail (``tether audit RUN``)."""
        entry = wire.AuditEntry(
            at=self.clock(),
            event=event,
            user=who.user if who else "",
            token=who.token if who else "",
            role=role,
            source=_source(ws) if ws is not None else "",
            client=client[:200],
            detail=detail[:500],
        )
        payload = msgpack.packb(entry.model_dump(), use_bin_type=True)
        await self.store.append(keys.audit(run_id), payload, maxlen=self.config.audit_entries)

    async def audit_log(self, run_id: str) -> list[wire.AuditEntry]:
        entries: list[wire.AuditEntry] = []
        cursor = "0"
        while batch := await self.store.read_after(keys.audit(run_id), cursor, count=1000):
            for cursor, payload in batch:  # noqa: B007 (the last id is the next cursor)
                entries.append(wire.AuditEntry.model_validate(msgpack.unpackb(payload)))
        return entries

    async def handle(self, ws: ServerConnection) -> None:
        try:
            hello = await self._handshake(ws)
            if hello is None:
                return
            who = await self._authenticate(ws, hello)
            if who is None:
                return
            slot = who.user if who.kind == "user" else f"worker:{who.token}"
            cap = (
                self.config.max_connections
                if who.kind == "user"
                else self.config.max_worker_connections
            )
            if self.connections.get(slot, 0) >= cap:
                await self._fatal(
                    ws,
                    ErrorCode.TOO_MANY_CONNECTIONS,
                    f"{who} has {cap} connections open to this relay already, the most it "
                    "allows; close some (another tether process?)",
                )
                return
            self.connections[slot] = self.connections.get(slot, 0) + 1
            token = hello.token or ""
            self.holders.setdefault(token, set()).add(ws)
            try:
                ws.protocol.max_message_size = _MAX_MESSAGE[hello.role]
                if hello.role is Role.CONTROL:
                    welcome = wire.Welcome(server=SERVER_NAME, user=who.user)
                    await ws.send(wire.encode_frame(welcome))
                    await self._serve_control(ws, who, hello.token or "")
                elif hello.role is Role.LOGS:
                    await self._serve_logs(ws, hello, who)
                else:
                    await self._serve_run(ws, hello, who)
            finally:
                self.connections[slot] -= 1
                if not self.connections[slot]:
                    del self.connections[slot]
                holding = self.holders[token]
                holding.discard(ws)
                if not holding:
                    del self.holders[token]
        except* ConnectionClosed:
            pass  # the peer went away; its stream entries stay in Redis
        except* StoreError as group:
            # Redis is down or restarting: the peer reconnects, resends and resumes
            log.warning("closing connection from %s: %s", ws.remote_address, group.exceptions[0])
            with trio.move_on_after(1):
                try:
                    await self._fatal(ws, ErrorCode.INTERNAL, "the relay lost its store; reconnect")
                except ConnectionClosed:
                    pass

    async def _handshake(self, ws: ServerConnection) -> wire.Hello | None:
        with trio.move_on_after(HANDSHAKE_TIMEOUT):
            data = await ws.recv()
            try:
                frame = wire.decode_frame(data)
            except WireError as exc:
                await self._fatal(ws, exc.code, exc.message)
                return None
            if not isinstance(frame, wire.Hello):
                await self._fatal(
                    ws, ErrorCode.HANDSHAKE_REQUIRED, "the first frame must be 'hello'"
                )
                return None
            if frame.v != wire.PROTOCOL_VERSION:
                await self._fatal(
                    ws,
                    ErrorCode.UNSUPPORTED_VERSION,
                    f"protocol version {frame.v} is not supported; this relay speaks "
                    f"{wire.PROTOCOL_VERSION}",
                )
                return None
            return frame
        await self._fatal(
            ws, ErrorCode.HANDSHAKE_REQUIRED, "no 'hello' frame within the handshake timeout"
        )
        return None

    async def _authenticate(self, ws: ServerConnection, hello: wire.Hello) -> Principal | None:
        """The token's holder, or ``None`` after refusing the connection (slowly: see
        :class:`~protocol_specs.auth.AuthThrottle`). The token itself is never logged."""
        got = check_token(hello.token, await self.tokens.lookup(hello.token), self.clock())
        if isinstance(got, Principal):
            return got
        source = _source(ws).rpartition(":")[0]
        delay, count = self.throttle.failed(source, trio.current_time())
        code, message = ErrorCode(got.code), got.message
        if self.throttle.throttled(count):
            code = ErrorCode.TOO_MANY_FAILURES
            message = (
                f"{message}; {count} failed authentications from {source} in the last minute, "
                f"so each refusal now waits {delay:g} s"
            )
        await trio.sleep(delay)
        if hello.run and await self.load(hello.run) is not None:
            await self.audit(
                hello.run, "refused", None, ws, role=hello.role.value, detail=got.message
            )
        await self._fatal(ws, code, message)
        return None

    async def recheck_forever(self) -> None:
        """Every ``config.recheck`` seconds, look again at each token an open connection presented
        (once per token, however many connections hold it) and close the connections of one that
        was revoked or expired meanwhile. Idle connections send nothing that could trigger it."""
        while True:
            await trio.sleep(max(self.config.recheck, MIN_RECHECK))
            for token, holding in list(self.holders.items()):
                try:
                    got = check_token(token, await self.tokens.lookup(token), self.clock())
                except StoreError as exc:
                    log.warning("cannot look at open connections' tokens again: %s", exc)
                    break
                if isinstance(got, Principal):
                    continue
                async with trio.open_nursery() as closing:
                    for ws in list(holding):
                        closing.start_soon(self._close_refused, ws, got)

    async def _close_refused(self, ws: ServerConnection, refusal: Refusal) -> None:
        with trio.move_on_after(HANDSHAKE_TIMEOUT):
            try:
                await self._fatal(ws, ErrorCode(refusal.code), refusal.message)
            except ConnectionClosed:
                pass

    async def _still_good(self, ws: ServerConnection, token: str, check: _Recheck) -> bool:
        """Whether a connection's token is still good (looked at every ``config.recheck`` s);
        if it was revoked or expired meanwhile, the connection is closed."""
        now = trio.current_time()
        if now - check.at < self.config.recheck:
            return True
        check.at = now
        got = check_token(token, await self.tokens.lookup(token), self.clock())
        if isinstance(got, Principal):
            return True
        await self._fatal(ws, ErrorCode(got.code), got.message)
        return False

    async def _refuse(
        self,
        ws: ServerConnection,
        hello: wire.Hello,
        who: Principal,
        refusal: Refusal,
        run: RunRecord | None,
    ) -> None:
        if run is not None:
            await self.audit(
                run.id, "refused", who, ws, role=hello.role.value, detail=refusal.message
            )
        await self._fatal(ws, ErrorCode(refusal.code), refusal.message)

    async def _fatal(self, ws: ServerConnection, code: ErrorCode, message: str) -> None:
        log.info("closing connection from %s: %s: %s", ws.remote_address, code.value, message)
        await ws.send(wire.encode_frame(wire.Error(code=code, message=message, fatal=True)))
        await ws.aclose(1008, message[:120])

    async def _send_error(
        self, ws: ServerConnection, code: ErrorCode, message: str, **ref: Any
    ) -> None:
        log.info("error to %s: %s: %s", ws.remote_address, code.value, message)
        await ws.send(wire.encode_frame(wire.Error(code=code, message=message, **ref)))

    async def _serve_run(self, ws: ServerConnection, hello: wire.Hello, who: Principal) -> None:
        if not hello.run:
            await self._fatal(ws, ErrorCode.BAD_FRAME, f"role {hello.role.value!r} needs a run id")
            return
        record = await self.load(hello.run)
        refusal = may_open(who, hello.role.value, record, hello.attempt)
        if refusal is not None or record is None:
            refusal = refusal or Refusal(ErrorCode.NO_SUCH_RUN, f"no run {hello.run!r}")
            await self._refuse(ws, hello, who, refusal, record)
            return
        run_id = record.id
        await self.audit(
            run_id,
            "connect",
            who,
            ws,
            role=hello.role.value,
            client=hello.client,
            detail=f"attempt {who.attempt}" if who.kind == "worker" else "",
        )
        if hello.role is Role.IDE:
            outbound, inbound = StreamName.TO_WORKER, StreamName.TO_IDE
        else:
            outbound, inbound = StreamName.TO_IDE, StreamName.TO_WORKER
        tails = {
            name.value: (await self.store.last_id(keys.stream(run_id, name))) or "0"
            for name in (StreamName.TO_WORKER, StreamName.TO_IDE)
        }
        if hello.role is Role.WORKER and not record.finished:
            await self.renew_lease(run_id)
        welcome = wire.Welcome(
            server=SERVER_NAME,
            run=record if hello.role is Role.WORKER else record.redacted(),
            tails=tails,
            # only a worker's heartbeats mean something (its lease); an idle IDE link sends none
            heartbeat=self.config.lease / 3 if hello.role is Role.WORKER else 0,
            user=who.user,
        )
        await ws.send(wire.encode_frame(welcome))
        conn = _RunConnection(
            ws,
            run_id,
            hello.role,
            outbound,
            inbound,
            hello.producer or secrets.token_hex(8),
            attempt=who.attempt,
            who=who,
            source=ws,
        )
        try:
            async with trio.open_nursery() as nursery:
                if hello.role is Role.IDE and hello.history:
                    await self._deliver_history(
                        ws, run_id, StreamName.TO_WORKER, hello.history_cursor
                    )
                nursery.start_soon(self._deliver, ws, run_id, inbound, hello.cursor)
                await self._receive(conn)
                nursery.cancel_scope.cancel()
        finally:
            if conn.presence is not None and conn.presence.attached:
                # the adapter's relay link is gone, and with it its IDE, as far as anyone can tell
                gone = conn.presence.model_copy(update={"attached": False})
                with trio.CancelScope(shield=True), trio.move_on_after(5):
                    try:
                        await self.store.append(
                            keys.stream(run_id, StreamName.TO_WORKER), wire.encode_entry(gone)
                        )
                    except StoreError as exc:
                        log.warning("run %s: cannot record an IDE leaving: %s", run_id, exc)

    async def _deliver_history(
        self, ws: ServerConnection, run_id: str, name: StreamName, after: str
    ) -> None:
        key = keys.stream(run_id, name)
        cursor = after
        while batch := await self.store.read_after(key, cursor, count=500):
            for entry_id, payload in batch:
                await ws.send(
                    wire.encode_frame(wire.Deliver(stream=name, cursor=entry_id, entry=payload))
                )
                cursor = entry_id

    async def _deliver(
        self, ws: ServerConnection, run_id: str, name: StreamName, cursor: str
    ) -> None:
        async with self.fanout.subscribe(keys.stream(run_id, name), cursor) as subscription:
            while True:
                for entry_id, payload in await subscription.next_batch(200):
                    frame = wire.Deliver(stream=name, cursor=entry_id, entry=payload)
                    await ws.send(wire.encode_frame(frame))

    async def _receive(self, conn: _RunConnection) -> None:
        ws = conn.ws
        while True:
            data = await ws.recv()
            try:
                frame = wire.decode_frame(data)
            except WireError as exc:
                await self._send_error(ws, exc.code, exc.message)
                continue
            if isinstance(frame, wire.Publish):
                if not await self._publish(conn, frame):
                    return
            elif isinstance(frame, wire.Received):
                if frame.stream is conn.inbound:
                    key = keys.stream(conn.run_id, conn.inbound)
                    while (
                        await self.store.trim_received(key, frame.cursor, limit=TRIM_BATCH)
                        >= TRIM_BATCH
                    ):
                        pass
            elif isinstance(frame, wire.Heartbeat):
                if conn.role is not Role.WORKER:
                    continue  # tokens are looked at again by recheck_forever
                if conn.attempt and not await self._current(conn):
                    return
                if not await self.renew_lease(conn.run_id):
                    record = await self.load(conn.run_id)
                    if record is not None and not record.finished:
                        continue  # a run without a lease yet (claimed before leases existed)
                    await self._fatal(
                        ws, ErrorCode.LEASE_LOST, f"run {conn.run_id} is no longer yours"
                    )
                    return
            else:
                await self._send_error(
                    ws,
                    ErrorCode.NOT_ALLOWED,
                    f"{frame.t!r} frames are not valid on a run connection",
                )

    async def _current(self, conn: _RunConnection) -> bool:
        """Whether a worker connection's attempt is still the run's; if not, close it."""
        record = await self.load(conn.run_id)
        if record is not None and record.attempt == conn.attempt:
            return True
        now = record.attempt if record else "?"
        await self._fatal(
            conn.ws,
            ErrorCode.STALE_ATTEMPT,
            f"run {conn.run_id} is at attempt {now}; attempt {conn.attempt} is over",
        )
        return False

    async def _publish(self, conn: _RunConnection, frame: wire.Publish) -> bool:
        """Store one published entry exactly once; False if the connection must close."""
        ws = conn.ws
        try:
            entry = wire.decode_entry(frame.entry)
        except WireError as exc:
            await self._send_error(ws, exc.code, exc.message, n=frame.n)
            return await self._skip(conn, frame.n)
        problem = _entry_not_allowed(conn.role, entry)
        if problem:
            await self._send_error(ws, ErrorCode.NOT_ALLOWED, problem, n=frame.n)
            return await self._skip(conn, frame.n)
        if isinstance(entry, wire.StatusEntry) and conn.attempt and not await self._current(conn):
            return False
        # status and presence entries are small and rare: never refused for a full buffer
        cap = self.config.buffer_cap if isinstance(entry, wire.DapEntry) else Cap()
        transient = isinstance(entry, wire.DapEntry) and entry.transient
        divert = None
        if isinstance(entry, wire.LogEntry):
            divert = Diversion(
                keys.stream(conn.run_id, StreamName.LOGS), maxlen=self.config.log_entries
            )
        key = keys.stream(conn.run_id, conn.outbound)
        stored_in = divert.stream if divert else key
        try:
            got = await self.store.append_once(
                key,
                conn.producer,
                frame.n,
                frame.entry,
                transient=transient,
                cap=cap,
                divert=divert,
                notify_except=self.fanout.id,
            )
        except BaseException:
            self.fanout.lost(stored_in)  # stored or not, nobody else will say
            raise
        if got.outcome == "stored":
            self.fanout.appended(stored_in, got.prev, got.cursor, frame.entry)
        if got.outcome == "gap":
            await self._fatal(
                ws,
                ErrorCode.OUT_OF_ORDER,
                f"publish {frame.n} skips ahead of {got.last + 1}; resend from there",
            )
            return False
        if got.outcome == "full":
            await self._send_error(
                ws,
                ErrorCode.BUFFER_FULL,
                f"run {conn.run_id}: {conn.outbound.value} holds {got.size} entries "
                f"(cap {cap.entries}) or its {cap.bytes} bytes are used up; nobody has read them",
                n=frame.n,
            )
            return True
        if got.outcome == "stored":
            if isinstance(entry, wire.StatusEntry):
                await self.worker_status(conn.run_id, entry)
            elif isinstance(entry, wire.PresenceEntry):
                if conn.presence is None or conn.presence.attached != entry.attached:
                    event = "attach" if entry.attached else "detach"
                    await self.audit(conn.run_id, event, conn.who, conn.source, role="ide")
                conn.presence = entry
        await ws.send(
            wire.encode_frame(
                wire.Ack(n=frame.n, cursor=got.cursor, duplicate=got.outcome == "duplicate")
            )
        )
        return True

    async def _skip(self, conn: _RunConnection, n: int) -> bool:
        """Count a refused publish as answered, so the producer's numbering has no gap."""
        key = keys.stream(conn.run_id, conn.outbound)
        await self.store.append_once(key, conn.producer, n, None)
        return True

    async def _serve_logs(self, ws: ServerConnection, hello: wire.Hello, who: Principal) -> None:
        """Deliver a run's logs stream from the cursor on, live, until the peer goes."""
        record = await self.load(hello.run or "")
        refusal = may_open(who, Role.LOGS.value, record)
        if refusal is not None or record is None:
            refusal = refusal or Refusal(ErrorCode.NO_SUCH_RUN, f"no run {hello.run!r}")
            await self._refuse(ws, hello, who, refusal, record)
            return
        if hello.cursor == "0":  # a reader starting over; not every reconnect of a follower
            await self.audit(record.id, "logs", who, ws, role="logs", client=hello.client)
        tail = await self.store.last_id(keys.stream(record.id, StreamName.LOGS)) or "0"
        welcome = wire.Welcome(
            server=SERVER_NAME,
            run=record.redacted(),
            tails={StreamName.LOGS.value: tail},
            user=who.user,
        )
        await ws.send(wire.encode_frame(welcome))
        async with trio.open_nursery() as nursery:
            nursery.start_soon(self._deliver, ws, record.id, StreamName.LOGS, hello.cursor)
            while True:  # a logs connection publishes nothing; it may only say it is alive
                data = await ws.recv()
                try:
                    frame = wire.decode_frame(data)
                except WireError as exc:
                    await self._send_error(ws, exc.code, exc.message)
                    continue
                if not isinstance(frame, wire.Heartbeat | wire.Received):
                    await self._send_error(
                        ws, ErrorCode.NOT_ALLOWED, f"{frame.t!r} frames are not valid on logs"
                    )

    async def _serve_control(self, ws: ServerConnection, who: Principal, token: str) -> None:
        conn = _ControlConnection(ws, who, token)
        try:
            while True:
                data = await ws.recv()
                if not await self._still_good(ws, token, conn.check):
                    return
                try:
                    frame = wire.decode_frame(data)
                except WireError as exc:
                    await self._send_error(ws, exc.code, exc.message, rid=_rid_of(data))
                    continue
                reply = await self._control(frame, conn)
                if isinstance(reply, wire.Error):
                    log.info("error to %s: %s: %s", _source(ws), reply.code.value, reply.message)
                await ws.send(wire.encode_frame(reply))
        finally:
            for upload in conn.uploads.values():
                with trio.CancelScope(shield=True):
                    await upload.abort()

    async def _visible(self, who: Principal, run_id: str) -> RunRecord | wire.Error:
        """``run_id``'s record if ``who`` may see it; a user cannot tell another's run from none."""
        record = await self.load(run_id)
        if record is None or not may_see(who, record):
            return wire.Error(
                code=ErrorCode.NO_SUCH_RUN, message=f"no run {run_id!r} (or not yours)"
            )
        return record

    async def _control(self, frame: wire.AnyFrame, conn: _ControlConnection) -> wire.AnyFrame:
        """The reply to one control frame."""
        rid = getattr(frame, "rid", None)
        assert rid is None or isinstance(rid, int)
        who = conn.who

        def answer(got: RunRecord | wire.Error | None, missing: str = "") -> wire.AnyFrame:
            if isinstance(got, wire.Error):
                return got.model_copy(update={"rid": rid})
            if got is None:
                return wire.Error(code=ErrorCode.NO_SUCH_RUN, message=missing, rid=rid)
            return wire.RunInfo(rid=rid or 0, run=got.redacted())

        refusal = may_control(who, frame.t)
        if refusal is not None:
            return wire.Error(code=ErrorCode(refusal.code), message=refusal.message, rid=rid)
        match frame:
            case wire.HaveBlobs():
                return wire.Missing(rid=frame.rid, digests=await self.blobs.missing(frame.digests))
            case wire.PutBlob():
                return await self._put_blob(frame, conn.uploads)
            case wire.GetBlob():
                if who.kind == "worker" and frame.digest not in await self._digests(conn):
                    return wire.Error(
                        code=ErrorCode.FORBIDDEN,
                        message=f"blob {frame.digest[:12]} is not in run {who.run}'s snapshot",
                        rid=rid,
                    )
                try:
                    size, chunk = await self.blobs.read(frame.digest, frame.offset, frame.length)
                except BlobError as exc:
                    return wire.Error(code=ErrorCode.NO_SUCH_BLOB, message=str(exc), rid=rid)
                return wire.BlobData(rid=frame.rid, size=size, offset=frame.offset, data=chunk)
            case wire.Submit():
                got = await self.submit(frame.spec, frame.manifest, owner=who.user)
                if isinstance(got, RunRecord):
                    await self.audit(got.id, "submit", who, conn.ws, role="control")
                return answer(got)
            case wire.Rerun():
                visible = await self._visible(who, frame.run)
                if isinstance(visible, wire.Error):
                    return answer(visible)
                got = await self.rerun(frame.run, who.user)
                if isinstance(got, RunRecord):
                    await self.audit(got.id, "submit", who, conn.ws, detail=f"rerun of {frame.run}")
                    await self.audit(frame.run, "rerun", who, conn.ws, detail=f"as {got.id}")
                return answer(got)
            case wire.Cancel():
                visible = await self._visible(who, frame.run)
                if isinstance(visible, wire.Error):
                    return answer(visible)
                await self.audit(frame.run, "cancel", who, conn.ws, detail=frame.detail)
                return answer(await self.cancel(frame.run, frame.detail), f"no run {frame.run!r}")
            case wire.GetRun():
                return answer(await self._visible(who, frame.run))
            case wire.GetAudit():
                visible = await self._visible(who, frame.run)
                if isinstance(visible, wire.Error):
                    return answer(visible)
                entries = await self.audit_log(frame.run)
                return wire.AuditLog(rid=frame.rid, run=frame.run, entries=entries)
            case wire.ListRuns():
                runs = await self.list_runs(frame.limit, "" if who.admin else who.user)
                return wire.RunList(rid=frame.rid, runs=[r.redacted() for r in runs])
            case wire.Report():
                return answer(await self.report(frame))
            case wire.Claim() if frame.run:
                if who.kind == "worker" and (who.run, who.attempt) != (frame.run, frame.attempt):
                    return wire.Error(
                        code=ErrorCode.FORBIDDEN,
                        message=f"this worker token is for run {who.run} attempt {who.attempt}",
                        rid=rid,
                    )
                taken = await self.claim_run(frame.worker, frame.run, frame.attempt)
                if isinstance(taken, wire.Error):
                    return answer(taken)
                return await self._assigned(frame.rid, who, conn, *taken)
            case wire.Claim():
                claimed, manifest = await self.claim(frame.worker, frame.backend)
                return await self._assigned(frame.rid, who, conn, claimed, manifest)
            case wire.Dispatch():
                handed = await self.dispatch(frame.backend, frame.dispatcher)
                return await self._assigned(frame.rid, who, conn, handed, Manifest())
            case wire.CreateToken():
                return await self._create_token(frame, who)
            case wire.ListTokens():
                user = frame.user if who.admin else who.user
                records = await self.tokens.list(user)
                return wire.TokenList(rid=frame.rid, tokens=[r.info() for r in records])
            case wire.RevokeToken():
                held = await self.tokens.get(frame.id)
                if held is None or held.kind != "user" or not (who.admin or held.user == who.user):
                    return wire.Error(
                        code=ErrorCode.NO_SUCH_TOKEN,
                        message=f"no token {frame.id!r} (or not yours)",
                        rid=rid,
                    )
                revoked = await self.tokens.revoke(frame.id)
                assert revoked is not None
                log.info("token %s of %s revoked by %s", frame.id, held.user, who)
                return wire.TokenList(rid=frame.rid, tokens=[revoked.info()])
        return wire.Error(
            code=ErrorCode.NOT_ALLOWED,
            message=f"{frame.t!r} frames are not valid on a control connection",
            rid=rid,
        )

    async def _digests(self, conn: _ControlConnection) -> frozenset[str]:
        """The blobs a worker token may read: its run's snapshot (looked up once)."""
        if conn.digests is None:
            conn.digests = frozenset((await self.manifest_of(conn.who.run)).digests)
        return conn.digests

    async def _assigned(
        self,
        rid: int,
        who: Principal,
        conn: _ControlConnection,
        record: RunRecord,
        manifest: Manifest,
    ) -> wire.Assigned:
        """A claimed or dispatched attempt, with a worker token for it (unless ``who`` is that
        attempt's worker already)."""
        token = ""
        if who.kind != "worker":
            ttl = self.config.retention + self.config.lease
            token = await self.tokens.mint_worker(record.owner, record.id, record.attempt, ttl)
        await self.audit(
            record.id,
            "claim",
            who,
            conn.ws,
            role="control",
            detail=f"attempt {record.attempt} to {record.worker or 'a scheduler job'}",
        )
        return wire.Assigned(rid=rid, run=record, manifest=manifest, token=token)

    async def _create_token(self, frame: wire.CreateToken, who: Principal) -> wire.AnyFrame:
        user = frame.user or who.user
        if not who.admin and (user != who.user or set(frame.scopes) - {Scope.RUNS}):
            return wire.Error(
                code=ErrorCode.FORBIDDEN,
                message="only an admin token may create tokens for other users or with the "
                "'admin' or 'backend' scope",
                rid=frame.rid,
            )
        token, record = await self.tokens.create(
            user,
            scopes=sorted(set(frame.scopes)),
            label=frame.label,
            expires_in=frame.expires_in,
            created_by=who.user,
        )
        log.info("token %s for %s created by %s", record.id, user, who)
        return wire.TokenCreated(rid=frame.rid, token=token, info=record.info())

    async def _put_blob(self, frame: wire.PutBlob, uploads: dict[str, Upload]) -> wire.AnyFrame:
        upload = uploads.get(frame.digest)
        try:
            if frame.offset == 0:
                if upload is not None:
                    await upload.abort()
                upload = uploads[frame.digest] = await self.blobs.begin(frame.digest, frame.size)
            elif upload is None or upload.received != frame.offset or upload.size != frame.size:
                expected = upload.received if upload else 0
                raise BlobError(
                    f"blob {frame.digest[:12]}: expected a piece at offset {expected}, "
                    f"got {frame.offset}; restart the upload from 0"
                )
            await upload.write(frame.data)
            if upload.received < upload.size:
                return wire.Stored(rid=frame.rid, received=upload.received)
            del uploads[frame.digest]
            await upload.commit()
            return wire.Stored(rid=frame.rid, received=upload.received, complete=True)
        except BlobError as exc:
            dropped = uploads.pop(frame.digest, None)
            if dropped is not None:
                await dropped.abort()
            return wire.Error(code=ErrorCode.BAD_BLOB, message=str(exc), rid=frame.rid)


@dataclass
class _Recheck:
    """When a connection's token was last checked (a revoked or expired token ends it)."""

    at: float = field(default_factory=trio.current_time)


@dataclass
class _ControlConnection:
    ws: ServerConnection
    who: Principal
    token: str = field(default="", repr=False)
    check: _Recheck = field(default_factory=_Recheck)
    uploads: dict[str, Upload] = field(default_factory=dict)
    #: worker tokens: the digests of their run's snapshot
    digests: frozenset[str] | None = None


@dataclass
class _RunConnection:
    ws: ServerConnection
    run_id: str
    role: Role
    outbound: StreamName
    inbound: StreamName
    producer: str
    #: worker connections: the attempt the worker runs (0: not said)
    attempt: int = 0
    who: Principal | None = None
    source: ServerConnection | None = None
    #: the last presence the adapter on this connection reported
    presence: wire.PresenceEntry | None = None


def _entry_not_allowed(role: Role, entry: wire.AnyEntry) -> str:
    if isinstance(entry, wire.DapEntry):
        return ""
    if role is Role.IDE and isinstance(entry, wire.PresenceEntry):
        return ""
    if role is Role.WORKER and isinstance(entry, wire.LogEntry):
        return ""
    if role is Role.WORKER and isinstance(entry, wire.StatusEntry):
        if entry.event in _WORKER_STATUS:
            return ""
        return f"workers may not publish status {entry.event!r}"
    return f"role {role.value!r} may not publish {entry.k!r} entries"


#: the largest message each role may send once it is authenticated (before: ``MAX_HELLO_BYTES``)
_MAX_MESSAGE = {
    Role.CONTROL: wire.MAX_FRAME_BYTES,
    Role.IDE: wire.MAX_RUN_FRAME_BYTES,
    Role.WORKER: wire.MAX_RUN_FRAME_BYTES,
    Role.LOGS: wire.MAX_HELLO_BYTES,
}


def _source(ws: ServerConnection) -> str:
    """The peer's ``host:port``."""
    address = ws.remote_address
    try:
        return f"{address[0]}:{address[1]}"
    except (TypeError, IndexError):
        return str(address)


def _rid_of(data: bytes | str) -> int | None:
    try:
        raw = msgpack.unpackb(data, raw=False) if isinstance(data, bytes) else None
        rid = raw.get("rid") if isinstance(raw, dict) else None
        return rid if isinstance(rid, int) else None
    except Exception:
        return None


async def serve_relay(
    store: Store,
    *,
    host: str = "127.0.0.1",
    port: int = 0,
    config: RelayConfig | None = None,
    blobs: BlobStore | None = None,
    ssl: SSLContext | None = None,
    task_status: trio.TaskStatus[Server] = trio.TASK_STATUS_IGNORED,
) -> None:
    """Serve the relay until cancelled (over TLS with ``ssl``: ``wss://``);
    ``task_status.started`` gets the websockets ``Server``."""
    relay = Relay(store, blobs=blobs, config=config)
    async with trio.open_nursery() as nursery:
        relay.background = nursery
        await nursery.start(relay.fanout.listen)
        nursery.start_soon(relay.sweep_forever)
        nursery.start_soon(relay.recheck_forever)
        await serve(
            relay.handle,
            port,
            host=host,
            compression=None,
            ssl=ssl,
            max_size=wire.MAX_HELLO_BYTES,  # raised per role once the token is checked
            ping_interval=relay.config.ping_interval,
            ping_timeout=relay.config.ping_timeout,
            task_status=task_status,
        )


def server_port(server: Server) -> int:
    return int(server.listeners[0].socket.getsockname()[1])
