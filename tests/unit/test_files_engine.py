"""The file-set engine (``relay/client/files.py``) on temporary directories, with a relay that
keeps blobs in a dict: scanning, chunking, the hash cache, uploads of what is lacking, downloads."""

from __future__ import annotations

import errno
import hashlib
import os
import time
from collections.abc import AsyncIterator, Callable
from pathlib import Path
from typing import cast

import pytest

from protocol_specs.checkpoints.files import CHUNK, FileSet, StoredFile
from protocol_specs.wire.wire import ErrorCode
from relay.client import ControlClient, RelayError
from relay.client import files as engine
from relay.client.files import FilesError, HashCache, download, hash_file, scan, upload_dir

HOUR_AGO = time.time() - 3600


class Blobs:
    """The relay's side of the blob calls, in memory, counting what crosses."""

    def __init__(self) -> None:
        self.blobs: dict[str, bytes] = {}
        self.asked: list[list[str]] = []
        self.put: list[str] = []
        self.reads: list[str] = []

    async def missing_blobs(self, digests: list[str]) -> list[str]:
        self.asked.append(list(digests))
        return [d for d in dict.fromkeys(digests) if d not in self.blobs]

    async def put_small_blobs(
        self,
        blobs: AsyncIterator[tuple[str, bytes]],
        on_blob: Callable[[str, int], None] = lambda _d, _n: None,
        *,
        window: int = 64,
    ) -> None:
        async for digest, data in blobs:
            assert hashlib.sha256(data).hexdigest() == digest
            self.blobs[digest] = data
            self.put.append(digest)
            on_blob(digest, len(data))

    async def put_blob(self, digest: str, data: bytes) -> None:
        assert hashlib.sha256(data).hexdigest() == digest
        self.blobs[digest] = data
        self.put.append(digest)

    async def read_blob(self, digest: str, offset: int = 0, *, run: str = "") -> tuple[int, bytes]:
        self.reads.append(digest)
        if digest not in self.blobs:
            raise RelayError(ErrorCode.NO_SUCH_BLOB, f"no blob {digest[:12]}")
        data = self.blobs[digest]
        return len(data), data[offset:]

    @property
    def control(self) -> ControlClient:
        return cast(ControlClient, self)


