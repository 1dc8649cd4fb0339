"""What every scheduler backend does: take queued runs from the relay, launch a job per attempt,
watch the jobs, tell the relay what became of them.

A backend (``worker_shim/backends/slurm.py``, ``worker_shim/backends/ray_jobs.py``) says how to
launch, look at and cancel a job; this module runs the two loops around that:

1. *dispatch*: each run queued for the backend is handed over by the relay (``dispatch``: the run
   stays ``queued``) with the credential of its attempt; the job is launched and its id reported
   (``tether ls`` shows it while the job waits);
2. *watch*: every ``poll`` seconds each job is looked at, together with its run's record, and
   ``worker_shim/backends/job_watch.py`` decides what to do.

The worker in the job claims exactly its run and attempt; compute nodes need no inbound
connections. What the backend tracks is kept in ``<state dir>/jobs.json`` (0600: it holds the
attempts' credentials), so it can be restarted.
"""

from __future__ import annotations

import json
import logging
import os
from abc import ABC, abstractmethod
from collections.abc import Callable
from dataclasses import asdict, dataclass
from pathlib import Path

import trio

from protocol_specs.runs.runs import RunRecord, RunState
from protocol_specs.wire.wire import ErrorCode
from relay.client import ControlClient, RelayError, Target, endpoint, open_control

from .job_watch import Action, Attempt, Do, JobWatch, Phase, Seen

__all__ = ["SUBMIT_PATIENCE", "Job", "SchedulerBackend", "SchedulerError", "SchedulerRefused"]

log = logging.getLogger("tether.backend")


#: how long a scheduler that does not answer (or fails) is asked again before the attempt counts
#: as lost; a refusal (:class:`SchedulerRefused`) counts at once
SUBMIT_PATIENCE = 600.0


class SchedulerError(Exception):
    """The scheduler failed a request, or could not be asked; the message says what it said."""


class SchedulerRefused(SchedulerError):
    """The scheduler answered, and said no: asking again would not help."""


@dataclass
class Job:
    job: str
    run: str
    attempt: int
    #: the attempt's credential (a worker token, or a ticket), to launch it again
    token: str = ""
    #: the run's time limit, where the backend enforces it (0: none, or the scheduler does)
    time_limit: float = 0.0


