"""Snapshotting the submitted working directory: a manifest of content-addressed files.

Which files: inside a git work tree, what git would commit (tracked files plus untracked ones not
ignored: ``git ls-files --cached --others --exclude-standard``); elsewhere, every file except those
matched by the root ``.gitignore`` and the usual caches (``.git``, ``.venv``, ``__pycache__``,
``node_modules``). In both cases patterns in a root ``.tetherignore`` (``.gitignore`` syntax, no
``!``) are left out too, tracked or not: that is where large data and checkpoints go.

Symlinks are kept as symlinks when they point inside the tree; one pointing out (``data ->
/mnt/datasets``) is left out with a warning: hand such data to the run with ``--mount``.

:func:`build_snapshot` hashes every file (SHA-256) into a :class:`~protocol_specs.snapshots.Manifest`;
:func:`submit_snapshot` uploads what the relay lacks and submits the run on the snapshot's root
tree (``protocol_specs/trees.py``): the relay is asked about the root, then only about what each
changed directory names, so a second submit of a big tree with one changed file sends that file
and the few trees above it.

Hashing a big tree on every submit would cost more than the upload it saves, so a
:class:`HashCache` (one small file per working directory under ``$TETHER_HOME/cache``) remembers
each file's digest with its size, mtime, ctime and inode, as git's index does: a file whose stat
is unchanged is not read again. A file modified within :data:`RACY_SECONDS` of when its digest was
taken is never trusted (a write in the same clock tick would leave its stat unchanged).
"""

from __future__ import annotations

import fnmatch
import hashlib
import os
import stat
import subprocess
from collections.abc import AsyncIterator, Callable, Iterable
from dataclasses import dataclass, field
from pathlib import Path
from time import time_ns

import msgpack
import trio
from pydantic import ValidationError

from protocol_specs.runs import RunRecord, RunSpec
from protocol_specs.snapshots import (
    BLOB_CHUNK,
    MAX_FILE_BYTES,
    MAX_PATH_CHARS,
    Manifest,
    ManifestEntry,
    check_relative_path,
    file_entry,
)
from protocol_specs.trees import Trees, build_trees
from protocol_specs.wire import ErrorCode
from relay.client import ControlClient, RelayError

__all__ = [
    "DEFAULT_LIMIT",
    "HashCache",
    "Snapshot",
    "SnapshotError",
    "Uploaded",
    "build_snapshot",
    "list_files",
    "submit_snapshot",
    "upload_snapshot",
]

#: the most bytes a snapshot may hold unless the user says otherwise (``--snapshot-limit``)
DEFAULT_LIMIT = 2 * 1024**3

ALWAYS_SKIPPED = {
    ".git",
    ".venv",
    "venv",
    "__pycache__",
    "node_modules",
    ".mypy_cache",
    ".pytest_cache",
    ".ruff_cache",
}


class SnapshotError(ValueError):
    """The working directory cannot be snapshotted as it is; the message says what to change."""


def _size(n: float) -> str:
    for unit in ("bytes", "KiB", "MiB", "GiB"):
        if n < 1024 or unit == "GiB":
            return f"{n:.0f} {unit}" if unit == "bytes" else f"{n:.1f} {unit}"
        n /= 1024
    return ""


def list_files(root: Path) -> list[str]:
    """Relative paths of the files and symlinks a snapshot of ``root`` contains, sorted."""
    return [rel for rel, _ in scan(root)]


def scan(root: Path) -> list[tuple[str, os.stat_result]]:
    """The files and symlinks a snapshot of ``root`` contains, sorted by path, each with its
    ``lstat`` (one system call a file: a second submit of a big tree is mostly this)."""
    top = os.fspath(root)
    try:
        out = subprocess.run(
            ["git", "ls-files", "-z", "--cached", "--others", "--exclude-standard"],
            cwd=root,
            capture_output=True,
            check=True,
        ).stdout
        found = []
        for rel in dict.fromkeys(out.decode().split("\0")):
            if rel and not _skipped(rel) and (st := _file_or_link(os.path.join(top, rel))):
                found.append((rel, st))
    except (OSError, subprocess.CalledProcessError):
        found = _walk(top)
    extra = _patterns(root / ".tetherignore")
    if extra:
        found = [(rel, st) for rel, st in found if not _ignored(rel, extra)]
    found.sort(key=lambda item: item[0])
    return found


def _file_or_link(path: str) -> os.stat_result | None:
    try:
        st = os.lstat(path)
    except OSError:
        return None  # deleted but still in git's index
    return st if stat.S_ISREG(st.st_mode) or stat.S_ISLNK(st.st_mode) else None


def _skipped(rel: str) -> bool:
    return any(part in ALWAYS_SKIPPED for part in rel.split("/"))


def _patterns(path: Path) -> list[str]:
    try:
        lines = path.read_text().splitlines()
    except OSError:
        return []
    return [line.strip() for line in lines if line.strip() and not line.startswith(("#", "!"))]


