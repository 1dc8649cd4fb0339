"""The relay: a trio WebSocket server that keeps runs and their DAP traffic in Redis.

Each connection starts with a ``hello`` frame naming its role (see ``protocol_specs/wire.py`` and
``protocol_specs/relay-protocol.md``):

- ``ide`` / ``worker`` connections are bound to one run. What they publish is appended to the run's
  outbound stream and acknowledged only after Redis stored it; a reader task delivers the run's inbound
  stream from the peer's cursor on, from Redis, so a peer can be on any relay process.
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
from typing import Any

import msgpack
import trio
from websockets.exceptions import ConnectionClosed
from websockets.trio.server import Server, ServerConnection, serve

from protocol_specs import wire
from protocol_specs.runs import IllegalTransition, RunEvent, RunRecord, RunSpec
from protocol_specs.session import StatusEvent
from protocol_specs.wire import ErrorCode, Role, StreamName, WireError

from . import keys
from .store import Cap, Store, StoreError

__all__ = ["Relay", "RelayConfig", "serve_relay"]

log = logging.getLogger("tether.relay")

HANDSHAKE_TIMEOUT = 10.0
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

    @property
    def sweep_interval(self) -> float:
        return max(self.lease / 6, 0.05)


class Relay:
    """Connection handlers bound to one :class:`~relay.store.Store`."""

    def __init__(
        self,
        store: Store,
        *,
        config: RelayConfig | None = None,
        clock: Callable[[], float] = time.time,
    ) -> None:
        self.store = store
        self.config = config or RelayConfig()
        self.clock = clock
        #: where background work (webhooks) runs; set by :func:`serve_relay`
        self.background: trio.Nursery | None = None

    # --- records ----------------------------------------------------------------------------------

    async def load(self, run_id: str) -> RunRecord | None:
        fields = await self.store.hgetall(keys.record(run_id))
        raw = fields.get("record")
        return RunRecord.model_validate_json(raw) if raw else None

    async def save(self, record: RunRecord) -> None:
        await self.store.hset(keys.record(record.id), {"record": record.model_dump_json()})

    async def append_status(self, run_id: str, event: str, record: RunRecord, **extra: Any) -> None:
        entry = wire.StatusEntry(event=event, state=record.state.value, at=self.clock(), **extra)
        await self.store.append(keys.stream(run_id, StreamName.TO_IDE), wire.encode_entry(entry))

    async def transition(self, run_id: str, event: RunEvent, **changes: Any) -> RunRecord | None:
        """Apply ``event`` to the run's record; ``None`` (and a log line) if it isn't legal now."""
        record = await self.load(run_id)
        if record is None:
            return None
        try:
            updated = record.apply(event, at=self.clock(), **changes)
        except IllegalTransition as exc:
            log.info("run %s: %s", run_id, exc)
            return None
        await self.save(updated)
        if updated.finished:
            await self.store.zrem(keys.LEASES, run_id)
            if updated.queue_entry:
                await self.store.ack(keys.QUEUE, keys.POOL_GROUP, updated.queue_entry)
            for key in keys.run_keys(run_id):
                await self.store.expire(key, self.config.retention)
        return updated

    async def submit(self, spec: RunSpec, snapshot: bytes) -> RunRecord:
        now = self.clock()
        record = RunRecord(id=new_run_id(), spec=spec, created_at=now, updated_at=now)
        if snapshot:
            await self.store.set_bytes(keys.snapshot(record.id), snapshot)
        await self.save(record)
        await self.store.zadd(keys.RUNS, record.id, now)
        await self.append_status(
            record.id, StatusEvent.QUEUED, record, detail="waiting for a worker"
        )
        await self.store.append(keys.QUEUE, record.id.encode())
        return record

    async def cancel(self, run_id: str, detail: str) -> RunRecord | None:
        record = await self.transition(run_id, RunEvent.CANCEL, detail=detail)
        if record is None:
            return await self.load(run_id)
        await self.append_status(run_id, StatusEvent.CANCELLED, record, detail=detail)
        control = wire.ControlEntry(action="terminate", detail=detail)
        await self.store.append(
            keys.stream(run_id, StreamName.TO_WORKER), wire.encode_entry(control)
        )
        return record

    async def claim(self, worker: str) -> tuple[RunRecord, bytes]:
        """Block until a queued run can be taken by ``worker``; mark it claimed."""
        async with self.store.blocking_reader() as reader:
            while True:
                got = await reader.read_group(keys.QUEUE, keys.POOL_GROUP, worker, block_ms=1000)
                if got is None:
                    continue
                entry_id, payload = got
                run_id = payload.decode()
                record = await self.transition(
                    run_id, RunEvent.CLAIM, worker=worker, queue_entry=entry_id
                )
                if record is None:  # cancelled while queued, or unknown: nothing to run
                    await self.store.ack(keys.QUEUE, keys.POOL_GROUP, entry_id)
                    continue
                await self.store.zadd(keys.LEASES, run_id, self.clock() + self.config.lease)
                await self.append_status(run_id, StatusEvent.CLAIMED, record, detail=worker)
                snapshot = await self.store.get_bytes(keys.snapshot(run_id)) or b""
                return record, snapshot

    async def renew_lease(self, run_id: str) -> bool:
        """Push the worker's lease on ``run_id`` forward; False if it already expired."""
        return await self.store.zadd(
            keys.LEASES, run_id, self.clock() + self.config.lease, only_existing=True
        )

    async def sweep(self) -> list[str]:
        """Mark the runs whose worker lease expired as lost; returns their ids.

        Every relay sweeps; the one whose ``ZREM`` removes a lease handles that run.
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
            record = await self.transition(run_id, RunEvent.LEASE_EXPIRED, detail=detail)
            if record is None:
                continue
            log.warning("run %s: worker %s lost: lease expired", run_id, record.worker)
            await self.append_status(run_id, StatusEvent.WORKER_LOST, record, detail=detail)
            control = wire.ControlEntry(action="terminate", detail="the run was marked lost")
            await self.store.append(
                keys.stream(run_id, StreamName.TO_WORKER), wire.encode_entry(control)
            )
            lost.append(run_id)
        return lost

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
            event = RunEvent.EXIT_OK if entry.exit_code == 0 else RunEvent.EXIT_ERROR
        else:
            maybe = _WORKER_STATUS.get(entry.event)
            if maybe is None:
                return
            event = maybe
        await self.transition(run_id, event, exit_code=entry.exit_code, detail=entry.detail)

    # --- connections ------------------------------------------------------------------------------

    async def handle(self, ws: ServerConnection) -> None:
        try:
            hello = await self._handshake(ws)
            if hello is None:
                return
            if hello.role is Role.CONTROL:
                await ws.send(wire.encode_frame(wire.Welcome(server=SERVER_NAME)))
                await self._serve_control(ws)
            else:
                await self._serve_run(ws, hello)
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

    async def _fatal(self, ws: ServerConnection, code: ErrorCode, message: str) -> None:
        log.info("closing connection from %s: %s: %s", ws.remote_address, code.value, message)
        await ws.send(wire.encode_frame(wire.Error(code=code, message=message, fatal=True)))
        await ws.aclose(1008, message[:120])

    async def _send_error(
        self, ws: ServerConnection, code: ErrorCode, message: str, **ref: Any
    ) -> None:
        log.info("error to %s: %s: %s", ws.remote_address, code.value, message)
        await ws.send(wire.encode_frame(wire.Error(code=code, message=message, **ref)))

    async def _serve_run(self, ws: ServerConnection, hello: wire.Hello) -> None:
        if not hello.run:
            await self._fatal(ws, ErrorCode.BAD_FRAME, f"role {hello.role.value!r} needs a run id")
            return
        record = await self.load(hello.run)
        if record is None:
            await self._fatal(ws, ErrorCode.NO_SUCH_RUN, f"no run {hello.run!r}")
            return
        run_id = record.id
        if hello.role is Role.IDE:
            outbound, inbound = StreamName.TO_WORKER, StreamName.TO_IDE
        else:
            outbound, inbound = StreamName.TO_IDE, StreamName.TO_WORKER
        tails = {
            name.value: (await self.store.last_id(keys.stream(run_id, name))) or "0"
            for name in StreamName
        }
        if hello.role is Role.WORKER and not record.finished:
            await self.renew_lease(run_id)
        welcome = wire.Welcome(
            server=SERVER_NAME, run=record, tails=tails, heartbeat=self.config.lease / 3
        )
        await ws.send(wire.encode_frame(welcome))
        conn = _RunConnection(
            ws, run_id, hello.role, outbound, inbound, hello.producer or secrets.token_hex(8)
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
        key = keys.stream(run_id, name)
        async with self.store.blocking_reader() as reader:
            while True:
                batch = await reader.read(key, cursor, block_ms=1000, count=200)
                for entry_id, payload in batch:
                    frame = wire.Deliver(stream=name, cursor=entry_id, entry=payload)
                    await ws.send(wire.encode_frame(frame))
                    cursor = entry_id

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
                    while await self.store.trim_received(key, frame.cursor) > 0:
                        pass
            elif isinstance(frame, wire.Heartbeat):
                if conn.role is Role.WORKER and not await self.renew_lease(conn.run_id):
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
        # status and presence entries are small and rare: never refused for a full buffer
        cap = self.config.buffer_cap if isinstance(entry, wire.DapEntry) else Cap()
        transient = isinstance(entry, wire.DapEntry) and entry.transient
        key = keys.stream(conn.run_id, conn.outbound)
        got = await self.store.append_once(
            key, conn.producer, frame.n, frame.entry, transient=transient, cap=cap
        )
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

    async def _serve_control(self, ws: ServerConnection) -> None:
        while True:
            data = await ws.recv()
            try:
                frame = wire.decode_frame(data)
            except WireError as exc:
                await self._send_error(ws, exc.code, exc.message, rid=_rid_of(data))
                continue
            reply: wire.RunInfo | wire.Assigned | wire.Error
            if isinstance(frame, wire.Submit):
                record = await self.submit(frame.spec, frame.snapshot)
                reply = wire.RunInfo(rid=frame.rid, run=record)
            elif isinstance(frame, wire.Cancel | wire.GetRun):
                found = (
                    await self.cancel(frame.run, frame.detail)
                    if isinstance(frame, wire.Cancel)
                    else await self.load(frame.run)
                )
                reply = (
                    wire.RunInfo(rid=frame.rid, run=found)
                    if found
                    else wire.Error(
                        code=ErrorCode.NO_SUCH_RUN, message=f"no run {frame.run!r}", rid=frame.rid
                    )
                )
            elif isinstance(frame, wire.Claim):
                record, snapshot = await self.claim(frame.worker)
                reply = wire.Assigned(rid=frame.rid, run=record, snapshot=snapshot)
            else:
                reply = wire.Error(
                    code=ErrorCode.NOT_ALLOWED,
                    message=f"{frame.t!r} frames are not valid on a control connection",
                    rid=getattr(frame, "rid", None),
                )
            await ws.send(wire.encode_frame(reply))


@dataclass
class _RunConnection:
    ws: ServerConnection
    run_id: str
    role: Role
    outbound: StreamName
    inbound: StreamName
    producer: str
    #: the last presence the adapter on this connection reported
    presence: wire.PresenceEntry | None = None


def _entry_not_allowed(role: Role, entry: wire.AnyEntry) -> str:
    if isinstance(entry, wire.DapEntry):
        return ""
    if role is Role.IDE and isinstance(entry, wire.PresenceEntry):
        return ""
    if role is Role.WORKER and isinstance(entry, wire.StatusEntry):
        if entry.event in _WORKER_STATUS:
            return ""
        return f"workers may not publish status {entry.event!r}"
    return f"role {role.value!r} may not publish {entry.k!r} entries"


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
    task_status: trio.TaskStatus[Server] = trio.TASK_STATUS_IGNORED,
) -> None:
    """Serve the relay until cancelled; ``task_status.started`` gets the websockets ``Server``."""
    relay = Relay(store, config=config)
    await store.ensure_group(keys.QUEUE, keys.POOL_GROUP)
    async with trio.open_nursery() as nursery:
        relay.background = nursery
        nursery.start_soon(relay.sweep_forever)
        await serve(
            relay.handle,
            port,
            host=host,
            compression=None,
            max_size=wire.MAX_FRAME_BYTES,
            ping_interval=relay.config.ping_interval,
            ping_timeout=relay.config.ping_timeout,
            task_status=task_status,
        )


def server_port(server: Server) -> int:
    return int(server.listeners[0].socket.getsockname()[1])
