"""The control RPC's blob requests: which blobs the relay lacks (``have_blobs``), an upload in
pieces (``put_blob``), a read (``get_blob``).

A worker token uploads its run's checkpoints and outputs (``have_blobs`` / ``put_blob``, counted
as the run owner's blobs) and reads its run's snapshot and the blobs its run's checkpoints, or its
seed's (``RunSpec.from_checkpoint``), name. A user reads a blob naming a run of theirs whose
checkpoints or outputs name it (``get_blob`` with ``run``).
"""

from __future__ import annotations

from protocol_specs.access.auth import Principal
from protocol_specs.access.permissions import Act
from protocol_specs.checkpoints.checkpoints import parse_source
from protocol_specs.wire import wire
from protocol_specs.wire.wire import ErrorCode

from ..runs.checkpoints import RunFiles
from ..snapshots.blobs import BlobError
from ..store import keys
from .context import Conn, Refused, Rooms, allow

__all__ = ["get_blob", "have_blobs", "missing", "put_blob", "uploader"]

#: digests looked up in one call
_BATCH = 5000


async def uploader(rooms: Rooms, conn: Conn, act: Act) -> str:
    """Whose blobs ``conn``'s uploads count as, once ``act`` is allowed: a user's own, a worker
    token's its run owner's (its attempt's only)."""
    who = conn.who
    if who.kind != "worker":
        allow(who, act)
        return who.user
    record = await rooms.registry.load(who.run)
    allow(who, act, record, about_run=who.run)
    assert record is not None
    return record.owner


async def have_blobs(rooms: Rooms, conn: Conn, frame: wire.HaveBlobs) -> wire.AnyFrame:
    user = await uploader(rooms, conn, Act.HAVE_BLOBS)
    lacking = await missing(rooms, conn.who, frame.digests, user=user)
    return wire.Missing(rid=frame.rid, digests=lacking)


async def missing(
    rooms: Rooms, who: Principal, digests: list[str], *, user: str | None = None
) -> list[str]:
    """Which of ``digests`` the relay lacks, as far as ``who`` may know: a user is told of the
    blobs they uploaded themselves (nobody learns whether another user's file is here); a
    worker, of its run owner's (``user``)."""
    lacking = await rooms.blobs.missing(digests)
    if who.admin:
        return lacking
    unknown = set(lacking)
    key = keys.user_blobs(who.user if user is None else user)
    for i in range(0, len(digests), _BATCH):
        batch = digests[i : i + _BATCH]
        held = await rooms.store.sismember(key, batch)
        unknown.update(d for d, ok in zip(batch, held, strict=True) if not ok)
    return [d for d in dict.fromkeys(digests) if d in unknown]


async def get_blob(rooms: Rooms, conn: Conn, frame: wire.GetBlob) -> wire.AnyFrame:
    who = conn.who
    if frame.run:  # a user's read of what their run stored (a worker names no run)
        record = await rooms.run(who, Act.GET_RUN_BLOB, frame.run)
        if frame.digest not in await RunFiles(rooms.store, rooms.blobs).named([record.id]):
            raise Refused(
                ErrorCode.FORBIDDEN,
                f"blob {frame.digest[:12]} is not named by run {record.id}'s checkpoints "
                "or outputs",
                run=record,
            )
    elif who.kind == "worker":
        own = await rooms.registry.load(who.run)
        allow(who, Act.GET_BLOB, own, about_run=who.run)
        assert own is not None
        if conn.digests is None:
            conn.digests = frozenset((await rooms.registry.manifest_of(who.run)).digests)
        if frame.digest not in conn.digests and frame.digest not in conn.files:
            # checkpoints appear during the run: look again once on a miss
            runs = [who.run]
            if own.spec.from_checkpoint:
                try:
                    runs.append(parse_source(own.spec.from_checkpoint)[0])
                except ValueError:
                    pass
            conn.files = frozenset(await RunFiles(rooms.store, rooms.blobs).named(runs))
        if frame.digest not in conn.digests and frame.digest not in conn.files:
            raise Refused(
                ErrorCode.FORBIDDEN,
                f"blob {frame.digest[:12]} is not in run {who.run}'s snapshot or checkpoints",
                run=own,
            )
    else:
        allow(who, Act.GET_BLOB)
    try:
        size, chunk = await rooms.blobs.read(frame.digest, frame.offset, frame.length)
    except BlobError as exc:
        return wire.Error(code=ErrorCode.NO_SUCH_BLOB, message=str(exc), rid=frame.rid)
    return wire.BlobData(rid=frame.rid, size=size, offset=frame.offset, data=chunk)


async def put_blob(rooms: Rooms, conn: Conn, frame: wire.PutBlob) -> wire.AnyFrame:
    user = await uploader(rooms, conn, Act.PUT_BLOB)
    uploads = conn.uploads
    upload = uploads.get(frame.digest)
    try:
        if frame.offset == 0 and len(frame.data) == frame.size and upload is None:
            await rooms.blobs.put(frame.digest, frame.data)  # whole in one piece
            await rooms.store.sadd(keys.user_blobs(user), [frame.digest])
            return wire.Stored(rid=frame.rid, received=frame.size, complete=True)
        if frame.offset == 0:
            if upload is not None:
                await upload.abort()
            upload = uploads[frame.digest] = await rooms.blobs.begin(frame.digest, frame.size)
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
        await rooms.store.sadd(keys.user_blobs(user), [frame.digest])
        return wire.Stored(rid=frame.rid, received=upload.received, complete=True)
    except BlobError as exc:
        dropped = uploads.pop(frame.digest, None)
        if dropped is not None:
            await dropped.abort()
        return wire.Error(code=ErrorCode.BAD_BLOB, message=str(exc), rid=frame.rid)