def _ignored(rel: str, patterns: list[str]) -> bool:
    parts = rel.split("/")
    for pattern in patterns:
        p = pattern.rstrip("/")
        anchored = p.startswith("/")
        p = p.lstrip("/")
        if "/" in p or anchored:
            if fnmatch.fnmatch(rel, p) or any(
                fnmatch.fnmatch("/".join(parts[:i]), p) for i in range(1, len(parts))
            ):
                return True
        elif any(fnmatch.fnmatch(part, p) for part in parts):
            return True
    return False


def _walk(top: str) -> list[tuple[str, os.stat_result]]:
    """Every file and symlink under ``top`` but the usual caches and what the root
    ``.gitignore`` names; a symlink to a directory is kept as a symlink, not entered."""
    patterns = _patterns(Path(top, ".gitignore"))
    found = []
    pending = [""]
    while pending:
        rel_dir = pending.pop()
        try:
            entries = list(os.scandir(os.path.join(top, rel_dir)))
        except OSError:
            continue  # unreadable: left out, as os.walk does
        for entry in entries:
            rel = f"{rel_dir}/{entry.name}" if rel_dir else entry.name
            try:
                is_dir = entry.is_dir()
                if is_dir and entry.name in ALWAYS_SKIPPED:
                    continue
                if patterns and _ignored(rel, patterns):
                    continue
                if entry.is_symlink():
                    found.append((rel, entry.stat(follow_symlinks=False)))
                elif is_dir:
                    pending.append(rel)
                elif entry.is_file(follow_symlinks=False):
                    found.append((rel, entry.stat(follow_symlinks=False)))
            except OSError:
                continue  # gone meanwhile
    return found


@dataclass
class Snapshot:
    root: Path
    manifest: Manifest
    #: digest -> a relative path holding those bytes
    sources: dict[str, str]
    #: what was left out, and why (symlinks pointing out of the tree)
    warnings: list[str] = field(default_factory=list)


def _hash_file(path: str | Path) -> str:
    digest = hashlib.sha256()
    with open(path, "rb") as f:
        while chunk := f.read(1024 * 1024):
            digest.update(chunk)
    return digest.hexdigest()


#: a digest taken this close to the file's last change is not reused
RACY_SECONDS = 2.0


