"""Checkpoints follow the run (issue 44, item 1): a real relay on a real Redis-compatible server, a
real local pool worker, a real program using ``tether.save_checkpoint``. The worker dies midway;
the retry, on another worker, finds the latest checkpoint restored and finishes from there. And a
``--from-checkpoint`` that cannot seed the run is refused at submit, in one line."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest
import trio
from live_relay import live_relay

from adapter.cli.submission import submit_run
from protocol_specs.checkpoints.book import CheckpointBook
from protocol_specs.checkpoints.checkpoints import Checkpoint
from protocol_specs.runs.runs import RunRecord, RunState
from protocol_specs.runs.spec import RunSpec
from protocol_specs.wire import wire
from relay.client import Endpoint, RelayError, follow_logs, open_control
from relay.runs.checkpoints import FILES_FIELD
from relay.store import Store, keys
from worker_shim.backends.pool import run_pool

pytestmark = [pytest.mark.redis, pytest.mark.slow, pytest.mark.timeout(180)]

#: checkpoints every 3 steps; the first attempt stops (for ever) once it saved step 6
TRAIN = """\
import sys, time
import tether

start = tether.latest_checkpoint()
where = tether.checkpoint_dir()
if start is not None:
    assert (where / "step").read_text() == str(start), "the restored file is not the step's"
print(f"attempt starts at {0 if start is None else start + 1} (restored {start})", flush=True)
for step in range(0 if start is None else start + 1, 10):
    if step % 3 == 0:
        (where / "step").write_text(str(step))
        stored = tether.save_checkpoint(step)
        assert stored["step"] == step, stored
    if step == 6 and start is None:
        print("midway", flush=True)
        time.sleep(3600)
print("finished", flush=True)
"""


def spec_of(workdir: Path, **fields: object) -> RunSpec:
    return RunSpec(
        command=[sys.executable, "train.py"], workdir=str(workdir), debug=False,
        debuggable=False, **fields,  # type: ignore[arg-type]
    )  # fmt: skip


def text_of(entries: list[wire.AnyEntry]) -> str:
    return b"".join(e.data for e in entries if isinstance(e, wire.LogEntry)).decode()


async def test_a_retry_on_another_worker_resumes_from_the_latest_checkpoint(
    redis_store: Store, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("TETHER_HOME", str(tmp_path / "home"))
    workdir = tmp_path / "project"
    workdir.mkdir()
    (workdir / "train.py").write_text(TRAIN)
    entries: list[wire.AnyEntry] = []
    midway = trio.Event()

    def seen(entry: wire.AnyEntry) -> None:
        entries.append(entry)
        if "midway" in text_of(entries):
            midway.set()

    async with live_relay(redis_store) as relay, trio.open_nursery() as nursery:
        first = trio.CancelScope()

        async def pool(name: str, scope: trio.CancelScope | None = None) -> None:
            with scope or trio.CancelScope():
                await run_pool(relay.pool, slots=1, work_dir=tmp_path / name, gpus=[], name=name)

        nursery.start_soon(pool, "first", first)
        spec = spec_of(workdir, max_retries=1, retry_backoff=0.0, keep_checkpoints=2)
        record = await submit_run(relay.alice, spec, lambda _line: None)
        done = trio.Event()
        ended: list[RunRecord] = []

        async def follow() -> None:
            await follow_logs(relay.alice, record.id, seen)
            async with open_control(relay.alice) as control:
                ended.append(await control.get_run(record.id))
            done.set()

        nursery.start_soon(follow)
        with trio.fail_after(60):
            await midway.wait()
        first.cancel()  # the first worker dies with its program, midway
        nursery.start_soon(pool, "second")
        with trio.fail_after(90):
            await done.wait()
        nursery.cancel_scope.cancel()
    run = ended[0]
    logs = text_of(entries)
    assert run.state is RunState.SUCCEEDED, (run.state, run.detail, logs)
    assert [a.n for a in run.attempts] == [1, 2]
    assert "attempt starts at 0 (restored None)" in logs
    assert "attempt starts at 7 (restored 6)" in logs, logs
    assert logs.count("finished") == 1
    assert run.checkpoint is not None and run.checkpoint.step == 9 and run.checkpoint.attempt == 2
    assert run.checkpoints == 2  # --keep-checkpoints 2: steps 6 and 9


async def test_a_seed_that_cannot_be_had_is_refused_at_submit(
    redis_store: Store, tmp_path: Path
) -> None:
    async with live_relay(redis_store) as relay:
        async with open_control(relay.alice) as control:
            mine = await control.submit(spec_of(tmp_path, name="no checkpoints"))
        async with open_control(relay.bob) as control:
            bobs = await control.submit(spec_of(tmp_path))
        said = {}
        for seed in ("nosuchrun", bobs.id, mine.id):
            said[seed] = await refused(relay.alice, spec_of(tmp_path, from_checkpoint=seed))
        book = CheckpointBook(kept=[Checkpoint(step=5, attempt=1, files="ab" * 32)])
        key = keys.checkpoints(mine.id)
        await redis_store.set_versioned(key, FILES_FIELD, book.model_dump_json().encode(), 0)
        for seed in (f"{mine.id}:3", f"{mine.id}:5", mine.id):
            said[f"then {seed}"] = await refused(
                relay.alice, spec_of(tmp_path, from_checkpoint=seed)
            )
    assert said == {
        "nosuchrun": "--from-checkpoint: there is no run nosuchrun",
        bobs.id: f"--from-checkpoint: run {bobs.id} is not yours (bob's)",
        mine.id: f"--from-checkpoint: run {mine.id} has no checkpoint "
        "(tether.save_checkpoint saves one)",
        # once it has its checkpoint of step 5
        f"then {mine.id}:3": f"--from-checkpoint: run {mine.id} has no checkpoint of step 3 (it "
        "keeps steps 5; latest 5)",
        f"then {mine.id}:5": "",
        f"then {mine.id}": "",
    }


async def refused(user: Endpoint, spec: RunSpec) -> str:
    """Why the relay refused ``spec`` (a ``bad_spec``); "" if it took it."""
    errors: list[RelayError] = []
    try:
        async with open_control(user) as control:
            await control.submit(spec)
    except* RelayError as group:
        errors += [e for e in group.exceptions if isinstance(e, RelayError)]
    if not errors:
        return ""
    assert errors[0].code == wire.ErrorCode.BAD_SPEC, errors
    return errors[0].message
