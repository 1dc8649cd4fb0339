"""Preempting, pausing and resuming runs on a real relay (a real Redis-compatible server) with a
real worker pool running real programs (``protocol_specs/runs/preemption.py``,
``relay/runs/preempting.py``, ``worker_shim/program/preempt.py``).

Each program notes what it saw in a file of a directory every uid may write (``shared_tmp``: a
root pool runs programs as uids of their own). Nothing waits by sleeping: each step waits for the
run's logs to say it happened (the program's ``ready`` line, the relay's status entries).
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path

import pytest
import trio
from live_relay import Relay, live_relay

from protocol_specs.runs.runs import RunRecord, RunState
from protocol_specs.runs.spec import RunSpec
from protocol_specs.wire import wire
from relay.client import Endpoint, RelayError, follow_logs, open_control
from relay.store import Store
from worker_shim.backends.pool import run_pool

pytestmark = [pytest.mark.redis, pytest.mark.slow, pytest.mark.timeout(120)]

REPO = Path(__file__).resolve().parents[2]

#: attempt 1 waits for its preempt (trapping SIGUSR1 if asked: it notes should_preempt() and
#: exits 3); a later attempt (its marker exists) exits 0
PROGRAM = """
import os, signal, sys, time
import tether
marks = sys.argv[1]
started = os.path.join(marks, "started")
if os.path.exists(started):
    print("attempt 2 ran", flush=True)
    sys.exit(0)
open(started, "w").close()
if sys.argv[2] == "trap":
    def preempted(signum, frame):
        with open(os.path.join(marks, "warned"), "w") as f:
            f.write(str(tether.should_preempt()))
        sys.exit(3)
    signal.signal(signal.SIGUSR1, preempted)
print("ready", flush=True)
while True:
    time.sleep(0.05)
"""


def spec_of(where: Path, mode: str, **more: object) -> RunSpec:
    script = where / "program.py"
    script.write_text(PROGRAM)
    script.chmod(0o644)
    marks = where / "marks"
    marks.mkdir(exist_ok=True)
    marks.chmod(0o777)
    command = [sys.executable, str(script), str(marks), mode]
    return RunSpec(command=command, workdir="/w", debug=False, debuggable=False, **more)  # type: ignore[arg-type]


class Watch:
    """A run's logs followed to their end: an event per text seen, the lines so far."""

    def __init__(self) -> None:
        self.lines: list[str] = []
        self.waiting: dict[str, trio.Event] = {}
        self.ended = trio.Event()

    def seen(self, text: str) -> trio.Event:
        event = self.waiting.setdefault(text, trio.Event())
        if any(text in line for line in self.lines):
            event.set()
        return event

    def __call__(self, entry: wire.LogEntry | wire.StatusEntry) -> None:
        if isinstance(entry, wire.LogEntry):
            line = entry.data.decode(errors="replace")
        else:
            line = f"[{entry.event}] {entry.detail}"
        self.lines.append(line)
        for text, event in self.waiting.items():
            if text in line:
                event.set()


@asynccontextmanager
async def watching(nursery: trio.Nursery, user: Endpoint, run: str) -> AsyncIterator[Watch]:
    watch = Watch()

    async def follow() -> None:
        await follow_logs(user, run, watch)
        watch.ended.set()

    nursery.start_soon(follow)
    yield watch


async def pool(nursery: trio.Nursery, relay: Relay, where: Path, slots: int = 1) -> None:
    await nursery.start(
        lambda task_status: run_pool(
            relay.pool, slots=slots, work_dir=where / "pool", gpus=[], name="p",
            task_status=task_status,
        )
    )  # fmt: skip


async def record_of(user: Endpoint, run: str) -> RunRecord:
    async with open_control(user) as control:
        return await control.get_run(run)


async def wait_for(watch: Watch, text: str) -> None:
    with trio.fail_after(60):
        await watch.seen(text).wait()


async def test_a_preempted_attempt_is_warned_and_retried_without_using_a_retry(
    redis_store: Store, tmp_path: Path, shared_tmp: Path
) -> None:
    spec = spec_of(shared_tmp, "trap", max_retries=0)
    async with live_relay(redis_store) as relay, trio.open_nursery() as nursery:
        await pool(nursery, relay, tmp_path)
        async with open_control(relay.alice) as control:
            run = (await control.submit(spec)).id
        async with watching(nursery, relay.alice, run) as watch:
            await wait_for(watch, "ready")
            async with open_control(relay.alice) as control:
                marked = await control.preempt(run, grace=30, detail="test")
            assert marked.attempts[-1].preempt == "retry"
            with trio.fail_after(60):
                await watch.ended.wait()
        done = await record_of(relay.alice, run)
        nursery.cancel_scope.cancel()
    assert (shared_tmp / "marks" / "warned").read_text() == "True"
    assert done.state is RunState.SUCCEEDED, done
    first, second = done.attempts
    assert (first.outcome, first.exit_code) == ("preempted", 3)
    assert second.outcome == "succeeded"
    said = "\n".join(watch.lines)
    assert "preempting attempt 1: test; the program has 30 s" in said
    assert "attempt 1 was preempted; attempt 2 starts from the beginning" in said
    assert "attempt 2 ran" in said


