"""Slurm's warnings preempt a run on a real single-node Slurm (``tests/slurm_cluster.py``): a job
requeued (``scontrol requeue``, what preemption with ``PreemptMode=REQUEUE`` does) or warned
before its time limit (``--signal=B:USR1@G``; sent here as Slurm sends it, to the batch shell,
with ``scancel --signal=USR1 --batch``) reaches the program as ``tether.should_preempt()``; it
saves its step and exits; the attempt ends ``preempted``; attempt 2 runs without using a retry
(``--max-retries 0``), starts from the saved step and finishes."""

from __future__ import annotations

import re
from pathlib import Path

import pytest
import trio
from slurm_cluster import SlurmCluster
from stack import relay_stack, tether
from test_slurm_e2e import slurm, slurm_backend

pytestmark = [pytest.mark.slow, pytest.mark.slurm, pytest.mark.timeout(240)]

__all__ = ["slurm"]  # the cluster fixture, shared

#: a loop that checkpoints its step when it is preempted and resumes from its latest checkpoint
#: (argv[1]: how long its save takes)
LOOP = """\
import signal, sys, time
import tether

start = tether.latest_checkpoint()
saved = tether.checkpoint_dir() / "step"
step = 0 if start is None else int(saved.read_text())
signals = []
for sig in (signal.SIGTERM, signal.SIGUSR1):
    signal.signal(sig, lambda n, _f: signals.append(signal.Signals(n).name))
print("starting at step", step, flush=True)
while start is None or step < start + 5:
    if tether.should_preempt():
        time.sleep(float(sys.argv[1]) if sys.argv[1:] else 0)  # a long save
        saved.write_text(str(step))
        began = time.monotonic()
        try:
            tether.save_checkpoint(step)
        except BaseException as exc:
            print("save failed:", repr(exc), flush=True)
            raise
        took = time.monotonic() - began
        print("preempted at step", step, "after", ",".join(signals), "saved in", took, flush=True)
        sys.exit(3)  # not done: a program that exits 0 has finished, preempted or not
    step += 1
    time.sleep(0.2)
print("finished at step", step, flush=True)
"""


@pytest.mark.parametrize("warning", ["requeue", "time limit"])
async def test_a_warned_slurm_job_is_preempted_and_resumes_without_a_retry(
    tmp_path: Path, slurm: SlurmCluster, warning: str
) -> None:
    workdir = tmp_path / "project"
    workdir.mkdir()
    (workdir / "loop.py").write_text(LOOP)
    home = tmp_path / "home"
    async with (
        relay_stack(home, workers=0) as (_up, relay),
        slurm_backend(home, relay, slurm) as backend,
    ):
        async with tether(
            "run", "--backend", "slurm", "--max-retries", "0", "--time", "30m",
            "--follow", "--workdir", str(workdir),
            "--", "python", "loop.py",
            home=home, name="run",
        ) as run:  # fmt: skip
            run_id = (await run.wait_line(r"tether run: run (\S+) queued")).group(1)
            first = (
                await backend.wait_line(rf"run {run_id} attempt 1: submitted as Slurm job (\d+)")
            ).group(1)
            await run.wait_line(r"^starting at step 0")
            script = (home / "slurm" / "jobs" / f"{run_id}-1.sh").read_text()
            assert "#SBATCH --signal=B:USR1@60" in script
            assert "--scheduler slurm --kill-wait 5" in script  # the test cluster's KillWait
            if warning == "requeue":
                slurm.run("scontrol", "requeue", first)
                seen = await run.wait_line(r"^preempted at step (\d+) after (\S*)")
            else:
                slurm.run("scancel", "--signal=USR1", "--batch", first)
                seen = await run.wait_line(r"^preempted at step (\d+) after (\S*)")
                assert seen.group(2) == "SIGUSR1"  # the worker passed Slurm's warning on
            step = int(seen.group(1))
            assert step > 0
            await run.wait_line(rf"attempt 1 was preempted; attempt 2 resumes from step {step}")
            second = (
                await backend.wait_line(rf"run {run_id} attempt 2: submitted as Slurm job (\d+)")
            ).group(1)
            assert second != first
            await run.wait_line(rf"^starting at step {step}$")
            await run.wait_line(rf"^finished at step {step + 5}$")
            await run.wait_line(rf"-- tether: run {run_id} succeeded")
            assert await run.process.wait() == 0
        if warning == "requeue":  # the requeued job was cancelled, never ran attempt 1 again
            state_of_first = await trio.to_thread.run_sync(slurm.job_state, first)
            assert state_of_first in ("CANCELLED", None)
        async with tether("status", run_id, home=home, name="status") as status:
            await status.process.wait()
        assert re.search(rf"#1 .*job {first} .*-> preempted", status.output), status.output
        assert re.search(rf"#2 on \S+ job {second} .*-> succeeded", status.output), status.output
        assert "lost" not in status.output


async def test_a_slurm_job_cancelled_by_hand_is_lost_not_preempted(
    tmp_path: Path, slurm: SlurmCluster
) -> None:
    """``scancel`` sends the SIGTERM a requeue sends: the worker asks Slurm, sees CANCELLED and
    does not preempt; the attempt is lost and, with no retry left, so is the run."""
    workdir = tmp_path / "project"
    workdir.mkdir()
    (workdir / "loop.py").write_text(LOOP)
    home = tmp_path / "home"
    async with (
        relay_stack(home, workers=0) as (_up, relay),
        slurm_backend(home, relay, slurm) as backend,
    ):
        async with tether(
            "run", "--backend", "slurm", "--max-retries", "0", "--time", "30m",
            "--follow", "--workdir", str(workdir),
            "--", "python", "loop.py",
            home=home, name="run",
        ) as run:  # fmt: skip
            run_id = (await run.wait_line(r"tether run: run (\S+) queued")).group(1)
            job = (
                await backend.wait_line(rf"run {run_id} attempt 1: submitted as Slurm job (\d+)")
            ).group(1)
            await run.wait_line(r"^starting at step 0")
            slurm.run("scancel", job)
            await run.wait_line(rf"-- tether: run {run_id} lost")
            await run.process.wait()
        assert "preempted at step" not in run.output
        async with tether("status", run_id, home=home, name="status") as status:
            await status.process.wait()
        assert re.search(rf"#1 .*job {job} .*-> lost", status.output), status.output
