"""The control RPC's checkpoint and outputs requests: a worker records a checkpoint of its attempt
(``put_checkpoint``) or its outputs (``put_outputs``) once it uploaded their chunks and file set;
the run's owner, an admin or its worker reads the checkpoints (``get_checkpoints``: the run's own,
else its seed's), the owner or an admin its outputs (``get_outputs``).

What a checkpoint must be before it is recorded: its file set blob stored and valid, every chunk it
names stored, and its bytes within the relay's limit (``RelayConfig.checkpoint_limit``); the book's
rules (``protocol_specs/checkpoints/book.py``) decide when a step of a run across nodes is complete
and which checkpoints are kept.
"""

from __future__ import annotations

from protocol_specs.access.permissions import Act
from protocol_specs.checkpoints.book import CheckpointBook, Part, size_text
from protocol_specs.checkpoints.checkpoints import Checkpoint, parse_source
from protocol_specs.checkpoints.files import FileSet, merge
from protocol_specs.runs.runs import RunRecord, RunState
from protocol_specs.wire import wire
from protocol_specs.wire.wire import ErrorCode

from ..runs.checkpoints import RunFiles, SetError
from .blobs import missing
from .context import Conn, Refused, Rooms, allow

__all__ = ["get_checkpoints", "get_outputs", "put_checkpoint", "put_outputs"]

#: the states in which an attempt's program may save a checkpoint
_SAVING = frozenset({RunState.STARTING, RunState.RUNNING, RunState.PAUSED})


def _files(rooms: Rooms) -> RunFiles:
    return RunFiles(rooms.store, rooms.blobs)


async def _uploaded(
    rooms: Rooms, conn: Conn, files: RunFiles, digest: str, what: str, record: RunRecord
) -> FileSet:
    """The file set blob ``digest`` names, once it and every chunk it lists are stored as the
    run owner's blobs. Only theirs: a set naming another user's blob (its digest known or
    guessed) would otherwise be recorded, and that blob then read back through the run, or its
    presence learnt (``blobs.missing``: nobody learns whether another user's file is here)."""
    if await missing(rooms, conn.who, [digest], user=record.owner):
        raise Refused(
            ErrorCode.MISSING_BLOBS, f"{what}: the file set blob {digest[:12]} is not stored",
            run=record,
        )  # fmt: skip
    try:
        got = await files.read_set(digest)
    except SetError as exc:
        code = ErrorCode.MISSING_BLOBS if exc.missing else ErrorCode.BAD_BLOB
        raise Refused(code, f"{what}: {exc}", run=record) from None
    lacking = await missing(rooms, conn.who, sorted(got.digests), user=record.owner)
    if lacking:
        raise Refused(
            ErrorCode.MISSING_BLOBS,
            f"{what} names {len(lacking)} chunk{'s' if len(lacking) != 1 else ''} the relay "
            "does not hold; upload them first",
            run=record,
        )
    return got


async def _worker_run(
    rooms: Rooms, conn: Conn, act: Act, run: str, attempt: int, node: int
) -> RunRecord:
    record = await rooms.run(conn.who, act, run)
    allow(conn.who, act, record, about_run=run, attempt=attempt)
    if node >= record.spec.resources.nodes:
        raise Refused(
            ErrorCode.FORBIDDEN,
            f"run {record.id} spans {record.spec.resources.nodes} node(s); there is no node {node}",
            run=record,
        )
    return record


