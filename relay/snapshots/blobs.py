"""Snapshot blobs: file contents named by their SHA-256 digest (``protocol_specs.snapshots.snapshots``).

:class:`BlobStore` is the seam; :class:`FileBlobStore` (the default) keeps blobs as files under the
relay's data directory (``<root>/ab/cdef...``), :class:`MemoryBlobStore` in a dict (tests). An
S3-compatible store is the next implementation: the interface is put-by-digest, get-by-range.

An upload arrives in pieces (``begin`` -> ``write`` ... -> ``commit``). The bytes are hashed as they
arrive; ``commit`` refuses a blob whose bytes do not match its digest, so a stored blob is always
what its name says. A part file is written beside the blobs and renamed into place atomically;
concurrent uploads of the same blob each write their own part file and the last rename wins (same
bytes). Files are read and written in worker threads, never on the event loop.

Garbage: :meth:`BlobStore.sweep` deletes the blobs no live run's snapshot names (the relay asks it,
``relay/server.py``), sparing those stored or asked about recently: a submit that just uploaded or
found a blob names it a moment later.

Several relays sharing one Redis must share the blob directory (one host, or a shared filesystem),
or use an object store.
"""

from __future__ import annotations

import hashlib
import os
import secrets
import time
from collections.abc import Callable
from pathlib import Path
from typing import Protocol

import trio

from protocol_specs.snapshots.snapshots import MAX_FILE_BYTES

__all__ = ["BlobError", "BlobStore", "FileBlobStore", "MemoryBlobStore", "Upload"]


class BlobError(Exception):
    """A blob upload or read that cannot proceed; the message says why."""


class Upload(Protocol):
    digest: str
    size: int
    received: int

    async def write(self, data: bytes) -> None: ...

    async def commit(self) -> None:
        """Store the blob; :class:`BlobError` if the bytes do not match the digest or size."""
        ...

    async def abort(self) -> None: ...


class BlobStore(Protocol):
    async def missing(self, digests: list[str]) -> list[str]:
        """The ``digests`` this store does not hold, in the given order."""
        ...

    async def begin(self, digest: str, size: int) -> Upload: ...

    async def put(self, digest: str, data: bytes) -> None:
        """Store a whole blob sent in one piece (a file of a snapshot is mostly that), at the cost
        of one upload's ``begin``, ``write`` and ``commit``; :class:`BlobError` as they would."""
        ...

    async def read(self, digest: str, offset: int, length: int) -> tuple[int, bytes]:
        """``(blob size, bytes [offset, offset+length))``; :class:`BlobError` if absent."""
        ...

    async def sweep(self, keep: Callable[[str], bool], older_than: float) -> int:
        """Delete the blobs ``keep`` refuses that were last asked about (``missing``) or stored
        before ``older_than`` (wall-clock seconds); how many went."""
        ...


def _check_size(size: int) -> None:
    if size > MAX_FILE_BYTES:
        raise BlobError(f"a blob of {size} bytes exceeds the {MAX_FILE_BYTES}-byte file limit")


class _HashingUpload:
    def __init__(self, digest: str, size: int) -> None:
        self.digest = digest
        self.size = size
        self.received = 0
        self._hash = hashlib.sha256()

    def _take(self, data: bytes) -> None:
        if self.received + len(data) > self.size:
            raise BlobError(f"blob {self.digest[:12]}: more than the announced {self.size} bytes")
        self._hash.update(data)
        self.received += len(data)

    def _verify(self) -> None:
        if self.received != self.size:
            raise BlobError(
                f"blob {self.digest[:12]}: {self.received} of {self.size} bytes received"
            )
        if self._hash.hexdigest() != self.digest:
            raise BlobError(f"blob {self.digest[:12]}: the bytes do not match the digest")


