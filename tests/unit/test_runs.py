"""The run lifecycle table and the run spec's validation."""

from __future__ import annotations

import pytest
from pydantic import ValidationError

from protocol_specs.runs import (
    TERMINAL_STATES,
    TRANSITIONS,
    IllegalTransition,
    RunEvent,
    RunRecord,
    RunSpec,
    RunState,
    next_state,
)

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
    from protocol_specs.diagrams import TARGET, run_states_markdown

    assert TARGET.read_text() == run_states_markdown(), "run: python -m protocol_specs.diagrams"
    for (state, event), target in TRANSITIONS.items():
        assert f"{state.value} --> {target.value}: {event.value}" in TARGET.read_text()
