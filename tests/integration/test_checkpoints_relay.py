"""The relay keeps runs' checkpoints and outputs (issue 44), on a real Redis: what a worker token
may store and read, retention, the relay's limit, a seed run's checkpoints, outputs merged, a
user's reads naming their run, a step of a run across two nodes, and the blob sweep."""

from __future__ import annotations

import hashlib
from collections.abc import AsyncIterator

import pytest
from live_relay import SPEC, live_relay

from protocol_specs.checkpoints.files import CHUNK, FileSet, StoredFile
from protocol_specs.runs.resources import Resources
from protocol_specs.wire import wire
from relay.client import ControlClient, Endpoint, RelayError, open_control
from relay.config import RelayConfig
from relay.runs.checkpoints import RunFiles
from relay.server import Relay
from relay.snapshots.blobs import MemoryBlobStore
from relay.store import Store

pytestmark = [pytest.mark.redis, pytest.mark.timeout(60)]


def _sha(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


def file_set(files: dict[str, bytes], attempt: int = 1) -> tuple[FileSet, dict[str, bytes]]:
    """The set of ``files`` and its blobs (the chunks and the set itself), by digest."""
    blobs: dict[str, bytes] = {}
    stored = []
    for path, data in sorted(files.items()):
        chunks = [data[i : i + CHUNK] for i in range(0, len(data), CHUNK)]
        blobs.update((_sha(c), c) for c in chunks)
        stored.append(
            StoredFile(path=path, size=len(data), attempt=attempt, chunks=[_sha(c) for c in chunks])
        )
    fs = FileSet(files=stored)
    blobs[fs.digest()] = fs.encode()
    return fs, blobs


async def upload(control: ControlClient, blobs: dict[str, bytes]) -> None:
    async def each() -> AsyncIterator[tuple[str, bytes]]:
        for item in blobs.items():
            yield item

    await control.put_small_blobs(each())


async def started(
    r: object, user: Endpoint, pool: Endpoint, spec: object = SPEC
) -> tuple[str, Endpoint]:
    """A run of ``user``'s claimed by the pool: its id and its worker's endpoint."""
    async with open_control(user) as control:
        run = (await control.submit(spec)).id  # type: ignore[arg-type]
    async with open_control(pool) as control:
        assigned = await control.claim("w-0")
    assert assigned.run.id == run
    return run, pool.with_token(assigned.token)


async def save(
    worker: ControlClient, run: str, step: int, files: dict[str, bytes], **kw: int
) -> wire.CheckpointStored:
    fs, blobs = file_set(files)
    await upload(worker, blobs)
    return await worker.put_checkpoint(run, 1, step, fs.digest(), **kw)


async def test_a_worker_saves_checkpoints_the_owner_reads_them_and_the_oldest_are_dropped(
    redis_store: Store,
) -> None:
    async with live_relay(redis_store) as r:
        spec = SPEC.model_copy(update={"keep_checkpoints": 2})
        run, worker = await started(r, r.alice, r.pool, spec)
        async with open_control(worker) as w:
            for step in (100, 200, 300):
                stored = await save(w, run, step, {"model.pt": bytes([step % 256]) * (CHUNK + 5)})
                assert stored.complete and stored.checkpoint.step == step
            got = await w.checkpoints(run, with_files=True)
        assert [c.step for c in got.checkpoints] == [200, 300]  # keep 2: step 100 dropped
        assert got.source == run and got.limit == RelayConfig().checkpoint_limit
        assert got.files is not None and got.files.files[0].size == CHUNK + 5
        async with open_control(r.alice) as alice:
            record = await alice.get_run(run)
            assert record.checkpoint is not None and record.checkpoint.step == 300
            assert (record.checkpoints, record.checkpoint_bytes) == (2, 2 * (CHUNK + 5))
            at_200 = await alice.checkpoints(run, step=200, with_files=True)
            assert at_200.files is not None
            chunk = at_200.files.files[0].chunks[0]
            assert await alice.get_blob(chunk, run=run) == bytes([200]) * CHUNK
            with pytest.raises(RelayError) as refused:
                await alice.get_blob(chunk)  # not naming the run
            assert refused.value.code == "forbidden"
        async with open_control(r.bob) as bob:
            with pytest.raises(RelayError) as hidden:
                await bob.checkpoints(run)
            assert hidden.value.code == "no_such_run"


async def test_a_checkpoint_missing_chunks_or_over_the_limit_is_refused(redis_store: Store) -> None:
    config = RelayConfig(checkpoint_limit=CHUNK)
    async with live_relay(redis_store, config) as r:
        run, worker = await started(r, r.alice, r.pool)
        async with open_control(worker) as w:
            fs, blobs = file_set({"a.bin": b"x" * 10, "b.bin": b"y" * 10})
            await upload(w, {fs.digest(): blobs[fs.digest()]})  # the set, not its chunks
            with pytest.raises(RelayError) as missing:
                await w.put_checkpoint(run, 1, 1, fs.digest())
            assert missing.value.code == "missing_blobs"
            assert "names 2 chunks the relay does not hold" in str(missing.value)
            with pytest.raises(RelayError) as too_large:
                await save(w, run, 7, {"big.bin": b"z" * (CHUNK + 1)})
            assert too_large.value.code == "too_large"
            assert "checkpoint of step 7 holds 1.0 MiB, over the relay's limit of 1.0 MiB" in str(
                too_large.value
            )
            assert (await w.checkpoints(run)).checkpoints == []


async def test_a_worker_reads_its_runs_checkpoints_and_its_seeds_not_another_runs(
    redis_store: Store,
) -> None:
    async with live_relay(redis_store) as r:
        seed, seed_worker = await started(r, r.alice, r.pool)
        async with open_control(seed_worker) as w:
            await save(w, seed, 10, {"s.pt": b"ten"})
            await save(w, seed, 20, {"s.pt": b"twenty"})
        seeded = SPEC.model_copy(update={"from_checkpoint": f"{seed}:10"})
        run, worker = await started(r, r.alice, r.pool, seeded)
        other, other_worker = await started(r, r.bob, r.pool)
        async with open_control(worker) as w:
            got = await w.checkpoints(run, with_files=True)
            assert got.source == seed and [c.step for c in got.checkpoints] == [10]
            assert got.files is not None
            assert await w.get_blob(got.files.files[0].chunks[0]) == b"ten"
            # its own first checkpoint: then it answers its own
            await save(w, run, 11, {"s.pt": b"eleven"})
            mine = await w.checkpoints(run)
            assert mine.source == run and [c.step for c in mine.checkpoints] == [11]
        async with open_control(other_worker) as o:
            with pytest.raises(RelayError) as refused:
                await o.get_blob(_sha(b"eleven"))
            assert refused.value.code == "forbidden"
            with pytest.raises(RelayError) as theirs:
                await o.checkpoints(run)
            assert theirs.value.code == "forbidden"
            with pytest.raises(RelayError) as put:
                await o.put_checkpoint(run, 1, 1, "ab" * 32)
            assert put.value.code == "forbidden"
        assert other


async def test_outputs_merge_and_a_user_reads_them_naming_the_run(redis_store: Store) -> None:
    async with live_relay(redis_store) as r:
        run, worker = await started(r, r.alice, r.pool)
        async with open_control(worker) as w:
            first, blobs = file_set({"out/a.txt": b"a1", "out/b.txt": b"b1"})
            await upload(w, blobs)
            assert (await w.put_outputs(run, 1, first.digest())).count == 2
            second, blobs = file_set({"out/a.txt": b"a2!", "plot.png": b"png"})
            await upload(w, blobs)
            stored = await w.put_outputs(run, 1, second.digest())
            assert (stored.count, stored.size) == (3, 3 + 2 + 3)
        async with open_control(r.alice) as alice:
            outputs = (await alice.outputs(run)).files
            assert [f.path for f in outputs.files] == ["out/a.txt", "out/b.txt", "plot.png"]
            a = outputs.get("out/a.txt")
            assert a is not None and await alice.get_blob(a.chunks[0], run=run) == b"a2!"
            with pytest.raises(RelayError) as refused:
                await alice.get_blob(a.chunks[0])
            assert refused.value.code == "forbidden"
            record = await alice.get_run(run)
            assert (record.outputs, record.outputs_bytes) == (3, 8)
        async with open_control(r.bob) as bob:
            with pytest.raises(RelayError) as hidden:
                await bob.get_blob(a.chunks[0], run=run)
            assert hidden.value.code == "no_such_run"


async def test_a_step_of_a_two_node_run_completes_once_both_nodes_put_it(
    redis_store: Store,
) -> None:
    async with live_relay(redis_store) as r:
        two = SPEC.model_copy(update={"resources": Resources(nodes=2)})
        run, worker = await started(r, r.alice, r.pool, two)
        async with open_control(worker) as w:
            part = await save(w, run, 5, {"rank1.pt": b"one"}, node=1)
            assert not part.complete
            assert (await w.checkpoints(run)).checkpoints == []
            done = await save(w, run, 5, {"rank0.pt": b"zero"}, node=0)
            assert done.complete and done.checkpoint.count == 2
            got = await w.checkpoints(run, with_files=True)
        assert [c.step for c in got.checkpoints] == [5]
        assert got.files is not None
        assert [f.path for f in got.files.files] == ["rank0.pt", "rank1.pt"]


async def test_the_blob_sweep_keeps_what_checkpoints_and_outputs_name(redis_store: Store) -> None:
    now = [10_000.0]
    blobs = MemoryBlobStore(clock=lambda: now[0])
    relay = Relay(
        redis_store, blobs=blobs, config=RelayConfig(blob_grace=3600), clock=lambda: now[0]
    )
    record = await relay.registry.submit(SPEC, wire.Submit(rid=1, spec=SPEC).manifest, owner="a")
    assert not isinstance(record, wire.Error)
    kept, kept_blobs = file_set({"ckpt.pt": b"weights"})
    out, out_blobs = file_set({"plot.png": b"png"})
    for digest, data in [*kept_blobs.items(), *out_blobs.items(), (_sha(b"junk"), b"junk")]:
        await blobs.put(digest, data)
    files = RunFiles(redis_store, blobs)
    from protocol_specs.checkpoints.checkpoints import Checkpoint

    checkpoint = Checkpoint(step=1, attempt=1, files=kept.digest())
    await files.update_book(record.id, lambda b: b.with_complete(checkpoint, 3)[0])
    await files.add_outputs(record.id, out)
    now[0] += 7200
    assert await relay.collect_blobs() == 1  # the junk only
    assert set(blobs.blobs) == {*kept_blobs, *out_blobs}


async def test_a_set_naming_another_users_blobs_is_not_recorded_nor_read_through_the_run(
    redis_store: Store,
) -> None:
    async with live_relay(redis_store) as r:
        secret = b"alice's weights " * 4
        run, worker = await started(r, r.alice, r.pool)
        async with open_control(worker) as w:
            alice_set = (await save(w, run, 1, {"model.pt": secret})).checkpoint.files
        chunk = _sha(secret)  # bob knows (or guesses) the digest, not the bytes
        theirs, their_worker = await started(r, r.bob, r.pool)
        forged = FileSet(files=[StoredFile(path="x.pt", size=len(secret), chunks=[chunk])])
        async with open_control(their_worker) as w:
            await upload(w, {forged.digest(): forged.encode()})  # the set is his own
            with pytest.raises(RelayError) as as_checkpoint:
                await w.put_checkpoint(theirs, 1, 2, forged.digest())
            with pytest.raises(RelayError) as as_outputs:
                await w.put_outputs(theirs, 1, forged.digest())
            for refused in (as_checkpoint, as_outputs):
                assert refused.value.code == "missing_blobs"
                assert "names 1 chunk the relay does not hold" in str(refused.value)
            with pytest.raises(RelayError) as whole:  # alice's own set blob, named whole
                await w.put_checkpoint(theirs, 1, 3, alice_set)
            assert f"the file set blob {alice_set[:12]} is not stored" in str(whole.value)
        async with open_control(r.bob) as bob:
            with pytest.raises(RelayError) as denied:
                await bob.get_blob(chunk, run=theirs)
            assert denied.value.code == "forbidden"
