"""Preempting, pausing and resuming a run (``protocol_specs/runs/preemption.py``), and how a
preempted attempt's end is counted (``RunRecord.attempt_over``): stepped event by event."""

from __future__ import annotations

import pytest

from protocol_specs.checkpoints.checkpoints import Checkpoint
from protocol_specs.runs import preemption
from protocol_specs.runs.claims import lease_expired
from protocol_specs.runs.runs import IllegalTransition, RunEvent, RunRecord, RunState
from protocol_specs.runs.spec import RunSpec


def _running(max_retries: int = 0, **spec: object) -> RunRecord:
    record = RunRecord(
        id="r1",
        spec=RunSpec(command=["python", "t.py"], workdir="/w", max_retries=max_retries, **spec),  # type: ignore[arg-type]
    )
    record = record.advance(RunEvent.CLAIM, at=1.0, worker="w1")
    return record.advance(RunEvent.START, at=2.0)


def test_a_preempted_attempt_that_exits_non_zero_is_queued_again_without_a_retry() -> None:
    record = preemption.preempt(_running(), "retry", at=3.0, detail="by the user")
    assert record.state is RunState.RUNNING
    assert record.attempts[-1].preempt == "retry"
    ended = record.attempt_over(RunEvent.EXIT_ERROR, at=5.0, about=1, exit_code=3)
    assert ended.state is RunState.QUEUED  # max_retries 0, yet queued again
    assert ended.attempt == 2
    assert ended.not_before == 5.0  # at once
    assert [a.outcome for a in ended.attempts] == ["preempted", ""]
    assert ended.attempts[0].exit_code == 3
    # attempt 2 is not preempted: its failure uses the run's (zero) retries
    again = ended.advance(RunEvent.CLAIM, at=6.0).advance(RunEvent.START, at=7.0)
    failed = again.attempt_over(RunEvent.EXIT_ERROR, at=8.0, about=2, exit_code=1)
    assert failed.state is RunState.FAILED


def test_retries_count_failed_and_lost_attempts_only() -> None:
    record = _running(max_retries=1, retry_backoff=10.0)
    record = preemption.preempt(record, "retry", at=3.0, detail="x")
    record = record.attempt_over(RunEvent.JOB_LOST, at=4.0, about=1)  # preempted
    record = record.advance(RunEvent.CLAIM, at=5.0).advance(RunEvent.START, at=6.0)
    record = record.attempt_over(RunEvent.EXIT_ERROR, at=7.0, about=2, exit_code=1)
    assert record.state is RunState.QUEUED  # the one retry, after the first backoff
    assert (record.attempt, record.not_before) == (3, 17.0)
    assert record.failures == 1
    record = record.advance(RunEvent.CLAIM, at=20.0).advance(RunEvent.START, at=21.0)
    assert record.attempt_over(RunEvent.EXIT_ERROR, at=22.0, exit_code=1).state is RunState.FAILED


def test_an_exit_0_under_a_preempt_succeeds_and_a_failed_start_fails() -> None:
    record = preemption.preempt(_running(), "retry", at=3.0, detail="x")
    assert record.advance(RunEvent.EXIT_OK, at=4.0).state is RunState.SUCCEEDED
    claimed = RunRecord(id="r1", spec=_running().spec).advance(RunEvent.CLAIM, at=1.0)
    marked = preemption.preempt(claimed, "retry", at=2.0, detail="x")
    assert marked.state is RunState.STARTING
    assert marked.advance(RunEvent.START_FAILED, at=3.0).state is RunState.FAILED


def test_a_lost_lease_under_a_preempt_is_preempted() -> None:
    record = _running().with_attempt(confirmed_at=1.5)
    record = preemption.preempt(record, "retry", at=3.0, detail="x")
    ended = lease_expired(record, at=9.0, about=1, detail="lease")
    assert (ended.state, ended.attempts[0].outcome) == (RunState.QUEUED, "preempted")


def test_a_pause_suspends_when_the_attempt_ends_and_resume_queues_the_next() -> None:
    record = preemption.preempt(_running(), "suspend", at=3.0, detail="paused by alice")
    suspended = record.attempt_over(RunEvent.EXIT_ERROR, at=4.0, about=1, exit_code=-15)
    assert suspended.state is RunState.SUSPENDED
    assert not suspended.finished
    assert suspended.attempts[-1].outcome == "preempted"
    assert "tether resume r1" in preemption.what_follows(record, suspended)
    assert preemption.resume_refusal(suspended, from_start=False) == (
        "run r1 has no checkpoint: it would start again from step 0; add --from-start"
    )
    with pytest.raises(IllegalTransition):
        preemption.resume(suspended, at=5.0, from_start=False)
    resumed = preemption.resume(suspended, at=5.0, from_start=True)
    assert (resumed.state, resumed.attempt, resumed.not_before) == (RunState.QUEUED, 2, 5.0)
    assert resumed.attempts[-1].n == 2
    checkpoint = Checkpoint(step=400, attempt=1, at=3.5, files="0" * 64)
    with_one = suspended.model_copy(update={"checkpoint": checkpoint})
    assert preemption.resume_refusal(with_one, from_start=False) is None
    assert preemption.next_attempt(preemption.resume(with_one, at=5.0, from_start=False)) == (
        "attempt 2 resumes from step 400"
    )