async def put_checkpoint(rooms: Rooms, conn: Conn, frame: wire.PutCheckpoint) -> wire.AnyFrame:
    record = await _worker_run(
        rooms, conn, Act.PUT_CHECKPOINT, frame.run, frame.attempt, frame.node
    )
    if record.state not in _SAVING:
        raise Refused(
            ErrorCode.RUN_FINISHED if record.finished else ErrorCode.FORBIDDEN,
            f"run {record.id} is {record.state.value}: it saves no checkpoint now",
            run=record,
        )
    files = _files(rooms)
    what = f"checkpoint of step {frame.step}"
    got = await _uploaded(rooms, conn, files, frame.files, what, record)
    _within_limit(rooms, got, frame.step, record)
    nodes = record.spec.resources.nodes
    digest, sent = frame.files, frame.sent
    if nodes > 1:
        part = Part(files=frame.files, sent=frame.sent)
        book = await files.update_book(
            record.id, lambda b: b.with_part(frame.attempt, frame.step, frame.node, part)
        )
        parts = book.parts_of(frame.attempt, frame.step)
        if len(parts) < nodes:
            partial = Checkpoint(
                step=frame.step, attempt=frame.attempt, at=rooms.registry.clock(),
                files=frame.files, count=len(got.files), size=got.size, sent=frame.sent,
            )  # fmt: skip
            return wire.CheckpointStored(rid=frame.rid, checkpoint=partial, complete=False)
        sets = [await files.read_set(parts[n].files) for n in sorted(parts)]
        got = merge(sets)
        _within_limit(rooms, got, frame.step, record)
        digest, sent = await files.put_set(got), sum(p.sent for p in parts.values())
    checkpoint = Checkpoint(
        step=frame.step, attempt=frame.attempt, at=rooms.registry.clock(),
        files=digest, count=len(got.files), size=got.size, sent=sent,
    )  # fmt: skip
    keep = record.spec.keep_checkpoints

    def complete(book: CheckpointBook) -> CheckpointBook:
        return book.with_complete(checkpoint, keep)[0]

    book = await files.update_book(record.id, complete)
    await _summarise(rooms, record.id, book)
    return wire.CheckpointStored(rid=frame.rid, checkpoint=checkpoint, complete=True)


def _within_limit(rooms: Rooms, got: FileSet, step: int, record: RunRecord) -> None:
    limit = rooms.config.checkpoint_limit
    if got.size > limit:
        raise Refused(
            ErrorCode.TOO_LARGE,
            f"checkpoint of step {step} holds {size_text(got.size)}, over the relay's limit "
            f"of {size_text(limit)}",
            run=record,
        )


async def _summarise(rooms: Rooms, run_id: str, book: CheckpointBook) -> None:
    summary = {
        "checkpoint": book.latest,
        "checkpoints": len(book.kept),
        "checkpoint_bytes": book.size,
    }
    await rooms.registry.update(run_id, lambda r: r.model_copy(update=summary))


async def get_checkpoints(rooms: Rooms, conn: Conn, frame: wire.GetCheckpoints) -> wire.AnyFrame:
    record = await rooms.run(conn.who, Act.GET_CHECKPOINTS, frame.run)
    files = _files(rooms)
    book = await files.book(record.id)
    source, kept, step = record.id, book.kept, frame.step
    if not kept and record.spec.from_checkpoint:
        try:
            seed, seed_step = parse_source(record.spec.from_checkpoint)
        except ValueError:
            seed, seed_step = "", None
        seed_book = await files.book(seed) if seed else CheckpointBook()
        chosen = seed_book.at_step(seed_step)
        if chosen is not None:
            source, kept, step = seed, [chosen], None
    answer = wire.Checkpoints(
        rid=frame.rid,
        run=record.id,
        source=source,
        checkpoints=kept,
        limit=rooms.config.checkpoint_limit,
    )
    if not frame.with_files:
        return answer
    chosen = CheckpointBook(kept=kept).at_step(step)
    if chosen is None:
        return answer
    try:
        got = await files.read_set(chosen.files)
    except SetError as exc:
        return wire.Error(
            code=ErrorCode.NO_SUCH_BLOB,
            message=f"run {source}'s checkpoint of step {chosen.step} is lost: {exc}",
            rid=frame.rid,
        )
    return answer.model_copy(update={"files": got})


async def put_outputs(rooms: Rooms, conn: Conn, frame: wire.PutOutputs) -> wire.AnyFrame:
    record = await _worker_run(rooms, conn, Act.PUT_OUTPUTS, frame.run, frame.attempt, frame.node)
    files = _files(rooms)
    got = await _uploaded(rooms, conn, files, frame.files, "the outputs", record)
    merged = await files.add_outputs(record.id, got)
    summary = {"outputs": len(merged.files), "outputs_bytes": merged.size}
    await rooms.registry.update(record.id, lambda r: r.model_copy(update=summary))
    return wire.OutputsStored(rid=frame.rid, count=len(merged.files), size=merged.size)


async def get_outputs(rooms: Rooms, conn: Conn, frame: wire.GetOutputs) -> wire.AnyFrame:
    record = await rooms.run(conn.who, Act.GET_OUTPUTS, frame.run)
    try:
        got = await _files(rooms).outputs(record.id)
    except SetError as exc:
        return wire.Error(
            code=ErrorCode.NO_SUCH_BLOB,
            message=f"run {record.id}'s outputs are lost: {exc}",
            rid=frame.rid,
        )
    return wire.Outputs(rid=frame.rid, run=record.id, files=got)
