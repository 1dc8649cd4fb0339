"""The control RPC's requests about runs and sweeps: submit (a run or a sweep), rerun, cancel,
get, list, read the audit trail, open a tunnel, and a program's ``claim_pause``.

A user asking about another user's run hears it does not exist (:meth:`Rooms.run`).
:func:`rerun_as` and :func:`cancel_as` are what the web view does too.
"""

from __future__ import annotations

from functools import partial

from protocol_specs.access.audit import AuditRole
from protocol_specs.access.auth import Principal
from protocol_specs.access.permissions import Act
from protocol_specs.runs.runs import RunRecord
from protocol_specs.runs.submits import run_id_for
from protocol_specs.snapshots.snapshots import Manifest
from protocol_specs.snapshots.trees import TreeError
from protocol_specs.wire import wire
from protocol_specs.wire.tunnels import TunnelSpec
from protocol_specs.wire.wire import AuditEvent, ErrorCode

from ..runs import preempting
from ..snapshots.blobs import BlobError
from ..snapshots.trees import Rooted, check_tree
from .blobs import missing
from .context import Conn, Refused, Rooms, allow, run_info

__all__ = [
    "cancel",
    "cancel_as",
    "claim_pause",
    "get_audit",
    "get_run",
    "list_runs",
    "open_tunnel",
    "preempt",
    "rerun",
    "rerun_as",
    "resume",
    "submit",
    "submit_sweep",
    "sweep",
]


async def submit(rooms: Rooms, conn: Conn, frame: wire.Submit) -> wire.AnyFrame:
    who = conn.who
    snapshot = await _snapshot(rooms, who, frame)
    lacking = [] if frame.tree else await missing(rooms, who, frame.manifest.digests)
    if lacking:
        return wire.Error(
            code=ErrorCode.MISSING_BLOBS,
            message=f"the relay lacks {len(lacking)} of the snapshot's blobs "
            f"(first: {lacking[0][:12]}); upload them before submitting",
            rid=frame.rid,
        )
    run_id = run_id_for(who.user, frame.key) if frame.key else ""
    got = await rooms.registry.submit(frame.spec, snapshot, owner=who.user, run_id=run_id)
    if isinstance(got, RunRecord):
        await rooms.note(got.id, AuditEvent.SUBMIT, conn)
    return run_info(got, frame.rid)


async def submit_sweep(rooms: Rooms, conn: Conn, frame: wire.SubmitSweep) -> wire.AnyFrame:
    who = conn.who
    snapshot = await _snapshot(rooms, who, frame)
    lacking = [] if frame.tree else await missing(rooms, who, frame.manifest.digests)
    if lacking:
        return wire.Error(
            code=ErrorCode.MISSING_BLOBS,
            message=f"the relay lacks {len(lacking)} of the snapshot's blobs",
            rid=frame.rid,
        )
    made = await rooms.sweeps.create(frame.spec, snapshot, who.user)
    if isinstance(made, wire.Error):
        return made.model_copy(update={"rid": frame.rid})
    return await rooms.sweeps.answer(wire.GetSweep(rid=frame.rid, sweep=made.id), who)


async def sweep(
    rooms: Rooms, conn: Conn, frame: wire.GetSweep | wire.CancelSweep | wire.ListSweeps
) -> wire.AnyFrame:
    """``get_sweep``, ``cancel_sweep``, ``list_sweeps``: authorised by ``relay/sweeps.py``."""
    return await rooms.sweeps.answer(frame, conn.who)


async def claim_pause(rooms: Rooms, conn: Conn, frame: wire.ClaimPause) -> wire.AnyFrame:
    record = await rooms.registry.load(frame.run)
    allow(conn.who, Act.CLAIM_PAUSE, record, about_run=frame.run, attempt=frame.attempt)
    assert record is not None
    return await rooms.sweeps.claim_pause(record, frame)


async def rerun(rooms: Rooms, conn: Conn, frame: wire.Rerun) -> wire.AnyFrame:
    record = await rooms.run(conn.who, Act.RERUN, frame.run)
    got = await rerun_as(rooms, record, conn.who, source=conn.peer.source, role=AuditRole.CONTROL)
    return run_info(got, frame.rid)


async def cancel(rooms: Rooms, conn: Conn, frame: wire.Cancel) -> wire.AnyFrame:
    record = await rooms.run(conn.who, Act.CANCEL, frame.run)
    cancelled = await cancel_as(
        rooms,
        record,
        conn.who,
        source=conn.peer.source,
        role=AuditRole.CONTROL,
        detail=frame.detail,
    )
    return run_info(cancelled, frame.rid)


