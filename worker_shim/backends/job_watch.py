"""What a scheduler backend does about each job it launched, decided without I/O.

Theory of operation
-------------------
A scheduler backend (``worker_shim/backends/scheduler.py``; Slurm, Ray) launches one job per attempt
and looks at its jobs every few seconds. Each look pairs two facts per job:

- what the scheduler says of it (:class:`Phase`): waiting for resources, running, over, gone from
  its books, put back in its queue after it had started (Slurm's requeue on preemption), or given
  up on before it started (Ray fails a job that waited longer than ``RAY_JOB_START_TIMEOUT_SECONDS``);
- what the relay says of the job's attempt (:class:`Attempt`): still waiting for its worker, started
  (the worker claimed it), or over (the run ended, or went on to another attempt).

:class:`JobWatch` turns the pair into one :class:`Action`:

=============  =====================  ===================  ==========================
scheduler      attempt waiting        attempt started      attempt over
=============  =====================  ===================  ==========================
pending        keep                   keep                 cancel
running        say it runs (once)     keep                 cancel after ``grace``
over, gone     lost (*)               lost                 forget
requeued       cancel, lost           cancel, lost (**)    cancel
gave up        submit again           lost                 forget
=============  =====================  ===================  ==========================

- (*) *gone*, for a job launched here that the scheduler has never listed yet, is kept for
  ``UNSEEN_GRACE`` first: a scheduler may not list a job it has just accepted.
- (**) an attempt being preempted (its worker trapped the scheduler's warning) is waited for
  first, for its ``preempt_grace`` and ``grace`` more: Slurm lists a requeued job as such while
  its processes still end, and the worker reports the attempt ``preempted`` meanwhile.
- *say it runs*: the relay is told the job runs (``report running``), once: a ticket claims its
  attempt only then (``protocol_specs/access/auth.py``), so a ticket read from a scheduler's job list
  while the job waited is worth nothing.
- *lost*: the relay is told; it retries the run as configured (a new attempt, a new job) or marks
  it lost. A requeued job is cancelled rather than left to start again, so the retry is a new
  attempt whose worker the relay knows; the old attempt's worker, should it start, is refused.
- *cancel after grace*: a running job whose attempt is over had its worker told to stop; it gets
  ``grace`` seconds to end by itself before it is cancelled.
- *submit again*: nothing ran, so the same attempt gets a new job and no retry is spent: a run that
  waits for GPUs for longer than the scheduler's patience keeps waiting, as a Slurm job would.

A scheduler without time limits of its own (Ray) gets the run's ``--time`` here: a job running
(as this watch saw it, from its first look at it running) for longer than its ``limit`` is
cancelled and its attempt lost, as Slurm's ``TIMEOUT`` is.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from enum import StrEnum

__all__ = ["STALE_GRACE", "UNSEEN_GRACE", "Action", "Attempt", "Do", "JobWatch", "Phase", "Seen"]

#: a running job whose attempt is over may take this long to end by itself before it is cancelled
STALE_GRACE = 30.0
#: a job just submitted that the scheduler does not list yet is not gone for this long
UNSEEN_GRACE = 30.0


class Phase(StrEnum):
    """What the scheduler says of a job."""

    PENDING = "pending"  #: queued, waiting for resources
    RUNNING = "running"
    ENDED = "ended"  #: over, for any reason
    GONE = "gone"  #: the scheduler no longer knows it
    REQUEUED = "requeued"  #: it started, then the scheduler put it back in its queue
    GAVE_UP = "gave up"  #: the scheduler failed it before it started (it waited too long)


class Attempt(StrEnum):
    """What the relay says of the job's attempt."""

    WAITING = "waiting"  #: current, its worker has not claimed it yet
    STARTED = "started"  #: current, claimed by its worker
    #: current, started, and preempted: its worker reports its end once the program exited
    PREEMPTING = "preempting"
    OVER = "over"  #: the run ended, or went on to another attempt


class Do(StrEnum):
    KEEP = "keep"
    FORGET = "forget"  #: stop tracking it (it is over and so is its attempt)
    CANCEL = "cancel"  #: cancel it, then forget it
    LOST = "lost"  #: tell the relay the attempt is lost, then forget it
    CANCEL_LOST = "cancel, lost"  #: cancel it, tell the relay the attempt is lost, forget it
    SUBMIT_AGAIN = "submit again"  #: the same attempt, a new job
    SAY_RUNNING = "say it runs"  #: tell the relay the job runs (then :meth:`JobWatch.said_running`)


@dataclass(frozen=True)
class Seen:
    """One job as the scheduler described it."""

    phase: Phase
    #: what the scheduler said, for people ("FAILED: exit code 1", "PREEMPTED")
    detail: str = ""


