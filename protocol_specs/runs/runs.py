"""The run's record and its lifecycle state machine: what the relay keeps of a run, and how it moves.

Theory of operation
-------------------
A run is submitted as a :class:`~protocol_specs.runs.spec.RunSpec` (``protocol_specs/runs/spec.py``:
what to run, where it came from, resources, retries, debug or not). The relay keeps a
:class:`RunRecord` per run and moves it through :class:`RunState` only along :data:`TRANSITIONS`,
a table keyed by ``(state, event)``. An event not in the table for the current state raises
:class:`IllegalTransition` naming the event and the state, and leaves the record unchanged.
Terminal states (``succeeded``, ``failed``, ``cancelled``, ``lost``) have no outgoing transitions:
a worker reporting an exit after the user cancelled is reported as illegal and ignored by the
caller.

Attempts: a run is tried up to ``1 + max_retries`` times. When an attempt fails (the program exits
non-zero) or is lost (its worker's lease expired, or the scheduler preempted or killed its job) and
:func:`retry_delay` allows another, the ``retry`` event puts the run back to ``queued`` instead of a
terminal state; the record's :class:`Attempt` list keeps each attempt's worker, times and outcome.
A program that could not be started (``start_failed``: a bad command, a broken snapshot) is not
retried: the next attempt would fail the same way.

Preemption (``protocol_specs/runs/preemption.py``): a preempted attempt is marked
(:attr:`Attempt.preempt`); when it ends other than by exiting 0 or failing to start, its outcome
is ``preempted`` and the run is queued again at once without using a retry (only ``failed`` and
``lost`` attempts count against ``max_retries``), or ``suspended`` until ``tether resume``. One
exception caps a run preempted at every time limit without progress: a preempted attempt that
stored no checkpoint since the run's previous preempted attempt counts (:attr:`Attempt.counted`).

The diagram in ``docs/run-states.md`` is generated from :data:`TRANSITIONS` (``python -m
protocol_specs.runs.diagrams``).
"""

from __future__ import annotations

from enum import StrEnum
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field

from ..checkpoints.checkpoints import Checkpoint
from ..text_width import clip
from .spec import RunSpec

__all__ = [
    "TERMINAL_STATES",
    "TRANSITIONS",
    "Attempt",
    "IllegalTransition",
    "NodeRow",
    "ProcessRow",
    "RunEvent",
    "RunRecord",
    "RunState",
    "StaleAttempt",
    "next_state",
    "retry_delay",
]


class RunState(StrEnum):
    QUEUED = "queued"  #: submitted, waiting for a worker slot
    STARTING = "starting"  #: claimed by a worker: fetching files, starting the program
    RUNNING = "running"  #: the program's process is running (under debugpy in debug mode)
    PAUSED = "paused"  #: debug mode: the program is stopped (a breakpoint, a step, an exception)
    SUCCEEDED = "succeeded"  #: exited with status 0
    FAILED = "failed"  #: exited non-zero, or could not start
    CANCELLED = "cancelled"  #: cancelled by the user (terminateDebuggee, ``tether cancel``)
    #: the worker stopped renewing its lease (host down, network cut for too long), or the
    #: scheduler's job ended without it
    LOST = "lost"
    #: paused by its user (``tether pause``): no attempt runs or waits until ``tether resume``
    #: (not terminal)
    SUSPENDED = "suspended"


