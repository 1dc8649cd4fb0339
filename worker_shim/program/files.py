"""Materialising a run's snapshot on the worker, without trusting it.

The manifest arrives validated (``protocol_specs.snapshots.snapshots``: relative paths only, no ``..``, no entry
under another file or symlink, symlinks resolving inside the tree). On top of that:

- every blob is checked against its digest as it is downloaded (a relay serving wrong bytes fails
  the run, it does not run them);
- the run directory must be new and empty, and every directory on the way to a file is created here,
  so no path component can be a symlink someone else planted; files are opened with
  ``O_CREAT | O_EXCL | O_NOFOLLOW``;
- symlinks are created last, after every file is written, so no write can go through one.

Blobs are kept in a content-addressed cache on the worker (``<cache>/ab/cdef...``), so a rerun or a
retry on the same machine downloads nothing; files are *copied* out of the cache (the program may
change its files, never the cache).
"""

from __future__ import annotations

import contextlib
import hashlib
import os
import secrets
from collections.abc import Awaitable, Callable
from pathlib import Path

import trio

from protocol_specs.snapshots.snapshots import Manifest, check_relative_path

__all__ = ["SnapshotRefused", "materialise"]

#: fetch(digest, offset) -> (blob size, bytes from offset)
Fetch = Callable[[str, int], Awaitable[tuple[int, bytes]]]


class SnapshotRefused(Exception):
    """The snapshot cannot be materialised (bad bytes, a hostile path); the message says why."""


def _private_dir(path: Path) -> None:
    """``path`` and the directories it needs, made readable by the worker's user only (they hold
    users' code, caches of it and logs of its output)."""
    path.mkdir(mode=0o700, parents=True, exist_ok=True)


async def _cached(cache: Path, digest: str, fetch: Fetch) -> Path:
    final = cache / digest[:2] / digest[2:]
    if final.is_file():
        with contextlib.suppress(OSError):
            os.utime(final)  # used now: the last to go when the cache is trimmed
        return final
    _private_dir(final.parent)
    part = final.with_name(f"{final.name}.{secrets.token_hex(4)}.part")
    hasher = hashlib.sha256()
    try:
        with open(part, "wb") as out:  # noqa: ASYNC230 (local cache file)
            offset = 0
            while True:
                size, data = await fetch(digest, offset)
                hasher.update(data)
                await trio.to_thread.run_sync(out.write, data)
                offset += len(data)
                if offset >= size or not data:
                    break
        if hasher.hexdigest() != digest:
            raise SnapshotRefused(f"blob {digest[:12]} does not match its digest")
        os.replace(part, final)
    finally:
        part.unlink(missing_ok=True)
    return final


def _write_file(dest: Path, rel: str, source: Path, mode: int) -> None:
    check_relative_path(rel)
    parent = dest
    parts = rel.split("/")
    for name in parts[:-1]:
        parent = parent / name
        try:
            os.mkdir(parent, 0o755)
        except FileExistsError:
            if parent.is_symlink() or not parent.is_dir():
                raise SnapshotRefused(f"{rel}: {parent} is not a directory made here") from None
    fd = os.open(parent / parts[-1], os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW, 0o600)
    with open(fd, "wb") as out, open(source, "rb") as src:
        while chunk := src.read(1024 * 1024):
            out.write(chunk)
        os.fchmod(out.fileno(), mode & 0o777)


async def materialise(manifest: Manifest, dest: Path, fetch: Fetch, *, cache: Path) -> int:
    """Write the snapshot into the new directory ``dest``; returns the number of files.

    Raises :class:`SnapshotRefused` for bytes that do not match their digest or a path that
    would leave ``dest``, and ``OSError`` for local failures.
    """
    _private_dir(dest.parent)
    dest.mkdir(mode=0o700, exist_ok=False)  # noqa: ASYNC240
    files = 0
    for entry in manifest.entries:
        if entry.kind != "file":
            continue
        source = await _cached(cache, entry.digest, fetch)
        await trio.to_thread.run_sync(_write_file, dest, entry.path, source, entry.mode)
        files += 1
    for entry in manifest.entries:
        if entry.kind == "symlink":
            link = dest / entry.path
            link.parent.mkdir(parents=True, exist_ok=True)
            os.symlink(entry.target, link)
    return files
