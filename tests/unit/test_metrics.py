"""Metrics: the ``tether`` module programs import, the decisions of ``protocol_specs/runs/metrics.py``
(patterns, reports, the hold), and the metric entry."""

from __future__ import annotations

import importlib
import json
import math
import re
import socket
import sys
import threading
import types
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st
from pydantic import ValidationError

import tether
from protocol_specs.runs.metrics import (
    MAX_POINTS,
    LineMetrics,
    MetricHold,
    check_condition,
    decode_pause,
    decode_report,
    last_values,
    parse_pattern,
    point_line,
    points_of,
)
from protocol_specs.runs.spec import RunSpec
from protocol_specs.wire import wire

# --- the tether module -----------------------------------------------------------------------------


@pytest.fixture
def worker_socket(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[Any]:
    """The worker's end of one process's connection (the socket as ``metrics_env`` says)."""
    importlib.reload(tether)  # a fresh module: its state is per process
    path = tmp_path / "metrics.sock"
    listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    listener.bind(str(path))
    listener.listen(1)
    listener.settimeout(5)
    monkeypatch.setenv("TETHER_METRICS_SOCKET", str(path))
    monkeypatch.setenv("TETHER_STOP_FILE", str(tmp_path / "stop"))
    accepted: list[socket.socket] = []

    class Worker:
        def recv_line(self) -> bytes:
            if not accepted:
                conn = listener.accept()[0]
                conn.settimeout(5)
                accepted.append(conn)
                self.buffer = b""
            while b"\n" not in self.buffer:
                self.buffer += accepted[0].recv(65536)
            line, _, self.buffer = self.buffer.partition(b"\n")
            return line

        def conn(self) -> socket.socket:
            return accepted[0]

        def close(self) -> None:
            listener.close()

    yield Worker()  # type: ignore[misc]
    for conn in accepted:
        conn.close()
    listener.close()
    if tether._state["sock"] is not None:
        tether._state["sock"].close()
    importlib.reload(tether)


def test_outside_tether_every_call_is_a_no_op(monkeypatch: pytest.MonkeyPatch) -> None:
    for name in ("TETHER_METRICS_SOCKET", "TETHER_STOP_FILE", "TETHER_PARAMS", "TETHER_TRIAL"):
        monkeypatch.delenv(name, raising=False)
    importlib.reload(tether)
    tether.report(step=1, loss=0.5)
    tether.report(loss="not even checked")  # nothing is done at all
    assert tether.should_stop() is False
    assert tether.params() == {}
    assert tether.trial() is None


def test_a_report_is_one_line_the_worker_reads(worker_socket: Any) -> None:
    tether.report(step=7, loss=0.25, acc=1)
    tether.report(loss=float("nan"))  # no step: one more than the last
    tether.report(loss=float("inf"))
    points = [decode_report(worker_socket.recv_line()) for _ in range(3)]
    assert [p[0] for p in points if p] == [7, 8, 9]
    first, second, third = (p[2] for p in points if p)
    assert first == {"loss": 0.25, "acc": 1.0}
    assert math.isnan(second["loss"]) and third == {"loss": math.inf}


def test_values_float_takes_are_metrics_and_others_are_refused(
    worker_socket: Any,
) -> None:
    class Tensor:  # a one-element tensor: float() works
        def __float__(self) -> float:
            return 0.5

    tether.report(step=0, loss=Tensor())
    point = decode_report(worker_socket.recv_line())
    assert point is not None and point[2] == {"loss": 0.5}
    with pytest.raises(TypeError, match="loss must be a number, not str"):
        tether.report(loss="0.5")
    with pytest.raises(TypeError, match="must be a number, not bool"):
        tether.report(ok=True)
    with pytest.raises(ValueError, match="at least one metric"):
        tether.report(step=3)
    with pytest.raises(ValueError, match="step must be an int from 0"):
        tether.report(step=-1, loss=1.0)


def test_a_gone_worker_never_breaks_the_program(worker_socket: Any, tmp_path: Path) -> None:
    worker_socket.close()
    (tmp_path / "metrics.sock").unlink()
    tether.report(step=0, loss=1.0)  # no error
    tether.report(step=1, loss=1.0)


def test_should_stop_is_the_stop_file(worker_socket: Any, tmp_path: Path) -> None:
    assert not tether.should_stop()
    (tmp_path / "stop").touch()
    assert tether.should_stop()


def test_params_and_trial_come_from_the_sweep(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("TETHER_PARAMS", json.dumps({"lr": 0.001, "bs": 32}))
    monkeypatch.setenv("TETHER_TRIAL", "17")
    assert tether.params() == {"lr": 0.001, "bs": 32}
    assert tether.trial() == 17


# --- reports and patterns --------------------------------------------------------------------------


@given(st.binary(max_size=300))
def test_no_line_breaks_the_reader(data: bytes) -> None:
    point = decode_report(data)
    assert point is None or (point[0] >= 0 and point[2])


@pytest.mark.parametrize(
    "data",
    [
        b"[1, 2.0]",
        b'[-1, 0, {"loss": 1}]',
        b'[1.5, 0, {"loss": 1}]',
        b'[1, 0, {"loss": "1"}]',
        b'[1, 0, {"loss": true}]',
        b'[1, 0, {"bad name": 1}]',
        b"[1, 0, {}]",
        b"not json",
    ],
)
def test_malformed_reports_are_dropped(data: bytes) -> None:
    assert decode_report(data) is None


def test_patterns_say_what_is_wrong_with_them() -> None:
    with pytest.raises(ValueError, match="names no metric"):
        parse_pattern(r"loss=([\d.]+)")
    with pytest.raises(ValueError, match="not a regular expression"):
        parse_pattern(r"loss=(?P<loss>[\d.]+")
    with pytest.raises(ValueError, match="names no metric"):
        parse_pattern(r"step (?P<step>\d+)")
    with pytest.raises(ValidationError, match="names no metric"):
        RunSpec(command=["python", "x.py"], workdir="/w", metrics=["loss"])
    for slow in (r"(?P<x>(a+)+)b", r"(?P<x>(\d*)*)$", r"(?:x|(?P<y>y+))*z"):
        with pytest.raises(ValueError, match=r"repeats a repeat"):
            parse_pattern(slow)
    parse_pattern(r"(?P<x>(ab){2})+")  # bounded inside: fine


def test_lines_give_points_across_chunks_with_their_step_or_a_count() -> None:
    lines = LineMetrics([r"loss=(?P<loss>[\d.e+-]+)", r"epoch (?P<step>\d+) acc (?P<acc>[\d.]+)"])
    assert lines.feed("stdout", b"loss=0.5 and lo", 1.0) == []
    got = lines.feed("stdout", b"ss\nloss=0.25\r\nepoch 3 acc 0.9\n", 2.0)
    assert [(p[0], p[2]) for p in got] == [
        (0, {"loss": 0.5}),
        (1, {"loss": 0.25}),
        (3, {"acc": 0.9}),
    ]
    # stderr is split into lines of its own: half a line there does not join stdout's
    assert lines.feed("stderr", b"loss=", 3.0) == []
    assert [p[2] for p in lines.feed("stdout", b"loss=1e-3\n", 3.0)] == [{"loss": 0.001}]
    assert lines.feed("stdout", b"loss=nope\n", 3.0) == []  # no number: no point


# --- the hold --------------------------------------------------------------------------------------


def test_the_first_point_goes_at_once_then_at_most_every_interval() -> None:
    hold = MetricHold(interval=1.0)
    hold.feed([(0, 0.0, {"loss": 1.0})])
    first = hold.ready(answered=0, now=10.0)
    assert [len(b) for b in first] == [1]
    hold.published(1, now=10.0)
    hold.feed([(i, 0.0, {"loss": 1.0}) for i in range(1, 6)])
    assert hold.ready(answered=1, now=10.5) == []  # within the interval
    assert hold.ready(answered=0, now=11.5) == []  # the previous entry is not answered
    assert [len(b) for b in hold.ready(answered=1, now=11.0)] == [5]


def test_an_entry_carries_at_most_max_points_and_the_end_takes_all() -> None:
    hold = MetricHold(cap=5000)
    hold.feed([(i, 0.0, {"x": float(i)}) for i in range(2500)])
    assert [len(b) for b in hold.ready(answered=0, now=0.0)] == [MAX_POINTS, MAX_POINTS, 500]
    # by values: a point of 64 names fills an entry 15 at a time (1000 values at most)
    hold.feed([(i, 0.0, {f"m{j}": 1.0 for j in range(64)}) for i in range(20)])
    assert [len(b) for b in hold.take()] == [15, 5]
    hold.feed([(i, 0.0, {"x": 0.0}) for i in range(5000)])
    assert hold.full
    assert [len(b) for b in hold.take()] == [1000] * 5
    assert len(hold) == 0


def test_metric_entries_check_their_points() -> None:
    entry = wire.MetricEntry(points=[(0, 1.0, {"loss": 0.5}), (1, 2.0, {"loss": 0.25})])
    decoded = wire.decode_entry(wire.encode_entry(entry))
    assert points_of([decoded]) == [(0, 1.0, {"loss": 0.5}), (1, 2.0, {"loss": 0.25})]
    assert last_values(points_of([decoded])) == {"loss": 0.25}
    assert (
        point_line((5, 0.0, {"loss": 0.123456, "acc": math.nan})) == "step 5  loss 0.1235  acc nan"
    )
    with pytest.raises(ValidationError):
        wire.MetricEntry(points=[(0, 1.0, {"bad name": 1.0})])
    with pytest.raises(ValidationError):
        wire.MetricEntry(points=[(0, 1.0, {})])
    with pytest.raises(ValidationError):
        wire.MetricEntry(points=[])


# --- --debug-when ----------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "text", ["loss != loss", "isnan(loss) or grad_norm > 1e3", "step >= 100 and -loss < 0.5"]
)
def test_conditions_users_write(text: str) -> None:
    assert check_condition(text) == text
    assert (
        RunSpec(command=["python", "x.py"], workdir="/w", debug_when=text).program_env()[
            "TETHER_DEBUG_WHEN"
        ]
        == text
    )


@pytest.mark.parametrize(
    ("text", "said"),
    [
        ("", "1 to 500 characters"),
        ("loss !=", "not an expression"),
        ("__import__('os')", "only abs, isfinite, isinf, isnan, max, min may be called"),
        ("loss.real > 0", "Attribute is not allowed"),
        ("'a' == loss", "only numbers are constants"),
        ("[loss][0] > 1", "is not allowed"),
        ("(lambda: 1)()", "may be called"),
    ],
)
def test_conditions_that_are_refused_at_submit(text: str, said: str) -> None:
    with pytest.raises(ValueError, match=re.escape(said)):
        check_condition(text)


def test_a_pause_question_reads_back() -> None:
    assert decode_pause(b'{"pause": [7, {"loss": NaN}]}') is not None
    step, values = decode_pause(b'{"pause": [7, {"loss": 1.5}]}') or (0, {})
    assert (step, values) == (7, {"loss": 1.5})
    assert decode_pause(b'{"pause": [7]}') is None
    assert decode_pause(b"[7, 0, {}]") is None


def test_a_report_that_meets_the_condition_asks_the_worker_then_pauses_in_the_callers_frame(
    worker_socket: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("TETHER_DEBUG_WHEN", "loss != loss")
    paused: list[Any] = []
    hooks = types.ModuleType("_tether_hooks")
    hooks.pause_here = lambda frame: paused.append(frame) or True  # type: ignore[attr-defined]
    hooks.can_pause = lambda: True  # type: ignore[attr-defined]
    monkeypatch.setitem(sys.modules, "_tether_hooks", hooks)
    answers = iter([b"pause\n"])

    def worker() -> None:  # reads the reports, answers the one question
        while True:
            line = worker_socket.recv_line()
            if line.startswith(b'{"pause"'):
                worker_socket.conn().sendall(next(answers))
                return

    thread = threading.Thread(target=worker)
    thread.start()
    tether.report(step=0, loss=1.0)
    here = sys._getframe()
    tether.report(step=1, loss=math.nan)  # meets it: asks, is told to pause
    thread.join(5)
    assert paused == [here]
    tether.report(step=2, loss=math.nan)  # once: no second question, no second pause
    assert paused == [here]
