"""The Slurm backend: queued runs become ``sbatch`` jobs whose worker dials out to the relay.

Theory of operation
-------------------
``tether backend slurm`` runs where ``sbatch`` works (a login node). It

1. takes each run queued for the ``slurm`` backend from the relay (``dispatch``: the run stays
   ``queued``), writes a credentials file readable by the user only (relay URL, run, attempt) and a
   batch script running ``tether worker --credentials FILE``, submits it with ``sbatch --parsable``
   (resources: ``--cpus-per-task``, ``--mem``, ``--time``, ``--gres=gpu:N``, ``--partition``;
   with ``--time``, ``--signal=B:USR1@G``: the worker preempts the attempt G = ``preempt_grace``
   seconds, at least 60, before the time limit) and
   reports the job id to the relay (``tether ls`` shows it while the job is pending). A run over
   N nodes is one job of N nodes, one task each (``--cpus-per-task`` and ``--gres`` are per node
   already): the script's ``srun`` starts a worker on every node, node ``$SLURM_NODEID`` in a
   work directory of its own (they may share a filesystem); node 0 claims the attempt, the others
   join it with the same credentials, and ``--kill-on-bad-exit`` ends the step on every node
   once one node's worker fails;
2. watches its jobs with ``scontrol show job`` (Slurm keeps ended jobs for ``MinJobAge``; no
   accounting storage is needed), and acts as ``worker_shim/backends/job_watch.py`` decides:

   - a job that ended, failed, timed out, was cancelled or preempted while its attempt was not
     finished is reported ``lost``: the relay retries it (``--max-retries``) or marks the run lost;
   - a job Slurm *requeued* (preemption with ``PreemptMode=REQUEUE``, ``scontrol requeue``) is
     cancelled, so the retry is a new attempt with its own job, and the old attempt's worker,
     should it start again, is refused by the relay. Its worker had trapped Slurm's ``SIGTERM``
     and preempted the attempt (``worker_shim/program/sched_warnings.py``): the attempt ended
     ``preempted`` and its retry does not count; one whose worker could not is reported lost;
   - a job whose run was cancelled (or moved on to another attempt) is ``scancel``-ed.

The loops around this are ``worker_shim/backends/scheduler.py``'s.
"""

from __future__ import annotations

import json
import math
import os
import re
import shlex
from pathlib import Path
from typing import Any

import trio

from protocol_specs.runs.runs import RunRecord
from relay.client import endpoint

from ..program.sched_warnings import SLURM_KILL_WAIT, slurm_signal_lead
from .job_watch import Phase, Seen
from .scheduler import Job, SchedulerBackend, SchedulerError, SchedulerRefused

__all__ = [
    "SlurmBackend",
    "SlurmError",
    "job_script",
    "kill_wait_of",
    "sbatch_options",
    "worker_line",
]

#: job states after which a job runs no more
ENDED = frozenset(
    {
        "COMPLETED",
        "FAILED",
        "CANCELLED",
        "TIMEOUT",
        "NODE_FAIL",
        "PREEMPTED",
        "OUT_OF_MEMORY",
        "BOOT_FAIL",
        "DEADLINE",
        "SPECIAL_EXIT",
    }
)


def kill_wait_of(config: str) -> float:
    """``KillWait`` from ``scontrol show config``'s text (``KillWait = 30 sec``)."""
    found = re.search(r"^KillWait\s*=\s*(\d+)", config, re.MULTILINE)
    return float(found.group(1)) if found else SLURM_KILL_WAIT


class SlurmError(SchedulerRefused):
    """A Slurm command failed: the attempt is lost at once (sbatch says why)."""


