"""Saving a directory to the relay as a file set, and writing a set's files back: the engine under
checkpoints and outputs (``protocol_specs/checkpoints/files.py`` says what a set is).

:func:`upload_dir` scans a directory (regular files only, symlinks and special files skipped and
never followed), hashes each file's :data:`~protocol_specs.checkpoints.files.CHUNK`-byte chunks in
worker threads (a :class:`HashCache` spares the files whose size, mtime and inode are unchanged),
asks the relay which chunks it lacks and uploads only those, a window of them on their way at once,
each read again from its file when it is sent (memory stays a window of chunks, never a file),
then the set blob. A save of a 1 GiB file with 1% changed in place sends about 1% of it.

:func:`download` writes a set's files under a directory: each to a temporary name beside it, then
renamed; every chunk checked against its digest; no write through a symlink; the chunks read a
window at a time on one connection (:meth:`~relay.client.control.ControlClient.read_small_blobs`),
a chunk the set names twice fetched once (later copies are read back from where it was written).

Every failure a user can cause or fix is a :class:`FilesError` with one line; a lost relay stays a
:class:`~relay.client.connect.RelayError`. A cancel leaves no temporary file behind: files already
renamed into place stay, whole.
"""

from __future__ import annotations

import contextlib
import errno
import hashlib
import math
import os
import secrets
import stat
import time
from collections.abc import AsyncIterator, Callable, Iterable
from dataclasses import dataclass
from pathlib import Path

import trio

from protocol_specs.checkpoints.files import (
    CHUNK,
    MAX_SET_BYTES,
    MAX_SET_FILES,
    FileSet,
    StoredFile,
)
from protocol_specs.snapshots.snapshots import BLOB_CHUNK, check_relative_path
from protocol_specs.wire.wire import ErrorCode

from .connect import RelayError
from .control import ControlClient
from .file_hashing import (
    FilesError,
    HashCache,
    hash_batches,
    hash_file,
    open_regular,
    scan,
    size_text,
)

__all__ = ["FilesError", "HashCache", "Sent", "download", "scan", "upload_dir"]

#: chunk uploads (and chunk downloads) on their way at once: memory is this many chunks
WINDOW = 16
#: chunks read again for upload in one worker thread call
_READ_BATCH = 4


# -- upload --------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Sent:
    files: FileSet
    digest: str  #: the set blob's digest
    sent: int  #: bytes uploaded (chunks the relay lacked, and the set blob)
    hashed: int  #: bytes read to hash (the files the hash cache could not vouch for)


async def upload_dir(
    control: ControlClient,
    root: Path,
    *,
    select: Callable[[str], bool] | None = None,
    cache: HashCache | None = None,
    limit: int = 0,
    attempt: int = 0,
) -> Sent:
    """Save the regular files under ``root`` as a file set on the relay (see the module doc);
    ``limit > 0``: a :class:`FilesError` before anything is uploaded if they hold more bytes."""
    found = await trio.to_thread.run_sync(scan, root, select)
    _check_sizes(found, limit)
    chunks: dict[str, list[str]] = {}
    stats: dict[str, os.stat_result] = {}
    todo = []
    for rel, st in found:
        known = cache.lookup(rel, st) if cache is not None else None
        if known is None:
            todo.append((rel, st))
        else:
            chunks[rel], stats[rel] = known, st
    hashed = 0
    for batch in hash_batches(todo):

        def hash_batch(
            batch: list[tuple[str, os.stat_result]] = batch,
        ) -> list[tuple[os.stat_result, int, list[str]]]:
            return [hash_file(os.path.join(root, rel), rel) for rel, _ in batch]

        for (rel, _), (st, at, digests) in zip(
            batch, await trio.to_thread.run_sync(hash_batch), strict=True
        ):
            chunks[rel], stats[rel] = digests, st
            hashed += st.st_size
            if cache is not None:
                cache.remember(rel, st, at, digests)
    _check_sizes([(rel, stats[rel]) for rel, _ in found], limit)  # as they were read
    files = FileSet(
        files=[
            StoredFile(
                path=rel,
                mode=stat.S_IMODE(stats[rel].st_mode) & 0o777,
                size=stats[rel].st_size,
                mtime=stats[rel].st_mtime,
                attempt=attempt,
                chunks=chunks[rel],
            )
            for rel, _ in found
        ]
    )
    encoded = files.encode()
    digest = files.digest()
    where: dict[str, tuple[str, int]] = {}  # chunk digest -> (file, chunk index): one place
    for stored in files.files:
        for i, d in enumerate(stored.chunks):
            where.setdefault(d, (stored.path, i))
    lacking = await control.missing_blobs([*where, digest])
    send = [d for d in lacking if d in where]
    sent = 0

    def count(_digest: str, n: int) -> None:
        nonlocal sent
        sent += n

    try:
        await control.put_small_blobs(_chunks_to_send(root, where, send), count, window=WINDOW)
    except RelayError as exc:
        if exc.code == ErrorCode.BAD_BLOB:
            rel = next((where[d][0] for d in send if d[:12] in exc.message), "a file")
            raise FilesError(f"{rel} changed while it was saved; save again") from None
        raise
    if digest in lacking:
        await control.put_blob(digest, encoded)
        sent += len(encoded)
    if cache is not None:
        cache.keep_only(rel for rel, _ in found)
        await trio.to_thread.run_sync(cache.save)
    return Sent(files=files, digest=digest, sent=sent, hashed=hashed)


