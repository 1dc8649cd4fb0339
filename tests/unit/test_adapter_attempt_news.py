"""What ``tether debug`` and the IDE's console say when an attempt ends and the run goes on (a
preempted attempt, the run suspended, or a retry): never "finished with exit code None"."""

from __future__ import annotations

from adapter.dap.status import RunNews
from protocol_specs.session.session import DebugSession, StatusEvent
from protocol_specs.wire.wire import StatusEntry


def test_an_attempt_that_ends_with_the_run_going_on_is_not_a_finished_run() -> None:
    session = DebugSession()
    news = RunNews("6b0400000000aa", session)
    session.apply_to_ide(StatusEntry(event=StatusEvent.DEBUGGER_LIVE, data={"attempt": 1}))
    # a suspended (preempted) attempt: the worker's exit is not final, the relay says what follows
    session.apply_to_ide(
        StatusEntry(event=StatusEvent.EXITED, exit_code=-15, data={"attempt": 1, "final": False})
    )
    assert news.status_text() == "Run 6b0400000000aa: attempt 1 ended."
    assert not session.finished
    session.apply_to_ide(
        StatusEntry(event=StatusEvent.EXITED, exit_code=0, data={"attempt": 2, "final": True})
    )
    assert news.status_text() == "Run 6b0400000000aa finished with exit code 0."
