"""Run connections: an adapter's (``ide``) and a worker's (``worker``) link to one run, and the two
links of a tunnel into it (``tunnel``, and a ``worker`` naming the tunnel: the tunnel's streams,
``relay/runs/tunnels.py``). A reader of its logs (``logs``) is opened here too, and served by
``relay/links/readers.py``.

What a link publishes is appended to the run's outbound stream exactly once
(:meth:`~relay.store.Store.append_once`) and acknowledged only after Redis stored it; a delivery
task sends the run's inbound stream from the peer's cursor on (``relay/links/delivery.py``).

Redis is not on the way of live traffic: a link's receiver checks each publish and, for a DAP
entry, hands it at once to the peers on this process that take entries early
(:meth:`Fanout.forward`); a storer task appends the link's publishes in order and answers them.
A publish goes early only while nothing the link sent before it waits to be stored and delivered
the ordinary way (a status or presence entry), so every peer sees a producer's entries in order.
What to admit, what goes early, how the storer batches and how acks are batched is decided by the
link's sans-I/O state (``protocol_specs/link/relay.py``); this module only performs it. A
worker's status entries move the run record along (``relay/runs/registry.py``); its link's opening
confirms the claim its token came with (``relay/runs/claiming.py``), its heartbeats renew its
attempt's lease. Who may open which link, and publish what on it, is
``protocol_specs/access/permissions.py``'s table, checked when the link opens and, for a worker, again
whenever its attempt may have ended (status entries, heartbeats).
"""

from __future__ import annotations

import logging
import secrets
import time
from collections.abc import Callable
from dataclasses import dataclass

import trio
from websockets.exceptions import ConnectionClosed

from protocol_specs.access.audit import AuditRole
from protocol_specs.access.auth import Principal, Refusal
from protocol_specs.access.permissions import Act, authorize
from protocol_specs.link.relay import (
    Action,
    AppendOutcome,
    Attached,
    Audit,
    Batch,
    Beat,
    Close,
    Queued,
    Reach,
    RelayLinkState,
    Skip,
    StatusStored,
    StoreOne,
    StoreRun,
    Tell,
)
from protocol_specs.runs import claims, nodes
from protocol_specs.runs.runs import RunRecord
from protocol_specs.wire import wire
from protocol_specs.wire.wire import (
    AfterLink,
    AnyLink,
    AuditEvent,
    ErrorCode,
    IdeLink,
    Role,
    StreamName,
    WireError,
    WorkerLink,
)

from ..config import SERVER_NAME, RelayConfig
from ..gate import Peer
from ..runs import claiming
from ..runs.audit import AuditTrail
from ..runs.registry import Registry
from ..runs.tunnels import Tunnels
from ..runs.worker_status import WorkerStatus, worker_may_publish
from ..store import Published, StoreError, keys
from .delivery import deliver, deliver_history, diversion
from .fanout import Fanout

__all__ = ["Links"]

log = logging.getLogger("tether.relay")

#: transient entries one ``trim_received`` call deletes at most
TRIM_BATCH = 1000
#: how long an append waits for a peer to send the entry's early copy first (seconds)
EARLY_FIRST = 0.005

_OPEN = {
    Role.IDE: Act.OPEN_IDE,
    Role.WORKER: Act.OPEN_WORKER,
    Role.LOGS: Act.OPEN_LOGS,
    Role.TUNNEL: Act.OPEN_TUNNEL,
}