class RunEvent(StrEnum):
    CLAIM = "claim"
    START = "start"
    EXIT_OK = "exit_ok"
    EXIT_ERROR = "exit_error"
    START_FAILED = "start_failed"
    CANCEL = "cancel"
    LEASE_EXPIRED = "lease_expired"
    #: the scheduler's job ended, was cancelled or preempted without the worker finishing
    JOB_LOST = "job_lost"
    PAUSE = "pause"
    RESUME = "resume"
    RETRY = "retry"
    #: a claim that never reached its worker (its connection closed first, or it was not confirmed
    #: in time: ``protocol_specs/runs/claims.py``): queued again, same attempt
    RELEASE = "release"
    #: the claim's worker says it holds the claim's answer: the claim counts from now on
    CONFIRM = "confirm"
    #: its submit was cut off before its snapshot was kept (``protocol_specs/runs/submits.py``)
    SUBMIT_CUT = "submit_cut"
    #: its attempt is preempted (``tether preempt``/``pause``, a scheduler's warning): marked,
    #: the state stays (``protocol_specs/runs/preemption.py``)
    PREEMPT = "preempt"
    #: ``tether pause`` of a queued run, or a preempted attempt that ended under ``suspend``
    SUSPEND = "suspend"
    #: ``tether resume`` of a suspended run: its next attempt is queued
    REQUEUE = "requeue"


TRANSITIONS: dict[tuple[RunState, RunEvent], RunState] = {
    (RunState.QUEUED, RunEvent.CLAIM): RunState.STARTING,
    (RunState.QUEUED, RunEvent.CANCEL): RunState.CANCELLED,
    (RunState.STARTING, RunEvent.RELEASE): RunState.QUEUED,
    (RunState.STARTING, RunEvent.CONFIRM): RunState.STARTING,
    (RunState.STARTING, RunEvent.START): RunState.RUNNING,
    (RunState.STARTING, RunEvent.START_FAILED): RunState.FAILED,
    (RunState.STARTING, RunEvent.CANCEL): RunState.CANCELLED,
    (RunState.RUNNING, RunEvent.EXIT_OK): RunState.SUCCEEDED,
    (RunState.RUNNING, RunEvent.EXIT_ERROR): RunState.FAILED,
    (RunState.RUNNING, RunEvent.CANCEL): RunState.CANCELLED,
    (RunState.RUNNING, RunEvent.PAUSE): RunState.PAUSED,
    (RunState.PAUSED, RunEvent.RESUME): RunState.RUNNING,
    (RunState.PAUSED, RunEvent.EXIT_OK): RunState.SUCCEEDED,
    (RunState.PAUSED, RunEvent.EXIT_ERROR): RunState.FAILED,
    (RunState.PAUSED, RunEvent.CANCEL): RunState.CANCELLED,
    (RunState.STARTING, RunEvent.LEASE_EXPIRED): RunState.LOST,
    (RunState.RUNNING, RunEvent.LEASE_EXPIRED): RunState.LOST,
    (RunState.PAUSED, RunEvent.LEASE_EXPIRED): RunState.LOST,
    (RunState.QUEUED, RunEvent.JOB_LOST): RunState.LOST,
    (RunState.QUEUED, RunEvent.SUBMIT_CUT): RunState.LOST,
    (RunState.STARTING, RunEvent.JOB_LOST): RunState.LOST,
    (RunState.RUNNING, RunEvent.JOB_LOST): RunState.LOST,
    (RunState.PAUSED, RunEvent.JOB_LOST): RunState.LOST,
    (RunState.QUEUED, RunEvent.RETRY): RunState.QUEUED,
    (RunState.STARTING, RunEvent.RETRY): RunState.QUEUED,
    (RunState.RUNNING, RunEvent.RETRY): RunState.QUEUED,
    (RunState.PAUSED, RunEvent.RETRY): RunState.QUEUED,
    (RunState.STARTING, RunEvent.PREEMPT): RunState.STARTING,
    (RunState.RUNNING, RunEvent.PREEMPT): RunState.RUNNING,
    (RunState.PAUSED, RunEvent.PREEMPT): RunState.PAUSED,
    (RunState.QUEUED, RunEvent.SUSPEND): RunState.SUSPENDED,
    (RunState.STARTING, RunEvent.SUSPEND): RunState.SUSPENDED,
    (RunState.RUNNING, RunEvent.SUSPEND): RunState.SUSPENDED,
    (RunState.PAUSED, RunEvent.SUSPEND): RunState.SUSPENDED,
    (RunState.SUSPENDED, RunEvent.REQUEUE): RunState.QUEUED,
    (RunState.SUSPENDED, RunEvent.CANCEL): RunState.CANCELLED,
}

