"""Run connections: an adapter's (``ide``) and a worker's (``worker``) link to one run, and a reader
of its logs (``logs``).

What a link publishes is appended to the run's outbound stream exactly once
(:meth:`~relay.store.Store.append_once`) and acknowledged only after Redis stored it; a delivery
task sends the run's inbound stream from the peer's cursor on, woken by ``relay/fanout.py``. A
worker's status entries move the run record along (``relay/registry.py``); its heartbeats renew
its attempt's lease. Who may open which link, and publish what on it, is
``protocol_specs/permissions.py``'s table, checked when the link opens and, for a worker, again
whenever its attempt may have ended (status entries, heartbeats).
"""

from __future__ import annotations

import logging
import secrets
import time
from collections.abc import Callable
from dataclasses import dataclass, field

import trio

from protocol_specs import wire
from protocol_specs.auth import Principal, Refusal
from protocol_specs.permissions import Act, authorize
from protocol_specs.processes import PROCESS_EVENTS, fold_into_record
from protocol_specs.runs import RunEvent, RunRecord
from protocol_specs.session import StatusEvent
from protocol_specs.wire import ErrorCode, Role, StreamName, WireError

from . import keys
from .audit import AuditTrail
from .config import SERVER_NAME, RelayConfig
from .fanout import Fanout
from .gate import Peer
from .registry import Registry
from .store import NO_CAP, Diversion, StoreError

__all__ = ["Links"]

log = logging.getLogger("tether.relay")

#: transient entries one ``trim_received`` call deletes at most
TRIM_BATCH = 1000

#: status events a worker may publish, and the run transition each one makes
_WORKER_STATUS: dict[str, RunEvent | None] = {
    StatusEvent.STARTED: RunEvent.START,
    StatusEvent.WAITING_FOR_IDE: None,
    StatusEvent.DEBUGGER_LIVE: None,
    StatusEvent.EXITED: None,  # EXIT_OK or EXIT_ERROR by exit code
    StatusEvent.START_FAILED: RunEvent.START_FAILED,
    StatusEvent.UNATTENDED_STOP: None,
    StatusEvent.BUFFER_FULL: None,
    StatusEvent.WORKER_STOPPED: None,  # the attempt is lost: retried, or the run ends
}

_OPEN = {Role.IDE: Act.OPEN_IDE, Role.WORKER: Act.OPEN_WORKER, Role.LOGS: Act.OPEN_LOGS}
_PUBLISH: dict[str, Act] = {
    "dap": Act.PUBLISH_DAP,
    "presence": Act.PUBLISH_PRESENCE,
    "status": Act.PUBLISH_STATUS,
    "log": Act.PUBLISH_LOG,
    "control": Act.PUBLISH_CONTROL,
}


@dataclass(eq=False)
class _Link:
    peer: Peer
    record: RunRecord  #: as it was when the link opened
    role: Role
    who: Principal
    outbound: StreamName
    inbound: StreamName
    producer: str
    #: the last presence the adapter on this link reported
    presence: wire.PresenceEntry | None = None
    #: entry kind -> why this link may not publish it (None: it may); decided once per kind: the
    #: holder and the run the decision rests on are fixed for the link's life
    refusals: dict[str, Refusal | None] = field(default_factory=dict)

    @property
    def run_id(self) -> str:
        return self.record.id

    @property
    def attempt(self) -> int:
        """A worker's attempt (0 for an IDE)."""
        return self.who.attempt