def old(path: Path, data: bytes) -> Path:
    """``path`` written with ``data``, last changed an hour ago (past the racy window)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_bytes(data)
    os.utime(path, (HOUR_AGO, HOUR_AGO))
    return path


def patch(path: Path, offset: int, data: bytes) -> None:
    """``data`` written over ``path`` at ``offset``, in place."""
    with open(path, "r+b") as f:
        f.seek(offset)
        f.write(data)


def checkpoint(root: Path) -> dict[str, bytes]:
    files = {
        "model.pt": os.urandom(3 * CHUNK + 100),
        "optim/state.bin": os.urandom(CHUNK),
        "optim/empty": b"",
        "meta.json": b'{"step": 3}',
    }
    for rel, data in files.items():
        old(root / rel, data)
    return files


# -- scanning and hashing -----------------------------------------------------------------------


def test_scan_lists_regular_files_sorted_and_skips_links_and_special_files(tmp_path: Path) -> None:
    root = tmp_path / "ckpt"
    checkpoint(root)
    (root / "a.txt").write_text("a")
    (root / "link").symlink_to(root / "model.pt")
    (root / "dirlink").symlink_to(root / "optim")
    (root / "outside").symlink_to(tmp_path)
    os.mkfifo(root / "fifo")
    found = [rel for rel, _ in scan(root)]
    assert found == ["a.txt", "meta.json", "model.pt", "optim/empty", "optim/state.bin"]
    assert found == sorted(found)
    selected = [rel for rel, _ in scan(root, lambda p: p.startswith("optim/"))]
    assert selected == ["optim/empty", "optim/state.bin"]


def test_a_file_is_hashed_in_fixed_chunks(tmp_path: Path) -> None:
    data = os.urandom(2 * CHUNK + 7)
    path = old(tmp_path / "f", data)
    st, _at, chunks = hash_file(str(path), "f")
    assert st.st_size == len(data)
    assert chunks == [
        hashlib.sha256(data[i : i + CHUNK]).hexdigest() for i in range(0, len(data), CHUNK)
    ]
    assert hash_file(str(old(tmp_path / "e", b"")), "e")[2] == []
    exact = old(tmp_path / "x", bytes(CHUNK))
    assert hash_file(str(exact), "x")[2] == [hashlib.sha256(bytes(CHUNK)).hexdigest()]


def test_a_file_that_keeps_changing_while_read_is_refused(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    path = old(tmp_path / "model.pt", b"x" * 10)
    stamps = iter(range(100))
    monkeypatch.setattr(engine, "_stamp", lambda _st: next(stamps))  # differs every time
    with pytest.raises(FilesError, match=r"^model.pt changed while it was saved; save again$"):
        hash_file(str(path), "model.pt")


def test_a_file_that_changed_once_while_read_is_read_again(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    path = old(tmp_path / "model.pt", b"x" * 10)
    stamps = iter([1, 2, 3, 3])  # the first read saw a change, the second none
    monkeypatch.setattr(engine, "_stamp", lambda _st: next(stamps))
    assert hash_file(str(path), "model.pt")[2] == [hashlib.sha256(b"x" * 10).hexdigest()]


# -- uploads ------------------------------------------------------------------------------------


async def test_an_upload_sends_the_chunks_the_relay_lacks_then_the_set(tmp_path: Path) -> None:
    root = tmp_path / "ckpt"
    files = checkpoint(root)
    relay = Blobs()
    sent = await upload_dir(relay.control, root, attempt=2)
    total = sum(len(d) for d in files.values())
    assert sent.hashed == total
    assert sent.sent == total + len(sent.files.encode())
    assert sent.digest == sent.files.digest()
    assert FileSet.decode(relay.blobs[sent.digest]) == sent.files
    assert relay.put[-1] == sent.digest  # the set after what it names
    model = sent.files.get("model.pt")
    assert model is not None and model.size == len(files["model.pt"]) and model.attempt == 2
    assert len(model.chunks) == 4

    again = await upload_dir(relay.control, root, attempt=2)
    assert again.sent == 0 and again.digest == sent.digest  # the relay has it all


async def test_the_hash_cache_spares_unchanged_files_and_persists(tmp_path: Path) -> None:
    root = tmp_path / "ckpt"
    files = checkpoint(root)
    relay = Blobs()
    cache_path = tmp_path / "cache" / "hashes"
    first = await upload_dir(relay.control, root, cache=HashCache(cache_path))
    assert cache_path.is_file()

    # one chunk of model.pt changes in place (same size), and it is dated an hour ago again
    patch(root / "model.pt", CHUNK + 10, b"changed!")
    later = HOUR_AGO + 60
    os.utime(root / "model.pt", (later, later))
    second = await upload_dir(relay.control, root, cache=HashCache(cache_path))  # a new process
    assert second.hashed == len(files["model.pt"])  # the others came from the cache
    assert second.sent == CHUNK + len(second.files.encode())
    assert second.files.get("meta.json") == first.files.get("meta.json")


async def test_a_digest_taken_right_after_a_change_is_not_trusted(tmp_path: Path) -> None:
    root = tmp_path / "ckpt"
    (root).mkdir()
    (root / "fresh").write_bytes(b"a" * 100)  # modified now: in the racy window
    cache = HashCache()
    relay = Blobs()
    await upload_dir(relay.control, root, cache=cache)
    again = await upload_dir(relay.control, root, cache=cache)
    assert again.hashed == 100


async def test_over_the_limit_nothing_is_uploaded(tmp_path: Path) -> None:
    root = tmp_path / "ckpt"
    checkpoint(root)
    relay = Blobs()
    with pytest.raises(FilesError, match=r"^the files hold 4.0 MiB, over the limit of 1.0 MiB$"):
        await upload_dir(relay.control, root, limit=CHUNK)
    assert relay.asked == [] and relay.put == []


# -- downloads ----------------------------------------------------------------------------------


async def test_a_download_writes_the_files_back_byte_identical(tmp_path: Path) -> None:
    root = tmp_path / "ckpt"
    files = checkpoint(root)
    os.chmod(root / "meta.json", 0o600)
    relay = Blobs()
    sent = await upload_dir(relay.control, root)
    dest = tmp_path / "restored"
    written = await download(relay.control, sent.files.files, dest)
    assert written == sum(len(d) for d in files.values())
    for rel, data in files.items():
        assert (dest / rel).read_bytes() == data
        assert (dest / rel).stat().st_mtime == pytest.approx(HOUR_AGO, abs=1e-3)
    assert (dest / "meta.json").stat().st_mode & 0o777 == 0o600
    assert sorted(p.name for p in dest.rglob("*")) == sorted(
        ["meta.json", "model.pt", "optim", "empty", "state.bin"]
    )  # no temporary file left

    only = await download(relay.control, sent.files.under("optim"), tmp_path / "o", strip="optim")
    assert only == CHUNK and (tmp_path / "o" / "state.bin").read_bytes() == files["optim/state.bin"]


async def test_a_chunk_named_twice_is_fetched_once(tmp_path: Path) -> None:
    root = tmp_path / "ckpt"
    block = os.urandom(CHUNK)
    old(root / "a", block * 3)
    old(root / "b", block + b"tail")
    relay = Blobs()
    sent = await upload_dir(relay.control, root)
    await download(relay.control, sent.files.files, tmp_path / "out")
    assert relay.reads.count(hashlib.sha256(block).hexdigest()) == 1
    assert (tmp_path / "out" / "a").read_bytes() == block * 3
    assert (tmp_path / "out" / "b").read_bytes() == block + b"tail"


async def test_a_corrupt_chunk_is_refused_naming_the_file(tmp_path: Path) -> None:
    root = tmp_path / "ckpt"
    checkpoint(root)
    relay = Blobs()
    sent = await upload_dir(relay.control, root)
    model = sent.files.get("model.pt")
    assert model is not None
    relay.blobs[model.chunks[2]] = os.urandom(CHUNK)
    dest = tmp_path / "restored"
    with pytest.raises(FilesError, match=r"^chunk 3 of model.pt is corrupt \(digest [0-9a-f]{12}"):
        await download(relay.control, sent.files.files, dest)
    assert not (dest / "model.pt").exists()
    assert not [p for p in dest.rglob("*") if p.name.endswith(".part")]


async def test_a_download_never_writes_through_a_symlink(tmp_path: Path) -> None:
    root = tmp_path / "ckpt"
    checkpoint(root)
    relay = Blobs()
    sent = await upload_dir(relay.control, root)
    dest, elsewhere = tmp_path / "restored", tmp_path / "elsewhere"
    dest.mkdir()
    elsewhere.mkdir()
    (dest / "optim").symlink_to(elsewhere)
    with pytest.raises(FilesError, match=r"optim is not a directory \(a symlink\?\)"):
        await download(relay.control, sent.files.files, dest)
    assert list(elsewhere.iterdir()) == []


async def test_a_download_that_does_not_fit_says_how_much_it_needs(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    root = tmp_path / "ckpt"
    checkpoint(root)
    relay = Blobs()
    sent = await upload_dir(relay.control, root)
    monkeypatch.setattr(engine, "_free", lambda _dest: CHUNK)
    dest = tmp_path / "restored"
    with pytest.raises(
        FilesError, match=rf"^no space left on {dest}: the files need 4.0 MiB, 1.0 MiB are free$"
    ):
        await download(relay.control, sent.files.files, dest)
    assert relay.reads == []


async def test_a_disk_that_fills_while_writing_is_one_clear_error(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    root = tmp_path / "ckpt"
    checkpoint(root)
    relay = Blobs()
    sent = await upload_dir(relay.control, root)

    def full(_fd: int, _data: object, _offset: int) -> int:
        raise OSError(errno.ENOSPC, "No space left on device")

    monkeypatch.setattr(os, "pwrite", full)
    dest = tmp_path / "restored"
    with pytest.raises(FilesError, match=rf"^no space left on {dest}: the files need 4.0 MiB"):
        await download(relay.control, sent.files.files, dest)
    # no half-written file (an empty one may be whole already)
    assert not [p for p in dest.rglob("*") if p.is_file() and p.stat().st_size]


async def test_a_missing_chunk_is_one_clear_error(tmp_path: Path) -> None:
    stored = StoredFile(path="w.bin", size=5, chunks=["ab" * 32])
    with pytest.raises(FilesError, match=r"^chunk 1 of w.bin is missing on the relay"):
        await download(Blobs().control, [stored], tmp_path / "out")