class FileBlobStore:
    def __init__(self, root: Path) -> None:
        self.root = root
        self._top = os.fspath(root)
        root.mkdir(mode=0o700, parents=True, exist_ok=True)  # users' files: the relay's only
        (root / "incoming").mkdir(mode=0o700, exist_ok=True)

    def __repr__(self) -> str:
        return f"<FileBlobStore {self.root}>"

    def path(self, digest: str) -> Path:
        return self.root / digest[:2] / digest[2:]

    def _where(self, digest: str) -> str:
        """:meth:`path` as text, made without pathlib (asked for twenty thousand at a time)."""
        return os.path.join(self._top, digest[:2], digest[2:])

    async def missing(self, digests: list[str]) -> list[str]:
        return await trio.to_thread.run_sync(self._missing, digests)

    def _missing(self, digests: list[str]) -> list[str]:
        """The absent ones; the present ones are marked used now (a sweep spares them a while:
        the submit that asked is about to name them)."""
        out = []
        for digest in digests:
            try:
                os.utime(self._where(digest))
            except OSError:
                out.append(digest)
        return out

    async def sweep(self, keep: Callable[[str], bool], older_than: float) -> int:
        def sweep() -> int:
            gone = 0
            for part in self.root.glob("[0-9a-f][0-9a-f]/*"):
                digest = part.parent.name + part.name
                try:
                    if not keep(digest) and part.stat().st_mtime < older_than:
                        part.unlink()
                        gone += 1
                except OSError:
                    continue
            return gone

        return await trio.to_thread.run_sync(sweep)

    async def begin(self, digest: str, size: int) -> Upload:
        _check_size(size)
        return await trio.to_thread.run_sync(_FileUpload, self, digest, size)

    async def put(self, digest: str, data: bytes) -> None:
        _check_size(len(data))

        def put() -> None:  # in one worker thread: a small blob costs one hop, not three
            upload = _FileUpload(self, digest, len(data))
            try:
                upload._take(data)
                upload._file.write(data)
                upload._finish()
            except BaseException:
                upload._discard()
                raise

        await trio.to_thread.run_sync(put)

    async def read(self, digest: str, offset: int, length: int) -> tuple[int, bytes]:
        def read() -> tuple[int, bytes]:
            try:
                with open(self.path(digest), "rb") as f:
                    size = os.fstat(f.fileno()).st_size
                    f.seek(offset)
                    return size, f.read(length)
            except FileNotFoundError:
                raise BlobError(f"no blob {digest[:12]}") from None

        return await trio.to_thread.run_sync(read)


class _FileUpload(_HashingUpload):
    def __init__(self, store: FileBlobStore, digest: str, size: int) -> None:
        super().__init__(digest, size)
        self.store = store
        self.part = store.root / "incoming" / f"{digest}.{secrets.token_hex(6)}"
        self._file = open(self.part, "wb")

    async def write(self, data: bytes) -> None:
        self._take(data)
        await trio.to_thread.run_sync(self._file.write, data)

    def _finish(self) -> None:
        self._file.close()
        self._verify()
        final = self.store.path(self.digest)
        final.parent.mkdir(exist_ok=True)
        os.replace(self.part, final)

    def _discard(self) -> None:
        self._file.close()
        self.part.unlink(missing_ok=True)

    async def commit(self) -> None:
        try:
            await trio.to_thread.run_sync(self._finish)
        except BaseException:
            await self.abort()
            raise

    async def abort(self) -> None:
        await trio.to_thread.run_sync(self._discard)


class MemoryBlobStore:
    def __init__(self, *, clock: Callable[[], float] = time.time) -> None:
        self.blobs: dict[str, bytes] = {}
        self.used: dict[str, float] = {}
        self.clock = clock

    async def missing(self, digests: list[str]) -> list[str]:
        await trio.lowlevel.checkpoint()
        now = self.clock()
        self.used.update((d, now) for d in digests if d in self.blobs)
        return [d for d in digests if d not in self.blobs]

    async def sweep(self, keep: Callable[[str], bool], older_than: float) -> int:
        await trio.lowlevel.checkpoint()
        gone = [d for d in self.blobs if not keep(d) and self.used.get(d, 0.0) < older_than]
        for digest in gone:
            del self.blobs[digest]
            self.used.pop(digest, None)
        return len(gone)

    async def begin(self, digest: str, size: int) -> Upload:
        _check_size(size)
        await trio.lowlevel.checkpoint()
        return _MemoryUpload(self, digest, size)

    async def put(self, digest: str, data: bytes) -> None:
        upload = await self.begin(digest, len(data))
        await upload.write(data)
        await upload.commit()

    async def read(self, digest: str, offset: int, length: int) -> tuple[int, bytes]:
        await trio.lowlevel.checkpoint()
        blob = self.blobs.get(digest)
        if blob is None:
            raise BlobError(f"no blob {digest[:12]}")
        return len(blob), blob[offset : offset + length]


class _MemoryUpload(_HashingUpload):
    def __init__(self, store: MemoryBlobStore, digest: str, size: int) -> None:
        super().__init__(digest, size)
        self.store = store
        self.parts: list[bytes] = []

    async def write(self, data: bytes) -> None:
        await trio.lowlevel.checkpoint()
        self._take(data)
        self.parts.append(data)

    async def commit(self) -> None:
        await trio.lowlevel.checkpoint()
        self._verify()
        self.store.blobs[self.digest] = b"".join(self.parts)
        self.store.used[self.digest] = self.store.clock()

    async def abort(self) -> None:
        self.parts.clear()
