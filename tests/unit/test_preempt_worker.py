"""The worker's side of a preempt (``worker_shim/program/preempt.py``) and the program's
``tether.should_preempt()``: which entries are orders, which processes get the warning signal,
the order performed (file, signal, the end after the grace) on a mock clock."""

from __future__ import annotations

import signal
from pathlib import Path
from typing import Any, cast

import pytest
import trio
import trio.testing

import tether
from protocol_specs.runs.runs import RunRecord
from protocol_specs.runs.spec import RunSpec
from protocol_specs.wire import wire
from worker_shim.program import preempt
from worker_shim.program.preempt import Order, Preemption, order_of, trapping


def _entry(attempt: int, **data: object) -> wire.ControlEntry:
    return wire.ControlEntry(action="preempt", attempt=attempt, detail="why", data=data)


def test_a_preempt_entry_for_this_attempt_is_an_order() -> None:
    entry = _entry(2, grace=5.0, then="suspend")
    assert order_of(entry, 2) == Order(grace=5.0, then="suspend", detail="why")
    delivery = wire.Deliver(stream="to_worker", cursor="1-0", entry=wire.encode_entry(entry))
    assert order_of(delivery, 2) == Order(grace=5.0, then="suspend", detail="why")
    assert order_of(entry, 3) is None  # an earlier attempt's
    assert order_of(wire.ControlEntry(action="terminate", attempt=2), 2) is None
    # a malformed grace or then falls back to the defaults, never to an error
    assert order_of(_entry(0, grace="soon", then="later"), 7) == Order(60.0, "retry", "why")


def _proc(root: Path, pid: int, ppid: int, caught: int) -> None:
    where = root / str(pid)
    where.mkdir()
    (where / "stat").write_text(f"{pid} (py thon) S {ppid} {pid} 0 0\n")
    (where / "status").write_text(f"Name:\tpython\nSigCgt:\t{caught:016x}\n")


def test_only_the_programs_processes_that_catch_the_signal_are_warned(tmp_path: Path) -> None:
    usr1 = 1 << (signal.SIGUSR1 - 1)
    _proc(tmp_path, 100, 1, usr1)  # the program: traps it
    _proc(tmp_path, 101, 100, 0)  # a rank that does not: left alone
    _proc(tmp_path, 102, 101, usr1 | 1)  # a grandchild that does
    _proc(tmp_path, 200, 1, usr1)  # another program's
    assert trapping(100, proc=tmp_path) == [100, 102]


async def test_an_order_touches_the_file_and_ends_the_program_after_the_grace(
    tmp_path: Path, autojump_clock: trio.testing.MockClock
) -> None:
    ended: list[float] = []
    preemption = Preemption(tmp_path)

    async def terminate() -> None:
        ended.append(trio.current_time())

    preemption.terminate = terminate
    async with trio.open_nursery() as nursery:
        nursery.start_soon(preemption.run)
        await trio.sleep(1)
        assert not preemption.file.exists()
        start = trio.current_time()
        preemption.give(Order(grace=30.0))
        preemption.give(Order(grace=1.0))  # a second order changes nothing
        await trio.sleep(29)
        assert preemption.file.exists() and not ended
        await trio.sleep(2)
        assert ended == [start + 30.0]
    assert preemption.order == Order(grace=30.0)


def test_should_preempt_looks_at_most_every_half_second_and_stays_true(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    now = [100.0]
    monkeypatch.setattr(tether.time, "monotonic", lambda: now[0])
    monkeypatch.setattr(tether, "_preempt", {"looked": None, "yes": False})
    flag = tmp_path / "preempt"
    monkeypatch.setenv("TETHER_PREEMPT_FILE", str(flag))
    assert tether.should_preempt() is False
    flag.touch()
    now[0] += 0.4
    assert tether.should_preempt() is False  # not looked at again yet
    now[0] += 0.2
    assert tether.should_preempt() is True
    flag.unlink()
    assert tether.should_preempt() is True  # once true, it stays true


def test_should_preempt_is_false_outside_tether(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("TETHER_PREEMPT_FILE", raising=False)
    monkeypatch.setattr(tether, "_preempt", {"looked": None, "yes": False})
    assert tether.should_preempt() is False


async def test_a_stopping_pool_preempts_an_attempt_whose_program_has_not_started(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """An attempt counts from its link's start, not its program's: a pool stopped while a run's
    files are still coming preempts it too (the order waits on its link), and waits for it."""
    attempts = preempt.Attempts()
    asked: list[tuple[str, float, str]] = []

    async def ask(link: object, record: RunRecord, grace: float, detail: str) -> None:
        asked.append((record.id, grace, detail))

    monkeypatch.setattr(preempt, "preempt_self", ask)
    spec = RunSpec(command=["python", "t.py"], workdir="/w", preempt_grace=7.0)
    record = RunRecord(id="r1", spec=spec)
    started, end, drained = trio.Event(), trio.Event(), trio.Event()

    async def attempt() -> None:
        async with attempts.taken(cast(Any, None), record):
            started.set()
            await end.wait()  # its files, its user: the program has not started

    async def drain() -> None:
        await attempts.drain()
        drained.set()

    with trio.fail_after(5):
        async with trio.open_nursery() as nursery:
            nursery.start_soon(attempt)
            await started.wait()
            assert len(attempts) == 1
            nursery.start_soon(drain)
            await trio.testing.wait_all_tasks_blocked()
            assert asked == [("r1", 7.0, "the worker pool is stopping")]
            assert not drained.is_set()  # it waits for the attempt to end
            end.set()
            await drained.wait()
    assert len(attempts) == 0 and attempts.stopping
