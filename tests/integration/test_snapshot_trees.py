"""Submitting snapshots by their root tree (``protocol_specs/trees.py``) to a real relay on a real
Redis: what each submit sends, what the worker gets, and what the relay refuses."""

from __future__ import annotations

import hashlib
from pathlib import Path

import msgpack
import pytest
import trio
from credentials import user_endpoint

from adapter.snapshot import Snapshot, SnapshotError, build_snapshot, submit_snapshot
from protocol_specs.auth import Scope
from protocol_specs.runs import RunSpec
from protocol_specs.trees import build_trees
from relay.blobs import MemoryBlobStore
from relay.client import Endpoint, RelayError, open_control
from relay.server import serve_relay, server_port
from relay.store import Store

pytestmark = [pytest.mark.redis, pytest.mark.timeout(60)]

SPEC = RunSpec(command=["python", "train.py"], workdir="/home/me/project")


@pytest.fixture
def blobs() -> MemoryBlobStore:
    return MemoryBlobStore()


@pytest.fixture
async def relay(
    redis_store: Store, blobs: MemoryBlobStore, nursery: trio.Nursery
) -> tuple[Endpoint, Endpoint]:
    """The relay, as the users ``me`` and ``eve``."""
    server = await nursery.start(
        lambda task_status: serve_relay(redis_store, port=0, blobs=blobs, task_status=task_status)
    )
    url = f"ws://127.0.0.1:{server_port(server)}"
    eve = await user_endpoint(redis_store, url, "eve", scopes=[Scope.RUNS])
    return await user_endpoint(redis_store, url, scopes=[Scope.RUNS, Scope.BACKEND]), eve


def tree(root: Path) -> Snapshot:
    for d in range(5):
        for f in range(20):
            path = root / f"pkg{d}" / "sub" / f"f{f}.py"
            path.parent.mkdir(parents=True, exist_ok=True)
            path.write_text(f"# {d} {f}\n" * 50)
    (root / "train.py").write_text("print('train')\n")
    return build_snapshot(root)


async def test_a_second_submit_sends_the_changed_file_and_the_trees_above_it(
    relay: tuple[Endpoint, Endpoint], tmp_path: Path
) -> None:
    me, _ = relay
    first = tree(tmp_path)
    async with open_control(me) as control:
        record, uploaded = await submit_snapshot(control, SPEC, first)
        assert (uploaded.blobs, uploaded.reused, uploaded.trees) == (101, 0, 11)
        assert (record.snapshot, record.files) == (first.manifest.id, 101)
        assigned = await control.claim("w", run=record.id, attempt=record.attempt)
        assert assigned.manifest == first.manifest  # the worker gets the whole manifest
    (tmp_path / "pkg3" / "sub" / "f7.py").write_text("changed\n")
    second = build_snapshot(tmp_path)
    async with open_control(me) as control:
        record, uploaded = await submit_snapshot(control, SPEC, second)
        sent = control.bytes_sent
    # the file, pkg3/sub, pkg3 and the root; the other 100 files were never asked about
    assert (uploaded.blobs, uploaded.bytes, uploaded.trees) == (1, len("changed\n"), 3)
    assert record.snapshot == second.manifest.id
    whole = len(second.manifest.model_dump_json())
    assert sent < whole / 3, (sent, whole)
    # the same tree again: one question (the root), no upload
    async with open_control(me) as control:
        _, uploaded = await submit_snapshot(control, SPEC, second)
        assert (uploaded.blobs, uploaded.trees) == (0, 0)


async def test_a_tree_whose_blobs_went_is_repaired_by_a_full_check(
    relay: tuple[Endpoint, Endpoint], blobs: MemoryBlobStore, tmp_path: Path
) -> None:
    me, _ = relay
    snapshot = tree(tmp_path)
    async with open_control(me) as control:
        await submit_snapshot(control, SPEC, snapshot)
        lost = snapshot.manifest.digests[:2]
        for digest in lost:
            del blobs.blobs[digest]  # swept by the relay's blob collection, say
        # the root is there: the top-down check finds nothing missing, the submit refuses, and
        # the client asks about everything and uploads what went
        record, uploaded = await submit_snapshot(control, SPEC, snapshot)
        assert record.snapshot == snapshot.manifest.id and uploaded.blobs == 2
    assert all(d in blobs.blobs for d in lost)


async def test_nobody_submits_or_probes_another_users_tree(
    relay: tuple[Endpoint, Endpoint], tmp_path: Path
) -> None:
    me, eve = relay
    snapshot = tree(tmp_path)
    async with open_control(me) as control:
        await submit_snapshot(control, SPEC, snapshot)
    root = build_trees(snapshot.manifest).root
    async with open_control(eve) as control:
        # the same answer as for a tree nobody has: eve learns nothing of what me uploaded
        with pytest.raises(RelayError, match="lacks 1 of the snapshot's trees") as mine:
            await control.submit(SPEC, tree=root)
        with pytest.raises(RelayError, match="lacks 1 of the snapshot's trees") as nobodys:
            await control.submit(SPEC, tree="0" * 64)
        assert str(mine.value).replace(root[:12], "") == str(nobodys.value).replace("0" * 12, "")


async def test_a_malformed_tree_is_refused_with_why(
    relay: tuple[Endpoint, Endpoint], tmp_path: Path
) -> None:
    me, _ = relay
    bad = msgpack.packb([["a", "x", 0, 0, ""]])
    digest = hashlib.sha256(bad).hexdigest()
    async with open_control(me) as control:
        await control.put_blob(digest, bad)
        with pytest.raises(RelayError, match="tree is refused: 'a': bad kind"):
            await control.submit(SPEC, tree=digest)
        # the relay serves on
        assert await control.missing_blobs([digest]) == []


async def test_a_file_gone_since_it_was_hashed_is_said(
    relay: tuple[Endpoint, Endpoint], tmp_path: Path
) -> None:
    me, _ = relay
    snapshot = tree(tmp_path)
    (tmp_path / "pkg2" / "sub" / "f5.py").unlink()
    async with open_control(me) as control:
        with pytest.raises(SnapshotError, match=r"cannot read pkg2/sub/f5.py: No such file"):
            await submit_snapshot(control, SPEC, snapshot)
        assert await control.missing_blobs([]) == []  # the connection serves on