async def test_a_program_that_does_not_trap_the_signal_is_ended_at_the_grace(
    redis_store: Store, tmp_path: Path, shared_tmp: Path
) -> None:
    spec = spec_of(shared_tmp, "ignore", max_retries=0)
    async with live_relay(redis_store) as relay, trio.open_nursery() as nursery:
        await pool(nursery, relay, tmp_path)
        async with open_control(relay.alice) as control:
            run = (await control.submit(spec)).id
        async with watching(nursery, relay.alice, run) as watch:
            await wait_for(watch, "ready")
            async with open_control(relay.alice) as control:
                await control.preempt(run, grace=0.5)
            with trio.fail_after(60):
                await watch.ended.wait()
        done = await record_of(relay.alice, run)
        nursery.cancel_scope.cancel()
    first = done.attempts[0]
    # ended as a terminate ends it (SIGTERM), not killed by a SIGUSR1 it does not trap
    assert (first.outcome, first.exit_code) == ("preempted", -signal.SIGTERM)
    assert done.state is RunState.SUCCEEDED
    assert not (shared_tmp / "marks" / "warned").exists()


async def test_pause_frees_the_slot_and_resume_runs_it_again(
    redis_store: Store, tmp_path: Path, shared_tmp: Path
) -> None:
    paused_dir, other_dir = shared_tmp / "a", shared_tmp / "b"
    paused_dir.mkdir(mode=0o777)
    other_dir.mkdir(mode=0o777)
    paused_dir.chmod(0o777)
    other_dir.chmod(0o777)
    spec = spec_of(paused_dir, "trap")
    async with live_relay(redis_store) as relay, trio.open_nursery() as nursery:
        await pool(nursery, relay, tmp_path, slots=1)
        async with open_control(relay.alice) as control:
            run = (await control.submit(spec)).id
        async with watching(nursery, relay.alice, run) as watch:
            await wait_for(watch, "ready")
            async with open_control(relay.alice) as control:
                await control.preempt(run, grace=30, suspend=True)
            await wait_for(watch, "[suspended]")
            suspended = await record_of(relay.alice, run)
            assert suspended.state is RunState.SUSPENDED
            assert suspended.attempts[-1].outcome == "preempted"
            # its slot is free: another run gets it
            other = spec_of(other_dir, "trap")
            (other_dir / "marks" / "started").touch()  # it exits 0 at once
            async with open_control(relay.alice) as control:
                second = (await control.submit(other)).id
            with trio.fail_after(60):
                await follow_logs(relay.alice, second, lambda _entry: None)
            assert (await record_of(relay.alice, second)).state is RunState.SUCCEEDED
            async with open_control(relay.alice) as control:
                with pytest.raises(RelayError, match="has no checkpoint: it would start again"):
                    await control.resume(run)
                resumed = await control.resume(run, from_start=True)
            assert (resumed.state, resumed.attempt) == (RunState.QUEUED, 2)
            with trio.fail_after(60):
                await watch.ended.wait()
        done = await record_of(relay.alice, run)
        nursery.cancel_scope.cancel()
    assert done.state is RunState.SUCCEEDED
    assert [a.outcome for a in done.attempts] == ["preempted", "succeeded"]
    assert "attempt 2 ran" in "\n".join(watch.lines)


async def test_a_pool_stopped_by_sigterm_preempts_its_runs_and_they_are_not_failed(
    redis_store: Store, tmp_path: Path, shared_tmp: Path
) -> None:
    spec = spec_of(shared_tmp, "trap", max_retries=0)
    async with live_relay(redis_store) as relay, trio.open_nursery() as nursery:
        env = {**os.environ, "TETHER_TOKEN": relay.pool.token or "", "TETHER_HOME": str(tmp_path)}
        out = (tmp_path / "worker.log").open("wb")
        worker = await trio.lowlevel.open_process(
            [sys.executable, "-m", "adapter.cli", "worker", "--relay", relay.url, "--slots", "2",
             "--work-dir", str(tmp_path / "worker"), "--no-isolation", "--any-user"],
            cwd=REPO, env=env, stdout=out, stderr=subprocess.STDOUT,
        )  # fmt: skip
        try:
            async with open_control(relay.alice) as control:
                run = (await control.submit(spec)).id
            async with trio.open_nursery() as following:
                async with watching(following, relay.alice, run) as watch:
                    await wait_for(watch, "ready")
                    following.cancel_scope.cancel()
            worker.send_signal(signal.SIGTERM)
            with trio.fail_after(60):
                code = await worker.wait()  # once its preempted attempt ended
            # the run's logs as the relay keeps them, read afresh
            async with watching(nursery, relay.alice, run) as watch:
                await wait_for(watch, "attempt 1 was preempted; attempt 2 starts")
            record = await record_of(relay.alice, run)
            assert code == 128 + signal.SIGTERM
            # max_retries 0, yet queued again, and not claimed by the stopping pool's idle slot
            assert (record.state, record.attempt) == (RunState.QUEUED, 2), record
            assert len(record.attempts) == 2
            assert (record.attempts[0].outcome, record.attempts[0].exit_code) == ("preempted", 3)
            assert (shared_tmp / "marks" / "warned").read_text() == "True"
        finally:
            if worker.returncode is None:
                worker.kill()
            out.close()
            print((tmp_path / "worker.log").read_text())
            nursery.cancel_scope.cancel()
