"""The control RPC's requests of worker pools and scheduler backends: ``claim`` (the next queued
run of a backend, or a named run's attempt), ``confirm`` (the claim's answer arrived),
``dispatch`` (an attempt handed to a scheduler, with a ticket) and ``report`` (the scheduler's view
of an attempt's job).

``claim`` and ``dispatch`` may wait for hours: they are cancelled the moment their connection
closes, and a run claimed for a connection that closed before the answer reached it is released
(queued again for the same attempt) through :attr:`Conn.undo`, so a dead worker never holds a run.
"""

from __future__ import annotations

import logging
from collections.abc import Awaitable, Callable
from typing import TypeVar

import trio
from websockets.exceptions import ConnectionClosed

from protocol_specs.access.permissions import Act
from protocol_specs.runs.runs import RunRecord
from protocol_specs.snapshots.snapshots import Manifest
from protocol_specs.snapshots.trees import TreeError
from protocol_specs.wire import wire
from protocol_specs.wire.wire import AuditEvent, ErrorCode

from ..gate import Peer
from ..runs import claiming
from ..snapshots.blobs import BlobError
from .context import Conn, Refused, Rooms, allow, run_info

__all__ = ["claim", "confirm", "dispatch", "report"]

log = logging.getLogger("tether.relay")

_T = TypeVar("_T")


async def claim(rooms: Rooms, conn: Conn, frame: wire.Claim) -> wire.AnyFrame:
    """A named run's attempt (``frame.run``: a ticket's or a worker token's), or the next queued
    run of ``frame.backend``, waited for."""
    who = conn.who
    if frame.node and not frame.run:
        return wire.Error(
            code=ErrorCode.BAD_FRAME, message="a node's join names its run", rid=frame.rid
        )
    if frame.run:
        target = await rooms.registry.load(frame.run)
        allow(who, Act.CLAIM_RUN, target, about_run=frame.run, attempt=frame.attempt)
        if who.kind == "ticket" and target is not None and not target.job_running:
            raise Refused(
                ErrorCode.JOB_NOT_RUNNING,
                f"run {frame.run}'s scheduler backend has not yet seen this attempt's job "
                "running: a ticket claims only then (ask again)",
                run=target,
            )
        if frame.node:  # a multi-node run's other node joins the attempt node 0 claimed
            joined = await claiming.join(
                rooms.registry, frame.worker, frame.run, frame.attempt, frame.node
            )
            if isinstance(joined, wire.Error):
                return joined.model_copy(update={"rid": frame.rid})
            token = ""
            if who.kind == "ticket":  # a Ray job's node: its ticket is traded, as node 0's was
                ttl = rooms.config.retention + rooms.config.lease
                token = await rooms.tokens.mint_worker(joined.owner, joined.id, joined.attempt, ttl)
            return await _assigned(
                rooms, frame.rid, conn, joined, token, node=frame.node, joiner=frame.worker
            )
        taken = await claiming.claim_run(
            rooms.registry, frame.worker, frame.run, frame.attempt, mint=who.kind != "worker"
        )
        if isinstance(taken, wire.Error):
            return taken.model_copy(update={"rid": frame.rid})
        claimed = taken.record
        conn.undo = lambda: rooms.registry.release(claimed, "its worker is gone")
        return await _assigned(rooms, frame.rid, conn, claimed, taken.token)
    allow(who, Act.CLAIM_NEXT)
    backend, worker = frame.backend, frame.worker
    log.info("%s (%s) waits for a run of %s", worker, conn.peer.source, backend)
    next_run = await _while_open(
        conn.peer, lambda: rooms.claims.claim(backend, worker, lambda: conn.peer.open)
    )
    if next_run is None:
        raise ConnectionClosed(None, None)
    conn.undo = lambda: rooms.registry.release(next_run.record, "its worker is gone")
    return await _assigned(rooms, frame.rid, conn, next_run.record, next_run.token)


async def confirm(rooms: Rooms, conn: Conn, frame: wire.Confirm) -> wire.AnyFrame:
    target = await rooms.registry.load(frame.run)
    allow(conn.who, Act.CONFIRM, target, about_run=frame.run, attempt=frame.attempt)
    got = await claiming.confirm(rooms.registry, frame.run, frame.attempt, frame.claim)
    return run_info(got, frame.rid)


async def dispatch(rooms: Rooms, conn: Conn, frame: wire.Dispatch) -> wire.AnyFrame:
    backend = frame.backend
    handed = await _while_open(
        conn.peer, lambda: rooms.claims.dispatch(backend, lambda: conn.peer.open)
    )
    if handed is None:
        raise ConnectionClosed(None, None)
    conn.undo = lambda: rooms.registry.enqueue(handed)
    token = await rooms.tokens.mint_worker(
        handed.owner,
        handed.id,
        handed.attempt,
        rooms.config.retention + rooms.config.lease,
        kind="ticket" if frame.ticket else "worker",
    )
    return await _assigned(rooms, frame.rid, conn, handed, token, manifest=False)


async def report(rooms: Rooms, conn: Conn, frame: wire.Report) -> wire.AnyFrame:
    return run_info(await rooms.registry.report(frame), frame.rid)


async def _assigned(
    rooms: Rooms,
    rid: int,
    conn: Conn,
    record: RunRecord,
    token: str,
    *,
    manifest: bool = True,
    node: int = 0,
    joiner: str = "",
) -> wire.AnyFrame:
    """A claimed or dispatched attempt, with its manifest (a dispatch to a scheduler: none)
    and the credential minted for it (a multi-node run's node ``node`` >= 1 that ``joiner``
    joined: none unless it holds a ticket, ``conn.undo`` untouched: nothing was claimed): a
    worker token (``""`` when the requester is that
    attempt's worker already; a ticket's claim gets one: that is what tickets are for), or a
    dispatch's ticket. A snapshot the relay lost part of since the submit (its blobs deleted
    by hand) fails the attempt's start, saying so."""
    try:
        snapshot = await rooms.registry.manifest_of(record.id) if manifest else Manifest()
    except (BlobError, TreeError) as exc:
        conn.undo = None
        detail = f"the relay lost part of the run's snapshot: {exc}"
        if not node:  # node 0's claim fails the start; a joiner's fails with it
            await rooms.registry.snapshot_lost(record, detail)
        return wire.Error(code=ErrorCode.NO_SUCH_BLOB, message=detail, rid=rid)
    worker = record.worker or "a scheduler job"
    await rooms.note(
        record.id,
        AuditEvent.CLAIM,
        conn,
        detail=f"attempt {record.attempt} node {node} to {joiner}"
        if node
        else f"attempt {record.attempt} to {worker}",
    )
    return wire.Assigned(rid=rid, run=record, manifest=snapshot, token=token)


async def _while_open(peer: Peer, wait: Callable[[], Awaitable[_T]]) -> _T | None:
    """``wait()``'s result, or ``None`` if the peer's connection closed first (``wait`` is then
    cancelled)."""
    result: _T | None = None

    async def watch(cancel: trio.CancelScope) -> None:
        await peer.ws.wait_closed()
        cancel.cancel()

    async with trio.open_nursery() as nursery:
        nursery.start_soon(watch, nursery.cancel_scope)
        result = await wait()
        nursery.cancel_scope.cancel()
    return result
