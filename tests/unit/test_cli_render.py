"""What `tether ls` shows: names after the script, cut with an ellipsis, wide characters lined
up, and a program that waits for an IDE told apart from one that runs."""

from __future__ import annotations

from adapter.render import runs_table
from protocol_specs.runs import RunEvent, RunRecord, RunSpec, RunState


def record(command: list[str], *, name: str = "", **fields: object) -> RunRecord:
    spec = RunSpec(command=command, workdir="/w", name=name)
    return RunRecord.model_validate({"id": "6b0400000000aa", "spec": spec, **fields})


def table(*records: RunRecord) -> list[str]:
    return runs_table(list(records), now=0.0).splitlines()


def test_a_run_is_named_after_its_script_not_its_interpreter() -> None:
    rows = table(
        record(["/opt/envs/torch/bin/python3.11", "-u", "train.py", "--lr", "3e-4"]),
        record(["python", "-m", "trainer.main"]),
        record(["./run.sh"], name="nightly"),
    )
    assert "train.py --lr 3e-4" in rows[1] and "/opt/envs" not in rows[1]
    assert "-m trainer.main" in rows[2]
    assert "nightly" in rows[3]


def test_long_and_wide_names_are_cut_with_an_ellipsis_and_stay_aligned() -> None:
    rows = table(
        record(["python", "x.py"], name="a" * 40),
        record(["python", "x.py"], name="学習" * 20),
        record(["python", "x.py"], name="short"),
    )
    assert "a" * 27 + "\u2026" in rows[1] and "a" * 28 not in rows[1]
    assert "\u2026" in rows[2]
    columns = [row.index("queued") for row in rows[1:]]
    widths = [
        len(row[:c]) + sum(1 for ch in row[:c] if "\u4e00" <= ch <= "\u9fff")
        for row, c in zip(rows[1:], columns, strict=True)
    ]
    assert len(set(widths)) == 1, rows  # the STATE column starts at one screen column


def test_a_program_held_for_its_ide_shows_so() -> None:
    running = record(["python", "x.py"], state=RunState.RUNNING)
    waiting = running.waiting(1, True)
    assert "waiting for an IDE" in table(waiting)[1]
    assert "running" in table(waiting.waiting(1, False))[1]
    paused = waiting.advance(RunEvent.PAUSE, at=1.0, paused_at="x.py:3")
    assert paused.waiting_for_ide is False