@dataclass(eq=False, slots=True)
class _Link:
    """A link's connection and what its loop keeps; what it decides is :attr:`state`'s."""

    peer: Peer
    state: RelayLinkState
    producer: str
    #: the peer closed the connection: what is queued is still stored, but nobody is told
    gone: bool = False
    #: the storer runs (while anything is queued)
    storing: bool = False
    #: set when the storer takes from the queue, or ends (made by whoever waits for it)
    drained: trio.Event | None = None
    #: what the peer said it is (its ``hello``), for the audit trail
    client: str = ""
    #: the node of a multi-node run a worker link runs (``protocol_specs/runs/nodes.py``)
    node: int = 0

    @property
    def run_id(self) -> str:
        return self.state.record.id

    @property
    def who(self) -> Principal:
        return self.state.who

    def key(self, name: StreamName) -> str:
        """The Redis key of the link's stream ``name``."""
        if self.state.tunnel:
            return keys.tunnel_stream(self.run_id, self.state.tunnel, name.value)
        return keys.stream(self.run_id, name)


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
        self.statuses = WorkerStatus(registry, on_unattended=on_unattended, clock=clock)
        self.tunnels = Tunnels(self.store, clock=clock)

    async def opened(self, peer: Peer, hello: wire.Hello, who: Principal) -> RunRecord | None:
        """The run the link is for, if ``who`` may open it; else ``None`` after refusing it."""
        if not hello.run:
            await peer.fatal(ErrorCode.BAD_FRAME, f"role {hello.role.value!r} needs a run id")
            return None
        record = await self.registry.load(hello.run)
        tunnel = hello.link.tunnel if hello.link else ""
        refusal = authorize(
            who, _OPEN[hello.role], record, about_run=hello.run, attempt=hello.attempt or None
        )
        if refusal is None and record is None:
            refusal = Refusal(ErrorCode.NO_SUCH_RUN, f"no run {hello.run!r} (or not yours)")
        if refusal is not None:
            if record is not None:
                await self.audit.refused(
                    record,
                    who,
                    request=f"open {hello.role.value}",
                    code=refusal.code,
                    message=refusal.message,
                    source=peer.source,
                    role=AuditRole(hello.role),
                    client=hello.client,
                    what=f"tunnel {tunnel}" if tunnel else "",
                )
            await peer.refuse(refusal)
            return None
        return record

    # --- ide and worker links ---------------------------------------------------------------------

    async def serve_run(self, peer: Peer, hello: wire.Hello, who: Principal) -> None:
        kind: AnyLink | None = (
            hello.link
        )  # the hello's role is its link's (``protocol_specs.wire.wire``)
        assert kind is not None, "the server serves only run roles here"
        record = await self.opened(peer, hello, who)
        if record is None:
            return
        run_id = record.id
        tunnel = kind.tunnel
        node = kind.node if isinstance(kind, WorkerLink) else 0
        if (why := nodes.link_refusal(record, node)) is not None:
            await peer.fatal(ErrorCode.BAD_FRAME, why)
            return
        if tunnel and not await self.tunnels.known(record, tunnel):
            await peer.fatal(
                ErrorCode.NO_SUCH_TUNNEL,
                f"run {run_id} has no tunnel {tunnel!r} now (it ended with an earlier attempt, "
                "or was never opened)",
            )
            return
        detail = f"attempt {who.attempt}" if who.kind == "worker" else ""
        await self.audit.record(
            run_id,
            AuditEvent.CONNECT,
            who,
            source=peer.source,
            role=AuditRole(hello.role),
            client=hello.client,
            detail=f"{detail} tunnel {tunnel}".strip() if tunnel else detail,
        )
        cap = self.config.buffer_cap
        state = RelayLinkState(
            kind,
            who,
            record,
            status_allowed=worker_may_publish,
            buffer_cap=(cap.entries, cap.bytes),
        )
        link = _Link(
            peer, state, hello.producer or secrets.token_hex(8), client=hello.client, node=node
        )
        inbound = state.inbound
        tails = {
            name.value: (await self.store.last_id(link.key(name))) or "0" for name in state.streams
        }
        cursor = hello.cursor
        match kind:
            case AfterLink():  # what the user asks from now on; never the run's past
                await self.tunnels.hold(run_id)
                cursor = tails[inbound.value] if cursor == "0" else cursor
            case WorkerLink() if not record.finished:
                # it holds the claim's answer (node 0's: the other nodes join, claiming nothing)
                if not node and who.token == claims.unconfirmed(record, who.attempt):
                    got = await claiming.confirm(self.registry, run_id, who.attempt, who.token)
                    if isinstance(got, wire.Error):
                        return await peer.fatal(got.code, got.message)
                await self.registry.renew_lease(run_id, who.attempt, node)
        welcome = wire.Welcome(
            server=SERVER_NAME,
            run=record if hello.role is Role.WORKER else record.redacted(),
            tails=tails,
            # only a worker's heartbeats mean something (its lease); an idle IDE link sends none
            heartbeat=self.config.heartbeat if hello.role is Role.WORKER else 0,
            user=who.user,
        )
        await peer.ws.send(wire.encode_frame(welcome))
        try:
            async with trio.open_nursery() as nursery:
                if isinstance(kind, IdeLink) and kind.history:
                    await deliver_history(
                        peer, self.store, run_id, StreamName.TO_WORKER, hello.history_cursor
                    )
                nursery.start_soon(
                    deliver,
                    peer,
                    self.fanout,
                    link.key(inbound),
                    inbound,
                    cursor,
                    kind.early,
                )
                await self._receive(link, nursery)
                # what is queued when the peer went is still stored
                while link.storing:
                    link.drained = trio.Event()
                    await link.drained.wait()
                nursery.cancel_scope.cancel()
        finally:
            gone = state.farewell()
            if gone is not None:
                # the adapter's relay link is gone, and with it its IDE, as far as anyone can tell
                with trio.CancelScope(shield=True), trio.move_on_after(5):
                    try:
                        await self.store.append(
                            keys.stream(run_id, StreamName.TO_WORKER), wire.encode_entry(gone)
                        )
                        await self.registry.update(
                            run_id, lambda record: record.with_ide(gone.origin, False)
                        )
                    except StoreError as exc:
                        log.warning("run %s: cannot record an IDE leaving: %s", run_id, exc)

    async def _receive(self, link: _Link, publishing: trio.Nursery) -> None:
        """Read the peer's frames until it goes: publishes to the storer (live DAP entries to the
        peers that take them early first), the rest handled here. The storer is a task of
        ``publishing`` while there is something to store (an idle link keeps none)."""
        peer, state = link.peer, link.state
        while True:
            try:
                data = await peer.ws.recv()
            except ConnectionClosed:
                return  # what was received is stored all the same (the storer drains its queue)
            try:
                frame = wire.decode_frame(data)
            except WireError as exc:
                await peer.error(exc.code, exc.message)
                continue
            if isinstance(frame, wire.Publish):
                while not state.has_room:  # Redis sets the pace
                    link.drained = trio.Event()
                    await link.drained.wait()
                if state.closing:
                    return
                item = state.admit(frame)
                if item.reach is Reach.EARLY:
                    key = link.key(state.outbound)
                    item.sending = tuple(
                        self.fanout.forward(key, link.producer, frame.n, frame.entry)
                    )
                if not link.storing:
                    link.storing = True
                    publishing.start_soon(self._store_all, link)
            elif isinstance(frame, wire.Received):
                if frame.stream is state.inbound:
                    await self._trim(link, frame.cursor)
            elif isinstance(frame, wire.Heartbeat):
                beat = state.heartbeat()
                if beat is Beat.IGNORE:
                    continue
                if not await self._current(link):
                    return
                if beat is Beat.HOLD:  # it still keeps the ended attempt's directory
                    await self.tunnels.hold(link.run_id)
                elif beat is Beat.RENEW and not await self.registry.renew_lease(
                    link.run_id, link.who.attempt, link.node
                ):
                    await peer.fatal(ErrorCode.LEASE_LOST, f"run {link.run_id} is no longer yours")
                    return
            else:
                await peer.error(
                    ErrorCode.NOT_ALLOWED,
                    f"{frame.t!r} frames are not valid on a run connection",
                )

    async def _store_all(self, link: _Link) -> None:
        """Store and answer the link's queued publishes in order, until none is left (or one
        ends the link: nothing more is stored, the receiver returns). What queued up meanwhile
        is taken together (:meth:`RelayLinkState.take`)."""
        state = link.state
        try:
            while (batch := state.take()) is not None:
                if link.drained is not None:
                    link.drained.set()
                try:
                    open_ = await self._store_batch(link, batch)
                finally:
                    state.finished(batch)
                if not open_:
                    state.close()  # the peer was told (a fatal error): its recv ends
        finally:
            link.storing = False
            if link.drained is not None:
                link.drained.set()

    async def _store_batch(self, link: _Link, batch: Batch) -> bool:
        """Perform ``batch``'s steps in order; False if the link must close."""
        for step in batch.steps:
            if isinstance(step, StoreRun):
                actions = await self._store_run(link, step.items)
            elif isinstance(step, StoreOne):
                if step.recheck and not await self._current(link):
                    return False
                actions = await self._store_one(link, step.item)
            else:
                actions = step.actions
            if not await self._perform(link, actions):
                return False
        return True

    async def _store_run(self, link: _Link, items: list[Queued]) -> list[Action]:
        """Store DAP (or tunnel) entries the link may publish, in one step."""
        for item in items:  # the early copies first: live traffic waits on them
            for subscription in item.sending:
                await subscription.sent(EARLY_FIRST)
        key = link.key(link.state.outbound)
        entries = [
            Published(item.frame.n, item.frame.entry, getattr(item.entry, "transient", False))
            for item in items
        ]
        try:
            got = await self.store.append_batch(
                key,
                link.producer,
                entries,
                cap=self.config.buffer_cap,
                notify_except=self.fanout.id,
            )
        except BaseException:
            self.fanout.lost(key)  # stored or not, nobody else will say
            raise
        for entry, result in zip(entries, got, strict=True):
            if result.outcome is AppendOutcome.STORED:
                self.fanout.appended(
                    key, result.prev, result.cursor, entry.payload, link.producer, entry.n
                )
        return link.state.answer_run(items, got)

    async def _store_one(self, link: _Link, item: Queued) -> list[Action]:
        """Store one entry that is not a DAP entry (those go in runs) exactly once."""
        frame, entry = item.frame, item.entry
        assert entry is not None and not isinstance(entry, wire.DapEntry)
        divert = diversion(link.run_id, entry, self.config)
        key = link.key(link.state.outbound)
        stored_in = divert.stream if divert else key
        try:
            got = await self.store.append_once(
                key,
                link.producer,
                frame.n,
                frame.entry,
                # status and presence entries are small and rare: never refused for a full buffer
                divert=divert,
                notify_except=self.fanout.id,
            )
        except BaseException:
            self.fanout.lost(stored_in)  # stored or not, nobody else will say
            raise
        if got.outcome is AppendOutcome.STORED:
            self.fanout.appended(
                stored_in, got.prev, got.cursor, frame.entry, link.producer, frame.n
            )
        return link.state.answer_one(item, got)

    async def _perform(self, link: _Link, actions: list[Action]) -> bool:
        """Do what the link's state decided, in order; False if the link must close."""
        for action in actions:
            if isinstance(action, Tell):
                if isinstance(action.frame, wire.Error):
                    error = action.frame
                    log.info(
                        "error to %s: %s: %s", link.peer.source, error.code.value, error.message
                    )
                await self._tell(link, action.frame)
            elif isinstance(action, Close):
                if not link.gone:
                    await link.peer.fatal(action.code, action.message)
                return False
            elif isinstance(action, Audit):
                record = link.state.record
                await self._audit_refusal(link, record, action.request, action.code, action.message)
            elif isinstance(action, Skip):
                key = link.key(link.state.outbound)
                await self.store.append_once(key, link.producer, action.n, None)
            elif isinstance(action, StatusStored):
                await self.statuses.apply(
                    link.run_id, action.entry, link.who.attempt, node=link.node
                )
            elif isinstance(action, Attached):
                await self._attached(link, action.entry)
            else:  # the worker's last word on its tunnel
                await self.tunnels.closed(link.run_id, link.who.attempt, link.state.tunnel)
        return True

    async def _trim(self, link: _Link, cursor: str) -> None:
        """The peer received its inbound stream up to ``cursor``: its transient entries go. Every
        node's worker of a run that spans nodes reads ``to_worker`` for itself: it is trimmed only
        to what they all received (a node that reconnects re-reads from its own cursor)."""
        key = link.key(link.state.inbound)
        spans = link.state.record.spec.resources.nodes
        if isinstance(link.state.link, WorkerLink) and spans > 1:
            mark = keys.received_key(key)
            await self.store.hset(mark, {str(link.state.link.node): cursor})
            seen = {
                name: value.decode() for name, value in (await self.store.hgetall(mark)).items()
            }
            point = nodes.trim_point(seen, spans)
            if point is None:
                return
            cursor = point
        while await self.store.trim_received(key, cursor, limit=TRIM_BATCH) >= TRIM_BATCH:
            pass

    async def _attached(self, link: _Link, entry: wire.PresenceEntry) -> None:
        """The adapter on ``link`` attached or detached its IDE."""
        event = AuditEvent.ATTACH if entry.attached else AuditEvent.DETACH
        await self.audit.record(
            link.run_id, event, link.who, source=link.peer.source, role=AuditRole.IDE
        )
        await self.registry.update(
            link.run_id, lambda record: record.with_ide(entry.origin, entry.attached)
        )

    async def _tell(self, link: _Link, frame: wire.AnyFrame) -> None:
        """Send the peer a frame, unless it is gone (then what it is owed it asks for again)."""
        if link.gone:
            return
        try:
            await link.peer.ws.send(wire.encode_frame(frame))
        except ConnectionClosed:
            link.gone = True

    async def _current(self, link: _Link) -> bool:
        """Whether a worker link's attempt is still the run's; if not, close it."""
        record = await self.registry.load(link.run_id)
        refusal = link.state.still_current(record)
        if refusal is None:
            return True
        if record is not None:
            await self._audit_refusal(
                link, record, "go on as worker", refusal.code, refusal.message
            )
        if not link.gone:
            await link.peer.refuse(refusal)
        return False

    async def _audit_refusal(
        self, link: _Link, record: RunRecord, request: str, code: str, message: str
    ) -> None:
        tunnel = link.state.tunnel
        await self.audit.refused(
            record,
            link.who,
            request=request,
            code=code,
            message=message,
            source=link.peer.source,
            role=AuditRole(link.state.role),
            client=link.client,
            what=f"tunnel {tunnel}" if tunnel else "",
        )
