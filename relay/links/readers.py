"""Logs readers: a ``logs`` connection to one run (``tether logs``, ``tether metrics``), opened as
any run connection is (``relay/links/links.py``: who may read it is the permission table's) and then
delivered the run's logs or metrics stream from its cursor on, live, until the peer goes. It
publishes nothing."""

from __future__ import annotations

import trio

from protocol_specs.access.audit import AuditRole
from protocol_specs.access.auth import Principal
from protocol_specs.wire import wire
from protocol_specs.wire.wire import AuditEvent, ErrorCode, StreamName, WireError

from ..config import SERVER_NAME
from ..gate import Peer
from ..store import keys
from .delivery import deliver
from .links import Links

__all__ = ["serve_logs"]


async def serve_logs(links: Links, peer: Peer, hello: wire.Hello, who: Principal) -> None:
    """Deliver a run's logs (or metrics) stream from the cursor on, live, until the peer
    goes."""
    record = await links.opened(peer, hello, who)
    if record is None:
        return
    if hello.cursor == "0":  # a reader starting over; not every reconnect of a follower
        await links.audit.record(
            record.id,
            AuditEvent.LOGS,
            who,
            source=peer.source,
            role=AuditRole.LOGS,
            client=hello.client,
        )
    name = StreamName(hello.stream)
    stream = keys.stream(record.id, name)
    tail = await links.store.last_id(stream) or "0"
    welcome = wire.Welcome(
        server=SERVER_NAME, run=record.redacted(), tails={name.value: tail}, user=who.user
    )
    await peer.ws.send(wire.encode_frame(welcome))
    async with trio.open_nursery() as nursery:
        nursery.start_soon(deliver, peer, links.fanout, stream, name, hello.cursor)
        while True:  # a logs connection publishes nothing; it may only say it is alive
            data = await peer.ws.recv()
            try:
                frame = wire.decode_frame(data)
            except WireError as exc:
                await peer.error(exc.code, exc.message)
                continue
            if not isinstance(frame, wire.Heartbeat | wire.Received):
                await peer.error(ErrorCode.NOT_ALLOWED, f"{frame.t!r} frames are not valid on logs")