TERMINAL_STATES = frozenset(
    {RunState.SUCCEEDED, RunState.FAILED, RunState.CANCELLED, RunState.LOST}
)


class IllegalTransition(Exception):
    def __init__(self, event: RunEvent, state: RunState) -> None:
        super().__init__(f"can't handle run event {event.value!r} in state {state.value!r}")
        self.event = event
        self.state = state


class StaleAttempt(IllegalTransition):
    """An event about an attempt that is not the run's current one (it ended, and another began)."""

    def __init__(self, event: RunEvent, state: RunState, attempt: int, current: int) -> None:
        super().__init__(event, state)
        self.args = (
            f"run event {event.value!r} is about attempt {attempt}; the run is at attempt "
            f"{current} ({state.value})",
        )
        self.attempt = attempt
        self.current = current


def next_state(state: RunState, event: RunEvent) -> RunState:
    """Return the state after ``event``; raises :class:`IllegalTransition` if not allowed."""
    try:
        return TRANSITIONS[(state, event)]
    except KeyError:
        raise IllegalTransition(event, state) from None


def retry_delay(attempt: int, max_retries: int, backoff: float) -> float | None:
    """Seconds before attempt ``attempt + 1`` after attempt ``attempt`` failed; None: no retry.

    Exponential: ``backoff``, ``2 * backoff``, ``4 * backoff``... capped at one hour.
    """
    if attempt > max_retries:
        return None
    return float(min(backoff * 2 ** (attempt - 1), 3600.0))


class NodeRow(BaseModel):
    """One node of a multi-node run's attempt, as ``tether status`` shows it
    (``protocol_specs/runs/nodes.py`` keeps them)."""

    model_config = ConfigDict(frozen=True, extra="ignore")

    node: int
    #: its worker's name (``""`` until that worker joined)
    host: str = ""
    state: Literal["starting", "running", "exited", "lost"] = "starting"
    exit_code: int | None = None


class Attempt(BaseModel):
    """One try at running the program."""

    model_config = ConfigDict(frozen=True, extra="ignore")

    n: int
    queued_at: float = 0.0
    claimed_at: float | None = None
    started_at: float | None = None
    ended_at: float | None = None
    worker: str = ""
    #: the scheduler's id for this attempt (a Slurm job id), if any
    job: str = ""
    #: when its scheduler backend saw that job running (a ticket's claim waits for it)
    job_running_at: float | None = None
    #: the claim that gave it to ``worker`` (``protocol_specs/runs/claims.py``): its id (the id of the
    #: worker token minted for it, if one was), until when it may be confirmed, when it was, and
    #: whether it took the run from its backend's queue; claims released unconfirmed before it
    claim: str = ""
    confirm_by: float | None = None
    confirmed_at: float | None = None
    from_queue: bool = False
    released: int = 0
    #: where the attempt's files are on its worker (the run directory)
    run_dir: str = ""
    #: how it ended: the terminal state or ``retried``-worthy outcome (``failed``, ``lost``,
    #: ``preempted``, ...)
    outcome: str = ""
    #: a preempt was asked of it (``tether preempt``, ``pause``, a scheduler's warning): what
    #: follows its end, ``retry`` or ``suspend`` (``protocol_specs/runs/preemption.py``)
    preempt: str = ""
    #: a preempted attempt that counts against ``max_retries`` all the same: it stored no
    #: checkpoint since the run's previous preempted attempt (:attr:`RunRecord.preempt_counts`)
    counted: bool = False
    exit_code: int | None = None
    detail: str = ""
    #: a multi-node run's nodes (``[]`` for one node), from node 0's claim on
    nodes: list[NodeRow] = Field(default_factory=list)


