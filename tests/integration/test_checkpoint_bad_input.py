"""Bad checkpoints on a real worker (issue 44): a real relay on a real Redis-compatible server with
blobs in files, a real local pool worker, a real program. A checkpoint over the relay's limit is
refused to ``save_checkpoint`` in one line and the earlier ones stay; a stored checkpoint whose
chunk file was overwritten with garbage is skipped at restore for the older intact one, and the
logs say which step. A worker whose disk is too small for the checkpoint fails the attempt's start
in one line, and the checkpoint stays for a worker with room."""

from __future__ import annotations

import subprocess
import sys
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import pytest
import trio
from live_relay import live_relay
from test_checkpoint_resume import spec_of, text_of

from adapter.cli.submission import submit_run
from protocol_specs.runs.runs import RunState
from protocol_specs.wire import wire
from relay.client import Endpoint, follow_logs, open_control
from relay.config import RelayConfig
from relay.snapshots.blobs import FileBlobStore
from relay.store import Store

pytestmark = [pytest.mark.redis, pytest.mark.slow, pytest.mark.timeout(120)]

LIMIT = 64 * 1024

#: attempt 1 saves steps 3 and 6, then one over the relay's limit, then waits to be paused;
#: a later attempt says what was restored
TRAIN = """\
import sys, time
import tether

start = tether.latest_checkpoint()
state = tether.checkpoint_dir() / "state"
if start is not None:
    print(f"restored {start}: {state.read_text().splitlines()[0]}", flush=True)
    sys.exit(0)
for step in (3, 6):
    state.write_text(f"state of step {step}\\n" * 1000)
    tether.save_checkpoint(step)
state.write_bytes(b"x" * (LIMIT + 1))
try:
    tether.save_checkpoint(9)
except Exception as exc:
    print(f"save of step 9: {type(exc).__name__}: {exc}", flush=True)
print("saved", flush=True)
while not tether.should_preempt():
    time.sleep(0.05)
sys.exit(3)
""".replace("LIMIT", str(LIMIT))


