"""Saving a directory to the relay as a file set, and writing a set's files back: the engine under
checkpoints and outputs (``protocol_specs/checkpoints/files.py`` says what a set is).

:func:`upload_dir` scans a directory (regular files only, symlinks and special files skipped and
never followed), hashes each file's :data:`~protocol_specs.checkpoints.files.CHUNK`-byte chunks in
worker threads (a :class:`HashCache` spares the files whose size, mtime and inode are unchanged),
asks the relay which chunks it lacks and uploads only those, a window of them on their way at once,
each read again from its file when it is sent (memory stays a window of chunks, never a file),
then the set blob. A save of a 1 GiB file with 1% changed in place sends about 1% of it.

:func:`download` writes a set's files under a directory: each to a temporary name beside it, then
renamed; every chunk checked against its digest; no write through a symlink; a chunk the set names
twice fetched once (later copies are read back from where it was written).

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

import msgpack
import trio

from protocol_specs.checkpoints.files import CHUNK, MAX_SET_FILES, FileSet, StoredFile
from protocol_specs.snapshots.snapshots import BLOB_CHUNK, MAX_FILE_BYTES, check_relative_path
from protocol_specs.wire.wire import ErrorCode

from .connect import RelayError
from .control import ControlClient

__all__ = ["FilesError", "HashCache", "Sent", "download", "scan", "upload_dir"]

#: chunk uploads (and chunk downloads) on their way at once: memory is this many chunks
WINDOW = 16
#: hashing: files handed to one worker thread until they hold this many bytes (or :data:`_BATCH`)
_BATCH_BYTES = 64 * CHUNK
_BATCH = 32
#: chunks read again for upload in one worker thread call
_READ_BATCH = 4
#: a digest taken this close to the file's last change is not reused (a write within the same
#: clock tick leaves mtime as it was)
RACY_NS = 2_000_000_000


class FilesError(Exception):
    """One clear line: over the limit, disk full, a corrupt chunk, a file that kept changing."""


def _size(n: float) -> str:
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
                except ValueError as exc:
                    raise FilesError(f"cannot save {rel!r}: {exc}") from None
                with contextlib.suppress(FileNotFoundError):
                    found.append((rel, entry.stat(follow_symlinks=False)))

    walk(os.fspath(root), "")
    found.sort(key=lambda item: item[0])
    return found


def _stamp(st: os.stat_result) -> tuple[int, int, int, int]:
    return (st.st_size, st.st_mtime_ns, st.st_ctime_ns, st.st_ino)


def _open_regular(path: str) -> int:
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
            fd = _open_regular(path)
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


def _batches(
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
    for batch in _batches(todo):

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
    for rel, st in found:
        if st.st_size > MAX_FILE_BYTES:
            raise FilesError(
                f"{rel} is {_size(st.st_size)}: one file may hold at most {_size(MAX_FILE_BYTES)}"
            )
    total = sum(st.st_size for _, st in found)
    if limit > 0 and total > limit:
        raise FilesError(f"the files hold {_size(total)}, over the limit of {_size(limit)}")


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
                    fd = _open_regular(os.path.join(root, rel))
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
    written = 0
    send, receive = trio.open_memory_channel[tuple[_Target, int]](0)

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
            data: bytes | None = None
            if digest in first:  # named before: read back from where it was written
                source, at, done = first[digest]
                await done.wait()
                data = await trio.to_thread.run_sync(_read_back, source, at, digest)
            else:
                done = first.setdefault(digest, (target, index, trio.Event()))[2]
            if data is None:
                data = await _fetch(control, digest, run, target, index)
            await trio.to_thread.run_sync(_write_chunk, target, index, data, dest, need)
            done.set()
            written += len(data)
            target.left -= 1
            if target.left == 0:
                await trio.to_thread.run_sync(_finish, target)

    try:
        async with trio.open_nursery() as nursery:
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
    return f"no space left on {dest}: the files need {_size(need)}, {_size(free)} are free"


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
    """A chunk already written (to ``source``'s temporary file, or its final one): its bytes if
    they are still what ``digest`` says."""
    path = source.temp or source.final
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC)
        try:
            data = os.pread(fd, CHUNK, index * CHUNK)
        finally:
            os.close(fd)
    except OSError:
        return None
    return data if hashlib.sha256(data).hexdigest() == digest else None


async def _fetch(
    control: ControlClient, digest: str, run: str, target: _Target, index: int
) -> bytes:
    """One chunk from the relay (at most :data:`BLOB_CHUNK`, so one read), checked."""
    name = f"chunk {index + 1} of {target.stored.path}"
    try:
        size, data = await control.read_blob(digest, run=run)
    except RelayError as exc:
        if exc.code == ErrorCode.NO_SUCH_BLOB:
            raise FilesError(f"{name} is missing on the relay (digest {digest[:12]})") from None
        raise
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