class HashCache:
    """Digests of a tree's files by stat, kept in ``path`` between snapshots (see the module doc)."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self._old: dict[str, list[int | str]] = {}
        self._new: dict[str, list[int | str]] = {}
        try:
            loaded = msgpack.unpackb(path.read_bytes())
            if isinstance(loaded, dict):
                self._old = loaded
        except (OSError, ValueError, msgpack.ExtraData, msgpack.FormatError, msgpack.StackError):
            pass

    @classmethod
    def for_tree(cls, cache_dir: Path, root: Path) -> HashCache:
        key = hashlib.sha256(str(root.resolve()).encode()).hexdigest()[:32]
        return cls(cache_dir / f"{key}.msgpack")

    @staticmethod
    def _stamp(st: os.stat_result) -> list[int | str]:
        return [st.st_size, st.st_mtime_ns, st.st_ctime_ns, st.st_ino]

    def digest(self, rel: str, path: str | Path, st: os.stat_result) -> str:
        stamp = self._stamp(st)
        known = self._old.get(rel)
        if known is not None and known[:4] == stamp:
            digest = str(known[4])
        else:
            digest = _hash_file(path)
        if time_ns() - st.st_mtime_ns > RACY_SECONDS * 1e9:
            self._new[rel] = [*stamp, digest]
        return digest

    def save(self) -> None:
        """Keep what this snapshot learnt (only the files it saw); a failure only costs speed."""
        try:
            self.path.parent.mkdir(parents=True, exist_ok=True)
            tmp = self.path.with_suffix(".tmp")
            tmp.write_bytes(msgpack.packb(self._new))
            tmp.replace(self.path)
        except OSError:
            pass


def build_snapshot(
    root: Path, *, limit: int = DEFAULT_LIMIT, cache: HashCache | None = None
) -> Snapshot:
    """Hash the files of ``root`` into a manifest; :class:`SnapshotError` says what is wrong.
    With ``cache``, files whose stat did not change are not read again."""
    entries: list[ManifestEntry] = []
    sources: dict[str, str] = {}
    warnings: list[str] = []
    total = 0
    top = os.fspath(root)
    for rel, st in scan(root):
        path = os.path.join(top, rel)
        try:
            if stat.S_ISLNK(st.st_mode):
                target = os.readlink(path)
                try:
                    entries.append(ManifestEntry(path=rel, kind="symlink", target=target))
                except ValidationError:
                    warnings.append(
                        f"{rel} -> {target} points outside the working directory; left out "
                        "(give such data to the run with --mount NAME=PATH)"
                    )
                continue
            if st.st_size > MAX_FILE_BYTES:
                raise SnapshotError(
                    f"{rel} is {_size(st.st_size)}, over the {_size(MAX_FILE_BYTES)} limit for one "
                    "file; add it to .tetherignore (and hand it to the run with --mount)"
                )
            total += st.st_size
            if total > limit:
                raise SnapshotError(
                    f"the working directory holds more than {_size(limit)} (reached at {rel}); "
                    "add large files (data, checkpoints) to .tetherignore or .gitignore, or raise "
                    "--snapshot-limit"
                )
            digest = cache.digest(rel, path, st) if cache else _hash_file(path)
            if "\\" in rel or len(rel) > MAX_PATH_CHARS:  # else a scanned name is a normal one
                check_relative_path(rel)
        except PermissionError:
            raise SnapshotError(
                f"cannot read {rel}: permission denied; add it to .tetherignore"
            ) from None
        except OSError as exc:
            raise SnapshotError(f"cannot read {rel}: {exc.strerror or exc}") from None
        except ValueError as exc:
            raise SnapshotError(f"cannot snapshot {rel!r}: {exc}") from None
        # checked here, not again field by field
        entries.append(file_entry(rel, st.st_mode & 0o777, st.st_size, digest))
        sources.setdefault(digest, rel)
    try:
        manifest = Manifest(entries=entries)
    except ValidationError as exc:
        raise SnapshotError(f"cannot snapshot {root}: {exc.errors()[0]['msg']}") from None
    if cache is not None:
        cache.save()
    return Snapshot(root, manifest, sources, warnings)


@dataclass
class Uploaded:
    blobs: int  #: blobs uploaded
    bytes: int  #: bytes uploaded
    reused: int  #: blobs the relay already had
    trees: int = 0  #: tree objects uploaded (``protocol_specs/trees.py``)


async def upload_snapshot(
    control: ControlClient,
    snapshot: Snapshot,
    on_progress: Callable[[int, int], None] = lambda _done, _total: None,
    *,
    trees: Trees | None = None,
) -> Uploaded:
    """Upload what the relay lacks of the snapshot; ``on_progress(bytes done, bytes to do)`` as it
    goes. With ``trees``, the relay is asked top-down (an unchanged directory is one digest, its
    files are not asked about) and the trees it lacks are uploaded after the files, deepest first;
    without, it is asked about every file."""
    digests = snapshot.manifest.digests
    if trees is None:
        missing, lacking_trees = await control.missing_blobs(digests), list[str]()
    else:
        missing, lacking_trees = await _missing_top_down(control, trees)
    sizes = {e.digest: e.size for e in snapshot.manifest.entries if e.kind == "file"}
    files = [d for d in missing if d in sizes]
    todo = sum(sizes[d] for d in files)
    done = 0

    def count(n: int) -> None:
        nonlocal done
        done += n
        on_progress(done, todo)

    small = [d for d in files if sizes[d] <= BLOB_CHUNK]
    try:
        await control.put_small_blobs(
            _read_files(snapshot, small), lambda _d, n: count(n)
        )  # many on their way at once
        for digest in files:
            if sizes[digest] > BLOB_CHUNK:
                await _put_big(control, snapshot, digest, sizes[digest], count)
    except RelayError as exc:
        if exc.code == ErrorCode.BAD_BLOB:
            rel = next((snapshot.sources[d] for d in files if d[:12] in exc.message), "a file")
            raise SnapshotError(f"{rel} changed while it was being uploaded") from None
        raise
    if trees is not None:
        await _upload_trees(control, trees, lacking_trees)
    return Uploaded(
        blobs=len(files), bytes=todo, reused=len(digests) - len(files), trees=len(lacking_trees)
    )


async def _read_files(snapshot: Snapshot, digests: list[str]) -> AsyncIterator[tuple[str, bytes]]:
    """Each blob's bytes, read in worker threads a batch at a time."""
    for i in range(0, len(digests), 64):
        batch = digests[i : i + 64]

        def read(batch: list[str] = batch) -> list[bytes]:
            out = []
            for digest in batch:
                rel = snapshot.sources[digest]
                try:
                    out.append((snapshot.root / rel).read_bytes())
                except OSError as exc:  # gone or unreadable since it was hashed
                    raise SnapshotError(f"cannot read {rel}: {exc.strerror or exc}") from None
            return out

        for digest, data in zip(batch, await trio.to_thread.run_sync(read), strict=True):
            yield digest, data


async def _put_big(
    control: ControlClient,
    snapshot: Snapshot,
    digest: str,
    size: int,
    count: Callable[[int], None],
) -> None:
    """A blob of more than one piece, piece by piece."""
    with open(snapshot.root / snapshot.sources[digest], "rb") as f:  # noqa: ASYNC230 (read in worker threads)

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
    tree. A relay that holds a tree but lost something below it (its blob collection spares what
    was used lately, not what a kept tree names) refuses the submit: then every tree and file is
    asked about and the submit made again."""
    trees = build_trees(snapshot.manifest)
    uploaded = await upload_snapshot(control, snapshot, on_progress, trees=trees)
    try:
        return await control.submit(spec, tree=trees.root), uploaded
    except RelayError as exc:
        if exc.code != ErrorCode.MISSING_BLOBS:
            raise
    again = await upload_snapshot(control, snapshot, on_progress)
    await _upload_trees(control, trees, await control.missing_blobs(trees.order))
    record = await control.submit(spec, tree=trees.root)
    return record, Uploaded(
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