def sbatch_options(record: RunRecord) -> list[str]:
    """The ``#SBATCH`` options for a run's resources."""
    res = record.spec.resources
    opts = [f"--job-name=tether-{record.id}-{record.attempt}", f"--cpus-per-task={res.cpus}"]
    if res.memory_mb:
        opts.append(f"--mem={res.memory_mb}M")
    if res.time_limit:
        opts.append(f"--time={max(1, math.ceil(res.time_limit / 60))}")
        if res.nodes == 1:  # to the batch shell: the worker, which the script execs
            opts.append(f"--signal=B:USR1@{slurm_signal_lead(record.spec.preempt_grace)}")
    if res.gpus:
        opts.append(f"--gres=gpu:{res.gpus}")
    if res.partition:
        opts.append(f"--partition={res.partition}")
    if res.nodes > 1:
        opts += [f"--nodes={res.nodes}", "--ntasks-per-node=1"]
    return opts


def worker_line(
    record: RunRecord,
    *,
    python: str,
    credentials: Path,
    work_dir: Path,
    allow_tunnels: bool,
    kill_wait: float = SLURM_KILL_WAIT,
) -> str:
    """The job's command: the attempt's worker, or (several nodes) an ``srun`` step starting
    node ``$SLURM_NODEID``'s worker on every node. One node's worker traps Slurm's warnings
    (``--scheduler slurm``; ``kill_wait``: the cluster's ``KillWait``); a run over nodes does
    not yet (srun would pass the signals on to every node's worker and program)."""
    tail = "" if allow_tunnels else " --no-shell"
    warned = f" --scheduler slurm --kill-wait {kill_wait:g}"
    worker = (
        f"{shlex.quote(python)} -m adapter.cli worker --credentials {shlex.quote(str(credentials))}"
    )
    nodes = record.spec.resources.nodes
    if nodes == 1:
        return f"exec {worker} --work-dir {shlex.quote(str(work_dir))}{warned}{tail}"
    # srun execs its command without a shell: one expands the node's index
    on_node = (
        f'exec {worker} --work-dir {shlex.quote(str(work_dir))}"-node$SLURM_NODEID" '
        f'--node "$SLURM_NODEID"{tail}'
    )
    # 22.05's srun does not take --cpus-per-task from the job: said again
    step = (
        f"--kill-on-bad-exit=1 --nodes={nodes} --ntasks-per-node=1 "
        f"--cpus-per-task={record.spec.resources.cpus}"
    )
    return f"exec srun {step} /bin/bash -c {shlex.quote(on_node)}"


def job_script(
    record: RunRecord,
    *,
    python: str,
    credentials: Path,
    work_dir: Path,
    output: Path,
    allow_tunnels: bool = True,
    kill_wait: float = SLURM_KILL_WAIT,
) -> str:
    lines = ["#!/bin/bash"]
    lines += [f"#SBATCH {opt}" for opt in sbatch_options(record)]
    lines += [
        f"#SBATCH --output={output}",
        "# written by tether backend slurm; the worker dials out to the relay",
        worker_line(
            record,
            python=python,
            credentials=credentials,
            work_dir=work_dir,
            allow_tunnels=allow_tunnels,
            kill_wait=kill_wait,
        ),
        "",
    ]
    return "\n".join(lines)