def test_a_queued_run_is_suspended_at_once_and_a_suspended_one_can_be_cancelled() -> None:
    queued = RunRecord(id="r1", spec=_running().spec)
    suspended = preemption.preempt(queued, "suspend", at=2.0, detail="paused")
    assert suspended.state is RunState.SUSPENDED
    assert suspended.advance(RunEvent.CANCEL, at=3.0).state is RunState.CANCELLED
    resumed = preemption.resume(suspended, at=4.0, from_start=True)
    assert (resumed.state, resumed.attempt) == (RunState.QUEUED, 2)


@pytest.mark.parametrize(
    ("state", "then", "says"),
    [
        (RunState.SUCCEEDED, "retry", "run r1 is succeeded: there is nothing to preempt"),
        (RunState.CANCELLED, "suspend", "run r1 is cancelled: there is nothing to pause"),
        (RunState.SUSPENDED, "suspend", "run r1 is suspended already"),
        (RunState.QUEUED, "retry", "run r1 is queued: no attempt runs to preempt"),
    ],
)
def test_refusals_say_why_in_one_line(state: RunState, then: preemption.Then, says: str) -> None:
    record = RunRecord(id="r1", spec=_running().spec, state=state)
    refusal = preemption.refusal(record, then)
    assert refusal is not None and refusal.startswith(says) and "\n" not in refusal
    with pytest.raises(IllegalTransition):
        preemption.preempt(record, then, at=1.0, detail="")


def test_resume_of_a_run_not_suspended_is_refused() -> None:
    refusal = preemption.resume_refusal(_running(), from_start=True)
    assert refusal == (
        "run r1 is running, not suspended: only a paused run (tether pause) is resumed"
    )


def _preempted_again(record: RunRecord, at: float) -> RunRecord:
    """The current attempt preempted (a scheduler's time limit) and ended; the next one started."""
    record = preemption.preempt(record, "retry", at=at, detail="time limit")
    record = record.attempt_over(
        RunEvent.EXIT_ERROR, at=at + 1, about=record.attempt, exit_code=-15
    )
    if record.state is RunState.QUEUED:
        record = record.advance(RunEvent.CLAIM, at=at + 2).advance(RunEvent.START, at=at + 3)
    return record


def _saved(record: RunRecord, step: int) -> RunRecord:
    checkpoint = Checkpoint(step=step, attempt=record.attempt, at=0.0, files="a" * 64)
    return record.model_copy(update={"checkpoint": checkpoint})


def test_a_preemption_without_a_new_checkpoint_since_the_last_one_counts_as_a_retry() -> None:
    record = _saved(_running(max_retries=1), step=100)
    record = _preempted_again(record, at=10.0)  # attempt 1 saved: free
    assert (record.attempt, record.failures) == (2, 0)
    before = preemption.preempt(record, "retry", at=20.0, detail="time limit")
    assert before.preempt_counts  # attempt 2 saved nothing since attempt 1's preemption
    after = before.attempt_over(RunEvent.EXIT_ERROR, at=21.0, about=2, exit_code=-15)
    assert (after.state, after.attempt, after.failures) == (RunState.QUEUED, 3, 1)
    assert after.attempts[1].outcome == "preempted" and after.attempts[1].counted
    assert preemption.what_follows(before, after).startswith(
        "attempt 2 was preempted without a new checkpoint: it counts as a retry; attempt 3"
    )
    record = after.advance(RunEvent.CLAIM, at=22.0).advance(RunEvent.START, at=23.0)
    ended = _preempted_again(record, at=30.0)  # the one retry is used: the run ends
    assert ended.state is RunState.FAILED


def test_a_preemption_after_progress_or_the_first_one_stays_free() -> None:
    record = _preempted_again(_running(max_retries=0), at=10.0)  # no checkpoint, but the first
    assert (record.state, record.attempt) == (RunState.RUNNING, 2)
    for n in range(3):  # each attempt saves a checkpoint: free every time
        record = _preempted_again(_saved(record, step=100 * (n + 1)), at=20.0 + 10 * n)
    assert (record.state, record.attempt, record.failures) == (RunState.RUNNING, 5, 0)
    paused = preemption.preempt(record, "suspend", at=90.0, detail="paused")
    assert not paused.preempt_counts  # a pause never counts
