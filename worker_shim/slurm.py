"""The Slurm backend: queued runs become ``sbatch`` jobs whose worker dials out to the relay.

Theory of operation
-------------------
``tether backend slurm`` runs where ``sbatch`` works (a login node). It

1. takes each run queued for the ``slurm`` backend from the relay (``dispatch``: the run stays
   ``queued``), writes a credentials file readable by the user only (relay URL, run, attempt) and a
   batch script running ``tether worker --credentials FILE``, submits it with ``sbatch --parsable``
   (resources: ``--cpus-per-task``, ``--mem``, ``--time``, ``--gres=gpu:N``, ``--partition``) and
   reports the job id to the relay (``tether ls`` shows it while the job is pending);
2. watches its jobs with ``squeue`` (and ``scontrol show job`` once they left the queue, within
   ``MinJobAge``; no accounting storage is needed):

   - a job that ended, failed, timed out, was cancelled or preempted while its attempt was not
     finished is reported ``lost``: the relay retries it (``--max-retries``) or marks the run lost;
   - a job Slurm *requeued* (preemption with ``PreemptMode=REQUEUE``, ``scontrol requeue``) is
     cancelled and reported lost too, so the retry is a new attempt with its own job, and the old
     attempt's worker, should it start again, is refused by the relay;
   - a job whose run was cancelled (or moved on to another attempt) is ``scancel``-ed.

The worker in the job claims exactly its run and attempt; compute nodes need no inbound
connections, only outbound ones to the relay. What the backend tracks is kept in
``<state dir>/jobs.json``, so it can be restarted.
"""

from __future__ import annotations

import json
import logging
import math
import os
import re
import shlex
from collections.abc import Callable
from dataclasses import asdict, dataclass
from pathlib import Path

import trio

from protocol_specs.runs import RunRecord
from relay.client import ControlClient, RelayError, Target, endpoint, open_control

__all__ = ["SlurmBackend", "SlurmError", "job_script", "sbatch_options"]

log = logging.getLogger("tether.slurm")

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
NAME = "slurm"
#: a job whose attempt is over (the run ended, or a later attempt began) may take this long to end
#: by itself (its worker was told to stop) before the backend cancels it
STALE_GRACE = 30.0


class SlurmError(Exception):
    pass


@dataclass
class Job:
    job: str
    run: str
    attempt: int


def sbatch_options(record: RunRecord) -> list[str]:
    """The ``#SBATCH`` options for a run's resources."""
    res = record.spec.resources
    opts = [f"--job-name=tether-{record.id}-{record.attempt}", f"--cpus-per-task={res.cpus}"]
    if res.memory_mb:
        opts.append(f"--mem={res.memory_mb}M")
    if res.time_limit:
        opts.append(f"--time={max(1, math.ceil(res.time_limit / 60))}")
    if res.gpus:
        opts.append(f"--gres=gpu:{res.gpus}")
    if res.partition:
        opts.append(f"--partition={res.partition}")
    return opts


def job_script(
    record: RunRecord,
    *,
    python: str,
    credentials: Path,
    work_dir: Path,
    output: Path,
    allow_tunnels: bool = True,
) -> str:
    lines = ["#!/bin/bash"]
    lines += [f"#SBATCH {opt}" for opt in sbatch_options(record)]
    lines += [
        f"#SBATCH --output={output}",
        "# written by tether backend slurm; the worker dials out to the relay",
        f"exec {shlex.quote(python)} -m adapter.cli worker "
        f"--credentials {shlex.quote(str(credentials))} --work-dir {shlex.quote(str(work_dir))}"
        + ("" if allow_tunnels else " --no-shell"),
        "",
    ]
    return "\n".join(lines)


