"""Submitting snapshots by their root tree (``protocol_specs/snapshots/trees.py``) to a real relay on a real
Redis: what each submit sends, what the worker gets, and what the relay refuses."""

from __future__ import annotations

import hashlib
from pathlib import Path

import msgpack
import pytest
import trio
from credentials import user_endpoint

from adapter.snapshots.snapshot import Snapshot, SnapshotError, build_snapshot
from adapter.snapshots.snapshot_upload import submit_snapshot
from protocol_specs.access.auth import Scope
from protocol_specs.runs.spec import RunSpec
from protocol_specs.snapshots.trees import build_trees
from relay.client import Endpoint, RelayError, open_control
from relay.config import RelayConfig
from relay.server import serve_relay, server_port
from relay.snapshots.blobs import MemoryBlobStore
from relay.store import Store, keys

pytestmark = [pytest.mark.redis, pytest.mark.timeout(60)]

SPEC = RunSpec(command=["python", "train.py"], workdir="/home/me/project")


class AskedBlobs(MemoryBlobStore):
    """Blobs in memory, noting every digest the relay asks about."""

    def __init__(self) -> None:
        super().__init__()
        self.asked: list[str] = []

    async def missing(self, digests: list[str]) -> list[str]:
        self.asked += digests
        return await super().missing(digests)


@pytest.fixture
def blobs() -> AskedBlobs:
    return AskedBlobs()


@pytest.fixture
def config() -> RelayConfig:
    return RelayConfig()


@pytest.fixture
async def relay(
    redis_store: Store, blobs: MemoryBlobStore, config: RelayConfig, nursery: trio.Nursery
) -> tuple[Endpoint, Endpoint]:
    """The relay, as the users ``me`` and ``eve``."""
    server = await nursery.start(
        lambda task_status: serve_relay(
            redis_store, port=0, blobs=blobs, config=config, task_status=task_status
        )
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
    relay: tuple[Endpoint, Endpoint], redis_store: Store, blobs: AskedBlobs, tmp_path: Path
) -> None:
    me, _ = relay
    first = tree(tmp_path)
    root = build_trees(first.manifest).root
    async with open_control(me) as control:
        record, uploaded = await submit_snapshot(control, SPEC, first)
        assert (uploaded.blobs, uploaded.reused, uploaded.trees) == (101, 0, 11)
        # the run is recorded by its root tree: no manifest kept beside it
        assert (record.snapshot, record.tree, record.files) == (root, root, 101)
        assert record.size == first.manifest.total_bytes
        assert await redis_store.get_bytes(keys.manifest(record.id)) is None
        assigned = await control.claim("w", run=record.id, attempt=record.attempt)
        assert assigned.manifest == first.manifest  # the worker gets the whole manifest
    (tmp_path / "pkg3" / "sub" / "f7.py").write_text("changed\n")
    second = build_snapshot(tmp_path)
    blobs.asked.clear()
    async with open_control(me) as control:
        record, uploaded = await submit_snapshot(control, SPEC, second)
        sent = control.bytes_sent
    # the file, pkg3/sub, pkg3 and the root; the other 100 files were never asked about, by the
    # client or by the relay checking the submit (it had checked the other subtrees)
    assert (uploaded.blobs, uploaded.bytes, uploaded.trees) == (1, len("changed\n"), 3)
    assert record.snapshot == build_trees(second.manifest).root
    others = {e.digest for e in first.manifest.entries if e.path.startswith(("pkg0", "pkg4"))}
    assert not set(blobs.asked) & others
    # the client: the root, its 6 entries, pkg3's 1, sub's 20; the relay: the 3 trees that
    # changed, train.py and sub's 20 files (pkg3/sub's tree is new: its files are asked about)
    assert len(blobs.asked) == 28 + 24, len(blobs.asked)
    whole = len(second.manifest.model_dump_json())
    # about a third of the whole manifest: the digests asked about, the file, three trees, and the
    # submit (its run spec)
    assert sent < whole / 2.5, (sent, whole)
    # the same tree again: one question (the root), no upload
    async with open_control(me) as control:
        _, uploaded = await submit_snapshot(control, SPEC, second)
        assert (uploaded.blobs, uploaded.trees) == (0, 0)
        # a rerun names the same tree
        again = await control.rerun(record.id)
        assert (again.tree, again.files, again.size) == (record.tree, 101, record.size)


@pytest.mark.parametrize("config", [RelayConfig(blob_grace=0)])
async def test_a_tree_whose_blobs_went_is_repaired_by_a_full_check(
    relay: tuple[Endpoint, Endpoint], blobs: MemoryBlobStore, tmp_path: Path
) -> None:
    """With no grace before the blob collection, a checked subtree vouches for nothing: the
    relay checks it again, finds what went, and the client repairs it."""
    me, _ = relay
    snapshot = tree(tmp_path)
    async with open_control(me) as control:
        await submit_snapshot(control, SPEC, snapshot)
        lost = snapshot.manifest.digests[:2]
        for digest in lost:
            del blobs.blobs[digest]  # swept by the relay's blob collection
        # the root is there: the top-down check finds nothing missing, the submit refuses, and
        # the client asks about everything and uploads what went
        record, uploaded = await submit_snapshot(control, SPEC, snapshot)
        assert record.tree == build_trees(snapshot.manifest).root and uploaded.blobs == 2
    assert all(d in blobs.blobs for d in lost)


async def test_a_claim_of_a_run_whose_trees_went_fails_its_start_saying_why(
    relay: tuple[Endpoint, Endpoint], blobs: MemoryBlobStore, tmp_path: Path
) -> None:
    me, _ = relay
    snapshot = tree(tmp_path)
    async with open_control(me) as control:
        record, _ = await submit_snapshot(control, SPEC, snapshot)
        del blobs.blobs[record.tree]  # deleted by hand: the blob collection keeps live runs'
        with pytest.raises(RelayError, match="lost part of the run's snapshot"):
            await control.claim("w", run=record.id, attempt=record.attempt)
        failed = await control.get_run(record.id)
        assert failed.state.value == "failed" and "lost part" in failed.detail
        assert await control.missing_blobs([]) == []  # the relay serves on


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
