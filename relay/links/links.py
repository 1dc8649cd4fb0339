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
the ordinary way (a status or presence entry), so every peer sees a producer's entries in order. A
worker's status entries move the run record along (``relay/runs/registry.py``); its link's opening
confirms the claim its token came with (``relay/runs/claiming.py``), its heartbeats renew its
attempt's lease. Who may open which link, and publish what on it, is
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
from websockets.exceptions import ConnectionClosed

from protocol_specs import claims, wire
from protocol_specs.auth import Principal, Refusal
from protocol_specs.permissions import Act, authorize
from protocol_specs.runs import RunRecord
from protocol_specs.wire import AuditEvent, ErrorCode, Role, StreamName, WireError

from ..config import SERVER_NAME, RelayConfig
from ..gate import Peer
from ..runs import claiming
from ..runs.audit import AuditTrail
from ..runs.registry import Registry
from ..runs.tunnels import Tunnels
from ..runs.worker_status import WorkerStatus, worker_may_publish
from ..store import Appended, Published, StoreError, keys
from .delivery import deliver, deliver_history, diversion
from .fanout import Fanout, Subscription

__all__ = ["Links"]

log = logging.getLogger("tether.relay")

#: transient entries one ``trim_received`` call deletes at most
TRIM_BATCH = 1000
#: publishes a link's receiver checks ahead of its storer (then it waits: Redis sets the pace)
STORE_QUEUE = 64
#: how long an append waits for a peer to send the entry's early copy first (seconds)
EARLY_FIRST = 0.005
#: publishes the storer takes at once (consecutive DAP entries go to Redis in one step)
STORE_BATCH = 64

_OPEN = {
    Role.IDE: Act.OPEN_IDE,
    Role.WORKER: Act.OPEN_WORKER,
    Role.LOGS: Act.OPEN_LOGS,
    Role.TUNNEL: Act.OPEN_TUNNEL,
}
_PUBLISH: dict[str, Act] = {
    "dap": Act.PUBLISH_DAP,
    "presence": Act.PUBLISH_PRESENCE,
    "status": Act.PUBLISH_STATUS,
    "log": Act.PUBLISH_LOG,
    "metric": Act.PUBLISH_METRIC,
    "control": Act.PUBLISH_CONTROL,
    "tunnel": Act.PUBLISH_TUNNEL,
}


@dataclass(eq=False, slots=True)
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
    #: publishes queued for the storer that go to the peer only once stored: while there are
    #: any, nothing goes early (it would overtake them)
    held_back: int = 0
    #: the peer closed the connection: what is queued is still stored, but nobody is told
    gone: bool = False
    #: publishes checked and waiting for the storer, which runs while there are any
    queue: list[_Queued] = field(default_factory=list)
    storing: bool = False
    #: set when the storer takes from the queue, or ends (made by whoever waits for it)
    drained: trio.Event | None = None
    #: the storer refused a publish in a way that ends the link
    closing: bool = False
    #: a tunnel's link (``protocol_specs/tunnels.py``): its streams instead of the run's
    tunnel: str = ""
    #: a worker that keeps an ended attempt's directory, serving the run's tunnels there
    after: bool = False
    #: what the peer said it is (its ``hello``), for the audit trail
    client: str = ""

    @property
    def run_id(self) -> str:
        return self.record.id

    def key(self, name: StreamName) -> str:
        """The Redis key of the link's stream ``name``."""
        if self.tunnel:
            return keys.tunnel_stream(self.record.id, self.tunnel, name.value)
        return keys.stream(self.record.id, name)

    @property
    def attempt(self) -> int:
        """A worker's attempt (0 for an IDE)."""
        return self.who.attempt


