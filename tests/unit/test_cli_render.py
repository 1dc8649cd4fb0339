"""What `tether ls` shows: names after the script, cut with an ellipsis, wide characters lined
up, and a program that waits for an IDE told apart from one that runs; and why a sweep failed, in
`tether sweep ls`, `sweep status` and its page."""

from __future__ import annotations

from adapter.show.render import runs_table, sweep_text, sweeps_table
from protocol_specs.access.auth import Principal, Scope
from protocol_specs.runs.runs import RunEvent, RunRecord, RunState
from protocol_specs.runs.spec import RunSpec
from protocol_specs.sweeps.sweeps import SweepRecord, SweepSpec, parse_param, round_failed
from relay.web.experiments import sweep_page


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


def test_a_failed_sweep_says_why_in_its_row_and_its_status() -> None:
    spec = SweepSpec(
        params=[parse_param("x=-1e300:1e300")],
        run=RunSpec(command=["python", "t.py", "{x}"], workdir="/w", debug=False),
    )
    record = SweepRecord(id="s1", spec=spec, owner="alice", created_at=0.0)
    failed = round_failed(record, OverflowError("Range exceeds valid bounds"), 5.0)
    why = "a round failed: OverflowError: Range exceeds valid bounds"
    row = sweeps_table([failed], 10.0).splitlines()[1]
    assert "failed" in row and row.endswith(why)
    assert sweeps_table([record], 10.0).splitlines()[1].endswith("-")
    assert sweep_text(failed, [], 10.0).splitlines()[0] == f"sweep      s1: failed: {why}"
    alice = Principal(token="t1", kind="user", user="alice", scopes=frozenset({Scope.RUNS}))
    assert f"failed: {why}" in sweep_page(failed, [], alice, "csrf", 10.0)
