"""The small pieces of post-mortem: the program's lines to the worker, and how a stop on an
exception reads in a report."""

from __future__ import annotations

import pytest

from worker_shim.session.debuggable import parse_line
from worker_shim.session.watch import stop_text


@pytest.mark.parametrize(
    ("line", "parsed"),
    [
        ("41234", (41234, False)),  # the answer to ``attach``
        ("post-mortem 41234", (41234, True)),  # unasked: an uncaught exception holds a thread
        ("pause 41234", (41234, True)),  # unasked: a report met --debug-when
        ("error: RuntimeError: no", (None, False)),
        ("post-mortem", (None, False)),
        ("post-mortem 0", (None, False)),
        ("70000", (None, False)),
        ("", (None, False)),
    ],
)
def test_the_programs_lines(line: str, parsed: tuple[int | None, bool]) -> None:
    assert parse_line(line) == parsed


def test_a_stop_on_an_exception_reads_by_its_break_mode() -> None:
    where = " at train.py:18 in step"
    info = {"exceptionId": "ValueError", "description": "bad", "breakMode": "unhandled"}
    assert stop_text("exception", where, info) == "uncaught ValueError at train.py:18 in step"
    assert stop_text("exception", where, info, message=True) == (
        "uncaught ValueError (bad) at train.py:18 in step"
    )
    raised = {**info, "breakMode": "always"}
    assert stop_text("exception", where, raised) == "ValueError raised at train.py:18 in step"
    user = {**info, "breakMode": "userUnhandled"}
    assert stop_text("exception", where, user).startswith("user-uncaught ValueError")
    assert stop_text("exception", where, {}) == where  # debugpy would not say: where only
    assert stop_text("breakpoint", where, info) == where