@dataclass(frozen=True, slots=True)
class _Queued:
    """A publish as the link's receiver checked it, waiting for the storer."""

    frame: wire.Publish
    entry: wire.AnyEntry | None  #: ``None``: malformed (``error`` says how)
    error: WireError | None
    early: bool = False  #: handed to the peers before it was stored
    held_back: bool = False  #: counted in ``_Link.held_back`` until stored
    #: the peers' subscriptions that send it next: the append waits for them (briefly)
    sending: tuple[Subscription, ...] = ()

    def __repr__(self) -> str:
        how = "early" if self.early else "held back" if self.held_back else "stored first"
        return f"<_Queued n={self.frame.n} {how}>"


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
                    role=hello.role.value,
                    client=hello.client,
                    what=f"tunnel {hello.tunnel}" if hello.tunnel else "",
                )
            await peer.refuse(refusal)
            return None
        return record

    # --- ide and worker links ---------------------------------------------------------------------

    async def serve_run(self, peer: Peer, hello: wire.Hello, who: Principal) -> None:
        record = await self.opened(peer, hello, who)
        if record is None:
            return
        run_id = record.id
        tunnel = hello.tunnel
        if (hello.role is Role.TUNNEL and not tunnel) or (hello.role is Role.IDE and tunnel):
            await peer.fatal(ErrorCode.BAD_FRAME, "only tunnel and worker links name a tunnel")
            return
        if hello.after and (hello.role is not Role.WORKER or tunnel):
            await peer.fatal(ErrorCode.BAD_FRAME, "only a worker's run link serves it 'after'")
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
            role=hello.role.value,
            client=hello.client,
            detail=f"{detail} tunnel {tunnel}".strip() if tunnel else detail,
        )
        if tunnel:
            names = (StreamName.TUNNEL_UP, StreamName.TUNNEL_DOWN)
            outbound, inbound = names[::-1] if hello.role is Role.WORKER else names
        elif hello.role is Role.IDE:
            names = outbound, inbound = StreamName.TO_WORKER, StreamName.TO_IDE
        else:
            names = (StreamName.TO_WORKER, StreamName.TO_IDE)
            outbound, inbound = StreamName.TO_IDE, StreamName.TO_WORKER
        link = _Link(
            peer,
            record,
            hello.role,
            who,
            outbound,
            inbound,
            hello.producer or secrets.token_hex(8),
            tunnel=tunnel,
            after=hello.after,
            client=hello.client,
        )
        tails = {name.value: (await self.store.last_id(link.key(name))) or "0" for name in names}
        cursor = hello.cursor
        if hello.after:  # what the user asks from now on; never the run's past
            await self.tunnels.hold(run_id)
            cursor = tails[inbound.value] if cursor == "0" else cursor
        elif hello.role is Role.WORKER and not record.finished and not tunnel:
            if who.token == claims.unconfirmed(record, who.attempt):  # it holds the claim's answer
                got = await claiming.confirm(self.registry, run_id, who.attempt, who.token)
                if isinstance(got, wire.Error):
                    return await peer.fatal(got.code, got.message)
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
        try:
            async with trio.open_nursery() as nursery:
                if hello.role is Role.IDE and hello.history:
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
                    hello.early,
                )
                await self._receive(link, nursery)
                # what is queued when the peer went is still stored
                while link.storing:
                    link.drained = trio.Event()
                    await link.drained.wait()
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
                        await self.registry.update(
                            run_id, lambda record: record.with_ide(gone.origin, False)
                        )
                    except StoreError as exc:
                        log.warning("run %s: cannot record an IDE leaving: %s", run_id, exc)

    async def _receive(self, link: _Link, publishing: trio.Nursery) -> None:
        """Read the peer's frames until it goes: publishes to the storer (live DAP entries to the
        peers that take them early first), the rest handled here. The storer is a task of
        ``publishing`` while there is something to store (an idle link keeps none)."""
        peer = link.peer
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
                while len(link.queue) >= STORE_QUEUE:  # Redis sets the pace
                    link.drained = trio.Event()
                    await link.drained.wait()
                if link.closing:
                    return
                link.queue.append(self._admit(link, frame))
                if not link.storing:
                    link.storing = True
                    publishing.start_soon(self._store_all, link)
            elif isinstance(frame, wire.Received):
                if frame.stream is link.inbound:
                    key = link.key(link.inbound)
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
                if link.after:  # it still keeps the ended attempt's directory
                    await self.tunnels.hold(link.run_id)
                elif link.tunnel:
                    continue  # the attempt's lease is its main link's to renew
                elif not await self.registry.renew_lease(link.run_id, link.attempt):
                    await peer.fatal(ErrorCode.LEASE_LOST, f"run {link.run_id} is no longer yours")
                    return
            else:
                await peer.error(
                    ErrorCode.NOT_ALLOWED,
                    f"{frame.t!r} frames are not valid on a run connection",
                )

    def _admit(self, link: _Link, frame: wire.Publish) -> _Queued:
        """Check a publish as it arrives; a DAP entry the link may publish goes early to the
        peers on this process (unless something before it is held back: it would overtake it)."""
        try:
            entry = wire.decode_entry(frame.entry)
        except WireError as exc:
            return _Queued(frame, None, exc)
        refusal = self._refusal(link, entry.k)
        if refusal is not None:
            return _Queued(frame, entry, None)  # the storer answers it, in order
        if isinstance(entry, wire.DapEntry) and not link.held_back:
            sending = self.fanout.forward(
                link.key(link.outbound), link.producer, frame.n, frame.entry
            )
            return _Queued(frame, entry, None, early=True, sending=tuple(sending))
        if not isinstance(entry, wire.LogEntry | wire.MetricEntry):  # streams of their own
            link.held_back += 1
            return _Queued(frame, entry, None, held_back=True)
        return _Queued(frame, entry, None)

    def _refusal(self, link: _Link, kind: str) -> Refusal | None:
        if kind not in link.refusals:
            if link.after:
                link.refusals[kind] = Refusal(
                    ErrorCode.NOT_ALLOWED, "a worker serving an ended attempt publishes nothing"
                )
            elif bool(link.tunnel) != (kind == "tunnel"):  # a tunnel's link carries only its steps
                where = "a tunnel's link" if link.tunnel else "a run's link (only on a tunnel's)"
                link.refusals[kind] = Refusal(ErrorCode.NOT_ALLOWED, f"no {kind} entry on {where}")
            else:
                link.refusals[kind] = authorize(
                    link.who, _PUBLISH[kind], link.record, about_run=link.run_id
                )
        return link.refusals[kind]

    async def _store_all(self, link: _Link) -> None:
        """Store and answer the link's queued publishes in order, until none is left (or one
        ends the link: nothing more is stored, the receiver returns). What queued up meanwhile
        is taken together: consecutive DAP entries in one step of Redis, with one ``ack``."""
        try:
            while link.queue and not link.closing:
                batch = link.queue[:STORE_BATCH]
                del link.queue[:STORE_BATCH]
                if link.drained is not None:
                    link.drained.set()
                try:
                    open_ = await self._store_batch(link, batch)
                finally:
                    link.held_back -= sum(item.held_back for item in batch)
                if not open_:
                    link.closing = True  # the peer was told (a fatal error): its recv ends
                    link.queue.clear()
        finally:
            link.storing = False
            if link.drained is not None:
                link.drained.set()

    async def _store_batch(self, link: _Link, batch: list[_Queued]) -> bool:
        """Store and answer ``batch`` in order; False if the link must close."""
        plain: list[_Queued] = []
        for item in batch:
            entry = item.entry
            if isinstance(entry, wire.DapEntry | wire.TunnelEntry) and (
                self._refusal(link, entry.k) is None
            ):
                plain.append(item)
                continue
            if plain and not await self._store_plain(link, plain):
                return False
            plain = []
            if not await self._store(link, item):
                return False
        return not plain or await self._store_plain(link, plain)

    async def _store_plain(self, link: _Link, items: list[_Queued]) -> bool:
        """Store DAP (or tunnel) entries the link may publish, in one step; answer them (one
        ``ack`` for a run of stored ones). False if the link must close."""
        for item in items:  # the early copies first: live traffic waits on them
            for subscription in item.sending:
                await subscription.sent(EARLY_FIRST)
        key = link.key(link.outbound)
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
        for item, entry, result in zip(items, entries, got, strict=True):
            if result.outcome == "stored":
                self.fanout.appended(
                    key, result.prev, result.cursor, entry.payload, link.producer, entry.n
                )
                if isinstance(item.entry, wire.TunnelEntry) and item.entry.op == "exit":
                    if link.role is Role.WORKER:  # the worker's last word: the tunnel is over
                        await self.tunnels.closed(link.run_id, link.attempt, link.tunnel)
        ack: wire.Ack | None = None
        for entry, result in zip(entries, got, strict=True):
            if result.outcome == "stored":
                ack = wire.Ack(n=entry.n, cursor=result.cursor)
                continue
            if ack is not None:
                await self._tell(link, ack)
                ack = None
            if not await self._answer(link, entry.n, result):
                return False
        if ack is not None:
            await self._tell(link, ack)
        return True

    async def _answer(self, link: _Link, n: int, got: Appended) -> bool:
        """Answer publish ``n`` that was not stored: a duplicate, a full stream, or a gap (which
        ends the link: False)."""
        if got.outcome == "gap":
            if not link.gone:
                await link.peer.fatal(
                    ErrorCode.OUT_OF_ORDER,
                    f"publish {n} skips ahead of {got.last + 1}; resend from there",
                )
            return False
        if got.outcome == "full":
            cap = self.config.buffer_cap
            message = (
                f"run {link.run_id}: {link.outbound.value} holds {got.size} entries "
                f"(cap {cap.entries}) or its {cap.bytes} bytes are used up; nobody has read them"
            )
            await self._refuse(link, n, ErrorCode.BUFFER_FULL, message)
            return True
        await self._tell(link, wire.Ack(n=n, cursor=got.cursor, duplicate=True))
        return True

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
        refusal = authorize(link.who, Act.OPEN_WORKER, record, about_run=link.run_id)
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
        await self.audit.refused(
            record,
            link.who,
            request=request,
            code=code,
            message=message,
            source=link.peer.source,
            role=link.role.value,
            client=link.client,
            what=f"tunnel {link.tunnel}" if link.tunnel else "",
        )

    async def _store(self, link: _Link, item: _Queued) -> bool:
        """Store one published entry that is not a DAP entry the link may publish (those go in
        batches, :meth:`_store_plain`) exactly once, and answer it; False if the link must close."""
        frame, entry = item.frame, item.entry
        if entry is None:
            assert item.error is not None
            await self._refuse(link, frame.n, item.error.code, item.error.message)
            return await self._skip(link, frame.n)
        refusal = self._refusal(link, entry.k)
        if refusal is not None:
            request = f"publish {entry.k}"
            await self._audit_refusal(link, link.record, request, refusal.code, refusal.message)
            await self._refuse(link, frame.n, ErrorCode(refusal.code), refusal.message)
            return await self._skip(link, frame.n)
        if isinstance(entry, wire.StatusEntry):
            if not worker_may_publish(entry.event):
                problem = f"workers may not publish status {entry.event!r}"
                code = ErrorCode.NOT_ALLOWED
                await self._audit_refusal(link, link.record, "publish status", code, problem)
                await self._refuse(link, frame.n, code, problem)
                return await self._skip(link, frame.n)
            if not await self._current(link):
                return False
        assert not isinstance(entry, wire.DapEntry)
        divert = diversion(link.run_id, entry, self.config)
        key = link.key(link.outbound)
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
        if got.outcome != "stored":
            return await self._answer(link, frame.n, got)
        self.fanout.appended(stored_in, got.prev, got.cursor, frame.entry, link.producer, frame.n)
        if isinstance(entry, wire.StatusEntry):
            await self.statuses.apply(link.run_id, entry, link.attempt)
        elif isinstance(entry, wire.PresenceEntry):
            if link.presence is None or link.presence.attached != entry.attached:
                event = AuditEvent.ATTACH if entry.attached else AuditEvent.DETACH
                await self.audit.record(
                    link.run_id, event, link.who, source=link.peer.source, role="ide"
                )
                await self.registry.update(
                    link.run_id, lambda record: record.with_ide(entry.origin, entry.attached)
                )
            link.presence = entry
        await self._tell(link, wire.Ack(n=frame.n, cursor=got.cursor))
        return True

    async def _refuse(self, link: _Link, n: int, code: ErrorCode, message: str) -> None:
        """Answer publish ``n`` with an error (it is not stored; the producer goes on)."""
        log.info("error to %s: %s: %s", link.peer.source, code.value, message)
        await self._tell(link, wire.Error(code=code, message=message, n=n))

    async def _skip(self, link: _Link, n: int) -> bool:
        """Count a refused publish as answered, so the producer's numbering has no gap."""
        key = link.key(link.outbound)
        await self.store.append_once(key, link.producer, n, None)
        return True
