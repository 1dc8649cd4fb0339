"""Bad checkpoints on a real worker (issue 44): a real relay on a real Redis-compatible server with
blobs in files, a real local pool worker, a real program. A checkpoint over the relay's limit is
refused to ``save_checkpoint`` in one line and the earlier ones stay; a stored checkpoint whose
chunk file was overwritten with garbage is skipped at restore for the older intact one, and the
logs say which step."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest
import trio
from live_relay import live_relay
from test_checkpoint_resume import spec_of, text_of

from adapter.cli.submission import submit_run
from protocol_specs.runs.runs import RunState
from protocol_specs.wire import wire
from relay.client import follow_logs, open_control
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
