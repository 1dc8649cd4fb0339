"""Control connections: the CLI, worker pools and scheduler backends, one request at a time.

Each request frame has one handler, found in :data:`ROUTES` by the frame's type (as debugpy's
adapter names ``<command>_request`` handlers): the table says which frames the control RPC serves
and which rows of :data:`protocol_specs.access.permissions.PERMISSIONS` decide who may send each. A frame
the table lacks is refused ``not_allowed``. Every request is authorised by
:func:`protocol_specs.access.permissions.authorize` before anything is read or written: here, for a route
:func:`gated` by one act; in its handler, for a route that authorises against the run it names
(:func:`deciding`). A refusal that names a run that exists is in that run's audit trail.

A claim whose answer was lost (this relay died before sending it, or the link with the answer in
a buffer) counts only once its worker confirms it (``confirm``); any relay releases it otherwise
(``relay/runs/claiming.py``).
"""

from __future__ import annotations

import logging
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Any

import msgpack
import trio
from pydantic import BaseModel
from websockets.exceptions import ConnectionClosed

from protocol_specs.access.audit import AuditRole
from protocol_specs.access.auth import Principal, check_token
from protocol_specs.access.permissions import Act
from protocol_specs.runs.runs import RunRecord
from protocol_specs.wire import wire
from protocol_specs.wire.wire import ErrorCode, WireError

from ..config import SERVER_NAME
from ..gate import Peer
from . import blobs, checkpoints, runs, tokens, workers
from .context import Conn, Refused, Rooms, allow

__all__ = ["ROUTES", "Control", "Route"]

log = logging.getLogger("tether.relay")

#: a handler: the reply to one frame of its type (or raises :class:`Refused`)
Handler = Callable[[Rooms, Conn, Any], Awaitable[wire.AnyFrame]]


@dataclass(frozen=True)
class Route:
    """How one type of control frame is answered."""

    handler: Handler
    #: the rows of the permissions table that decide who may send the frame
    acts: tuple[Act, ...]
    #: whether the dispatcher authorises ``acts[0]`` before the handler runs (no run to read
    #: first); else the handler authorises, against the run or the request it reads
    gate: bool


def gated(act: Act, handler: Handler) -> Route:
    """A frame anyone ``act`` allows may send: authorised before ``handler`` runs."""
    return Route(handler, (act,), gate=True)


def deciding(handler: Handler, *acts: Act) -> Route:
    """A frame ``handler`` authorises itself, by one of ``acts``, against what it names."""
    return Route(handler, acts, gate=False)


#: every request of the control RPC, by frame type
ROUTES: dict[type[BaseModel], Route] = {
    # blobs: snapshots', checkpoints' and outputs' (a worker's uploads count as its run owner's)
    wire.HaveBlobs: deciding(blobs.have_blobs, Act.HAVE_BLOBS),
    wire.PutBlob: deciding(blobs.put_blob, Act.PUT_BLOB),
    wire.GetBlob: deciding(blobs.get_blob, Act.GET_BLOB, Act.GET_RUN_BLOB),
    # checkpoints and outputs
    wire.PutCheckpoint: deciding(checkpoints.put_checkpoint, Act.PUT_CHECKPOINT),
    wire.GetCheckpoints: deciding(checkpoints.get_checkpoints, Act.GET_CHECKPOINTS),
    wire.PutOutputs: deciding(checkpoints.put_outputs, Act.PUT_OUTPUTS),
    wire.GetOutputs: deciding(checkpoints.get_outputs, Act.GET_OUTPUTS),
    # runs
    wire.Submit: gated(Act.SUBMIT, runs.submit),
    wire.Rerun: deciding(runs.rerun, Act.RERUN),
    wire.Cancel: deciding(runs.cancel, Act.CANCEL),
    wire.Preempt: deciding(runs.preempt, Act.PREEMPT),
    wire.Resume: deciding(runs.resume, Act.RESUME),
    wire.GetRun: deciding(runs.get_run, Act.GET_RUN),
    wire.ListRuns: gated(Act.LIST_RUNS, runs.list_runs),
    wire.GetAudit: deciding(runs.get_audit, Act.GET_AUDIT),
    wire.OpenTunnel: deciding(runs.open_tunnel, Act.OPEN_TUNNEL),
    # sweeps
    wire.SubmitSweep: gated(Act.SUBMIT_SWEEP, runs.submit_sweep),
    wire.GetSweep: deciding(runs.sweep, Act.GET_SWEEP),
    wire.CancelSweep: deciding(runs.sweep, Act.CANCEL_SWEEP),
    wire.ListSweeps: deciding(runs.sweep, Act.LIST_SWEEPS),
    wire.ClaimPause: deciding(runs.claim_pause, Act.CLAIM_PAUSE),
    # worker pools and scheduler backends
    wire.Claim: deciding(workers.claim, Act.CLAIM_RUN, Act.CLAIM_NEXT),
    wire.Confirm: deciding(workers.confirm, Act.CONFIRM),
    wire.Dispatch: gated(Act.DISPATCH, workers.dispatch),
    wire.Report: gated(Act.REPORT, workers.report),
    # tokens and the web view's login
    wire.CreateToken: deciding(tokens.create_token, Act.CREATE_TOKEN, Act.CREATE_ANY_TOKEN),
    wire.ListTokens: gated(Act.LIST_TOKENS, tokens.list_tokens),
    wire.RevokeToken: gated(Act.REVOKE_TOKEN, tokens.revoke_token),
    wire.WebLogin: gated(Act.WEB_LOGIN, tokens.web_login),
}


