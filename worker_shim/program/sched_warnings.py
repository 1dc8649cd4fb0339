"""A scheduler's warnings to a job's worker become preemptions of its attempt.

Theory of operation
-------------------
A scheduler takes a job back with a signal, then a ``SIGKILL`` some seconds later:

- **Slurm**, before the time limit: ``SIGUSR1`` to the batch shell (the worker, which the batch
  script ``exec``-s), ``preempt_grace`` seconds ahead, because the backend submits the job with
  ``--signal=B:USR1@G`` (``worker_shim/backends/slurm.py``);
- **Slurm**, preempting or requeueing the job (``scontrol requeue``, ``PreemptMode=REQUEUE``) or
  cancelling it: ``SIGTERM`` to the job's processes, ``SIGKILL`` after the cluster's
  ``KillWait`` (the backend reads it once from ``scontrol show config`` and passes it on). A job
  cancelled by hand (``scancel``) is no preemption: Slurm marks it ``CANCELLED`` before it
  signals, so the worker asks (:func:`slurm_cancelled`) and does not preempt it; the attempt
  ends as any job that ended does (``lost``, counted against ``--max-retries``). A job Slurm
  preempts and requeues is ``REQUEUED``/``PENDING``, one preempted for good ``PREEMPTED``;
- **Ray**, stopping the job (``ray job stop``): ``SIGTERM`` to the entrypoint and every process
  under it, ``SIGKILL`` after ``RAY_JOB_STOP_WAIT_TIME_S`` (Ray's default 3 s; the backend sets it
  in the job's environment from the run's ``preempt_grace``, ``worker_shim/backends/ray_jobs.py``).

:func:`warnings_of` says, as data, which signals the worker of a job traps and what each means
(how long the program has, what the run's record will say); :func:`trap_warnings` is the thin
trio loop that turns the first of each into one preemption of the attempt (the relay's
``Preempt``, asked with the worker's own token): the program sees ``tether.should_preempt()``
and ``SIGUSR1``, and the attempt ends ``preempted``, its retry not counted against
``--max-retries``. A ``SIGTERM`` trapped here no longer stops the worker at once (the command's
own handler): the worker stays to end the attempt as a preempted one, and exits after it.

The program's grace after ``SIGTERM`` is the scheduler's wait less :data:`MARGIN`, so the worker
reports the attempt's end before the scheduler's ``SIGKILL`` ends the worker too.
"""

from __future__ import annotations

import logging
import math
import re
import signal
from collections.abc import Awaitable, Callable, Mapping
from dataclasses import dataclass

import trio

__all__ = [
    "MARGIN",
    "RAY_STOP_WAIT",
    "SCHEDULERS",
    "SLURM_KILL_WAIT",
    "Warned",
    "cancelled_in",
    "ray_stop_wait",
    "slurm_cancelled",
    "slurm_signal_lead",
    "trap_warnings",
    "warnings_of",
]

log = logging.getLogger("tether.worker")

#: the schedulers whose warnings a job's worker knows
SCHEDULERS = ("slurm", "ray")
#: Slurm's ``KillWait`` when the cluster's configuration could not be read (its default)
SLURM_KILL_WAIT = 30.0
#: Ray's wait between ``SIGTERM`` and ``SIGKILL`` when its variable is not set (Ray's default:
#: ``JobSupervisor.DEFAULT_RAY_JOB_STOP_WAIT_TIME_S`` in ray/dashboard/modules/job/job_supervisor.py)
RAY_STOP_WAIT = 3.0
#: the most that is kept back from the scheduler's wait for the worker to report the end
MARGIN = 5.0


@dataclass(frozen=True)
class Warned:
    """What one of a scheduler's signals means for the attempt."""

    #: how long the program has to checkpoint and exit
    grace: float
    #: why, as the run's record says it
    detail: str
    #: the signal also comes with a job cancelled by hand: asked (``cancelled``) before it preempts
    maybe_cancel: bool = False


def warnings_of(scheduler: str, *, preempt_grace: float, term_wait: float) -> dict[int, Warned]:
    """The signals a ``scheduler``'s job's worker traps. ``preempt_grace``: the run's;
    ``term_wait``: the scheduler's wait between ``SIGTERM`` and ``SIGKILL``."""
    after_term = max(0.0, term_wait - min(MARGIN, term_wait / 2))
    if scheduler == "slurm":
        return {
            signal.SIGUSR1: Warned(preempt_grace, "slurm: the job's time limit is near"),
            signal.SIGTERM: Warned(
                after_term, "slurm: the job was preempted or requeued", maybe_cancel=True
            ),
        }
    if scheduler == "ray":
        return {signal.SIGTERM: Warned(after_term, "ray: the job was stopped")}
    raise ValueError(f"no such scheduler: {scheduler!r} (one of {', '.join(SCHEDULERS)})")