class SchedulerBackend(ABC):
    #: the backend's name: runs submitted with ``--backend NAME`` come here
    name: str
    #: the scheduler's name in messages ("Slurm", "Ray")
    scheduler: str
    #: ask the relay for tickets rather than worker tokens (see ``protocol_specs/access/auth.py``)
    tickets: bool = False
    #: the scheduler enforces the runs' time limits itself (else the watch does)
    limits_time: bool = True

    def __init__(
        self,
        relay: Target,
        *,
        state_dir: Path,
        worker_relay: str | None = None,
        python: str,
        poll: float = 5.0,
        on_event: Callable[[str], None] | None = None,
        allow_tunnels: bool = True,
    ) -> None:
        self.relay = relay
        #: its jobs' workers serve tether exec/shell/port-forward
        self.allow_tunnels = allow_tunnels
        self.worker_relay = worker_relay or endpoint(relay).url
        self.state_dir = state_dir
        self.python = python
        self.poll = poll
        self.say = on_event or (lambda _text: None)
        self.jobs: dict[str, Job] = {}
        self.watch = JobWatch(self.scheduler)
        state_dir.mkdir(parents=True, exist_ok=True)
        self._load()

    # --- what a backend says --------------------------------------------------------------------

    @abstractmethod
    async def launch(self, record: RunRecord, token: str, *, patience: float) -> str:
        """Launch a job for ``record``'s attempt whose worker presents ``token``; its id. Raises
        :class:`SchedulerRefused` if the scheduler refuses it, :class:`SchedulerError` if it could
        not be asked for ``patience`` seconds (a backend that cannot tell launches once)."""

    @abstractmethod
    async def look(self, jobs: list[str]) -> dict[str, Seen]:
        """What the scheduler says of each of ``jobs`` (one it does not know: leave it out)."""

    @abstractmethod
    async def cancel(self, job: str) -> None:
        """Cancel ``job`` (whatever its state; one that is over already is no error)."""

    def forgotten(self, job: Job) -> None:  # noqa: B027 (a hook: most backends keep nothing more)
        """``job`` is no longer tracked: drop what was kept for it."""

    # --- persistence ----------------------------------------------------------------------------

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
        tmp.unlink(missing_ok=True)  # made anew, so it is 0600 whatever a leftover was
        fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
        with os.fdopen(fd, "w") as f:
            json.dump([asdict(j) for j in self.jobs.values()], f)
        tmp.replace(self._jobs_file)

    # --- the two loops --------------------------------------------------------------------------

    async def serve(self, task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED) -> None:
        async with trio.open_nursery() as nursery:
            nursery.start_soon(self._dispatch_forever)
            nursery.start_soon(self._watch_forever)
            task_status.started()

    def _client(self) -> str:
        return f"tether-backend {self.name}"

    async def _dispatch_forever(self) -> None:
        backoff = 0.2
        while True:
            try:
                async with open_control(self.relay, client=self._client()) as control:
                    backoff = 0.2
                    while True:
                        assigned = await control.dispatch(
                            self.name, f"{self.name}-backend", ticket=self.tickets
                        )
                        await self.submit(control, assigned.run, assigned.token)
            except (RelayError, OSError) as exc:
                log.warning("%s backend: %s; retrying in %.1f s", self.name, exc, backoff)
                await trio.sleep(backoff)
                backoff = min(backoff * 2, 5.0)

    async def submit(self, control: ControlClient, record: RunRecord, token: str) -> None:
        """Launch the attempt's job and report its id (or that the scheduler refused it)."""
        try:
            job = await self.launch(record, token, patience=SUBMIT_PATIENCE)
        except SchedulerError as exc:
            self.say(f"run {record.id}: attempt {record.attempt} not submitted: {exc}")
            await control.report(record.id, record.attempt, "lost", detail=str(exc))
            return
        await self._launched(control, record, Job(job, record.id, record.attempt, token))

    async def _launched(
        self, control: ControlClient, record: RunRecord, job: Job, why: str = ""
    ) -> None:
        """Track ``job`` and tell the relay (``tether ls`` shows its id while it waits)."""
        job.time_limit = 0.0 if self.limits_time else record.spec.resources.time_limit
        self.watch.launched(job.job, trio.current_time())
        self.jobs[job.job] = job
        self._save()
        again = f" again ({why})" if why else ""
        self.say(
            f"run {record.id} attempt {record.attempt}: submitted{again} as "
            f"{self.scheduler} job {job.job}"
        )
        await control.report(
            record.id,
            record.attempt,
            "job",
            job=job.job,
            detail=f"{self.scheduler} job {job.job} submitted{again}",
        )

    async def _watch_forever(self) -> None:
        while True:
            try:
                async with open_control(self.relay, client=self._client()) as control:
                    while True:
                        await self.watch_once(control)
                        await trio.sleep(self.poll)
            except (RelayError, OSError, SchedulerError) as exc:
                log.warning("%s backend: %s", self.name, exc)
                await trio.sleep(self.poll)

    async def watch_once(self, control: ControlClient) -> None:
        """One look at every tracked job, acted on as ``worker_shim/backends/job_watch.py``
        decides."""
        if not self.jobs:
            return
        seen = await self.look(list(self.jobs))
        for job_id, job in list(self.jobs.items()):
            record = await self._record(control, job)
            action = self.watch.look(
                job_id,
                seen.get(job_id, Seen(Phase.GONE)),
                _attempt(record, job),
                trio.current_time(),
                limit=job.time_limit,
                preempt_grace=record.spec.preempt_grace if record is not None else 0.0,
            )
            await self._act(control, job, action, record)

    async def _record(self, control: ControlClient, job: Job) -> RunRecord | None:
        """The job's run (``None``: it is no more, deleted or never was)."""
        try:
            return await control.get_run(job.run)
        except RelayError as exc:
            if exc.code == ErrorCode.NO_SUCH_RUN:
                return None
            raise  # anything else: looked at again at the next poll, nothing decided on it

    async def _act(
        self, control: ControlClient, job: Job, action: Action, record: RunRecord | None
    ) -> None:
        match action.do:
            case Do.KEEP:
                return
            case Do.CANCEL | Do.CANCEL_LOST:
                self.say(f"run {job.run}: cancelling {self.scheduler} job {job.job}: {action.why}")
                await self.cancel(job.job)
            case Do.SAY_RUNNING:
                await control.report(job.run, job.attempt, "running", job=job.job)
                self.watch.said_running(job.job)
                return
            case Do.SUBMIT_AGAIN:
                assert record is not None  # the attempt is waiting: its run is there
                await self._again(control, job, record, action.why)
                return
        if action.do in (Do.LOST, Do.CANCEL_LOST):
            self.say(f"run {job.run} attempt {job.attempt}: {action.why}")
            await control.report(job.run, job.attempt, "lost", job=job.job, detail=action.why)
        self._forget(job)

    async def _again(self, control: ControlClient, job: Job, record: RunRecord, why: str) -> None:
        """A new job for ``job``'s attempt, which never started; asked once (this look holds up
        the others): if the scheduler cannot take it now, the next look asks again."""
        try:
            new = await self.launch(record, job.token, patience=0.0)
        except SchedulerRefused as exc:  # it will not be taken later either
            detail = f"{why}; not submitted again: {exc}"
            self.say(f"run {job.run} attempt {job.attempt}: {detail}")
            await control.report(job.run, job.attempt, "lost", job=job.job, detail=detail)
            self._forget(job)
            return
        except SchedulerError as exc:
            log.warning("run %s: %s; not submitted again yet: %s", job.run, why, exc)
            return
        self._forget(job)
        await self._launched(control, record, Job(new, job.run, job.attempt, job.token), why)

    def _forget(self, job: Job) -> None:
        self.jobs.pop(job.job, None)
        self.watch.forget(job.job)
        self._save()
        self.forgotten(job)
        self.say(f"run {job.run} attempt {job.attempt}: done with {self.scheduler} job {job.job}")


def _attempt(record: RunRecord | None, job: Job) -> Attempt:
    if record is None or record.finished or record.attempt != job.attempt:
        return Attempt.OVER
    if record.attempts and record.attempts[-1].outcome:
        return Attempt.OVER  # it ended (preempted, the run suspended): nothing to report
    if record.state is RunState.QUEUED:
        return Attempt.WAITING
    if record.attempts and record.attempts[-1].preempt:
        return Attempt.PREEMPTING
    return Attempt.STARTED
