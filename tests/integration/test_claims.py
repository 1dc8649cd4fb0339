"""Claims against a live relay: a worker that died while waiting never takes a run, a claim whose
answer cannot be delivered is released (at once by its relay, or at its deadline by any relay's
sweep when it is never confirmed), and queue entries a dead relay held are queued again.

The relay runs in-process (so the test can see who waits in line) on a real Redis-compatible
server, over real WebSockets; a worker "dies" by its TCP connection closing without a goodbye.
"""

from __future__ import annotations

import time
from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager
from dataclasses import dataclass
from pathlib import Path

import pytest
import trio
from websockets.trio.client import connect

from protocol_specs.access.auth import Scope
from protocol_specs.runs import claims
from protocol_specs.runs.runs import RunRecord, RunState
from protocol_specs.runs.spec import RunSpec
from protocol_specs.wire import wire
from protocol_specs.wire.wire import ErrorCode, Role, WorkerLink
from relay.auth import TokenStore
from relay.client import Endpoint, RelayError, open_control, open_run_link
from relay.runs import claiming
from relay.runs.claims import ORPHAN_AFTER, Claims
from relay.runs.registry import Registry
from relay.server import Relay, RelayConfig, server_port
from relay.store import MemoryStore, Store, keys
from worker_shim.backends.confirm import confirm_claim

pytestmark = [pytest.mark.redis, pytest.mark.timeout(60)]

SPEC = RunSpec(command=["python", "app.py"], workdir="/w")


@dataclass
class Live:
    relay: Relay
    url: str
    alice: Endpoint
    pool: Endpoint


@asynccontextmanager
async def live(store: Store, clock: Callable[[], float] = time.time) -> AsyncIterator[Live]:
    from websockets.trio.server import serve

    tokens = TokenStore(store)
    alice, _ = await tokens.create("alice", scopes=[Scope.RUNS])
    pool, _ = await tokens.create("pool", scopes=[Scope.BACKEND])
    async with trio.open_nursery() as nursery:
        relay = Relay(store, config=RelayConfig(), clock=clock, background=nursery)
        await nursery.start(relay.fanout.listen)
        await nursery.start(relay.claims.serve)
        server = await nursery.start(
            lambda task_status: serve(relay.handle, 0, host="127.0.0.1", task_status=task_status)
        )
        url = f"ws://127.0.0.1:{server_port(server)}"
        yield Live(relay, url, Endpoint(url, token=alice), Endpoint(url, token=pool))
        nursery.cancel_scope.cancel()


async def _dies_while_claiming(live: Live, worker: str) -> None:
    """A worker that sends its claim, then vanishes: its TCP connection closes, no goodbye."""
    async with connect(live.url, compression=None) as ws:
        await ws.send(
            wire.encode_frame(wire.Hello(role=Role.CONTROL, token=live.pool.token, client=worker))
        )
        assert isinstance(wire.decode_frame(await ws.recv()), wire.Welcome)
        await ws.send(wire.encode_frame(wire.Claim(rid=1, worker=worker)))
        with trio.fail_after(10):
            await live.relay.claims.wait_until("local", 1)
        await ws.stream.aclose()  # the process is gone: the kernel closed its socket


async def test_a_worker_that_died_while_waiting_never_takes_the_next_run(
    redis_store: Store,
) -> None:
    async with live(redis_store) as lv:
        await _dies_while_claiming(lv, "dead-0")
        with trio.fail_after(10):
            await lv.relay.claims.wait_until("local", 0)  # out of line as soon as it closed
        async with open_control(lv.pool) as healthy, open_control(lv.alice) as alice:
            got: list[wire.Assigned] = []
            async with trio.open_nursery() as nursery:

                async def claim() -> None:
                    got.append(await healthy.claim("alive-0"))

                nursery.start_soon(claim)
                await lv.relay.claims.wait_until("local", 1)
                run = (await alice.submit(SPEC)).id
            assert got[0].run.id == run and got[0].run.worker == "alive-0"
            assert (await alice.get_run(run)).state is RunState.STARTING