class Links:
    def __init__(
        self,
        registry: Registry,
        fanout: Fanout,
        audit: AuditTrail,
        config: RelayConfig,
        *,
        on_unattended: Callable[[RunRecord, wire.StatusEntry], None] = lambda _r, _e: None,
        clock: Callable[[], float] = time.time,
    ) -> None:
        self.registry = registry
        self.store = registry.store
        self.fanout = fanout
        self.audit = audit
        self.config = config
        self.on_unattended = on_unattended
        self.clock = clock

    async def _opened(self, peer: Peer, hello: wire.Hello, who: Principal) -> RunRecord | None:
        """The run the link is for, if ``who`` may open it; else ``None`` after refusing it."""
        if not hello.run:
            await peer.fatal(ErrorCode.BAD_FRAME, f"role {hello.role.value!r} needs a run id")
            return None
        record = await self.registry.load(hello.run)
        refusal = authorize(
            who, _OPEN[hello.role], record, about_run=hello.run, attempt=hello.attempt or None
        )
        if refusal is None and record is None:
            refusal = Refusal(ErrorCode.NO_SUCH_RUN, f"no run {hello.run!r} (or not yours)")
        if refusal is not None:
            if record is not None:
                await self.audit.record(
                    record.id,
                    "refused",
                    who,
                    source=peer.source,
                    role=hello.role.value,
                    detail=refusal.message,
                )
            await peer.refuse(refusal)
            return None
        return record

    # --- ide and worker links ---------------------------------------------------------------------

    async def serve_run(self, peer: Peer, hello: wire.Hello, who: Principal) -> None:
        record = await self._opened(peer, hello, who)
        if record is None:
            return
        run_id = record.id
        await self.audit.record(
            run_id,
            "connect",
            who,
            source=peer.source,
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
            await self.registry.renew_lease(run_id, who.attempt)
        welcome = wire.Welcome(
            server=SERVER_NAME,
            run=record if hello.role is Role.WORKER else record.redacted(),
            tails=tails,
            # only a worker's heartbeats mean something (its lease); an idle IDE link sends none
            heartbeat=self.config.heartbeat if hello.role is Role.WORKER else 0,
            user=who.user,
        )
        await peer.ws.send(wire.encode_frame(welcome))
        link = _Link(
            peer,
            record,
            hello.role,
            who,
            outbound,
            inbound,
            hello.producer or secrets.token_hex(8),
        )
        try:
            async with trio.open_nursery() as nursery:
                if hello.role is Role.IDE and hello.history:
                    await self._deliver_history(
                        peer, run_id, StreamName.TO_WORKER, hello.history_cursor
                    )
                nursery.start_soon(self._deliver, peer, run_id, inbound, hello.cursor)
                await self._receive(link)
                nursery.cancel_scope.cancel()
        finally:
            if link.presence is not None and link.presence.attached:
                # the adapter's relay link is gone, and with it its IDE, as far as anyone can
                # tell; ``link_lost``: it may well be back in a moment (the worker waits a little)
                gone = link.presence.model_copy(update={"attached": False, "link_lost": True})
                with trio.CancelScope(shield=True), trio.move_on_after(5):
                    try:
                        await self.store.append(
                            keys.stream(run_id, StreamName.TO_WORKER), wire.encode_entry(gone)
                        )
                    except StoreError as exc:
                        log.warning("run %s: cannot record an IDE leaving: %s", run_id, exc)

    async def _deliver_history(self, peer: Peer, run_id: str, name: StreamName, after: str) -> None:
        key = keys.stream(run_id, name)
        cursor = after
        while batch := await self.store.read_after(key, cursor, count=500):
            for entry_id, payload in batch:
                frame = wire.Deliver(stream=name, cursor=entry_id, entry=payload)
                await peer.ws.send(wire.encode_frame(frame))
                cursor = entry_id

    async def _deliver(self, peer: Peer, run_id: str, name: StreamName, cursor: str) -> None:
        async with self.fanout.subscribe(keys.stream(run_id, name), cursor) as subscription:
            while True:
                for entry_id, payload in await subscription.next_batch(200):
                    frame = wire.Deliver(stream=name, cursor=entry_id, entry=payload)
                    await peer.ws.send(wire.encode_frame(frame))

    async def _receive(self, link: _Link) -> None:
        peer = link.peer
        while True:
            data = await peer.ws.recv()
            try:
                frame = wire.decode_frame(data)
            except WireError as exc:
                await peer.error(exc.code, exc.message)
                continue
            if isinstance(frame, wire.Publish):
                if not await self._publish(link, frame):
                    return
            elif isinstance(frame, wire.Received):
                if frame.stream is link.inbound:
                    key = keys.stream(link.run_id, link.inbound)
                    while (
                        await self.store.trim_received(key, frame.cursor, limit=TRIM_BATCH)
                        >= TRIM_BATCH
                    ):
                        pass
            elif isinstance(frame, wire.Heartbeat):
                if link.role is not Role.WORKER:
                    continue  # tokens are looked at again by the gate's recheck
                if not await self._current(link):
                    return
                if not await self.registry.renew_lease(link.run_id, link.attempt):
                    await peer.fatal(ErrorCode.LEASE_LOST, f"run {link.run_id} is no longer yours")
                    return
            else:
                await peer.error(
                    ErrorCode.NOT_ALLOWED,
                    f"{frame.t!r} frames are not valid on a run connection",
                )

    async def _current(self, link: _Link) -> bool:
        """Whether a worker link's attempt is still the run's; if not, close it."""
        record = await self.registry.load(link.run_id)
        refusal = authorize(link.who, Act.OPEN_WORKER, record, about_run=link.run_id)
        if refusal is None:
            return True
        await link.peer.refuse(refusal)
        return False

    async def _publish(self, link: _Link, frame: wire.Publish) -> bool:
        """Store one published entry exactly once; False if the link must close."""
        peer = link.peer
        try:
            entry = wire.decode_entry(frame.entry)
        except WireError as exc:
            await peer.error(exc.code, exc.message, n=frame.n)
            return await self._skip(link, frame.n)
        if entry.k not in link.refusals:
            link.refusals[entry.k] = authorize(
                link.who, _PUBLISH[entry.k], link.record, about_run=link.run_id
            )
        refusal = link.refusals[entry.k]
        if refusal is not None:
            await peer.error(ErrorCode(refusal.code), refusal.message, n=frame.n)
            return await self._skip(link, frame.n)
        if isinstance(entry, wire.StatusEntry):
            if entry.event not in _WORKER_STATUS and entry.event not in PROCESS_EVENTS:
                problem = f"workers may not publish status {entry.event!r}"
                await peer.error(ErrorCode.NOT_ALLOWED, problem, n=frame.n)
                return await self._skip(link, frame.n)
            if not await self._current(link):
                return False
        # status and presence entries are small and rare: never refused for a full buffer
        cap = self.config.buffer_cap if isinstance(entry, wire.DapEntry) else NO_CAP
        transient = isinstance(entry, wire.DapEntry) and entry.transient
        divert = None
        if isinstance(entry, wire.LogEntry):
            divert = Diversion(
                keys.stream(link.run_id, StreamName.LOGS), maxlen=self.config.log_entries
            )
        key = keys.stream(link.run_id, link.outbound)
        stored_in = divert.stream if divert else key
        try:
            got = await self.store.append_once(
                key,
                link.producer,
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
            await peer.fatal(
                ErrorCode.OUT_OF_ORDER,
                f"publish {frame.n} skips ahead of {got.last + 1}; resend from there",
            )
            return False
        if got.outcome == "full":
            await peer.error(
                ErrorCode.BUFFER_FULL,
                f"run {link.run_id}: {link.outbound.value} holds {got.size} entries "
                f"(cap {cap.entries}) or its {cap.bytes} bytes are used up; nobody has read them",
                n=frame.n,
            )
            return True
        if got.outcome == "stored":
            if isinstance(entry, wire.StatusEntry):
                await self.worker_status(link.run_id, entry, link.attempt)
            elif isinstance(entry, wire.PresenceEntry):
                if link.presence is None or link.presence.attached != entry.attached:
                    event = "attach" if entry.attached else "detach"
                    await self.audit.record(
                        link.run_id, event, link.who, source=peer.source, role="ide"
                    )
                link.presence = entry
        ack = wire.Ack(n=frame.n, cursor=got.cursor, duplicate=got.outcome == "duplicate")
        await peer.ws.send(wire.encode_frame(ack))
        return True

    async def _skip(self, link: _Link, n: int) -> bool:
        """Count a refused publish as answered, so the producer's numbering has no gap."""
        key = keys.stream(link.run_id, link.outbound)
        await self.store.append_once(key, link.producer, n, None)
        return True

    async def worker_status(self, run_id: str, entry: wire.StatusEntry, attempt: int) -> None:
        """Move the run record along with a status the worker of ``attempt`` published."""
        registry = self.registry
        if entry.event == StatusEvent.UNATTENDED_STOP:
            record = await registry.load(run_id)
            if record is not None and record.spec.webhook:
                self.on_unattended(record, entry)
            return
        if entry.event in PROCESS_EVENTS:  # the run is paused while any of its processes is
            now = registry.clock()
            await registry.update(
                run_id, lambda record: fold_into_record(record, entry, about=attempt, at=now)
            )
            return
        if entry.event in (StatusEvent.WAITING_FOR_IDE, StatusEvent.DEBUGGER_LIVE):
            waiting = entry.event == StatusEvent.WAITING_FOR_IDE
            await registry.update(run_id, lambda record: record.waiting(attempt, waiting))
            return
        if entry.event == StatusEvent.WORKER_STOPPED:
            detail = entry.detail or "the worker stopped"
            ended = await registry.attempt_ended(
                run_id, RunEvent.JOB_LOST, about=attempt, detail=detail
            )
            if ended is not None and ended.finished:
                await registry.append_status(run_id, StatusEvent.WORKER_LOST, ended, detail=detail)
            return
        if entry.event == StatusEvent.EXITED:
            if entry.exit_code != 0:
                await registry.attempt_ended(
                    run_id,
                    RunEvent.EXIT_ERROR,
                    about=attempt,
                    exit_code=entry.exit_code,
                    detail=entry.detail,
                )
                return
            event = RunEvent.EXIT_OK
        else:
            maybe = _WORKER_STATUS.get(entry.event)
            if maybe is None:
                return
            event = maybe
        run_dir = entry.data.get("run_dir") if event is RunEvent.START else None
        record = await registry.transition(
            run_id,
            event,
            about=attempt,
            attempt_fields={"run_dir": run_dir[:1000]} if isinstance(run_dir, str) else None,
            exit_code=entry.exit_code,
            detail=entry.detail,
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
            await registry.log_marker(run_id, wire.encode_entry(marker))

    # --- logs -------------------------------------------------------------------------------------

    async def serve_logs(self, peer: Peer, hello: wire.Hello, who: Principal) -> None:
        """Deliver a run's logs stream from the cursor on, live, until the peer goes."""
        record = await self._opened(peer, hello, who)
        if record is None:
            return
        if hello.cursor == "0":  # a reader starting over; not every reconnect of a follower
            await self.audit.record(
                record.id, "logs", who, source=peer.source, role="logs", client=hello.client
            )
        tail = await self.store.last_id(keys.stream(record.id, StreamName.LOGS)) or "0"
        welcome = wire.Welcome(
            server=SERVER_NAME,
            run=record.redacted(),
            tails={StreamName.LOGS.value: tail},
            user=who.user,
        )
        await peer.ws.send(wire.encode_frame(welcome))
        async with trio.open_nursery() as nursery:
            nursery.start_soon(self._deliver, peer, record.id, StreamName.LOGS, hello.cursor)
            while True:  # a logs connection publishes nothing; it may only say it is alive
                data = await peer.ws.recv()
                try:
                    frame = wire.decode_frame(data)
                except WireError as exc:
                    await peer.error(exc.code, exc.message)
                    continue
                if not isinstance(frame, wire.Heartbeat | wire.Received):
                    await peer.error(
                        ErrorCode.NOT_ALLOWED, f"{frame.t!r} frames are not valid on logs"
                    )
