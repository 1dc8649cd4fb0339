"""The local half of saving a directory as a file set (``relay/client/files.py``): which files
it holds (:func:`scan`), their chunks' digests (:func:`hash_file`), and the :class:`HashCache` that
spares the files whose stat is unchanged since the last save. No relay here.
"""

from __future__ import annotations

import contextlib
import errno
import hashlib
import os
import secrets
import stat
import time
from collections.abc import Callable, Iterable
from pathlib import Path

import msgpack

from protocol_specs.checkpoints.files import CHUNK
from protocol_specs.snapshots.snapshots import check_relative_path

__all__ = [
    "RACY_NS",
    "FilesError",
    "HashCache",
    "hash_batches",
    "hash_file",
    "open_regular",
    "scan",
    "size_text",
]

#: hashing: files handed to one worker thread until they hold this many bytes (or :data:`_BATCH`)
_BATCH_BYTES = 64 * CHUNK
_BATCH = 32
#: a digest taken this close to the file's last change is not reused (a write within the same
#: clock tick leaves mtime as it was)
RACY_NS = 2_000_000_000


class FilesError(Exception):
    """One clear line: over the limit, disk full, a corrupt chunk, a file that kept changing."""


def size_text(n: float) -> str:
    for unit in ("bytes", "KiB", "MiB", "GiB", "TiB"):
        if abs(n) < 1024 or unit == "TiB":
            return f"{n:.0f} {unit}" if unit == "bytes" else f"{n:.1f} {unit}"
        n /= 1024
    return f"{n} bytes"  # pragma: no cover


# -- the hash cache ------------------------------------------------------------------------------


class HashCache:
    """path -> (size, mtime_ns, ino, chunk digests) of the last save, so an unchanged file is not
    read again; kept in ``path`` between processes when one is given (a damaged cache file only
    costs speed). A digest taken within :data:`RACY_NS` of the file's mtime is not trusted."""

    VERSION = 1

    def __init__(self, path: Path | None = None) -> None:
        self.path = path
        #: rel -> [size, mtime_ns, ino, hashed_at_ns, [digests]]
        self._entries: dict[str, list[object]] = {}
        if path is not None:
            with contextlib.suppress(OSError, ValueError, TypeError, msgpack.ExtraData):
                loaded = msgpack.unpackb(path.read_bytes())
                if isinstance(loaded, dict) and loaded.get("v") == self.VERSION:
                    entries = loaded.get("files")
                    self._entries = entries if isinstance(entries, dict) else {}

    def __len__(self) -> int:
        return len(self._entries)

    def lookup(self, rel: str, st: os.stat_result) -> list[str] | None:
        """The chunk digests of ``rel`` if its stat is what it was when they were taken."""
        entry = self._entries.get(rel)
        if not isinstance(entry, list) or len(entry) != 5:
            return None
        size, mtime_ns, ino, hashed_at, chunks = entry
        if (size, mtime_ns, ino) != (st.st_size, st.st_mtime_ns, st.st_ino):
            return None
        if not isinstance(hashed_at, int) or hashed_at - st.st_mtime_ns < RACY_NS:
            return None
        if not isinstance(chunks, list) or len(chunks) != -(-st.st_size // CHUNK):
            return None
        if not all(isinstance(d, str) and len(d) == 64 for d in chunks):
            return None
        return chunks

    def remember(self, rel: str, st: os.stat_result, hashed_at: int, chunks: list[str]) -> None:
        self._entries[rel] = [st.st_size, st.st_mtime_ns, st.st_ino, hashed_at, chunks]

    def keep_only(self, paths: Iterable[str]) -> None:
        """Forget the files that are gone."""
        keep = set(paths)
        self._entries = {p: e for p, e in self._entries.items() if p in keep}

    def save(self) -> None:
        """Write it to its path (atomically); a failure only costs speed next time."""
        if self.path is None:
            return
        try:
            self.path.parent.mkdir(parents=True, exist_ok=True)
            tmp = self.path.with_name(f"{self.path.name}.{secrets.token_hex(4)}.tmp")
            tmp.write_bytes(msgpack.packb({"v": self.VERSION, "files": self._entries}))
            tmp.replace(self.path)
        except OSError:
            pass


# -- scanning and hashing ------------------------------------------------------------------------


def scan(
    root: Path, select: Callable[[str], bool] | None = None
) -> list[tuple[str, os.stat_result]]:
    """The regular files under ``root`` (relative POSIX paths, sorted, with their ``lstat``);
    symlinks and special files skipped, never followed; ``select(path)`` filters."""
    found: list[tuple[str, os.stat_result]] = []

    def walk(directory: str, prefix: str) -> None:
        try:
            with os.scandir(directory) as entries:
                listed = list(entries)
        except FileNotFoundError:
            return  # gone while we walked
        except OSError as exc:
            raise FilesError(f"cannot read {prefix or '.'}: {exc.strerror or exc}") from None
        for entry in listed:
            rel = f"{prefix}{entry.name}"
            if entry.is_dir(follow_symlinks=False):
                walk(entry.path, rel + "/")
            elif entry.is_file(follow_symlinks=False):
                if select is not None and not select(rel):
                    continue
                try:
                    check_relative_path(rel)
                    rel.encode("utf-8")
                except UnicodeEncodeError:
                    raise FilesError(f"cannot save {rel!r}: its name is not UTF-8") from None
                except ValueError as exc:
                    raise FilesError(f"cannot save {rel!r}: {exc}") from None
                with contextlib.suppress(FileNotFoundError):
                    found.append((rel, entry.stat(follow_symlinks=False)))

    walk(os.fspath(root), "")
    found.sort(key=lambda item: item[0])
    return found


def _stamp(st: os.stat_result) -> tuple[int, int, int, int]:
    return (st.st_size, st.st_mtime_ns, st.st_ctime_ns, st.st_ino)


def open_regular(path: str) -> int:
    fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | getattr(os, "O_CLOEXEC", 0))
    if not stat.S_ISREG(os.fstat(fd).st_mode):
        os.close(fd)
        raise OSError(errno.EINVAL, "not a regular file")
    return fd