async def test_a_checkpoint_over_the_limit_is_refused_and_a_corrupt_one_skipped_for_the_older(
    redis_store: Store, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("TETHER_HOME", str(tmp_path / "home"))
    workdir = tmp_path / "project"
    workdir.mkdir()
    (workdir / "train.py").write_text(TRAIN)
    blobs = FileBlobStore(tmp_path / "blobs")
    entries: list[wire.AnyEntry] = []
    said = {text: trio.Event() for text in ("saved", "is suspended", "restored")}

    def seen(entry: wire.AnyEntry) -> None:
        entries.append(entry)
        got = text_of(entries) + " ".join(
            e.detail for e in entries if isinstance(e, wire.StatusEntry)
        )
        for text, event in said.items():
            if text in got:
                event.set()

    config = RelayConfig(checkpoint_limit=LIMIT)
    async with live_relay(redis_store, config, blobs) as relay, trio.open_nursery() as nursery:
        nursery.start_soon(lambda: run_pool_of(relay.pool, tmp_path / "pool"))
        spec = spec_of(workdir, sys.executable, keep_checkpoints=3)
        record = await submit_run(relay.alice, spec, lambda _line: None)
        finished = trio.Event()

        async def follow() -> None:
            await follow_logs(relay.alice, record.id, seen)  # until the run finished
            finished.set()

        nursery.start_soon(follow)
        async with open_control(relay.alice) as alice:
            with trio.fail_after(60):
                await said["saved"].wait()
            kept = (await alice.checkpoints(record.id)).checkpoints
            assert [c.step for c in kept] == [3, 6]  # step 9 refused, the others intact
            await alice.preempt(record.id, suspend=True, grace=30, detail="paused by the test")
            with trio.fail_after(60):
                await said["is suspended"].wait()
            at_6 = await alice.checkpoints(record.id, step=6, with_files=True)
            assert at_6.files is not None
            chunk = at_6.files.files[0].chunks[0]
            blobs.path(chunk).write_bytes(b"garbage" * 100)  # the relay's file of that chunk
            await alice.resume(record.id)
            with trio.fail_after(60):
                await said["restored"].wait()
            with trio.fail_after(30):
                await finished.wait()
            run = await alice.get_run(record.id)
        nursery.cancel_scope.cancel()
    logs = text_of(entries)
    assert (
        "save of step 9: CheckpointError: cannot store the checkpoint of step 9: the files hold "
        "64.0 KiB, over the limit of 64.0 KiB\n" in logs
    ), logs
    assert "tether: skipped the checkpoint of step 6: chunk 1 of state is corrupt" in logs, logs
    assert "restored 3: state of step 3" in logs, logs
    assert run.state is RunState.SUCCEEDED
    assert [a.outcome for a in run.attempts] == ["preempted", "succeeded"]


async def run_pool_of(pool: object, work_dir: Path) -> None:
    from worker_shim.backends.pool import run_pool

    await run_pool(pool, slots=1, work_dir=work_dir, gpus=[], name="w")  # type: ignore[arg-type]


#: attempt 1 saves a 3 MiB checkpoint of step 6, then waits to be paused; a later attempt (or a
#: run seeded from it) says what was restored
BIG = """\
import hashlib, sys, time
import tether

start = tether.latest_checkpoint()
state = tether.checkpoint_dir() / "state"
if start is not None:
    print(f"restored {start}: {hashlib.sha256(state.read_bytes()).hexdigest()}", flush=True)
    sys.exit(0)
data = b"".join(hashlib.sha256(str(i).encode()).digest() for i in range(3 * 32768))
state.write_bytes(data)
tether.save_checkpoint(6)
print(f"saved {hashlib.sha256(data).hexdigest()}", flush=True)
while not tether.should_preempt():
    time.sleep(0.05)
sys.exit(3)
"""


@contextmanager
def small_tmpfs(where: Path, size: str) -> Iterator[Path]:
    where.mkdir()
    mounted = subprocess.run(
        ["mount", "-t", "tmpfs", "-o", f"size={size}", "tmpfs", str(where)],
        capture_output=True, text=True, check=False,
    )  # fmt: skip
    if mounted.returncode != 0:
        pytest.skip(f"cannot mount a tmpfs (root is needed): {mounted.stderr.strip()}")
    try:
        yield where
    finally:
        subprocess.run(["umount", "-l", str(where)], check=False)


async def test_a_full_disk_at_restore_fails_the_start_in_one_line_and_keeps_the_checkpoint(
    redis_store: Store, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("TETHER_HOME", str(tmp_path / "home"))
    workdir = tmp_path / "project"
    workdir.mkdir()
    (workdir / "train.py").write_text(BIG)
    lines: dict[str, list[wire.AnyEntry]] = {}

    async def follow(relay: Endpoint, run: str, wanted: str | None, seen: trio.Event) -> None:
        """``seen`` set once ``wanted`` is in the run's logs, or (None) once the run finished."""
        got = lines.setdefault(run, [])

        def each(entry: wire.AnyEntry) -> None:
            got.append(entry)
            if wanted is not None and wanted in text_of(got) + " ".join(
                e.detail for e in got if isinstance(e, wire.StatusEntry)
            ):
                seen.set()

        await follow_logs(relay, run, each)
        seen.set()  # finished

    with small_tmpfs(tmp_path / "small", "2m") as small:
        async with live_relay(redis_store) as relay, trio.open_nursery() as nursery:
            roomy = trio.CancelScope()
            nursery.start_soon(pool_in, relay.pool, tmp_path / "roomy", roomy)
            record = await submit_run(relay.alice, spec_of(workdir), lambda _line: None)
            saved, suspended, ended = trio.Event(), trio.Event(), trio.Event()
            nursery.start_soon(follow, relay.alice, record.id, "saved", saved)
            async with open_control(relay.alice) as alice:
                with trio.fail_after(60):
                    await saved.wait()
                digest = text_of(lines[record.id]).split("saved ")[1].split()[0]
                nursery.start_soon(follow, relay.alice, record.id, "is suspended", suspended)
                await alice.preempt(record.id, suspend=True, grace=30, detail="paused")
                with trio.fail_after(60):
                    await suspended.wait()
                roomy.cancel()  # only the worker with no room is left
                nursery.start_soon(pool_in, relay.pool, small, None)
                nursery.start_soon(follow, relay.alice, record.id, None, ended)
                await alice.resume(record.id)
                with trio.fail_after(60):
                    await ended.wait()
                run = await alice.get_run(record.id)
                assert run.state is RunState.FAILED, (run.state, run.detail)
                assert run.detail.startswith("cannot restore checkpoint of step 6 (3.0 MiB)")
                assert "no space left on" in run.detail and "\n" not in run.detail
                kept = (await alice.checkpoints(record.id)).checkpoints
                assert [c.step for c in kept] == [6]  # intact
                # a run seeded from it, on a worker with room, restores it whole
                nursery.start_soon(pool_in, relay.pool, tmp_path / "roomy2", None)
                seeded = spec_of(workdir, from_checkpoint=record.id)
                again = await submit_run(relay.alice, seeded, lambda _line: None)
                restored = trio.Event()
                nursery.start_soon(follow, relay.alice, again.id, None, restored)
                with trio.fail_after(60):
                    await restored.wait()
            nursery.cancel_scope.cancel()
    assert f"restored 6: {digest}" in text_of(lines[again.id]), text_of(lines[again.id])


async def pool_in(pool: Endpoint, work_dir: Path, scope: trio.CancelScope | None) -> None:
    from worker_shim.backends.pool import run_pool

    with scope or trio.CancelScope():
        await run_pool(pool, slots=1, work_dir=work_dir, gpus=[], name=work_dir.name)