def ray_stop_wait(env: Mapping[str, str]) -> float:
    """Ray's wait between ``SIGTERM`` and ``SIGKILL`` for this job (Ray reads the variable as an
    int; one it cannot read leaves its default)."""
    try:
        return float(int(env.get("RAY_JOB_STOP_WAIT_TIME_S", "")))
    except ValueError:
        return RAY_STOP_WAIT


def slurm_signal_lead(preempt_grace: float) -> int:
    """``G`` of ``--signal=B:USR1@G``: the run's grace, at least 60 s (Slurm's resolution: it may
    send the signal up to a minute early, never late)."""
    return max(60, math.ceil(preempt_grace))


def cancelled_in(scontrol_job: str, restarts: int = 0) -> bool:
    """Whether ``scontrol -o show job``'s text, read when the job's ``SIGTERM`` came, says the job
    was cancelled (``scancel``) rather than requeued or preempted; ``restarts``: its restart count
    when this run of it began (``$SLURM_RESTART_COUNT``).

    While its processes end, Slurm shows both a cancelled and a requeued job as ``COMPLETING``
    (seen on Slurm 23); a requeue has raised ``Restarts`` already. So: ``CANCELLED``, or
    ``COMPLETING`` with the count unchanged, no preemption time and its time limit not reached
    (a time limit's ``SIGTERM`` is Slurm's, not a person's)."""
    fields = dict(re.findall(r"\b(\w+)=(\S*)", scontrol_job))
    state = fields.get("JobState", "").split("+")[0]
    if state == "CANCELLED":
        return True
    if state != "COMPLETING" or fields.get("PreemptTime", "None") not in ("None", "Unknown"):
        return False
    if fields.get("Restarts", "0") != str(restarts):
        return False
    limit, ran = _seconds(fields.get("TimeLimit", "")), _seconds(fields.get("RunTime", ""))
    return limit is None or ran is None or ran < limit


def _seconds(text: str) -> int | None:
    """Slurm's ``[D-]HH:MM:SS`` (or ``MM:SS``) in seconds; None for ``UNLIMITED`` and the like."""
    days, _, clock = text.rpartition("-")
    parts = clock.split(":")
    if (
        not all(p.isdigit() for p in parts)
        or not 1 <= len(parts) <= 3
        or (days and not days.isdigit())
    ):
        return None
    seconds = 0
    for p in parts:
        seconds = seconds * 60 + int(p)
    return seconds + int(days or 0) * 86400


def _restarts(env: Mapping[str, str]) -> int:
    try:
        return int(env.get("SLURM_RESTART_COUNT", "0"))
    except ValueError:
        return 0


async def slurm_cancelled(env: Mapping[str, str]) -> bool | None:
    """Whether this job (``$SLURM_JOB_ID``) was cancelled by hand; None: Slurm could not say."""
    job = env.get("SLURM_JOB_ID", "")
    if not job:
        return None
    try:
        asked = await trio.run_process(
            ["scontrol", "-o", "show", "job", job], capture_stdout=True, capture_stderr=True,
            check=False, env=dict(env),
        )  # fmt: skip
    except OSError:
        return None
    if asked.returncode != 0:
        log.warning("scontrol show job %s: %s", job, asked.stderr.decode(errors="replace").strip())
        return None
    return cancelled_in(asked.stdout.decode(errors="replace"), _restarts(env))


async def trap_warnings(
    warned: dict[int, Warned],
    preempt: Callable[[Warned], Awaitable[None]],
    *,
    say: Callable[[str], None] = lambda _text: None,
    cancelled: Callable[[], Awaitable[bool | None]] | None = None,
    task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED,
) -> None:
    """Until cancelled: the first of each signal of ``warned`` preempts the attempt
    (``preempt``; a failure to is said, never raised: the scheduler's ``SIGKILL`` comes
    anyway), unless it may mean a cancel (:attr:`Warned.maybe_cancel`) and ``cancelled`` says it
    was one (None: could not tell, taken for a preemption). Must run in the main thread.
    Cancelled, it restores the signals' handlers."""
    done: set[int] = set()
    with trio.open_signal_receiver(*warned) as signals:
        task_status.started()
        async for signum in signals:
            if signum in done:
                continue
            done.add(signum)
            what = warned[signum]
            name = signal.Signals(signum).name
            was_cancel = await cancelled() if what.maybe_cancel and cancelled else False
            if was_cancel is None:
                say(f"{name}: Slurm could not say whether the job was cancelled: a preemption")
            if was_cancel:
                text = (
                    f"{name}: the job was cancelled (scancel), not preempted: the attempt "
                    "ends lost and counts against --max-retries"
                )
                log.warning("%s", text)
                say(text)
                continue
            say(f"{name}: {what.detail}; preempting the attempt")
            try:
                await preempt(what)
            except Exception as exc:  # said: the attempt ends anyway
                log.warning("could not preempt the attempt: %s", exc)
                say(f"could not preempt the attempt: {exc}")