async def test_a_claim_whose_answer_cannot_be_delivered_is_released(redis_store: Store) -> None:
    """The run came while the worker was dying: it is claimed, the answer fails, the run is
    queued again for the same attempt and the next worker gets it."""
    async with live(redis_store) as lv:
        async with open_control(lv.alice) as alice:
            run = (await alice.submit(SPEC)).id
            claimed = await lv.relay.registry.claimed(run, "dying-0")
            assert claimed is not None and claimed.record.state is RunState.STARTING
            await lv.relay.registry.release(claimed.record, "its worker is gone")
            released = await alice.get_run(run)
            assert (released.state, released.attempt, released.worker) == (RunState.QUEUED, 1, "")
            async with open_control(lv.pool) as healthy:
                with trio.fail_after(10):
                    assigned = await healthy.claim("alive-0")
            assert (assigned.run.id, assigned.run.attempt) == (run, 1)
            assert assigned.run.attempts[-1].worker == "alive-0"


async def test_a_worker_whose_confirm_comes_too_late_is_told_and_its_token_refused(
    redis_store: Store,
) -> None:
    """The claim's answer reached its worker only after the claim went back to the queue: the
    worker's confirm is refused, as is the token that answer carried; the next worker's claim of
    the same attempt is the one that counts."""
    now = [time.time()]
    async with live(redis_store, clock=lambda: now[0]) as lv:
        async with open_control(lv.alice) as alice, open_control(lv.pool) as pool:
            run = (await alice.submit(SPEC)).id
            late = await pool.claim("slow-0")
            now[0] += lv.relay.config.claim_confirm
            await lv.relay.registry.sweep()  # the sweep of any relay
            as_late = lv.pool.with_token(late.token)
            with pytest.raises(RelayError) as refused:
                await confirm_claim(pool, as_late, late, client="slow-0")
            assert refused.value.code == ErrorCode.STALE_ATTEMPT
            assert "went back to the queue" in refused.value.message
            with pytest.raises(RelayError) as revoked:
                async with open_control(as_late):
                    pass
            assert revoked.value.code == ErrorCode.UNAUTHORIZED
            assert "revoked" in revoked.value.message
            with trio.fail_after(10):
                again = await pool.claim("quick-0")
            await confirm_claim(pool, lv.pool.with_token(again.token), again, client="quick-0")
            record = await alice.get_run(run)
            assert (record.state, record.attempt, record.worker) == (
                RunState.STARTING,
                1,
                "quick-0",
            )
            assert record.attempts[-1].confirmed_at == now[0]


async def test_opening_its_worker_link_with_the_claims_token_confirms_a_claim(
    redis_store: Store,
) -> None:
    """A worker that says nothing but opens its run link with the token the claim's answer carried
    has the answer: its claim counts, and no sweep puts the run back."""
    now = [time.time()]
    async with live(redis_store, clock=lambda: now[0]) as lv:
        async with open_control(lv.alice) as alice, open_control(lv.pool) as pool:
            run = (await alice.submit(SPEC)).id
            assigned = await pool.claim("w-0")
            assert (await alice.get_run(run)).attempts[-1].confirmed_at is None
            as_worker = lv.pool.with_token(assigned.token)
            async with open_run_link(as_worker, link=WorkerLink(), run=run, attempt=1):
                pass  # connected (welcomed) before it returns
            assert (await alice.get_run(run)).attempts[-1].confirmed_at == now[0]
            now[0] += lv.relay.config.claim_confirm + 1
            await lv.relay.registry.sweep()
            record = await alice.get_run(run)
            assert (record.state, record.worker) == (RunState.STARTING, "w-0")


async def test_entries_a_dead_relay_held_are_queued_again() -> None:
    """A relay read a queue entry and died before claiming it: after ``ORPHAN_AFTER`` another
    relay's recovery queues the run again (and drops entries of runs no longer queued)."""
    now = [1000.0]
    store = MemoryStore(clock=lambda: now[0])
    registry = Registry(store, RelayConfig(), clock=lambda: now[0])
    queued = await registry.submit(SPEC, wire.Submit(rid=1, spec=SPEC).manifest, owner="alice")
    gone = await registry.submit(SPEC, wire.Submit(rid=1, spec=SPEC).manifest, owner="alice")
    assert not isinstance(queued, wire.Error) and not isinstance(gone, wire.Error)
    await registry.cancel(gone.id, "cancelled")
    async with store.blocking_reader() as dead:  # the relay that died holding both entries
        for _ in range(2):
            assert await dead.read_group(keys.queue("local"), keys.POOL_GROUP, "dead", block_ms=10)
    survivor = Claims(registry, consumer="relay-b")
    assert await survivor.recover() == 0  # not orphaned yet: maybe still in hand
    now[0] += ORPHAN_AFTER + 1
    assert await survivor.recover() == 1
    assert await store.pending(keys.queue("local"), keys.POOL_GROUP) == []
    async with store.blocking_reader() as reader:
        entry = await reader.read_group(keys.queue("local"), keys.POOL_GROUP, "b", block_ms=10)
    assert entry is not None and entry[1] == queued.id.encode()