def hash_file(path: str, rel: str) -> tuple[os.stat_result, int, list[str]]:
    """``(stat, hashed at (ns), chunk digests)`` of one file; a file that changes while it is read
    is read once more, then :class:`FilesError`."""
    buf = bytearray(CHUNK)
    view = memoryview(buf)
    for _ in range(2):
        hashed_at = time.time_ns()
        try:
            fd = open_regular(path)
        except OSError as exc:
            raise FilesError(f"cannot read {rel}: {exc.strerror or exc}") from None
        try:
            before = os.fstat(fd)
            chunks, total = [], 0
            while True:
                n = _read_full(fd, view)
                if n == 0:
                    break
                chunks.append(hashlib.sha256(view[:n]).hexdigest())
                total += n
                if n < CHUNK:
                    break
            after = os.fstat(fd)
        except OSError as exc:
            raise FilesError(f"cannot read {rel}: {exc.strerror or exc}") from None
        finally:
            os.close(fd)
        if _stamp(before) == _stamp(after) and total == after.st_size:
            return after, hashed_at, chunks
    raise FilesError(f"{rel} changed while it was saved; save again")


def _read_full(fd: int, view: memoryview) -> int:
    """Fill ``view`` from ``fd`` (short only at the end of the file)."""
    got = 0
    while got < len(view):
        n = os.readv(fd, [view[got:]])
        if n == 0:
            break
        got += n
    return got


def hash_batches(
    todo: list[tuple[str, os.stat_result]],
) -> Iterable[list[tuple[str, os.stat_result]]]:
    batch: list[tuple[str, os.stat_result]] = []
    held = 0
    for item in todo:
        batch.append(item)
        held += item[1].st_size
        if held >= _BATCH_BYTES or len(batch) >= _BATCH:
            yield batch
            batch, held = [], 0
    if batch:
        yield batch