def _check_sizes(found: list[tuple[str, os.stat_result]], limit: int) -> None:
    if len(found) > MAX_SET_FILES:
        raise FilesError(f"{len(found):,} files: a set holds at most {MAX_SET_FILES:,}")
    total = sum(st.st_size for _, st in found)
    if total > MAX_SET_BYTES:
        raise FilesError(
            f"the files hold {size_text(total)}: a set holds at most {size_text(MAX_SET_BYTES)}"
        )
    if limit > 0 and total > limit:
        raise FilesError(f"the files hold {size_text(total)}, over the limit of {size_text(limit)}")


async def _chunks_to_send(
    root: Path, where: dict[str, tuple[str, int]], send: list[str]
) -> AsyncIterator[tuple[str, bytes]]:
    """Each chunk to upload, read again from its file a few at a time in a worker thread and
    checked against its digest (a file changed since it was hashed is a :class:`FilesError`)."""
    for i in range(0, len(send), _READ_BATCH):
        batch = send[i : i + _READ_BATCH]

        def read(batch: list[str] = batch) -> list[bytes]:
            out = []
            for digest in batch:
                rel, index = where[digest]
                try:
                    fd = open_regular(os.path.join(root, rel))
                    try:
                        data = os.pread(fd, CHUNK, index * CHUNK)
                    finally:
                        os.close(fd)
                except OSError as exc:
                    raise FilesError(f"cannot read {rel}: {exc.strerror or exc}") from None
                if hashlib.sha256(data).hexdigest() != digest:
                    raise FilesError(f"{rel} changed while it was saved; save again")
                out.append(data)
            return out

        for digest, data in zip(batch, await trio.to_thread.run_sync(read), strict=True):
            yield digest, data


# -- download ------------------------------------------------------------------------------------


@dataclass
class _Target:
    stored: StoredFile
    final: str  #: where it goes
    temp: str = ""
    fd: int = -1
    left: int = 0  #: chunks not written yet