async def _queued_runs(store: Store, backend: str = "local") -> list[str]:
    """The run ids of ``backend``'s queue entries nobody has read yet."""
    found = []
    async with store.blocking_reader() as reader:
        while entry := await reader.read_group(
            keys.queue(backend), keys.POOL_GROUP, "t", block_ms=1
        ):
            found.append(entry[1].decode())
    return found


async def test_a_claim_left_unconfirmed_is_swept_back_to_the_queue_by_another_relay() -> None:
    """A pool's claim whose answer was lost (its relay died after writing it): at its deadline
    another relay's sweep queues the run again at attempt 1 and revokes the lost answer's token;
    the worker's confirm, should it come now, is told the claim is gone."""
    now = [1000.0]
    store = MemoryStore(clock=lambda: now[0])
    config = RelayConfig(claim_confirm=15.0)
    dead, survivor = (Registry(store, config, clock=lambda: now[0]) for _ in range(2))
    submitted = await dead.submit(SPEC, wire.Submit(rid=1, spec=SPEC).manifest, owner="alice")
    assert not isinstance(submitted, wire.Error)
    assert await _queued_runs(store) == [submitted.id]  # taken from the queue by the dead relay
    claimed = await dead.claimed(submitted.id, "pool-0")
    assert claimed is not None
    claim = claimed.record.attempts[-1].claim
    assert claimed.token.startswith(f"tthw_{claim}_")  # the answer's token is the claim's id
    now[0] += 14.9
    assert await survivor.sweep() == [] and await _queued_runs(store) == []
    record = await survivor.load(submitted.id)
    assert record is not None and record.state is RunState.STARTING
    now[0] += 0.1
    await survivor.sweep()
    record = await survivor.load(submitted.id)
    assert record is not None
    assert (record.state, record.attempt, record.attempts[-1].released) == (RunState.QUEUED, 1, 1)
    assert await _queued_runs(store) == [submitted.id]  # in the queue again, once
    token = await survivor.tokens.get(claim)
    assert token is not None and token.revoked_at == now[0]
    for key in (keys.UNCONFIRMED, keys.LEASES, keys.DELAYED):
        assert await store.zrange_by_score(key, float("inf"), 10) == [], key
    late = await claiming.confirm(survivor, submitted.id, 1, claim)
    assert isinstance(late, wire.Error) and late.code == ErrorCode.STALE_ATTEMPT
    assert "not held by this claim" in late.message
    # claimed again and confirmed in time: the claim counts; a later sweep leaves it alone
    again = await survivor.claimed(submitted.id, "pool-1")
    assert again is not None and again.record.attempt == 1
    confirmed = await claiming.confirm(survivor, submitted.id, 1, again.record.attempts[-1].claim)
    assert isinstance(confirmed, RunRecord) and confirmed.attempts[-1].confirmed_at == now[0]
    now[0] += 60
    await survivor.sweep()
    kept = await survivor.load(submitted.id)
    assert kept is not None and (kept.state, kept.worker) == (RunState.STARTING, "pool-1")