class ProcessRow(BaseModel):
    """One debugged process of the current attempt, as ``tether status`` shows it (the worker's
    ``process_started`` / ``paused`` / ``resumed`` / ``process_exited``: ``protocol_specs.session.processes``)."""

    model_config = ConfigDict(extra="ignore")

    title: str  #: ``rank 3 (pid 4242) on gpu-7``
    pid: int = 0
    rank: int | None = None
    state: Literal["running", "paused", "exited"] = "running"
    where: str = ""  #: where it is paused
    exit_code: int | None = None
    #: why it is paused (the ``stopped`` event's reason: ``breakpoint``, ``exception``, ...)
    reason: str = ""


class RunRecord(BaseModel):
    """The relay's record of a run (stored as one Redis hash, see ``relay/store/keys.py``)."""

    model_config = ConfigDict(frozen=True, extra="ignore")

    id: str
    spec: RunSpec
    state: RunState = RunState.QUEUED
    created_at: float = 0.0
    updated_at: float = 0.0
    worker: str = ""
    exit_code: int | None = None
    detail: str = ""
    #: records written before queue entries were acknowledged at claim time: the entry a worker
    #: claimed (acknowledged when the attempt ends)
    queue_entry: str = ""
    #: the snapshot (its manifest's id, or its root tree's digest), its file count and bytes
    snapshot: str = ""
    #: a snapshot recorded by its root tree (``relay/snapshots/trees.py``): the digest; its manifest
    #: is expanded when a worker claims the run
    tree: str = ""
    files: int = 0
    size: int = 0
    #: the current attempt's number (1-based) and every attempt so far
    attempt: int = 1
    attempts: list[Attempt] = Field(default_factory=list)
    #: where the program is paused (``train.py:18 in step``), while ``paused``
    paused_at: str = ""
    #: the current attempt's debugged processes by key (``""``: the main one, listed once it
    #: paused); at most ``processes.MAX_ROWS``
    processes: dict[str, ProcessRow] = Field(default_factory=dict)
    #: a retried run is not claimed before this time
    not_before: float = 0.0
    #: the run this one reruns (``tether rerun``)
    rerun_of: str = ""
    #: the user who submitted it (the only one besides admins who may see or debug it)
    owner: str = ""
    #: seconds since the worker was last heard from, once that is longer than its heartbeats
    #: allow (its host may be down); set by the relay when it answers, never stored
    silent_for: float = 0.0
    #: debug mode: the program is held before its first line until an IDE configures the
    #: debugger (the worker said ``waiting_for_ide``, not yet ``debugger_live``)
    waiting_for_ide: bool = False
    #: the adapters (their ``origin``) with an IDE attached now, as their presence entries say
    ides: list[str] = Field(default_factory=list, max_length=16)
    #: the last value of each metric the newest metric entry has: set by the relay when it
    #: answers, never stored
    metrics: dict[str, float] = Field(default_factory=dict)
    #: the sweep and trial this run is (``S#3``), if it is one
    trial: str = ""
    #: why a queued run of a worker pool still waits (what holds its slots: ``run_text``); set
    #: by the relay when it answers, never stored
    queued_why: str = ""
    #: its latest complete checkpoint (``protocol_specs/checkpoints``), how many it keeps and
    #: their bytes together (each counted whole, as ``tether status`` shows them)
    checkpoint: Checkpoint | None = None
    checkpoints: int = 0
    checkpoint_bytes: int = 0
    #: the files its outputs list (``RunSpec.outputs``) and their bytes
    outputs: int = 0
    outputs_bytes: int = 0

    def with_ide(self, origin: str, attached: bool) -> RunRecord:
        """The record with adapter ``origin``'s IDE attached or gone (a finished run has none)."""
        ides = [o for o in self.ides if o != origin]
        if attached and not self.finished:
            ides = [*ides, origin][-16:]
        return self if ides == self.ides else self.model_copy(update={"ides": ides})

    def waiting(self, attempt: int, waiting: bool) -> RunRecord:
        """The record with :attr:`waiting_for_ide` as the worker of ``attempt`` said; raises
        :class:`IllegalTransition` for news of another attempt or about a run that is not
        running."""
        event = RunEvent.START
        self.check_attempt(event, attempt)
        if self.state is not RunState.RUNNING:
            raise IllegalTransition(event, self.state)
        return self.model_copy(update={"waiting_for_ide": waiting})

    def redacted(self) -> RunRecord:
        """The record as users see it: secret environment values hidden."""
        if not self.spec.secret_env:
            return self
        return self.model_copy(update={"spec": self.spec.redacted()})

    @property
    def job_running(self) -> bool:
        """The current attempt's job was seen running by its scheduler backend."""
        last = self.attempts[-1] if self.attempts else None
        return last is not None and last.n == self.attempt and last.job_running_at is not None

    def with_attempt(self, **changes: Any) -> RunRecord:
        """The record with the current attempt's entry updated (created if missing)."""
        attempts = list(self.attempts)
        if not attempts or attempts[-1].n != self.attempt:
            attempts.append(Attempt(n=self.attempt, queued_at=self.updated_at))
        attempts[-1] = attempts[-1].model_copy(update=changes)
        return self.model_copy(update={"attempts": attempts})

    def apply(self, event: RunEvent, *, at: float, **changes: Any) -> RunRecord:
        """The record after ``event``; raises :class:`IllegalTransition` and changes nothing."""
        state = next_state(self.state, event)
        return self.model_copy(update={"state": state, "updated_at": at, **changes})

    def advance(
        self, event: RunEvent, *, at: float, about: int | None = None, **changes: Any
    ) -> RunRecord:
        """:meth:`apply` with the current attempt's bookkeeping (claimed, started, ended).

        ``about``: the attempt the event is about; another than the current one raises
        :class:`StaleAttempt` (news from a worker whose attempt is over).
        """
        self.check_attempt(event, about)
        updated = self.apply(event, at=at, **changes)
        if event is RunEvent.CLAIM:
            updated = updated.with_attempt(claimed_at=at, worker=updated.worker)
        elif event is RunEvent.RELEASE:
            updated = updated.with_attempt(claimed_at=None, worker="")
        elif event is RunEvent.START:
            updated = updated.with_attempt(started_at=at).model_copy(update={"processes": {}})
        elif updated.finished:
            updated = updated.with_attempt(
                ended_at=at,
                outcome=updated.state.value,
                exit_code=updated.exit_code,
                detail=updated.detail,
            ).model_copy(update={"ides": [], "processes": _ended(updated.processes)})
        if updated.state is not RunState.PAUSED:
            updated = updated.model_copy(update={"paused_at": ""})
        if updated.state is not RunState.RUNNING:
            updated = updated.model_copy(update={"waiting_for_ide": False})
        return updated

    def attempt_over(
        self,
        event: RunEvent,
        *,
        at: float,
        about: int | None = None,
        exit_code: int | None = None,
        detail: str = "",
    ) -> RunRecord:
        """The current attempt failed (``exit_error``) or was lost (``lease_expired``,
        ``job_lost``): the run queued again for the next attempt if :func:`retry_delay` allows
        one (``not_before`` says when it may be claimed), else ended by ``event``. A preempted
        attempt (:attr:`preempted`) ends ``preempted``: queued again at once without using a
        retry, or ``suspended``.

        Raises :class:`IllegalTransition` for a finished run, and for a queued run unless the
        scheduler lost its job (nothing of a queued run is running).
        """
        self.check_attempt(event, about)
        if self.state is RunState.QUEUED and event is not RunEvent.JOB_LOST:
            raise IllegalTransition(event, self.state)
        next_state(self.state, event)  # finished runs: IllegalTransition
        then = self.preempted
        counted = self.preempt_counts
        if then == "suspend":
            ended = self.with_attempt(
                ended_at=at, outcome="preempted", exit_code=exit_code, detail=detail
            )
            return ended.advance(
                RunEvent.SUSPEND, at=at, worker="", exit_code=exit_code, queue_entry="",
                detail=detail, processes=_ended(self.processes), ides=[],
            )  # fmt: skip
        delay: float | None = 0.0
        if not then or counted:
            failures = self.failures + 1
            delay = retry_delay(failures, self.spec.max_retries, self.spec.retry_backoff)
        if delay is None:
            return self.advance(event, at=at, exit_code=exit_code, detail=detail)
        outcome = "failed" if event is RunEvent.EXIT_ERROR else "lost"
        if then:
            outcome = "preempted"
        ended = self.with_attempt(
            ended_at=at, outcome=outcome, exit_code=exit_code, detail=detail, counted=counted
        )
        return ended.next_attempt(RunEvent.RETRY, at=at, not_before=at + delay, detail=detail)

    def next_attempt(
        self, event: RunEvent, *, at: float, not_before: float, detail: str
    ) -> RunRecord:
        """The record with its next attempt queued by ``event`` (a retry, a resume), claimable
        from ``not_before``."""
        attempts = [*self.attempts, Attempt(n=self.attempt + 1, queued_at=at)]
        return self.model_copy(update={"attempts": attempts}).advance(
            event,
            at=at,
            attempt=self.attempt + 1,
            worker="",
            exit_code=None,
            queue_entry="",
            not_before=not_before,
            detail=detail,
        )

    @property
    def preempted(self) -> str:
        """What follows the current attempt's end if it was preempted (``retry`` or
        ``suspend``); ``""``: it was not."""
        last = self.attempts[-1] if self.attempts else None
        return last.preempt if last is not None and last.n == self.attempt else ""

    @property
    def preempt_counts(self) -> bool:
        """Whether the current attempt, preempted to be retried, counts against ``max_retries``:
        an earlier attempt was preempted too and no checkpoint was stored since (by this attempt
        or one between). A run preempted at every time limit without progress would otherwise be
        queued again for ever; its first preemption, and any after progress, stay free."""
        if self.preempted != "retry":
            return False
        earlier = [a.n for a in self.attempts if a.n < self.attempt and a.outcome == "preempted"]
        if not earlier:
            return False
        return self.checkpoint is None or self.checkpoint.attempt <= max(earlier)

    @property
    def failures(self) -> int:
        """The attempts before the current one that failed or were lost, and the preempted ones
        that made no progress (:attr:`preempt_counts`): what counts against ``max_retries``."""
        return sum(
            1
            for a in self.attempts
            if a.n != self.attempt and (a.outcome in ("failed", "lost") or a.counted)
        )

    def check_attempt(self, event: RunEvent, about: int | None) -> None:
        """Raise :class:`StaleAttempt` if ``about`` is given and is not the current attempt."""
        if about is not None and about != self.attempt:
            raise StaleAttempt(event, self.state, about, self.attempt)

    @property
    def finished(self) -> bool:
        return self.state in TERMINAL_STATES

    def where(self) -> str:
        """Where the run is, in a few words: paused where (and how many more processes are),
        its exit code, its scheduler job while queued, or why it ended."""
        if self.paused_at:
            paused = sum(1 for row in self.processes.values() if row.state == "paused")
            return self.paused_at + (f" (+{paused - 1} more paused)" if paused > 1 else "")
        if self.finished and self.exit_code is not None:
            return f"exit {self.exit_code}"
        attempt = self.attempts[-1] if self.attempts else None
        if self.state is RunState.QUEUED and attempt and attempt.job:
            return f"job {attempt.job}"
        if self.state is RunState.QUEUED:
            return self.queued_why
        return clip(self.detail, 40) if self.finished else ""


def _ended(rows: dict[str, ProcessRow]) -> dict[str, ProcessRow]:
    """A finished run's processes: none is still running or paused."""
    done = {"state": "exited", "where": ""}
    return {k: r if r.state == "exited" else r.model_copy(update=done) for k, r in rows.items()}