async def download(
    control: ControlClient,
    files: Iterable[StoredFile],
    dest: Path,
    *,
    run: str = "",
    strip: str = "",
) -> int:
    """Write ``files`` under ``dest`` (``strip``: a path prefix taken off each; a file that is the
    prefix itself keeps its name), each atomically, never through a symlink, every chunk checked;
    returns the bytes written. :class:`FilesError` for a corrupt or missing chunk, a full disk,
    a path that would go through a symlink."""
    wanted = list(files)
    rels = [_stripped(f.path, strip) for f in wanted]
    need = sum(f.size for f in wanted)
    await trio.to_thread.run_sync(_make_dirs, dest, "")
    free = _free(dest)
    if need > free:
        raise FilesError(_no_space(dest, need, free))
    targets = [
        _Target(f, os.path.join(dest, rel), left=len(f.chunks))
        for f, rel in zip(wanted, rels, strict=True)
    ]
    first: dict[str, tuple[_Target, int, trio.Event]] = {}  # digest -> where it is written first
    origin: dict[str, str] = {}  # digest -> "chunk N of PATH", in the order they are fetched
    for target in targets:
        for index, digest in enumerate(target.stored.chunks):
            origin.setdefault(digest, f"chunk {index + 1} of {target.stored.path}")
    fetched: dict[str, tuple[int, bytes]] = {}
    arrived = {digest: trio.Event() for digest in origin}
    room = trio.Semaphore(WINDOW)  # chunks fetched and not written yet
    written = 0
    send, receive = trio.open_memory_channel[tuple[_Target, int]](0)

    async def fetch() -> None:
        """Every chunk once, in the order the workers take them, a window on its way."""
        delivered = 0

        async def keep(digest: str, size: int, data: bytes) -> None:
            nonlocal delivered
            await room.acquire()
            fetched[digest] = (size, data)
            delivered += 1
            arrived[digest].set()

        try:
            await control.read_small_blobs(list(origin), keep, run=run, window=WINDOW)
        except RelayError as exc:
            if exc.code == ErrorCode.NO_SUCH_BLOB and delivered < len(origin):
                digest = list(origin)[delivered]
                raise FilesError(
                    f"{origin[digest]} is missing on the relay (digest {digest[:12]})"
                ) from None
            raise

    async def feed() -> None:
        """Each file opened (in order: a window of files open at once), then its chunks."""
        async with send:
            for target, rel in zip(targets, rels, strict=True):
                await trio.to_thread.run_sync(_open_target, dest, rel, target)
                if target.left == 0:
                    await trio.to_thread.run_sync(_finish, target)
                for index in range(len(target.stored.chunks)):
                    await send.send((target, index))

    async def work() -> None:
        nonlocal written
        async for target, index in receive:
            digest = target.stored.chunks[index]
            if digest in first:  # named before: read back from where it was written
                source, at, done = first[digest]
                await done.wait()
                data = await trio.to_thread.run_sync(_read_back, source, at, digest)
                if data is None:
                    raise FilesError(f"{source.final} changed while it was restored; restore again")
            else:
                done = first.setdefault(digest, (target, index, trio.Event()))[2]
                await arrived[digest].wait()
                size, got = fetched.pop(digest)
                room.release()
                data = await _checked(got, size, digest, target, index)
            await trio.to_thread.run_sync(_write_chunk, target, index, data, dest, need)
            done.set()
            written += len(data)
            target.left -= 1
            if target.left == 0:
                await trio.to_thread.run_sync(_finish, target)

    try:
        async with trio.open_nursery() as nursery:
            nursery.start_soon(fetch)
            nursery.start_soon(feed)
            for _ in range(WINDOW):
                nursery.start_soon(work)
    except BaseExceptionGroup as group:
        told = _told(group)
        if told is None:
            raise
        raise told from None
    finally:
        with trio.CancelScope(shield=True):
            await trio.to_thread.run_sync(_discard, targets)
    return written


def _told(group: BaseExceptionGroup[BaseException]) -> Exception | None:
    """The error to tell: the first of the workers' that says what went wrong."""
    leaves: list[BaseException] = []

    def walk(exc: BaseException) -> None:
        if isinstance(exc, BaseExceptionGroup):
            for inner in exc.exceptions:
                walk(inner)
        else:
            leaves.append(exc)

    walk(group)
    return next((e for e in leaves if isinstance(e, FilesError | RelayError)), None)


def _stripped(path: str, strip: str) -> str:
    strip = strip.strip("/")
    if not strip:
        return path
    if path == strip:
        return path.rsplit("/", 1)[-1]
    if path.startswith(strip + "/"):
        return path[len(strip) + 1 :]
    raise FilesError(f"{path} is not under {strip}")


def _free(dest: Path) -> int:
    st = os.statvfs(dest)
    return st.f_bavail * st.f_frsize


def _no_space(dest: Path, need: int, free: int) -> str:
    return f"no space left on {dest}: the files need {size_text(need)}, {size_text(free)} are free"