async def preempt(rooms: Rooms, conn: Conn, frame: wire.Preempt) -> wire.AnyFrame:
    """``tether preempt`` / ``pause`` (the owner, an admin), or the run's own worker whose
    scheduler warned it (its worker token, its current attempt)."""
    who = conn.who
    if who.kind == "worker":
        record = await rooms.registry.load(frame.run)
        allow(who, Act.PREEMPT, record, about_run=frame.run)
        assert record is not None
        by = f"the worker {record.worker or '?'}"
    else:
        record = await rooms.run(who, Act.PREEMPT, frame.run)
        by = who.user
    detail = frame.detail or f"{'paused' if frame.suspend else 'preempted'} by {by}"
    got = await preempting.preempt(
        rooms.registry,
        record,
        then="suspend" if frame.suspend else "retry",
        grace=frame.grace,
        detail=detail,
    )
    if isinstance(got, RunRecord):
        await rooms.note(got.id, AuditEvent.PREEMPT, conn, detail=detail)
    return run_info(got, frame.rid)


async def resume(rooms: Rooms, conn: Conn, frame: wire.Resume) -> wire.AnyFrame:
    record = await rooms.run(conn.who, Act.RESUME, frame.run)
    got = await preempting.resume(rooms.registry, record, from_start=frame.from_start)
    if isinstance(got, RunRecord):
        detail = "from the start" if frame.from_start else ""
        await rooms.note(got.id, AuditEvent.RESUME, conn, detail=detail)
    return run_info(got, frame.rid)


async def get_run(rooms: Rooms, conn: Conn, frame: wire.GetRun) -> wire.AnyFrame:
    record = await rooms.run(conn.who, Act.GET_RUN, frame.run)
    [shown] = await rooms.explained([await rooms.registry.with_liveness(record)], conn.who)
    return run_info(shown, frame.rid)


async def open_tunnel(rooms: Rooms, conn: Conn, frame: wire.OpenTunnel) -> wire.AnyFrame:
    record = await rooms.run(conn.who, Act.OPEN_TUNNEL, frame.run)
    noting = partial(_note_tunnel, rooms, record.id, conn, frame.spec)
    return await rooms.tunnels.open(
        record, frame.spec, frame.rid, user=conn.who.user, key=frame.key, noting=noting
    )


async def get_audit(rooms: Rooms, conn: Conn, frame: wire.GetAudit) -> wire.AnyFrame:
    record = await rooms.run(conn.who, Act.GET_AUDIT, frame.run)
    entries = await rooms.audit.read(record.id)
    return wire.AuditLog(rid=frame.rid, run=record.id, entries=entries)


async def list_runs(rooms: Rooms, conn: Conn, frame: wire.ListRuns) -> wire.AnyFrame:
    who = conn.who
    runs = await rooms.registry.list_runs(frame.limit, "" if who.admin else who.user)
    runs = await rooms.explained(runs, who)
    return wire.RunList(rid=frame.rid, runs=[r.redacted() for r in runs])


async def rerun_as(
    rooms: Rooms, record: RunRecord, who: Principal, *, source: str, role: AuditRole
) -> RunRecord | wire.Error:
    """Submit ``record``'s run again, on its snapshot, as ``who`` (authorised already)."""
    registry = rooms.registry
    again: Manifest | Rooted = (
        Rooted.of(record) if record.tree else await registry.manifest_of(record.id)
    )
    got = await registry.submit(record.spec, again, owner=who.user, rerun_of=record.id)
    if isinstance(got, RunRecord):
        note = partial(rooms.audit.record, who=who, source=source, role=role)
        await note(got.id, AuditEvent.SUBMIT, detail=f"rerun of {record.id}")
        await note(record.id, AuditEvent.RERUN, detail=f"as {got.id}")
    return got


async def cancel_as(
    rooms: Rooms, record: RunRecord, who: Principal, *, source: str, role: AuditRole, detail: str
) -> RunRecord:
    """Cancel ``record``'s run as ``who`` (authorised already); the record after."""
    await rooms.audit.record(
        record.id, AuditEvent.CANCEL, who, source=source, role=role, detail=detail
    )
    return await rooms.registry.cancel(record.id, detail) or record


async def _snapshot(
    rooms: Rooms, who: Principal, frame: wire.Submit | wire.SubmitSweep
) -> Manifest | Rooted:
    """The submit's snapshot: the manifest as sent, or the root tree it names, checked
    reading only what changed since ``who`` last submitted it (``relay/snapshots/trees.py``)."""
    if not frame.tree:
        return frame.manifest
    try:
        lacking = partial(missing, rooms, who)
        checked = await check_tree(rooms.blobs, frame.tree, lacking, rooms.checked, who.user)
        return Rooted.checked(frame.tree, checked)
    except BlobError as exc:
        raise Refused(
            ErrorCode.MISSING_BLOBS, f"the relay lacks {exc}; upload them before submitting"
        ) from None
    except TreeError as exc:
        raise Refused(ErrorCode.BAD_FRAME, f"the snapshot's tree is refused: {exc}") from None


async def _note_tunnel(
    rooms: Rooms, run_id: str, conn: Conn, spec: TunnelSpec, tunnel: str
) -> None:
    await rooms.note(run_id, AuditEvent.TUNNEL, conn, detail=f"{tunnel}: {spec.describe()}")
