"""The decisions of ``worker_shim/backends/job_watch.py``: every cell of its table, and the grace a
running job gets once its attempt is over (a plain clock: the core takes ``now``)."""

from __future__ import annotations

import pytest

from worker_shim.backends.job_watch import UNSEEN_GRACE, Action, Attempt, Do, JobWatch, Phase, Seen

W, S, OVER = Attempt.WAITING, Attempt.STARTED, Attempt.OVER
P = Attempt.PREEMPTING
TABLE = {
    (Phase.PENDING, W): Do.KEEP,
    (Phase.PENDING, S): Do.KEEP,
    (Phase.PENDING, OVER): Do.CANCEL,
    (Phase.RUNNING, W): Do.SAY_RUNNING,
    (Phase.RUNNING, S): Do.KEEP,
    (Phase.ENDED, W): Do.LOST,
    (Phase.ENDED, S): Do.LOST,
    (Phase.ENDED, OVER): Do.FORGET,
    (Phase.GONE, W): Do.LOST,
    (Phase.GONE, S): Do.LOST,
    (Phase.GONE, OVER): Do.FORGET,
    (Phase.REQUEUED, W): Do.CANCEL_LOST,
    (Phase.REQUEUED, S): Do.CANCEL_LOST,
    (Phase.REQUEUED, OVER): Do.CANCEL,
    (Phase.GAVE_UP, W): Do.SUBMIT_AGAIN,
    (Phase.GAVE_UP, S): Do.LOST,
    (Phase.GAVE_UP, OVER): Do.FORGET,
    # preempted: as started, but a requeued job is waited for (its worker reports the end)
    (Phase.PENDING, P): Do.KEEP,
    (Phase.RUNNING, P): Do.KEEP,
    (Phase.ENDED, P): Do.LOST,
    (Phase.GONE, P): Do.LOST,
    (Phase.REQUEUED, P): Do.KEEP,
    (Phase.GAVE_UP, P): Do.LOST,
}


@pytest.mark.parametrize(("phase", "attempt"), list(TABLE))
def test_every_cell_of_the_table(phase: Phase, attempt: Attempt) -> None:
    action = JobWatch("Ray").look("j1", Seen(phase, "FAILED"), attempt, now=0.0)
    assert action.do is TABLE[(phase, attempt)]
    assert action.do in (Do.KEEP, Do.FORGET, Do.SAY_RUNNING) or "j1" in action.why


def test_every_phase_and_attempt_has_a_cell() -> None:
    cells = {(p, a) for p in Phase for a in Attempt} - {(Phase.RUNNING, OVER)}
    assert cells == set(TABLE)


def test_a_job_is_said_running_once_while_its_attempt_waits_for_its_worker() -> None:
    watch = JobWatch("Ray")
    running = Seen(Phase.RUNNING)
    assert watch.look("j", running, W, now=0.0).do is Do.SAY_RUNNING
    assert watch.look("j", running, W, now=1.0).do is Do.SAY_RUNNING  # the report failed
    watch.said_running("j")
    assert watch.look("j", running, W, now=2.0).do is Do.KEEP
    assert watch.look("j", running, S, now=3.0).do is Do.KEEP
    watch.forget("j")
    assert watch.look("j", running, W, now=4.0).do is Do.SAY_RUNNING  # a restarted backend


def test_a_running_job_whose_attempt_is_over_gets_its_grace_then_is_cancelled() -> None:
    watch = JobWatch("Slurm", grace=30.0)
    running = Seen(Phase.RUNNING)
    assert watch.look("7", running, OVER, now=100.0) == Action(Do.KEEP)
    assert watch.look("7", running, OVER, now=129.9) == Action(Do.KEEP)
    action = watch.look("7", running, OVER, now=130.0)
    assert action.do is Do.CANCEL and "30 s after its attempt ended" in action.why
    # the cancel failed (the scheduler did not answer): decided again, the clock running
    assert watch.look("7", running, OVER, now=135.0).do is Do.CANCEL
    watch.forget("7")  # acted on for good: the same id seen again starts a new grace
    assert watch.look("7", running, OVER, now=500.0) == Action(Do.KEEP)


def test_the_grace_is_per_job_and_ends_when_the_job_ends() -> None:
    watch = JobWatch(grace=10.0)
    watch.look("a", Seen(Phase.RUNNING), OVER, now=0.0)
    assert watch.look("b", Seen(Phase.RUNNING), OVER, now=9.0).do is Do.KEEP
    assert watch.look("a", Seen(Phase.ENDED), OVER, now=5.0).do is Do.FORGET
    watch.forget("a")
    assert watch.look("a", Seen(Phase.RUNNING), OVER, now=12.0).do is Do.KEEP  # a new grace
    assert watch.look("b", Seen(Phase.RUNNING), OVER, now=19.0).do is Do.CANCEL