@dataclass(frozen=True)
class Action:
    do: Do
    #: why, as the relay's record and the backend's log will say it
    why: str = ""


@dataclass
class JobWatch:
    """Decides per look; remembers only since when each over-attempt job has kept running."""

    #: the scheduler's name, as messages say it ("Slurm", "Ray")
    scheduler: str = "the scheduler"
    grace: float = STALE_GRACE
    _stale_since: dict[str, float] = field(default_factory=dict)
    _running_since: dict[str, float] = field(default_factory=dict)
    _said_running: set[str] = field(default_factory=set)
    #: jobs launched here that the scheduler has not listed yet, since when
    _unseen_since: dict[str, float] = field(default_factory=dict)

    def launched(self, job: str, now: float) -> None:
        """``job`` was just submitted: until the scheduler lists it (for :data:`UNSEEN_GRACE`
        s), its absence from the scheduler's books is not taken for its end. Slurm has been seen
        to answer "Invalid job id" for a job ``sbatch`` had just accepted, and taking that for
        gone reported the attempt lost and removed its credentials before the job started."""
        self._unseen_since[job] = now

    def look(
        self,
        job: str,
        seen: Seen,
        attempt: Attempt,
        now: float,
        *,
        limit: float = 0.0,
        preempt_grace: float = 0.0,
    ) -> Action:
        """What to do about ``job``; ``limit``: the run's time limit, for a scheduler that has
        none of its own (0: none); ``preempt_grace``: the run's, how long a preempted attempt's
        program may take to end."""
        if seen.phase is not Phase.GONE:
            self._unseen_since.pop(job, None)  # listed: its absence counts from now on
        if seen.phase is Phase.RUNNING:
            started = self._running_since.setdefault(job, now)
            if limit and attempt is not Attempt.OVER and now - started >= limit:
                why = f"{self.scheduler} job {job} ran past the run's time limit ({limit:g} s)"
                return Action(Do.CANCEL_LOST, why)
        return self._decide(job, seen, attempt, now, preempt_grace)

    def said_running(self, job: str) -> None:
        """The relay was told ``job`` runs."""
        self._said_running.add(job)

    def forget(self, job: str) -> None:
        """``job`` was acted on for good (cancelled, reported, replaced): its clocks go. Until
        then, an action that failed is decided again at the next look, clocks running."""
        self._stale_since.pop(job, None)
        self._running_since.pop(job, None)
        self._said_running.discard(job)
        self._unseen_since.pop(job, None)

    def _decide(
        self, job: str, seen: Seen, attempt: Attempt, now: float, preempt_grace: float = 0.0
    ) -> Action:
        said = f": {seen.detail}" if seen.detail else ""
        over = attempt is Attempt.OVER
        name = f"{self.scheduler} job {job}"
        match seen.phase:
            case Phase.REQUEUED:
                if over:
                    return Action(Do.CANCEL, f"{name} was requeued; its attempt is over")
                if attempt is Attempt.PREEMPTING:
                    # Slurm says requeued while the job's processes still end (KillWait): its
                    # worker reports the preempted attempt's end, unless it died first
                    first = self._stale_since.setdefault(job, now)
                    if now - first < preempt_grace + self.grace:
                        return Action(Do.KEEP)
                return Action(Do.CANCEL_LOST, f"{self.scheduler} requeued job {job} (preempted?)")
            case Phase.ENDED | Phase.GONE:
                if over:
                    return Action(Do.FORGET)
                launched = self._unseen_since.get(job)
                if seen.phase is Phase.GONE and launched is not None:
                    if now - launched < UNSEEN_GRACE:
                        return Action(Do.KEEP)  # not listed yet: not gone
                    self._unseen_since.pop(job, None)
                how = "ended" if seen.phase is Phase.ENDED else "is gone"
                return Action(Do.LOST, f"{name} {how}{said}")
            case Phase.GAVE_UP:
                if over:
                    return Action(Do.FORGET)
                if attempt is Attempt.WAITING:
                    return Action(Do.SUBMIT_AGAIN, f"{name} never started{said}")
                return Action(Do.LOST, f"{name} failed{said}")
            case Phase.PENDING | Phase.RUNNING:
                if seen.phase is Phase.RUNNING and attempt is Attempt.WAITING:
                    if job not in self._said_running:
                        return Action(Do.SAY_RUNNING)
                if not over:
                    return Action(Do.KEEP)
                if seen.phase is Phase.PENDING:
                    return Action(Do.CANCEL, f"{name} is still queued; its attempt is over")
                first = self._stale_since.setdefault(job, now)
                if now - first < self.grace:
                    return Action(Do.KEEP)
                return Action(
                    Do.CANCEL, f"{name} still runs {self.grace:g} s after its attempt ended"
                )
