"""Preempting, pausing and resuming a run: the relay's decisions, without I/O.

Theory of operation
-------------------
A preempt (``tether preempt``, ``tether pause``, a scheduler's warning that reached the run's
worker) is asked of the run's *current attempt*. :func:`preempt` decides what it does to the
record:

- a starting, running or paused attempt is marked (:attr:`~protocol_specs.runs.runs.Attempt.preempt`:
  ``retry`` or ``suspend``); the relay then tells its worker (a ``preempt`` control entry), which
  warns the program and ends it after the grace. When that attempt ends, other than by exiting 0
  or failing to start, :meth:`~protocol_specs.runs.runs.RunRecord.attempt_over` ends it
  ``preempted``: the run is queued again at once without using a retry, or ``suspended``;
- a queued run that is paused (``suspend``) is ``suspended`` at once: nothing of it runs;
- anything else is refused, in one line (:func:`refusal`).

:func:`resume` queues the next attempt of a suspended run (:func:`resume_refusal` says when not).
"""

from __future__ import annotations

from typing import Literal

from .runs import IllegalTransition, RunEvent, RunRecord, RunState

__all__ = [
    "Then",
    "next_attempt",
    "preempt",
    "refusal",
    "resume",
    "resume_refusal",
    "what_follows",
]

#: what follows a preempted attempt's end
Then = Literal["retry", "suspend"]

_LIVE = (RunState.STARTING, RunState.RUNNING, RunState.PAUSED)


def refusal(record: RunRecord, then: Then) -> str | None:
    """Why ``record``'s run cannot be preempted (``then``: what would follow) now, in one line;
    None: it can."""
    verb = "pause" if then == "suspend" else "preempt"
    if record.finished:
        return f"run {record.id} is {record.state.value}: there is nothing to {verb}"
    if record.state is RunState.SUSPENDED:
        return f"run {record.id} is suspended already; tether resume {record.id} queues it again"
    if record.state is RunState.QUEUED and then == "retry":
        return (
            f"run {record.id} is queued: no attempt runs to preempt "
            f"(tether pause {record.id} holds it until tether resume)"
        )
    return None


def preempt(record: RunRecord, then: Then, *, at: float, detail: str) -> RunRecord:
    """The record once a preempt of its current attempt was asked (see the module's docstring);
    raises :class:`IllegalTransition` where :func:`refusal` would refuse (a race lost)."""
    if refusal(record, then) is not None:
        raise IllegalTransition(RunEvent.PREEMPT, record.state)
    if record.state is RunState.QUEUED:  # suspend: at once
        suspended = record.with_attempt(
            ended_at=at, outcome="preempted", preempt="suspend", detail=detail
        )
        return suspended.advance(RunEvent.SUSPEND, at=at, detail=detail, queue_entry="")
    assert record.state in _LIVE
    marked = record.advance(RunEvent.PREEMPT, at=at)
    return marked.with_attempt(preempt=then)


def resume_refusal(record: RunRecord, *, from_start: bool) -> str | None:
    """Why ``record``'s run cannot be resumed, in one line; None: it can."""
    if record.state is not RunState.SUSPENDED:
        return (
            f"run {record.id} is {record.state.value}, not suspended: only a paused run "
            "(tether pause) is resumed"
        )
    if record.checkpoint is None and not from_start:
        return (
            f"run {record.id} has no checkpoint: it would start again from step 0; add --from-start"
        )
    return None


def resume(record: RunRecord, *, at: float, from_start: bool) -> RunRecord:
    """The suspended run's next attempt, queued (claimable at once); raises
    :class:`IllegalTransition` where :func:`resume_refusal` would refuse."""
    if resume_refusal(record, from_start=from_start) is not None:
        raise IllegalTransition(RunEvent.REQUEUE, record.state)
    return record.next_attempt(RunEvent.REQUEUE, at=at, not_before=at, detail="resumed")


def what_follows(before: RunRecord, after: RunRecord) -> str:
    """What ``tether logs`` says once a preempted attempt ended: ``attempt 2 was preempted;
    attempt 3 resumes from step 400`` (or ``... is suspended; tether resume RUN``)."""
    head = f"attempt {before.attempt} was preempted"
    if before.preempt_counts:
        head += " without a new checkpoint: it counts as a retry"
    if after.state is RunState.SUSPENDED:
        return f"{head}; run {after.id} is suspended: tether resume {after.id} continues it"
    return f"{head}; {next_attempt(after)}"


def next_attempt(record: RunRecord) -> str:
    """``attempt 3 resumes from step 400`` (its latest checkpoint), or ``... starts from the
    beginning``."""
    if record.checkpoint is not None:
        return f"attempt {record.attempt} resumes from step {record.checkpoint.step}"
    return f"attempt {record.attempt} starts from the beginning (no checkpoint)"