class Control:
    """Serves control connections, answering each frame through :data:`ROUTES`."""

    def __init__(self, rooms: Rooms, routes: dict[type[BaseModel], Route] | None = None) -> None:
        self.rooms = rooms
        self.routes = ROUTES if routes is None else routes

    async def serve(self, peer: Peer, hello: wire.Hello, who: Principal) -> None:
        conn = Conn(peer, who, hello.token or "", client=hello.client)
        await peer.ws.send(wire.encode_frame(wire.Welcome(server=SERVER_NAME, user=who.user)))
        try:
            while True:
                data = await peer.ws.recv()
                if not await self._still_good(conn):
                    return
                try:
                    frame = wire.decode_frame(data)
                except WireError as exc:
                    await peer.error(exc.code, exc.message, rid=_rid_of(data))
                    continue
                conn.undo = None
                reply = await self.answer(frame, conn)
                if isinstance(reply, wire.Error):
                    log.info("error to %s: %s: %s", peer.source, reply.code.value, reply.message)
                try:
                    await peer.ws.send(_encoded(reply))
                except ConnectionClosed:
                    if conn.undo is not None:
                        with trio.CancelScope(shield=True), trio.move_on_after(10):
                            await conn.undo()
                    raise
        finally:
            for upload in conn.uploads.values():
                with trio.CancelScope(shield=True):
                    await upload.abort()

    async def answer(self, frame: wire.AnyFrame, conn: Conn) -> wire.AnyFrame:
        """The reply to one control frame. A refusal that names a run that exists is in that
        run's audit trail (the reply is the same as for one that does not)."""
        rid = getattr(frame, "rid", None)
        assert rid is None or isinstance(rid, int)
        route = self.routes.get(type(frame))
        if route is None:
            return wire.Error(
                code=ErrorCode.NOT_ALLOWED,
                message=f"{frame.t!r} frames are not valid on a control connection",
                rid=rid,
            )
        try:
            if route.gate:
                allow(conn.who, route.acts[0])
            return await route.handler(self.rooms, conn, frame)
        except Refused as refused:
            await self._note_refused(frame, conn, refused)
            return wire.Error(code=refused.code, message=refused.message, rid=rid)

    async def rerun(
        self, record: RunRecord, who: Principal, *, source: str, role: AuditRole
    ) -> RunRecord | wire.Error:
        """Submit ``record``'s run again as ``who`` (authorised already): the web view's rerun."""
        return await runs.rerun_as(self.rooms, record, who, source=source, role=role)

    async def cancel_run(
        self, record: RunRecord, who: Principal, *, source: str, role: AuditRole, detail: str
    ) -> RunRecord:
        """Cancel ``record``'s run as ``who`` (authorised already): the web view's cancel."""
        return await runs.cancel_as(
            self.rooms, record, who, source=source, role=role, detail=detail
        )

    async def _note_refused(self, frame: wire.AnyFrame, conn: Conn, refused: Refused) -> None:
        run = refused.run
        if run is None and isinstance(frame, wire.Report):  # refused before its run was read
            run = await self.rooms.registry.load(frame.run)
        if run is None:
            return
        request, what = _request(frame)
        await self.rooms.audit.refused(
            run,
            conn.who,
            request=request,
            code=refused.code.value,
            message=refused.message,
            source=conn.peer.source,
            role=AuditRole.CONTROL,
            client=conn.client,
            what=what,
        )

    async def _still_good(self, conn: Conn) -> bool:
        """Whether the connection's token is still good, looked at again before a request once
        ``config.recheck`` s passed (the gate also closes idle holders); else it is closed."""
        now = trio.current_time()
        if now - conn.checked < self.rooms.config.recheck:
            return True
        conn.checked = now
        held = self.rooms.tokens
        got = check_token(conn.token, await held.lookup(conn.token), held.clock())
        if isinstance(got, Principal):
            return True
        await conn.peer.refuse(got)
        return False


def _request(frame: wire.AnyFrame) -> tuple[str, str]:
    """What a refused control request asked, as its run's audit trail says it: the request
    (``cancel``, ``open_tunnel exec``...), and more about it (a tunnel's command)."""
    if isinstance(frame, wire.OpenTunnel):
        return f"{frame.t.value} {frame.spec.kind}", frame.spec.describe()
    return frame.t.value, ""


def _encoded(reply: wire.AnyFrame) -> bytes:
    """The reply as a frame; one that holds what msgpack cannot carry (a number beyond 64 bits
    in a sweep a relay stored before its space was checked) is answered ``internal`` instead of
    ending the connection."""
    try:
        return wire.encode_frame(reply)
    except (OverflowError, ValueError, TypeError) as exc:
        log.warning("cannot send a %r answer: %s", reply.t, exc)
        message = f"the relay cannot send its {reply.t!r} answer: {exc}"
        rid = getattr(reply, "rid", None)
        return wire.encode_frame(wire.Error(code=ErrorCode.INTERNAL, message=message, rid=rid))


def _rid_of(data: bytes | str) -> int | None:
    try:
        raw = msgpack.unpackb(data, raw=False) if isinstance(data, bytes) else None
        rid = raw.get("rid") if isinstance(raw, dict) else None
        return rid if isinstance(rid, int) else None
    except Exception:
        return None