async def test_a_release_cut_short_by_its_relays_death_is_queued_by_a_sweep() -> None:
    """A relay that released a pool's claim and died before it appended the run to the queue
    again leaves the run in the delayed set at the claim's deadline: the next sweep queues it."""
    now = [1000.0]
    store = MemoryStore(clock=lambda: now[0])
    registry = Registry(store, RelayConfig(claim_confirm=15.0), clock=lambda: now[0])
    submitted = await registry.submit(SPEC, wire.Submit(rid=1, spec=SPEC).manifest, owner="alice")
    assert not isinstance(submitted, wire.Error)
    assert await _queued_runs(store) == [submitted.id]
    claimed = await registry.claimed(submitted.id, "pool-0")
    assert claimed is not None
    claim = claimed.record.attempts[-1].claim
    # the release is written; its relay dies before any of its side effects
    cut_short = await registry.update(
        submitted.id, lambda r: claims.release(r, claim, at=now[0], about=1)
    )
    assert cut_short is not None and cut_short.after.state is RunState.QUEUED
    await registry.sweep()
    assert await _queued_runs(store) == []  # not due before the claim's deadline
    now[0] += 15
    await registry.sweep()
    assert await _queued_runs(store) == [submitted.id]


async def test_a_scheduler_jobs_claim_released_waits_for_its_worker_not_the_queue() -> None:
    """A claim naming its run (a scheduler job's worker) that goes back unconfirmed is queued
    again for that job's worker to claim, not appended to the backend's queue: the backend would
    launch a second job for the attempt."""
    now = [1000.0]
    store = MemoryStore(clock=lambda: now[0])
    registry = Registry(store, RelayConfig(claim_confirm=15.0), clock=lambda: now[0])
    spec = SPEC.model_copy(update={"backend": "slurm"})
    submitted = await registry.submit(spec, wire.Submit(rid=1, spec=spec).manifest, owner="alice")
    assert not isinstance(submitted, wire.Error)
    assert await _queued_runs(store, "slurm") == [submitted.id]  # dispatched
    taken = await claiming.claim_run(registry, "job-7", submitted.id, 1, mint=False)
    assert isinstance(taken, claiming.Claimed) and taken.token == ""
    now[0] += 15
    await registry.sweep()
    record = await registry.load(submitted.id)
    assert record is not None and (record.state, record.attempt) == (RunState.QUEUED, 1)
    assert await _queued_runs(store, "slurm") == []
    again = await claiming.claim_run(registry, "job-7", submitted.id, 1, mint=False)
    assert isinstance(again, claiming.Claimed)  # the job's worker, asking again, gets it


async def test_a_worker_whose_heartbeats_are_late_is_shown_silent() -> None:
    """`tether ls` says "paused (worker silent 25s)" once heartbeats are late, instead of
    "paused" for the whole lease after a worker host died."""
    from adapter.show.render import runs_table, status_text

    now = [1000.0]
    config = RelayConfig(lease=90.0)
    registry = Registry(MemoryStore(clock=lambda: now[0]), config, clock=lambda: now[0])
    submitted = await registry.submit(SPEC, wire.Submit(rid=1, spec=SPEC).manifest, owner="a")
    assert not isinstance(submitted, wire.Error)
    await registry.claimed(submitted.id, "w-0")
    now[0] += 2 * config.heartbeat  # two heartbeats may be missed: not silent yet
    record = await registry.load(submitted.id)
    assert record is not None and (await registry.with_liveness(record)).silent_for == 0
    now[0] += 5
    silent = await registry.with_liveness(record)
    assert silent.silent_for == 2 * config.heartbeat + 5
    assert "starting (worker silent 25s)" in runs_table([silent], now[0])
    assert "silent for 25s" in status_text(silent, now[0])
    assert await registry.renew_lease(submitted.id, 1)  # a heartbeat
    assert (await registry.with_liveness(record)).silent_for == 0
    assert (await registry.list_runs(10))[0].silent_for == 0


async def test_blobs_no_live_run_names_are_collected_and_recent_ones_spared() -> None:
    from protocol_specs.snapshots.snapshots import Manifest, ManifestEntry
    from relay.snapshots.blobs import MemoryBlobStore

    now = [10_000.0]
    blobs = MemoryBlobStore(clock=lambda: now[0])
    for digest in ("a" * 64, "b" * 64, "c" * 64):  # named by a live run, by none, asked about
        blobs.blobs[digest], blobs.used[digest] = b"", now[0]
    store = MemoryStore(clock=lambda: now[0])
    relay = Relay(store, blobs=blobs, config=RelayConfig(blob_grace=3600), clock=lambda: now[0])
    manifest = Manifest(entries=[ManifestEntry(path="train.py", digest="a" * 64, size=0)])
    assert not isinstance(await relay.registry.submit(SPEC, manifest, owner="alice"), wire.Error)
    assert await relay.collect_blobs() == 0  # everything is recent
    now[0] += 7200
    assert await blobs.missing(["c" * 64]) == []  # a submit asked: it is about to be named
    assert await relay.collect_blobs() == 1
    assert sorted(blobs.blobs) == ["a" * 64, "c" * 64]


