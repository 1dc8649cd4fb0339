"""Saving a directory as a file set (``relay/client/files.py``) to a real relay on a real Redis,
with its blobs on disk: what a second save sends, a restore into an empty directory, a chunk
damaged in the relay's store, a symlink in the directory."""

from __future__ import annotations

import hashlib
import os
from pathlib import Path

import pytest
import trio
from credentials import user_endpoint

from protocol_specs.access.auth import Scope
from protocol_specs.checkpoints.files import CHUNK, FileSet
from relay.client import Endpoint, open_control
from relay.client.files import FilesError, HashCache, download, upload_dir
from relay.server import serve_relay, server_port
from relay.snapshots.blobs import FileBlobStore
from relay.store import Store

pytestmark = [pytest.mark.redis, pytest.mark.timeout(60)]

BIG = 20 * CHUNK


@pytest.fixture
def blobs(tmp_path: Path) -> FileBlobStore:
    return FileBlobStore(tmp_path / "relay-blobs")


@pytest.fixture
async def relay(
    redis_store: Store, blobs: FileBlobStore, nursery: trio.Nursery
) -> tuple[Endpoint, Endpoint]:
    """The relay, as a user who saves (``runs``) and as an admin who reads any blob."""
    server = await nursery.start(
        lambda task_status: serve_relay(redis_store, port=0, blobs=blobs, task_status=task_status)
    )
    url = f"ws://127.0.0.1:{server_port(server)}"
    me = await user_endpoint(redis_store, url, "me", scopes=[Scope.RUNS])
    admin = await user_endpoint(redis_store, url, "root", scopes=[Scope.RUNS, Scope.ADMIN])
    return me, admin


def patch(path: Path, offset: int, data: bytes) -> None:
    """``data`` written over ``path`` at ``offset``, in place."""
    with open(path, "r+b") as f:
        f.seek(offset)
        f.write(data)


def make_dir(root: Path) -> bytes:
    root.mkdir()
    big = os.urandom(BIG)
    (root / "model.pt").write_bytes(big)
    (root / "meta").mkdir()
    (root / "meta" / "step.json").write_text('{"step": 100}')
    return big


async def test_a_second_save_sends_the_changed_chunks_and_a_restore_is_identical(
    relay: tuple[Endpoint, Endpoint], blobs: FileBlobStore, tmp_path: Path
) -> None:
    me, admin = relay
    root = tmp_path / "ckpt"
    big = make_dir(root)
    (root / "latest").symlink_to(root / "model.pt")  # skipped, not followed
    cache = HashCache(tmp_path / "hashes")
    async with open_control(me) as control:
        first = await upload_dir(control, root, cache=cache)
        assert first.sent >= BIG and first.hashed == BIG + 13
        assert [f.path for f in first.files.files] == ["meta/step.json", "model.pt"]
        # 1% of the file changes in place, in one region
        start = 7 * CHUNK + 4096
        patch(root / "model.pt", start, os.urandom(BIG // 100))
        second = await upload_dir(control, root, cache=cache)
    changed = {i for i in range(20) if i * CHUNK < start + BIG // 100 and (i + 1) * CHUNK > start}
    assert len(changed) == 1
    set_bytes = len(second.files.encode())
    assert second.sent == len(changed) * CHUNK + set_bytes, (second.sent, set_bytes)
    assert FileSet.decode(blobs.path(second.digest).read_bytes()) == second.files

    dest = tmp_path / "restored"
    async with open_control(admin) as control:
        written = await download(control, second.files.files, dest)
    assert written == BIG + 13
    assert (dest / "model.pt").read_bytes() == (root / "model.pt").read_bytes() != big
    assert (dest / "meta" / "step.json").read_text() == '{"step": 100}'
    assert sorted(str(p.relative_to(dest)) for p in dest.rglob("*")) == [
        "meta",
        "meta/step.json",
        "model.pt",
    ]


async def test_a_chunk_damaged_in_the_relays_store_is_refused_naming_the_file(
    relay: tuple[Endpoint, Endpoint], blobs: FileBlobStore, tmp_path: Path
) -> None:
    me, admin = relay
    root = tmp_path / "ckpt"
    make_dir(root)
    async with open_control(me) as control:
        sent = await upload_dir(control, root)
    model = sent.files.get("model.pt")
    assert model is not None
    damaged = blobs.path(model.chunks[4])
    damaged.write_bytes(os.urandom(CHUNK))  # the disk under the relay went bad
    assert hashlib.sha256(damaged.read_bytes()).hexdigest() != model.chunks[4]
    dest = tmp_path / "restored"
    async with open_control(admin) as control:
        with pytest.raises(FilesError, match=r"^chunk 5 of model.pt is corrupt \(digest "):
            await download(control, sent.files.files, dest)
    assert not (dest / "model.pt").exists()
    assert not [p for p in dest.rglob("*") if p.name.endswith(".part")]
