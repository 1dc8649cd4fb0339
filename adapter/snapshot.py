"""Snapshotting the submitted working directory: a manifest of content-addressed files.

Which files: inside a git work tree, what git would commit (tracked files plus untracked ones not
ignored: ``git ls-files --cached --others --exclude-standard``); elsewhere, every file except those
matched by the root ``.gitignore`` and the usual caches (``.git``, ``.venv``, ``__pycache__``,
``node_modules``). In both cases patterns in a root ``.tetherignore`` (``.gitignore`` syntax, no
``!``) are left out too, tracked or not: that is where large data and checkpoints go.

Symlinks are kept as symlinks when they point inside the tree; one pointing out (``data ->
/mnt/datasets``) is left out with a warning: hand such data to the run with ``--mount``.

:func:`build_snapshot` hashes every file (SHA-256) into a :class:`~protocol_specs.snapshots.Manifest`;
:func:`upload_snapshot` asks the relay which blobs it lacks and uploads those alone.

Hashing a big tree on every submit would cost more than the upload it saves, so a
:class:`HashCache` (one small file per working directory under ``$TETHER_HOME/cache``) remembers
each file's digest with its size, mtime, ctime and inode, as git's index does: a file whose stat
is unchanged is not read again. A file modified within :data:`RACY_SECONDS` of when its digest was
taken is never trusted (a write in the same clock tick would leave its stat unchanged).
"""

from __future__ import annotations

import fnmatch
import hashlib
import json
import os
import stat
import subprocess
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from time import time_ns
from typing import BinaryIO

import trio
from pydantic import ValidationError

from protocol_specs.snapshots import MAX_FILE_BYTES, Manifest, ManifestEntry
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
    try:
        out = subprocess.run(
            ["git", "ls-files", "-z", "--cached", "--others", "--exclude-standard"],
            cwd=root,
            capture_output=True,
            check=True,
        ).stdout
        names = [n for n in out.decode().split("\0") if n]
        found = [n for n in names if not _skipped(n) and _is_file_or_link(root / n)]
    except (OSError, subprocess.CalledProcessError):
        found = _walk(root)
    extra = _patterns(root / ".tetherignore")
    return sorted({n for n in found if not _ignored(n, extra)})


def _is_file_or_link(path: Path) -> bool:
    try:
        mode = path.lstat().st_mode
    except OSError:
        return False  # deleted but still in git's index
    return stat.S_ISREG(mode) or stat.S_ISLNK(mode)


def _skipped(rel: str) -> bool:
    return any(part in ALWAYS_SKIPPED for part in Path(rel).parts)


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


def _walk(root: Path) -> list[str]:
    patterns = _patterns(root / ".gitignore")
    found = []
    for dirpath, dirnames, filenames in os.walk(root):
        rel_dir = os.path.relpath(dirpath, root)
        keep = []
        for d in dirnames:
            rel = os.path.normpath(os.path.join(rel_dir, d))
            if d in ALWAYS_SKIPPED or _ignored(rel, patterns):
                continue
            if os.path.islink(os.path.join(dirpath, d)):
                found.append(rel)  # a symlink to a directory: kept as a symlink, not entered
            else:
                keep.append(d)
        dirnames[:] = keep
        for name in filenames:
            rel = os.path.normpath(os.path.join(rel_dir, name))
            if not _ignored(rel, patterns) and _is_file_or_link(Path(dirpath, name)):
                found.append(rel)
    return sorted(found)


@dataclass
class Snapshot:
    root: Path
    manifest: Manifest
    #: digest -> a relative path holding those bytes
    sources: dict[str, str]
    #: what was left out, and why (symlinks pointing out of the tree)
    warnings: list[str] = field(default_factory=list)


def _hash_file(path: Path) -> str:
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
            loaded = json.loads(path.read_text())
            if isinstance(loaded, dict):
                self._old = loaded
        except (OSError, ValueError):
            pass

    @classmethod
    def for_tree(cls, cache_dir: Path, root: Path) -> HashCache:
        key = hashlib.sha256(str(root.resolve()).encode()).hexdigest()[:32]
        return cls(cache_dir / f"{key}.json")

    @staticmethod
    def _stamp(st: os.stat_result) -> list[int | str]:
        return [st.st_size, st.st_mtime_ns, st.st_ctime_ns, st.st_ino]

    def digest(self, rel: str, path: Path, st: os.stat_result) -> str:
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
            tmp.write_text(json.dumps(self._new, separators=(",", ":")))
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
    for rel in list_files(root):
        path = root / rel
        try:
            st = path.lstat()
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
        except PermissionError:
            raise SnapshotError(
                f"cannot read {rel}: permission denied; add it to .tetherignore"
            ) from None
        except OSError as exc:
            raise SnapshotError(f"cannot read {rel}: {exc.strerror or exc}") from None
        entries.append(
            ManifestEntry(path=rel, mode=st.st_mode & 0o777, size=st.st_size, digest=digest)
        )
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


async def upload_snapshot(
    control: ControlClient,
    snapshot: Snapshot,
    on_progress: Callable[[int, int], None] = lambda _done, _total: None,
) -> Uploaded:
    """Upload the blobs the relay lacks; ``on_progress(bytes done, bytes to do)`` as it goes."""
    digests = snapshot.manifest.digests
    missing = await control.missing_blobs(digests)
    sizes = {e.digest: e.size for e in snapshot.manifest.entries if e.kind == "file"}
    todo = sum(sizes[d] for d in missing)
    done = 0

    def count(n: int) -> None:
        nonlocal done
        done += n
        on_progress(done, todo)

    for digest in missing:
        rel = snapshot.sources[digest]
        with open(snapshot.root / rel, "rb") as f:  # noqa: ASYNC230 (read in worker threads)

            async def read(offset: int, length: int, f: BinaryIO = f) -> bytes:
                def piece() -> bytes:
                    f.seek(offset)
                    return f.read(length)

                return await trio.to_thread.run_sync(piece)

            try:
                await control.put_blob(digest, (sizes[digest], read), count)
            except RelayError as exc:
                if exc.code == ErrorCode.BAD_BLOB:
                    raise SnapshotError(f"{rel} changed while it was being uploaded") from None
                raise
    return Uploaded(blobs=len(missing), bytes=todo, reused=len(digests) - len(missing))
