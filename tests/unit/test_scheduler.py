"""The scheduler backends' shared loop (``worker_shim/backends/scheduler.py``) against a scheduler
and a relay that are plain objects: what it reports and tracks when a scheduler refuses, fails or
gives up. The real schedulers and relay are in the Slurm and Ray end-to-end tests."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from protocol_specs.runs.runs import RunRecord, RunState
from protocol_specs.runs.spec import RunSpec
from worker_shim.backends.job_watch import Phase, Seen
from worker_shim.backends.scheduler import SchedulerBackend, SchedulerError, SchedulerRefused


class Relay:
    """What the backend tells the relay, and the run it asks about."""

    def __init__(self, record: RunRecord) -> None:
        self.record = record
        self.reports: list[tuple[str, int, str, str]] = []

    async def get_run(self, run: str) -> RunRecord:
        return self.record

    async def report(self, run: str, attempt: int, event: str, **kw: Any) -> RunRecord:
        self.reports.append((run, attempt, event, kw.get("job", "")))
        return self.record


class Scheduler(SchedulerBackend):
    name = "fake"
    scheduler = "Fake"

    def __init__(self, state_dir: Path) -> None:
        super().__init__("ws://127.0.0.1:1", state_dir=state_dir, python="python")
        self.seen: dict[str, Seen] = {}
        self.launches: list[BaseException | str] = []  #: what each launch does, in turn
        self.cancelled: list[str] = []

    async def launch(self, record: RunRecord, token: str, *, patience: float) -> str:
        outcome = self.launches.pop(0)
        if isinstance(outcome, BaseException):
            raise outcome
        return outcome

    async def look(self, jobs: list[str]) -> dict[str, Seen]:
        return {job: self.seen[job] for job in jobs if job in self.seen}

    async def cancel(self, job: str) -> None:
        self.cancelled.append(job)


def queued() -> RunRecord:
    spec = RunSpec(command=["python", "x.py"], workdir="/w", backend="fake")
    return RunRecord(id="r1", spec=spec, state=RunState.QUEUED, attempt=1)


async def test_a_refused_submission_is_a_lost_attempt(tmp_path: Path) -> None:
    backend, relay = Scheduler(tmp_path), Relay(queued())
    backend.launches = [SchedulerRefused("no such partition")]
    await backend.submit(relay, relay.record, "ttht_x")  # type: ignore[arg-type]
    assert relay.reports == [("r1", 1, "lost", "")] and not backend.jobs


async def test_a_job_given_up_on_is_replaced_once_the_scheduler_takes_the_new_one(
    tmp_path: Path,
) -> None:
    backend, relay = Scheduler(tmp_path), Relay(queued())
    backend.launches = ["j1", SchedulerError("no answer"), "j2"]
    await backend.submit(relay, relay.record, "ttht_x")  # type: ignore[arg-type]
    backend.seen["j1"] = Seen(Phase.GAVE_UP, "FAILED")
    await backend.watch_once(relay)  # type: ignore[arg-type]
    assert list(backend.jobs) == ["j1"]  # not taken yet: the old one keeps the run's place
    await backend.watch_once(relay)  # type: ignore[arg-type]
    assert list(backend.jobs) == ["j2"] and backend.jobs["j2"].token == "ttht_x"
    assert [r[2:] for r in relay.reports] == [("job", "j1"), ("job", "j2")]
    assert Scheduler(tmp_path).jobs == backend.jobs  # kept on disk, for a restart


async def test_a_job_given_up_on_whose_new_one_is_refused_is_a_lost_attempt(
    tmp_path: Path,
) -> None:
    backend, relay = Scheduler(tmp_path), Relay(queued())
    backend.launches = ["j1", SchedulerRefused("HTTP 400")]
    await backend.submit(relay, relay.record, "ttht_x")  # type: ignore[arg-type]
    backend.seen["j1"] = Seen(Phase.GAVE_UP, "FAILED")
    await backend.watch_once(relay)  # type: ignore[arg-type]
    assert relay.reports[-1] == ("r1", 1, "lost", "j1") and not backend.jobs


async def test_a_running_job_is_said_running_once_and_cancelled_with_its_run(
    tmp_path: Path,
) -> None:
    backend, relay = Scheduler(tmp_path), Relay(queued())
    backend.launches = ["j1"]
    await backend.submit(relay, relay.record, "ttht_x")  # type: ignore[arg-type]
    backend.seen["j1"] = Seen(Phase.RUNNING)
    await backend.watch_once(relay)  # type: ignore[arg-type]
    await backend.watch_once(relay)  # type: ignore[arg-type]
    assert [r[2:] for r in relay.reports] == [("job", "j1"), ("running", "j1")]
    relay.record = relay.record.model_copy(update={"state": RunState.CANCELLED})
    backend.seen["j1"] = Seen(Phase.PENDING)
    await backend.watch_once(relay)  # type: ignore[arg-type]
    assert backend.cancelled == ["j1"] and not backend.jobs


async def test_a_requeued_job_whose_attempt_ended_preempted_is_cancelled_never_reported_lost(
    tmp_path: Path,
) -> None:
    """Slurm requeues the job after its worker preempted the attempt (its SIGTERM): the attempt
    ended ``preempted`` (the run suspended, or its next attempt not made yet): the job is
    cancelled, and no ``lost`` report could end the run or spend a retry."""
    from protocol_specs.runs.runs import Attempt

    backend, relay = Scheduler(tmp_path), Relay(queued())
    backend.launches = ["j1"]
    await backend.submit(relay, relay.record, "ttht_x")  # type: ignore[arg-type]
    ended = Attempt(n=1, outcome="preempted", detail="slurm: the job was preempted")
    relay.record = relay.record.model_copy(update={"state": RunState.RUNNING, "attempts": [ended]})
    backend.seen["j1"] = Seen(Phase.REQUEUED, "PENDING")
    await backend.watch_once(relay)  # type: ignore[arg-type]
    assert [r[2] for r in relay.reports] == ["job"]
    assert backend.cancelled == ["j1"] and not backend.jobs