class SlurmBackend:
    def __init__(
        self,
        relay: Target,
        *,
        state_dir: Path,
        worker_relay: str | None = None,
        python: str,
        poll: float = 5.0,
        sbatch_args: list[str] | None = None,
        env: dict[str, str] | None = None,
        on_event: Callable[[str], None] | None = None,
        allow_tunnels: bool = True,
    ) -> None:
        self.relay = relay
        self.allow_tunnels = (
            allow_tunnels  #: its jobs' workers serve tether exec/shell/port-forward
        )
        self.worker_relay = worker_relay or endpoint(relay).url
        self.state_dir = state_dir
        self.python = python
        self.poll = poll
        self.sbatch_args = sbatch_args or []
        self.env = {**os.environ, **(env or {})}
        self.say = on_event or (lambda _text: None)
        self.jobs: dict[str, Job] = {}
        #: jobs whose attempt is over but that still run: since when (they get ``STALE_GRACE``)
        self._stale: dict[str, float] = {}
        for sub in ("jobs", "credentials", "work"):
            (state_dir / sub).mkdir(parents=True, exist_ok=True)
        (state_dir / "credentials").chmod(0o700)
        self._load()

    # --- persistence --------------------------------------------------------------------------

    @property
    def _jobs_file(self) -> Path:
        return self.state_dir / "jobs.json"

    def _load(self) -> None:
        try:
            raw = json.loads(self._jobs_file.read_text())
        except (OSError, ValueError):
            return
        self.jobs = {j["job"]: Job(**j) for j in raw if isinstance(j, dict)}

    def _save(self) -> None:
        tmp = self._jobs_file.with_suffix(".tmp")
        tmp.write_text(json.dumps([asdict(j) for j in self.jobs.values()]))
        tmp.replace(self._jobs_file)

    # --- Slurm commands -----------------------------------------------------------------------

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
        """``job -> (state, restarts)`` for the jobs Slurm still knows."""
        out: dict[str, tuple[str, int]] = {}
        for job in jobs:
            text = await self._slurm("scontrol", "-o", "show", "job", job, check=False)
            state = re.search(r"\bJobState=(\S+)", text)
            restarts = re.search(r"\bRestarts=(\d+)", text)
            if state:
                out[job] = (state.group(1), int(restarts.group(1)) if restarts else 0)
        return out

    # --- the two loops ------------------------------------------------------------------------

    async def serve(self, task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED) -> None:
        async with trio.open_nursery() as nursery:
            nursery.start_soon(self._dispatch_forever)
            nursery.start_soon(self._watch_forever)
            task_status.started()

    async def _dispatch_forever(self) -> None:
        backoff = 0.2
        while True:
            try:
                async with open_control(self.relay, client="tether-backend slurm") as control:
                    backoff = 0.2
                    while True:
                        assigned = await control.dispatch(NAME, "slurm-backend")
                        await self.submit(control, assigned.run, assigned.token)
            except (RelayError, OSError) as exc:
                log.warning("slurm backend: %s; retrying in %.1f s", exc, backoff)
                await trio.sleep(backoff)
                backoff = min(backoff * 2, 5.0)

    async def submit(self, control: ControlClient, record: RunRecord, token: str) -> None:
        """Write the attempt's credentials (its worker token: never on a command line) and
        submit its job."""
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
            )
        )
        try:
            out = await self._slurm(
                "sbatch", "--parsable", f"--chdir={self.state_dir}", *self.sbatch_args, str(script)
            )
        except SlurmError as exc:
            self.say(f"run {record.id}: sbatch refused attempt {record.attempt}: {exc}")
            await control.report(
                record.id, record.attempt, "lost", detail=f"sbatch refused the job: {exc}"
            )
            return
        job = out.strip().split(";")[0]
        self.jobs[job] = Job(job, record.id, record.attempt)
        self._save()
        self.say(f"run {record.id} attempt {record.attempt}: submitted as Slurm job {job}")
        await control.report(
            record.id, record.attempt, "job", job=job, detail=f"Slurm job {job} submitted"
        )

    async def _watch_forever(self) -> None:
        while True:
            try:
                async with open_control(self.relay, client="tether-backend slurm") as control:
                    while True:
                        await self.watch_once(control)
                        await trio.sleep(self.poll)
            except (RelayError, OSError, SlurmError) as exc:
                log.warning("slurm backend: %s", exc)
                await trio.sleep(self.poll)

    async def watch_once(self, control: ControlClient) -> None:
        """One look at every tracked job; report and cancel as the module docstring says."""
        if not self.jobs:
            return
        states = await self.job_states(list(self.jobs))
        for job_id, job in list(self.jobs.items()):
            state, restarts = states.get(job_id, ("GONE", 0))
            base = state.split("+")[0]
            try:
                record = await control.get_run(job.run)
            except RelayError:
                record = None
            current = record is not None and not record.finished and record.attempt == job.attempt
            if restarts > 0 and base not in ENDED:
                await self._slurm("scancel", job_id, check=False)
                await self._lost(control, job, f"Slurm requeued job {job_id} (preempted?)")
                continue
            if base in ENDED or base == "GONE":
                if current:
                    await self._lost(control, job, f"Slurm job {job_id} ended: {base}")
                else:
                    self._forget(job)
                continue
            if not current:
                # the run ended or went on to another attempt: a pending job is cancelled; a
                # running one's worker stops by itself (it was told), else it is cancelled after
                # a grace period
                first = self._stale.setdefault(job_id, trio.current_time())
                if base != "PENDING" and trio.current_time() - first < STALE_GRACE:
                    continue
                self.say(
                    f"run {job.run}: cancelling Slurm job {job_id} (attempt {job.attempt} over)"
                )
                await self._slurm("scancel", job_id, check=False)
                self._forget(job)

    async def _lost(self, control: ControlClient, job: Job, detail: str) -> None:
        self.say(f"run {job.run} attempt {job.attempt}: {detail}")
        await control.report(job.run, job.attempt, "lost", job=job.job, detail=detail)
        self._forget(job)

    def _forget(self, job: Job) -> None:
        self.jobs.pop(job.job, None)
        self._stale.pop(job.job, None)
        self._save()
        (self.state_dir / "credentials" / f"{job.run}-{job.attempt}.json").unlink(missing_ok=True)
        self.say(f"run {job.run} attempt {job.attempt}: done with Slurm job {job.job}")