def _make_dirs(dest: Path, rel_dir: str) -> str:
    """``dest`` (which may be a symlink the caller chose), then each directory of ``rel_dir``
    under it, created here (0o755) or already a real directory: never a symlink."""
    try:
        dest.mkdir(mode=0o755, parents=True, exist_ok=True)
    except OSError as exc:
        raise FilesError(f"cannot create {dest}: {exc.strerror or exc}") from None
    where = os.fspath(dest)
    for name in [p for p in rel_dir.split("/") if p]:
        where = os.path.join(where, name)
        try:
            os.mkdir(where, 0o755)
        except FileExistsError:
            st = os.lstat(where)
            if not stat.S_ISDIR(st.st_mode):
                raise FilesError(
                    f"{where} is not a directory (a symlink?): not written through"
                ) from None
        except OSError as exc:
            raise FilesError(f"cannot create {where}: {exc.strerror or exc}") from None
    return where


def _open_target(dest: Path, rel: str, target: _Target) -> None:
    check_relative_path(rel)
    parent, _, name = rel.rpartition("/")
    directory = _make_dirs(dest, parent)
    target.temp = os.path.join(directory, f".{name}.{secrets.token_hex(4)}.part")
    try:
        target.fd = os.open(
            target.temp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC, 0o600
        )
    except OSError as exc:
        raise FilesError(f"cannot write {target.final}: {exc.strerror or exc}") from None


def _write_chunk(target: _Target, index: int, data: bytes, dest: Path, need: int) -> None:
    try:
        view = memoryview(data)
        offset = index * CHUNK
        while view:
            n = os.pwrite(target.fd, view, offset)
            view, offset = view[n:], offset + n
    except OSError as exc:
        if exc.errno in (errno.ENOSPC, errno.EDQUOT):
            raise FilesError(_no_space(dest, need, _free(dest))) from None
        raise FilesError(f"cannot write {target.final}: {exc.strerror or exc}") from None


def _finish(target: _Target) -> None:
    """Its mode and mtime, then renamed into place."""
    stored = target.stored
    try:
        os.ftruncate(target.fd, stored.size)
        os.fchmod(target.fd, stored.mode & 0o777)
        mtime = stored.mtime if math.isfinite(stored.mtime) else time.time()
        os.utime(target.fd, (mtime, mtime))
        os.close(target.fd)
        target.fd = -1
        if os.path.isdir(target.final) and not os.path.islink(target.final):
            raise FilesError(f"{target.final} is a directory: not replaced")
        os.rename(target.temp, target.final)
        target.temp = ""
    except OSError as exc:
        raise FilesError(f"cannot write {target.final}: {exc.strerror or exc}") from None


def _read_back(source: _Target, index: int, digest: str) -> bytes | None:
    """A chunk already written (to ``source``'s temporary file, or its final one once renamed):
    its bytes if they are still what ``digest`` says."""
    for path in (source.temp, source.final):
        if not path:
            continue
        try:
            fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC)
        except OSError:
            continue  # renamed meanwhile: the final name has it
        try:
            data = os.pread(fd, CHUNK, index * CHUNK)
        except OSError:
            return None
        finally:
            os.close(fd)
        return data if hashlib.sha256(data).hexdigest() == digest else None
    return None


async def _checked(data: bytes, size: int, digest: str, target: _Target, index: int) -> bytes:
    """A chunk as the relay sent it (at most :data:`BLOB_CHUNK`, so one read), checked."""
    name = f"chunk {index + 1} of {target.stored.path}"
    expected = min(CHUNK, target.stored.size - index * CHUNK)
    if size != expected or len(data) != size or size > BLOB_CHUNK:
        raise FilesError(f"{name} is corrupt (digest {digest[:12]}: {size} bytes, not {expected})")
    if await trio.to_thread.run_sync(lambda: hashlib.sha256(data).hexdigest()) != digest:
        raise FilesError(f"{name} is corrupt (digest {digest[:12]} does not match its bytes)")
    return data


def _discard(targets: list[_Target]) -> None:
    for target in targets:
        if target.fd >= 0:
            with contextlib.suppress(OSError):
                os.close(target.fd)
            target.fd = -1
        if target.temp:
            with contextlib.suppress(OSError):
                os.unlink(target.temp)
            target.temp = ""