async def test_the_collection_keeps_the_trees_and_files_of_a_run_recorded_by_its_tree() -> None:
    import hashlib

    from protocol_specs.snapshots.snapshots import Manifest, ManifestEntry
    from protocol_specs.snapshots.trees import build_trees
    from relay.snapshots.blobs import MemoryBlobStore
    from relay.snapshots.trees import Rooted

    now = [10_000.0]
    blobs = MemoryBlobStore(clock=lambda: now[0])
    kept, other = hashlib.sha256(b"x").hexdigest(), hashlib.sha256(b"y").hexdigest()
    trees = build_trees(Manifest(entries=[ManifestEntry(path="src/a.py", digest=kept, size=1)]))
    for digest, data in [*trees.blobs.items(), (kept, b"x"), (other, b"y")]:
        blobs.blobs[digest], blobs.used[digest] = data, now[0]
    store = MemoryStore(clock=lambda: now[0])
    relay = Relay(store, blobs=blobs, config=RelayConfig(blob_grace=3600), clock=lambda: now[0])
    rooted = Rooted(tree=trees.root, snapshot=trees.root, files=1, size=1)
    assert not isinstance(await relay.registry.submit(SPEC, rooted, owner="alice"), wire.Error)
    now[0] += 7200
    assert await relay.collect_blobs() == 1
    assert sorted(blobs.blobs) == sorted([*trees.blobs, kept])


async def test_the_file_blob_store_sweeps_by_name_and_age(tmp_path: Path) -> None:
    import hashlib
    import os

    from relay.snapshots.blobs import FileBlobStore

    store = FileBlobStore(tmp_path / "blobs")
    digests = []
    for data in (b"kept", b"old", b"young"):
        digest = hashlib.sha256(data).hexdigest()
        upload = await store.begin(digest, len(data))
        await upload.write(data)
        await upload.commit()
        digests.append(digest)
    kept, old, _young = digests  # the young one is spared by its age
    for digest in (kept, old):
        os.utime(store.path(digest), (1000, 1000))
    gone = await store.sweep(lambda d: d == kept, older_than=2000)
    assert gone == 1 and await store.missing(digests) == [old]


async def test_a_whole_blob_is_stored_in_one_go_and_refused_whole(tmp_path: Path) -> None:
    import hashlib

    from relay.snapshots.blobs import BlobError, FileBlobStore

    store = FileBlobStore(tmp_path / "blobs")
    good = hashlib.sha256(b"bytes").hexdigest()
    await store.put(good, b"bytes")
    assert await store.read(good, 0, 100) == (5, b"bytes")
    with pytest.raises(BlobError, match="do not match the digest"):
        await store.put("0" * 64, b"other bytes")
    assert await store.missing(["0" * 64]) == ["0" * 64]
    assert list((tmp_path / "blobs" / "incoming").iterdir()) == []  # no part file left behind


async def test_a_run_is_named_by_a_unique_prefix_of_its_id_or_by_its_name(
    redis_store: Store,
) -> None:
    from relay.client import RelayError

    async with live(redis_store) as lv:
        bob = Endpoint(lv.url, token=(await TokenStore(redis_store).create("bob"))[0])
        async with open_control(lv.alice) as alice:
            first = await alice.submit(SPEC.model_copy(update={"name": "lr-sweep"}))
            second = await alice.submit(SPEC)
            assert (await alice.get_run(first.id[:-1])).id == first.id
            assert (await alice.get_run("lr-sweep")).id == first.id
            shared = next(i for i in range(4, 15) if first.id[:i] != second.id[:i]) - 1
            if shared >= 4:  # submitted in the same second: the time part is common
                with pytest.raises(RelayError, match="give more of the id"):
                    await alice.get_run(first.id[:shared])
        async with open_control(bob) as control:
            for name in (first.id[:-1], "lr-sweep"):
                with pytest.raises(RelayError) as refused:
                    await control.get_run(name)
                assert refused.value.code == "no_such_run"  # not found: not bob's to find