def test_messages_name_the_scheduler_and_what_it_said() -> None:
    watch = JobWatch("Slurm")
    assert watch.look("9", Seen(Phase.REQUEUED), W, 0).why == "Slurm requeued job 9 (preempted?)"
    assert watch.look("9", Seen(Phase.ENDED, "TIMEOUT"), S, 0).why == "Slurm job 9 ended: TIMEOUT"
    assert watch.look("9", Seen(Phase.GONE), S, 0).why == "Slurm job 9 is gone"


def test_a_time_limit_the_scheduler_does_not_keep_is_kept_from_the_first_look_at_it_running() -> (
    None
):
    watch = JobWatch("Ray")
    assert watch.look("r", Seen(Phase.PENDING), W, now=0.0, limit=60.0).do is Do.KEEP
    assert watch.look("r", Seen(Phase.RUNNING), S, now=1000.0, limit=60.0).do is Do.KEEP
    assert watch.look("r", Seen(Phase.RUNNING), S, now=1059.0, limit=60.0).do is Do.KEEP
    action = watch.look("r", Seen(Phase.RUNNING), S, now=1060.0, limit=60.0)
    assert action == Action(Do.CANCEL_LOST, "Ray job r ran past the run's time limit (60 s)")
    # the stop failed: the clock does not start again
    assert watch.look("r", Seen(Phase.RUNNING), S, now=1065.0, limit=60.0) == action
    # no limit, or an attempt already over (its worker was told to stop): the grace applies
    assert watch.look("s", Seen(Phase.RUNNING), S, now=0.0).do is Do.KEEP
    assert watch.look("s", Seen(Phase.RUNNING), S, now=10**6).do is Do.KEEP
    assert watch.look("t", Seen(Phase.RUNNING), OVER, now=0.0, limit=1.0).do is Do.KEEP


def test_a_job_just_submitted_that_the_scheduler_does_not_list_yet_is_not_gone() -> None:
    """Slurm once answered "Invalid job id" for a job sbatch had just accepted: taken for gone,
    its attempt was reported lost and its credentials removed before it started."""
    watch = JobWatch("Slurm")
    watch.launched("9", now=100.0)
    assert watch.look("9", Seen(Phase.GONE), W, now=100.1).do is Do.KEEP
    assert watch.look("9", Seen(Phase.GONE), W, now=100.0 + UNSEEN_GRACE - 1).do is Do.KEEP
    assert watch.look("9", Seen(Phase.GONE), W, now=100.0 + UNSEEN_GRACE).do is Do.LOST
    # once listed, its absence counts at once
    watch.launched("10", now=200.0)
    assert watch.look("10", Seen(Phase.PENDING), W, now=200.5).do is Do.KEEP
    assert watch.look("10", Seen(Phase.GONE), W, now=201.0).do is Do.LOST
    # a job this backend did not just launch (found in its state after a restart): at once
    assert watch.look("11", Seen(Phase.GONE), W, now=0.0).do is Do.LOST


def test_a_requeued_job_whose_attempt_is_being_preempted_is_waited_for_then_lost() -> None:
    """Slurm lists a requeued job as such while its processes still end: the worker, which
    trapped the SIGTERM, reports the preempted attempt meanwhile; if it never does (it died), the
    attempt is lost once the run's grace and the watch's are over."""
    watch = JobWatch("Slurm", grace=30.0)
    requeued = Seen(Phase.REQUEUED, "PENDING")
    at = {"preempt_grace": 60.0}
    assert watch.look("7", requeued, Attempt.PREEMPTING, 0.0, **at).do is Do.KEEP
    assert watch.look("7", requeued, Attempt.PREEMPTING, 89.0, **at).do is Do.KEEP
    assert watch.look("7", requeued, Attempt.OVER, 89.5, **at).do is Do.CANCEL
    watch.forget("7")
    assert watch.look("8", requeued, Attempt.PREEMPTING, 0.0, **at).do is Do.KEEP
    assert watch.look("8", requeued, Attempt.PREEMPTING, 90.0, **at).do is Do.CANCEL_LOST
    # not preempted: lost at once, as before
    assert watch.look("9", requeued, Attempt.STARTED, 0.0, **at).do is Do.CANCEL_LOST
