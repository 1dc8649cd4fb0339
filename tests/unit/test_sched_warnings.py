"""A scheduler's warnings become preemptions (``worker_shim/program/sched_warnings.py``): what the
backends ask of Slurm and Ray for it, and what the job's worker does with each signal. The real
Slurm and Ray are in ``tests/e2e/test_slurm_preempt_e2e.py`` and ``tests/e2e/test_ray_e2e.py``."""

from __future__ import annotations

import os
import signal
from pathlib import Path

import pytest
import trio

from protocol_specs.runs.resources import Resources
from protocol_specs.runs.runs import RunRecord
from protocol_specs.runs.spec import RunSpec
from worker_shim.backends.ray_jobs import job_request
from worker_shim.backends.slurm import job_script, kill_wait_of, sbatch_options
from worker_shim.program.sched_warnings import (
    Warned,
    cancelled_in,
    ray_stop_wait,
    trap_warnings,
    warnings_of,
)


def record(*, grace: float = 60.0, **resources: object) -> RunRecord:
    spec = RunSpec(
        command=["python", "t.py"],
        workdir="/w",
        resources=Resources(**resources),  # type: ignore[arg-type]
        preempt_grace=grace,
    )
    return RunRecord(id="r1", spec=spec, attempt=1)


def test_a_run_with_a_time_limit_is_warned_its_grace_ahead_never_less_than_a_minute() -> None:
    assert "--signal=B:USR1@60" in sbatch_options(record(time_limit=3600, grace=10))
    assert "--signal=B:USR1@91" in sbatch_options(record(time_limit=3600, grace=90.5))
    assert not [o for o in sbatch_options(record()) if o.startswith("--signal")]
    # srun would pass it on to every node's worker and program: not yet for runs over nodes
    over_nodes = sbatch_options(record(time_limit=3600, nodes=2))
    assert not [o for o in over_nodes if o.startswith("--signal")]


def test_the_jobs_worker_traps_slurms_warnings_with_the_clusters_kill_wait() -> None:
    script = job_script(
        record(time_limit=600),
        python="/usr/bin/python3",
        credentials=Path("/s/c.json"),
        work_dir=Path("/s/work"),
        output=Path("/s/r1.out"),
        kill_wait=45,
    )
    assert "#SBATCH --time=10\n#SBATCH --signal=B:USR1@60\n" in script
    assert script.strip().splitlines()[-1] == (
        "exec /usr/bin/python3 -m adapter.cli worker --credentials /s/c.json --work-dir /s/work"
        " --scheduler slurm --kill-wait 45"
    )


def test_kill_wait_is_read_from_scontrols_config_or_is_slurms_default() -> None:
    config = "JobRequeue              = 1\nKillWait                = 12 sec\nKillOnBadExit = 0\n"
    assert kill_wait_of(config) == 12.0
    assert kill_wait_of("") == 30.0


def test_ray_waits_the_runs_grace_after_its_sigterm_and_the_worker_knows() -> None:
    body = job_request(record(grace=120), "tttk_x", submission_id="s", python="py", relay="ws://r")
    assert body["entrypoint"].endswith("--scheduler ray")
    wait = body["runtime_env"]["env_vars"]["RAY_JOB_STOP_WAIT_TIME_S"]
    assert wait == "125"
    assert warnings_of("ray", preempt_grace=120, term_wait=ray_stop_wait({
        "RAY_JOB_STOP_WAIT_TIME_S": wait})) == {
        signal.SIGTERM: Warned(120.0, "ray: the job was stopped")
    }  # fmt: skip
    assert ray_stop_wait({}) == 3.0 and ray_stop_wait({"RAY_JOB_STOP_WAIT_TIME_S": "x"}) == 3.0


def test_each_signal_gives_the_program_what_is_left_before_the_sigkill() -> None:
    slurm = warnings_of("slurm", preempt_grace=90, term_wait=30)
    assert slurm[signal.SIGUSR1] == Warned(90, "slurm: the job's time limit is near")
    assert slurm[signal.SIGTERM].grace == 25.0  # KillWait less the worker's margin
    assert warnings_of("ray", preempt_grace=90, term_wait=3)[signal.SIGTERM].grace == 1.5
    with pytest.raises(ValueError, match="no such scheduler"):
        warnings_of("pbs", preempt_grace=1, term_wait=1)


