"""The processes of a run: names a person can place, and the fold of their statuses."""

from __future__ import annotations

import pytest

from adapter.show.render import runs_table, status_text
from protocol_specs.runs.runs import RunEvent, RunRecord, RunState, StaleAttempt
from protocol_specs.runs.spec import RunSpec
from protocol_specs.session.processes import (
    MAIN,
    MAX_ROWS,
    ProcessInfo,
    ProcessState,
    ProcessTable,
    fold_into_record,
    process_key,
)
from protocol_specs.wire import wire
from protocol_specs.wire.wire import StatusEntry, StatusEvent

MAIN_INFO = ProcessInfo(key=MAIN, pid=4100, host="gpu-7")
RANK_3 = ProcessInfo(key="4242", pid=4242, parent=MAIN, host="gpu-7", rank=3, nth=4)
WORKER = ProcessInfo(key="4300", pid=4300, parent="4242", host="gpu-7", rank=3, nth=2)


def test_titles_say_rank_pid_and_host() -> None:
    assert MAIN_INFO.title() == "main process (pid 4100) on gpu-7"
    assert RANK_3.title(MAIN_INFO) == "rank 3 (pid 4242) on gpu-7"
    # a DataLoader worker inherits its rank's RANK: it is named after the rank it works for
    assert WORKER.title(RANK_3) == "worker 2 of rank 3 (pid 4300) on gpu-7"
    plain = ProcessInfo(key="77", pid=77, nth=1)
    assert plain.title(MAIN_INFO) == "worker 1 of the main process (pid 77)"
    assert plain.title() == "worker 1 of the main process (pid 77)"
    orphan = ProcessInfo(key="78", pid=78, parent="5", nth=1)
    assert orphan.title() == "process (pid 78)"
    assert process_key(4242) == "4242"


def _status(event: StatusEvent, process: str, **fields: object) -> StatusEntry:
    return StatusEntry(event=event, process=process, **fields)  # type: ignore[arg-type]


def test_the_table_folds_process_statuses() -> None:
    table = ProcessTable()
    for info in (MAIN_INFO, RANK_3, WORKER):
        assert table.apply(_status(StatusEvent.PROCESS_STARTED, info.key, data=info.model_dump()))
    assert table.apply(_status(StatusEvent.PAUSED, "4242", data={"where": "train.py:42 in step"}))
    assert table.apply(_status(StatusEvent.PROCESS_EXITED, "4300", exit_code=0))
    assert not table.apply(_status(StatusEvent.QUEUED, MAIN))
    assert table.title("4300") == "worker 2 of rank 3 (pid 4300) on gpu-7"
    assert table.state("4242") is ProcessState.PAUSED
    rows = {row["pid"]: row for row in table.rows()}
    assert rows[4242]["where"] == "train.py:42 in step" and rows[4300]["state"] == "exited"
    assert table.apply(_status(StatusEvent.RESUMED, "4242"))
    assert table.state("4242") is ProcessState.RUNNING
    # a malformed announcement is not a process
    assert not table.apply(_status(StatusEvent.PROCESS_STARTED, "9", data={"pid": "x"}))
    assert table.title("9") == "process (pid 9)"


def test_dap_entries_carry_their_process_through_the_fast_path() -> None:
    entry = wire.DapEntry(body=b'{"seq":1}', process="4242")
    back = wire.decode_entry(wire.encode_entry(entry))
    assert back == entry and back.process == "4242"
    assert wire.decode_entry(wire.encode_entry(wire.DapEntry(body=b"{}"))).process == MAIN


def test_ranks_are_checked_and_kept_sorted() -> None:
    spec = RunSpec(command=["python", "x.py"], workdir="/w", ranks=[3, 0, 3])
    assert spec.ranks == [0, 3] and spec.processes == "stopped"
    with pytest.raises(ValueError, match="ranks are numbers"):
        RunSpec(command=["python", "x.py"], workdir="/w", ranks=[-1])


def _record(state: RunState = RunState.RUNNING) -> RunRecord:
    spec = RunSpec(command=["python", "x.py"], workdir="/w")
    return RunRecord(id="r1", spec=spec, state=state, attempt=1)


def _fold(record: RunRecord, event: StatusEvent, process: str, **fields: object) -> RunRecord:
    return fold_into_record(record, _status(event, process, **fields), about=1, at=10.0)


def test_the_run_is_paused_while_any_process_is() -> None:
    record = _fold(_record(), StatusEvent.PROCESS_STARTED, MAIN, data=MAIN_INFO.model_dump())
    record = _fold(record, StatusEvent.PROCESS_STARTED, "4242", data=RANK_3.model_dump())
    assert record.processes["4242"].title == "rank 3 (pid 4242) on gpu-7"
    record = _fold(record, StatusEvent.PAUSED, "4242", data={"where": "train.py:42 in step"})
    assert record.state is RunState.PAUSED
    assert record.paused_at == "rank 3 (pid 4242) on gpu-7: train.py:42 in step"
    record = _fold(record, StatusEvent.PAUSED, MAIN, data={"where": "train.py:9 in main"})
    # tether ls: how many processes are alive and paused, where the first is paused, how many more
    [head, row] = runs_table([record], now=20.0).splitlines()
    assert head.split() == ["ID", "NAME", "STATE", "BACKEND", "AGE", "ATTEMPT", "PROCS", "WHERE"]
    assert "2 (2 paused)" in row
    assert row.endswith("train.py:9 in main (+1 more paused)")
    record = _fold(record, StatusEvent.RESUMED, "4242")
    assert record.state is RunState.PAUSED and record.paused_at == "train.py:9 in main"
    record = _fold(record, StatusEvent.RESUMED, MAIN)
    assert record.state is RunState.RUNNING and record.paused_at == ""
    record = _fold(record, StatusEvent.PROCESS_EXITED, "4242", exit_code=0)
    assert record.processes["4242"].state == "exited"
    text = status_text(record, now=20.0)
    assert "processes  1 besides the main one" in text
    assert "rank 3 (pid 4242) on gpu-7: exited (exit 0)" in text
    assert "PROCS" in runs_table([record], now=20.0)  # running, one process alive
    done = record.advance(RunEvent.EXIT_OK, at=30.0, about=1, exit_code=0)
    assert "PROCS" not in runs_table([done], now=40.0)  # a finished run's are gone


def test_news_of_an_earlier_attempt_changes_nothing() -> None:
    with pytest.raises(StaleAttempt):
        fold_into_record(
            _record(), _status(StatusEvent.PAUSED, "7", data={"where": "x"}), about=2, at=1.0
        )


def test_a_full_table_makes_room_by_forgetting_the_oldest_ended_process() -> None:
    record = _record()
    for pid in range(1, MAX_ROWS + 1):
        info = ProcessInfo(key=str(pid), pid=pid, nth=pid)
        record = _fold(record, StatusEvent.PROCESS_STARTED, str(pid), data=info.model_dump())
    late = ProcessInfo(key="9999", pid=9999, nth=1)
    assert (
        "9999"
        not in _fold(record, StatusEvent.PROCESS_STARTED, "9999", data=late.model_dump()).processes
    )
    record = _fold(record, StatusEvent.PROCESS_EXITED, "7", exit_code=0)
    record = _fold(record, StatusEvent.PROCESS_STARTED, "9999", data=late.model_dump())
    assert "9999" in record.processes and "7" not in record.processes
    assert len(record.processes) == MAX_ROWS
