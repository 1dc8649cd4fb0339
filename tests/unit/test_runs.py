"""The run lifecycle table and the run spec's validation."""

from __future__ import annotations

import pytest
from pydantic import ValidationError

from protocol_specs.runs.runs import (
    TERMINAL_STATES,
    TRANSITIONS,
    IllegalTransition,
    RunEvent,
    RunRecord,
    RunState,
    next_state,
    retry_delay,
)
from protocol_specs.runs.spec import RunSpec

SPEC = RunSpec(command=["python", "train.py"], workdir="/home/me/project")


def test_happy_path_walks_the_table() -> None:
    record = RunRecord(id="r1", spec=SPEC)
    for event, state in [
        (RunEvent.CLAIM, RunState.STARTING),
        (RunEvent.START, RunState.RUNNING),
        (RunEvent.EXIT_OK, RunState.SUCCEEDED),
    ]:
        record = record.apply(event, at=1.0)
        assert record.state is state
    assert record.finished


@pytest.mark.parametrize("state", sorted(TERMINAL_STATES))
@pytest.mark.parametrize("event", list(RunEvent))
def test_terminal_states_absorb_everything(state: RunState, event: RunEvent) -> None:
    record = RunRecord(id="r1", spec=SPEC, state=state)
    with pytest.raises(IllegalTransition, match=f"{event.value}.*{state.value}"):
        record.apply(event, at=2.0)
    assert record.state is state  # unchanged


def test_illegal_transition_names_event_and_state() -> None:
    with pytest.raises(IllegalTransition) as info:
        next_state(RunState.QUEUED, RunEvent.EXIT_OK)
    assert info.value.event is RunEvent.EXIT_OK and info.value.state is RunState.QUEUED
    assert "exit_ok" in str(info.value) and "queued" in str(info.value)


def test_every_non_terminal_state_can_be_cancelled() -> None:
    for state in set(RunState) - TERMINAL_STATES:
        assert TRANSITIONS[(state, RunEvent.CANCEL)] is RunState.CANCELLED


@pytest.mark.parametrize(
    ("fields", "needle"),
    [
        ({"command": []}, "command"),
        ({"command": [""]}, "empty"),
        ({"command": ["python", "a\x00b"]}, "NUL"),
        ({"workdir": "relative/dir"}, "absolute"),
        ({"env": {"1BAD": "x"}}, "environment variable"),
        ({"surprise": 1}, "surprise"),
    ],
)
def test_broken_specs_are_refused_with_a_reason(fields: dict[str, object], needle: str) -> None:
    base: dict[str, object] = {"command": ["python", "train.py"], "workdir": "/w"}
    with pytest.raises(ValidationError, match=needle):
        RunSpec.model_validate({**base, **fields})


def test_windows_workdir_is_absolute() -> None:
    assert RunSpec(command=["python"], workdir="C:\\Users\\me\\proj").workdir.startswith("C:")


def test_the_run_state_diagram_in_docs_is_generated_from_the_table() -> None:
    from protocol_specs.runs.diagrams import TARGET, run_states_markdown

    assert TARGET.read_text() == run_states_markdown(), (
        "run: python -m protocol_specs.runs.diagrams"
    )
    for (state, event), target in TRANSITIONS.items():
        assert f"{state.value} --> {target.value}: {event.value}" in TARGET.read_text()


def test_paused_is_entered_and_left_and_ends_like_running() -> None:
    record = RunRecord(id="r1", spec=SPEC, state=RunState.RUNNING)
    paused = record.apply(RunEvent.PAUSE, at=1.0, paused_at="train.py:3 in main")
    assert paused.state is RunState.PAUSED
    assert paused.apply(RunEvent.RESUME, at=2.0).state is RunState.RUNNING
    assert paused.apply(RunEvent.CANCEL, at=2.0).state is RunState.CANCELLED
    assert paused.apply(RunEvent.LEASE_EXPIRED, at=2.0).state is RunState.LOST


@pytest.mark.parametrize("state", [RunState.STARTING, RunState.RUNNING, RunState.PAUSED])
def test_a_retry_queues_the_run_again(state: RunState) -> None:
    record = RunRecord(id="r1", spec=SPEC, state=state)
    assert record.apply(RunEvent.RETRY, at=1.0, attempt=2).state is RunState.QUEUED


def test_retry_delay_doubles_and_stops_after_max_retries() -> None:
    assert [retry_delay(n, 3, 5.0) for n in (1, 2, 3, 4)] == [5.0, 10.0, 20.0, None]
    assert retry_delay(1, 0, 5.0) is None
    assert retry_delay(30, 100, 10.0) == 3600.0


def test_attempts_are_kept_per_number() -> None:
    record = RunRecord(id="r1", spec=SPEC, updated_at=5.0)
    record = record.with_attempt(worker="w1", claimed_at=6.0)
    record = record.with_attempt(outcome="failed", exit_code=3)
    record = record.model_copy(update={"attempt": 2}).with_attempt(worker="w2")
    assert [(a.n, a.worker, a.outcome) for a in record.attempts] == [
        (1, "w1", "failed"),
        (2, "w2", ""),
    ]


def test_spec_refuses_bad_backends_mounts_and_tags() -> None:
    for bad in (
        {"backend": "Slurm; rm"},
        {"mounts": {"1x": "/data"}},
        {"mounts": {"data": ""}},
        {"tags": ["has space"]},
        {"resources": {"gpus": -1}},
        {"resources": {"partition": "gpu;x"}},
    ):
        with pytest.raises(ValidationError):
            RunSpec(command=["x"], workdir="/w", **bad)  # type: ignore[arg-type]
    spec = RunSpec(command=["x"], workdir="/w", mounts={"imagenet": "s3://b/i"}, env={"A": "1"})
    assert spec.program_env() == {"TETHER_MOUNT_IMAGENET": "s3://b/i", "A": "1"}


def test_a_submits_key_names_one_run_per_user() -> None:
    from protocol_specs.runs.submits import run_id_for

    key = "ab" * 16
    assert run_id_for("alice", key) == run_id_for("alice", key)  # asked again: the same run
    assert run_id_for("alice", key) != run_id_for("bob", key)  # never another user's
    assert run_id_for("alice", key) != run_id_for("alice", "cd" * 16)
    assert len(run_id_for("alice", key)) == 14 and int(run_id_for("alice", key), 16) >= 0