async def test_the_first_of_each_warning_preempts_the_attempt_once() -> None:
    """Real signals to this process: SIGTERM then SIGUSR1 preempt, each once; a second SIGTERM
    (Slurm's scancel after its requeue) asks nothing more and does not stop the worker."""
    asked: list[Warned] = []
    twice = trio.Event()

    async def preempt(what: Warned) -> None:
        asked.append(what)
        if len(asked) == 2:
            twice.set()
        if len(asked) == 1:
            raise OSError("relay unreachable")  # said, not raised: the trap stays

    warned = warnings_of("slurm", preempt_grace=60, term_wait=30)
    said: list[str] = []
    with trio.fail_after(10):
        async with trio.open_nursery() as nursery:
            await nursery.start(lambda task_status: trap_warnings(
                warned, preempt, say=said.append, task_status=task_status))  # fmt: skip
            os.kill(os.getpid(), signal.SIGTERM)
            os.kill(os.getpid(), signal.SIGTERM)
            os.kill(os.getpid(), signal.SIGUSR1)
            await twice.wait()
            nursery.cancel_scope.cancel()
    assert [w.detail for w in asked] == [
        "slurm: the job was preempted or requeued",
        "slurm: the job's time limit is near",
    ]
    assert "could not preempt the attempt: relay unreachable" in said


_JOB = (
    "JobId=7 JobName=t UserId=root(0) JobState={} Reason=None Requeue=1 Restarts={} "
    "RunTime=00:00:02 TimeLimit={}"
)


def _job(state: str, restarts: int = 0, limit: str = "00:30:00") -> str:
    return _JOB.format(state, restarts, limit)


async def _trapped(state: str | None) -> tuple[list[str], list[str]]:
    """A SIGTERM then a SIGUSR1 to this process, Slurm saying the job is ``state`` (None: it
    cannot say): the warnings that preempted, and what the worker said."""
    asked: list[str] = []
    said: list[str] = []
    looked, both = trio.Event(), trio.Event()

    def say(text: str) -> None:
        said.append(text)
        if text.startswith("SIGUSR1"):  # the last signal is handled: the trap may end
            both.set()

    async def preempt(what: Warned) -> None:
        asked.append(what.detail)

    async def cancelled() -> bool | None:
        looked.set()
        return None if state is None else cancelled_in(_job(state))

    warned = warnings_of("slurm", preempt_grace=60, term_wait=30)
    with trio.fail_after(10):
        async with trio.open_nursery() as nursery:
            await nursery.start(lambda task_status: trap_warnings(
                warned, preempt, say=say, cancelled=cancelled, task_status=task_status))  # fmt: skip
            os.kill(os.getpid(), signal.SIGTERM)
            await looked.wait()
            os.kill(os.getpid(), signal.SIGUSR1)  # the time-limit warning: never asked about
            await both.wait()
            nursery.cancel_scope.cancel()
    return asked, said


async def test_a_job_cancelled_by_hand_is_not_preempted_a_requeued_one_is() -> None:
    """scancel sends the SIGTERM a requeue sends; Slurm marks the job CANCELLED first, and the
    worker asks: a cancel is no preemption (the attempt ends lost and counts), a requeue is."""
    assert cancelled_in(_job("CANCELLED"))
    assert cancelled_in(_job("CANCELLED+"))
    # what Slurm 23 shows at the SIGTERM: COMPLETING both; a requeue raised Restarts already
    assert cancelled_in(_job("COMPLETING"))
    assert not cancelled_in(_job("COMPLETING", restarts=1))
    assert cancelled_in(_job("COMPLETING", restarts=1), restarts=1)  # cancelled after a requeue
    assert not cancelled_in(_job("COMPLETING", limit="00:00:02"))  # its time limit: Slurm's
    assert cancelled_in(_job("COMPLETING", limit="UNLIMITED"))
    assert not cancelled_in(_job("COMPLETING") + " PreemptTime=2026-11-28T10:26:21")
    assert not cancelled_in(_job("REQUEUED"))
    assert not cancelled_in(_job("PENDING"))
    assert not cancelled_in(_job("PREEMPTED"))  # preempted for good: still a preemption
    limit = "slurm: the job's time limit is near"
    asked, said = await _trapped("CANCELLED")
    assert asked == [limit]
    assert said[0] == (
        "SIGTERM: the job was cancelled (scancel), not preempted: the attempt ends lost "
        "and counts against --max-retries"
    )
    for state in ("REQUEUED", None):  # requeued, or Slurm could not say: a preemption
        asked, _ = await _trapped(state)
        assert asked == ["slurm: the job was preempted or requeued", limit]
