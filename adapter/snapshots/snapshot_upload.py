"""Uploading a snapshot (``adapter/snapshots/snapshot.py``) and submitting a run on it.

The relay is asked about the root tree, then about what each tree it lacks names, level by level:
an unchanged directory is one digest however big. The files it lacks go first, many on their way at
once (:meth:`~relay.client.ControlClient.put_small_blobs`), then the trees it lacks, deepest first,
so a tree is never stored before what it names; then the submit names the root.
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Awaitable, Callable, Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import TypeVar

import trio

from protocol_specs.runs.runs import RunRecord
from protocol_specs.runs.spec import RunSpec
from protocol_specs.snapshots.snapshots import BLOB_CHUNK
from protocol_specs.snapshots.trees import Trees
from protocol_specs.wire.wire import ErrorCode
from relay.client import ControlClient, RelayError

from .snapshot import Snapshot, SnapshotError

__all__ = ["Uploaded", "submit_on_snapshot", "submit_snapshot", "upload_snapshot"]

_T = TypeVar("_T")


@dataclass
class Uploaded:
    blobs: int  #: blobs uploaded
    bytes: int  #: bytes uploaded
    reused: int  #: blobs the relay already had
    trees: int = 0  #: tree objects uploaded (``protocol_specs/snapshots/trees.py``)


async def upload_snapshot(
    control: ControlClient,
    snapshot: Snapshot,
    on_progress: Callable[[int, int], None] = lambda _done, _total: None,
    *,
    top_down: bool = True,
) -> Uploaded:
    """Upload what the relay lacks of the snapshot; ``on_progress(bytes done, bytes to do)`` as it
    goes. ``top_down``: the relay is asked about the root, then about what each tree it lacks
    names (an unchanged directory is one digest, its files are not asked about), and the trees it
    lacks are uploaded after the files, deepest first; else it is asked about every file (and the
    trees are left to the caller)."""
    trees = snapshot.trees
    if top_down:
        missing, lacking_trees = await _missing_top_down(control, trees)
        where = snapshot.files_in(lacking_trees)
        reused = snapshot.files - len([d for d in missing if d in where])
    else:
        where = snapshot.files_in(trees.order)
        missing, lacking_trees = await control.missing_blobs(list(where)), []
        reused = len(where) - len(missing)
    files = [d for d in missing if d in where]
    sizes = {d: size for d, (_, size) in where.items()}
    todo = sum(sizes[d] for d in files)
    done = 0

    def count(n: int) -> None:
        nonlocal done
        done += n
        on_progress(done, todo)

    small = [d for d in files if sizes[d] <= BLOB_CHUNK]
    try:
        await control.put_small_blobs(
            _read_files(snapshot.root, where, small), lambda _d, n: count(n)
        )  # many on their way at once
        for digest in files:
            if sizes[digest] > BLOB_CHUNK:
                await _put_big(
                    control, snapshot.root / where[digest][0], digest, sizes[digest], count
                )
    except RelayError as exc:
        if exc.code == ErrorCode.BAD_BLOB:
            rel = next((where[d][0] for d in files if d[:12] in exc.message), "a file")
            raise SnapshotError(f"{rel} changed while it was being uploaded") from None
        raise
    await _upload_trees(control, trees, lacking_trees)
    return Uploaded(blobs=len(files), bytes=todo, reused=reused, trees=len(lacking_trees))


async def _read_files(
    root: Path, where: dict[str, tuple[str, int]], digests: list[str]
) -> AsyncIterator[tuple[str, bytes]]:
    """Each blob's bytes, read in worker threads a batch at a time."""
    for i in range(0, len(digests), 64):
        batch = digests[i : i + 64]

        def read(batch: list[str] = batch) -> list[bytes]:
            out = []
            for digest in batch:
                rel = where[digest][0]
                try:
                    out.append((root / rel).read_bytes())
                except OSError as exc:  # gone or unreadable since it was hashed
                    raise SnapshotError(f"cannot read {rel}: {exc.strerror or exc}") from None
            return out

        for digest, data in zip(batch, await trio.to_thread.run_sync(read), strict=True):
            yield digest, data


async def _put_big(
    control: ControlClient, path: Path, digest: str, size: int, count: Callable[[int], None]
) -> None:
    """A blob of more than one piece, piece by piece."""
    with open(path, "rb") as f:  # noqa: ASYNC230 (read in worker threads)

        async def read(offset: int, length: int) -> bytes:
            def piece() -> bytes:
                f.seek(offset)
                return f.read(length)

            return await trio.to_thread.run_sync(piece)

        await control.put_blob(digest, (size, read), count)


async def _missing_top_down(control: ControlClient, trees: Trees) -> tuple[list[str], list[str]]:
    """(what the relay lacks, the trees among it), asking about the root, then about what each
    lacking tree names, level by level."""
    lacking: list[str] = []
    level = [trees.root]
    while level:
        missing = await control.missing_blobs(level)
        lacking += missing
        level = trees.children(d for d in missing if d in trees.blobs)
    return lacking, [d for d in lacking if d in trees.blobs]


async def submit_snapshot(
    control: ControlClient,
    spec: RunSpec,
    snapshot: Snapshot,
    on_progress: Callable[[int, int], None] = lambda _done, _total: None,
) -> tuple[RunRecord, Uploaded]:
    """Upload what the relay lacks of ``snapshot`` and submit ``spec`` on it, named by its root
    tree (:func:`submit_on_snapshot`)."""
    return await submit_on_snapshot(
        control, snapshot, lambda tree: control.submit(spec, tree=tree), on_progress
    )


async def submit_on_snapshot(
    control: ControlClient,
    snapshot: Snapshot,
    submit: Callable[[str], Awaitable[_T]],
    on_progress: Callable[[int, int], None] = lambda _done, _total: None,
) -> tuple[_T, Uploaded]:
    """Upload what the relay lacks of ``snapshot``, then ``submit(root tree)`` (a run, a sweep).
    A relay that holds a tree but lost something below it (its blob collection spares what was
    used lately, not what a kept tree names) refuses the submit: then every tree and file is
    asked about and the submit made again."""
    trees = snapshot.trees
    uploaded = await upload_snapshot(control, snapshot, on_progress)
    try:
        return await submit(trees.root), uploaded
    except RelayError as exc:
        if exc.code != ErrorCode.MISSING_BLOBS:
            raise
    again = await upload_snapshot(control, snapshot, on_progress, top_down=False)
    await _upload_trees(control, trees, await control.missing_blobs(trees.order))
    done = await submit(trees.root)
    return done, Uploaded(
        blobs=uploaded.blobs + again.blobs,
        bytes=uploaded.bytes + again.bytes,
        reused=again.reused,
        trees=uploaded.trees,
    )


async def _upload_trees(control: ControlClient, trees: Trees, lacking: list[str]) -> None:
    """The trees the relay lacks, each after everything it names (in :attr:`Trees.order`): the
    small ones many at a time, one of over a piece (some 40,000 entries) on its own."""
    wanted = set(lacking)
    run: list[str] = []
    for digest in [*(d for d in trees.order if d in wanted), ""]:
        if digest and len(trees.blobs[digest]) <= BLOB_CHUNK:
            run.append(digest)
            continue
        await control.put_small_blobs(_aiter((d, trees.blobs[d]) for d in run))
        run = []
        if digest:
            await control.put_blob(digest, trees.blobs[digest])


async def _aiter(items: Iterable[tuple[str, bytes]]) -> AsyncIterator[tuple[str, bytes]]:
    for item in items:
        yield item