class SlurmBackend(SchedulerBackend):
    name = "slurm"
    scheduler = "Slurm"

    def __init__(
        self,
        *args: Any,
        sbatch_args: list[str] | None = None,
        env: dict[str, str] | None = None,
        **kwargs: Any,
    ) -> None:
        super().__init__(*args, **kwargs)
        self.sbatch_args = sbatch_args or []
        self._kill_wait: float | None = None
        self.env = {**os.environ, **(env or {})}
        for sub in ("jobs", "credentials", "work"):
            (self.state_dir / sub).mkdir(parents=True, exist_ok=True)
        (self.state_dir / "credentials").chmod(0o700)

    async def _slurm(self, *argv: str, check: bool = True) -> str:
        result = await trio.run_process(
            list(argv), capture_stdout=True, capture_stderr=True, check=False, env=self.env
        )
        if check and result.returncode != 0:
            raise SlurmError(
                f"{argv[0]} failed ({result.returncode}): {result.stderr.decode().strip()}"
            )
        return str(result.stdout.decode())

    async def job_states(self, jobs: list[str]) -> dict[str, tuple[str, int]]:
        """``job -> (state, restarts)`` for the jobs Slurm still knows. A job Slurm says it does
        not know is left out (gone); any other failure to ask (the controller busy or restarting:
        ``Socket timed out``) raises :class:`SlurmError`, and nothing is decided on this look:
        a pending job taken for gone would be reported lost, and its credentials removed before
        it starts."""
        out: dict[str, tuple[str, int]] = {}
        for job in jobs:
            asked = await trio.run_process(
                ["scontrol", "-o", "show", "job", job], capture_stdout=True, capture_stderr=True,
                check=False, env=self.env,
            )  # fmt: skip
            said = asked.stderr.decode(errors="replace").strip()
            if asked.returncode != 0:
                if "Invalid job id" in said:
                    continue
                raise SchedulerError(f"scontrol show job {job} failed ({asked.returncode}): {said}")
            text = asked.stdout.decode(errors="replace")
            state = re.search(r"\bJobState=(\S+)", text)
            restarts = re.search(r"\bRestarts=(\d+)", text)
            if state:
                out[job] = (state.group(1), int(restarts.group(1)) if restarts else 0)
        return out

    async def look(self, jobs: list[str]) -> dict[str, Seen]:
        seen = {}
        for job, (state, restarts) in (await self.job_states(jobs)).items():
            base = state.split("+")[0]
            if base in ENDED:
                seen[job] = Seen(Phase.ENDED, base)
            elif restarts > 0:
                seen[job] = Seen(Phase.REQUEUED, base)
            else:
                seen[job] = Seen(Phase.PENDING if base == "PENDING" else Phase.RUNNING, base)
        return seen

    async def kill_wait(self) -> float:
        """The cluster's ``KillWait`` (between a job's ``SIGTERM`` and its ``SIGKILL``), read from
        ``scontrol show config`` once; Slurm's default if it cannot be read."""
        if self._kill_wait is None:
            try:
                said = await self._slurm("scontrol", "show", "config")
            except (SlurmError, OSError):
                said = ""
            self._kill_wait = kill_wait_of(said)
        return self._kill_wait

    async def cancel(self, job: str) -> None:
        await self._slurm("scancel", job, check=False)

    async def launch(self, record: RunRecord, token: str, *, patience: float) -> str:
        """Write the attempt's credentials (its worker token: never on a command line) and
        submit its job (once: sbatch's own retries are its ``MessageTimeout``)."""
        del patience
        key = f"{record.id}-{record.attempt}"
        credentials = self.state_dir / "credentials" / f"{key}.json"
        fd = os.open(credentials, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
        creds = {
            "relay": self.worker_relay,
            "run": record.id,
            "attempt": record.attempt,
            "token": token,
            "ca_file": endpoint(self.relay).ca_file,
        }
        with os.fdopen(fd, "w") as f:
            json.dump(creds, f)
        script = self.state_dir / "jobs" / f"{key}.sh"
        script.write_text(
            job_script(
                record,
                python=self.python,
                credentials=credentials,
                work_dir=self.state_dir / "work",
                output=self.state_dir / "jobs" / f"{key}.out",
                allow_tunnels=self.allow_tunnels,
                kill_wait=await self.kill_wait(),
            )
        )
        try:
            out = await self._slurm(
                "sbatch", "--parsable", f"--chdir={self.state_dir}", *self.sbatch_args, str(script)
            )
        except SlurmError as exc:
            raise SlurmError(f"sbatch refused the job: {exc}") from None
        return out.strip().split(";")[0]

    def forgotten(self, job: Job) -> None:
        (self.state_dir / "credentials" / f"{job.run}-{job.attempt}.json").unlink(missing_ok=True)
