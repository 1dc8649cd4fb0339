"""The session fold: compaction for the worker's replay, verification, threads and stops."""

from __future__ import annotations

from typing import Any

import orjson

from protocol_specs.session.session import (
    PLACES_EVENT,
    BreakpointSet,
    DebugSession,
    StatusEvent,
    places_event,
)
from protocol_specs.wire.wire import DapEntry, StatusEntry


def req(
    seq: int,
    command: str,
    arguments: Any = None,
    *,
    bp_ids: list[int] | None = None,
    origin: str = "a",
) -> DapEntry:
    msg: dict[str, Any] = {"seq": seq, "type": "request", "command": command}
    if arguments is not None:
        msg["arguments"] = arguments
    return DapEntry(origin=origin, body=orjson.dumps(msg), local=True, bp_ids=bp_ids)


def bps(path: str, *lines: int) -> dict[str, Any]:
    return {"source": {"path": path}, "breakpoints": [{"line": n} for n in lines]}


def test_only_the_latest_configuration_per_source_is_replayed() -> None:
    s = DebugSession()
    s.apply_to_worker(req(1, "initialize", {"adapterID": "debugpy"}))
    s.apply_to_worker(req(2, "attach", {"justMyCode": False}))
    s.apply_to_worker(req(3, "setBreakpoints", bps("/p/a.py", 1), bp_ids=[1]))
    s.apply_to_worker(req(4, "setBreakpoints", bps("/p/b.py", 2), bp_ids=[2]))
    s.apply_to_worker(req(5, "setBreakpoints", bps("/p/a.py", 5, 6), bp_ids=[3, 4]))
    s.apply_to_worker(req(6, "setExceptionBreakpoints", {"filters": []}))
    s.apply_to_worker(req(7, "setExceptionBreakpoints", {"filters": ["raised"]}))
    s.apply_to_worker(
        req(8, "setFunctionBreakpoints", {"breakpoints": [{"name": "f"}]}, bp_ids=[5])
    )
    s.apply_to_worker(req(9, "configurationDone"))
    plan = s.configuration()
    assert [(p.command, p.seq) for p in plan] == [
        ("setBreakpoints", 5),
        ("setBreakpoints", 4),
        ("setFunctionBreakpoints", 8),
        ("setExceptionBreakpoints", 7),
    ]
    assert plan[0].ids == [3, 4]
    assert s.configuration_done and s.attach_args == {"justMyCode": False}


def test_assigned_ids_reuse_unchanged_lines_and_never_collide() -> None:
    s = DebugSession()
    first = s.assign_breakpoint_ids("setBreakpoints", bps("/p/a.py", 1, 2))
    s.apply_to_worker(req(1, "setBreakpoints", bps("/p/a.py", 1, 2), bp_ids=first))
    second = s.assign_breakpoint_ids("setBreakpoints", bps("/p/a.py", 2, 3))
    assert first == [1, 2] and second == [2, 3]
    # an id folded from another adapter moves the counter past it
    s.apply_to_worker(req(2, "setBreakpoints", bps("/p/b.py", 9), bp_ids=[40], origin="b"))
    assert s.assign_breakpoint_ids("setFunctionBreakpoints", {"breakpoints": [{"name": "g"}]}) == [
        41
    ]


def test_threads_and_stops_are_tracked_from_events() -> None:
    s = DebugSession()

    def ev(name: str, body: dict[str, Any]) -> None:
        s.apply_to_ide(
            DapEntry(body=orjson.dumps({"seq": 1, "type": "event", "event": name, "body": body}))
        )

    s.apply_to_ide(StatusEntry(event=StatusEvent.STARTED))
    ev("thread", {"reason": "started", "threadId": 1})
    ev("thread", {"reason": "started", "threadId": 2})
    ev("stopped", {"reason": "breakpoint", "threadId": 1, "allThreadsStopped": True})
    assert set(s.stopped) == {1, 2}
    ev("continued", {"threadId": 1, "allThreadsContinued": True})
    assert s.stopped == {}
    ev("stopped", {"reason": "pause", "threadId": 2})
    ev("thread", {"reason": "exited", "threadId": 2})
    assert s.stopped == {} and set(s.threads) == {1}
    s.apply_to_ide(StatusEntry(event=StatusEvent.EXITED, exit_code=0))
    assert s.finished and s.exit_code == 0 and not s.live and s.threads == {}
    assert "finished=True" in repr(s)


def test_debugpy_ids_map_to_adapter_ids_through_responses_and_events() -> None:
    s = DebugSession()
    s.apply_to_worker(req(3, "setBreakpoints", bps("/p/a.py", 1, 2), bp_ids=[1, 2]))
    resp = {
        "seq": 9,
        "type": "response",
        "request_seq": 3,
        "success": True,
        "command": "setBreakpoints",
        "body": {
            "breakpoints": [{"id": 10, "verified": True, "line": 1}, {"id": 11, "verified": False}]
        },
    }
    assert s.apply_to_ide(DapEntry(origin="a", body=orjson.dumps(resp))) == [1, 2]
    assert s.verification[2] == {"id": 2, "verified": False}
    event = {
        "seq": 10,
        "type": "event",
        "event": "breakpoint",
        "body": {"reason": "changed", "breakpoint": {"id": 11, "verified": True, "line": 2}},
    }
    assert s.apply_to_ide(DapEntry(body=orjson.dumps(event))) == [2]
    assert s.verification[2]["verified"] is True
    assert s.to_adapter_id(99) == 3  # unknown debugpy id: a fresh adapter id
    assert [b["id"] for b in s.current_breakpoints()] == [1, 2]


def test_a_place_the_worker_configured_is_named_by_the_id_this_session_gave_it() -> None:
    """A child process, configured by the worker before its session existed: debugpy's ids of
    the worker's breakpoints become the ids this session answered for the same places."""
    worker = BreakpointSet("setBreakpoints", bps("/p/a.py", 8, 9), [1, 2], "main", 3)
    answer = {"success": True, "body": {"breakpoints": [{"id": 6}, {"id": 7}]}}
    places = places_event(worker, answer)
    assert places is not None and places["event"] == PLACES_EVENT
    assert places["body"] == {"command": "setBreakpoints", "source": "/p/a.py", "keys": [8, 9],
                              "ids": [6, 7]}  # fmt: skip
    s = DebugSession(live=True)
    s.apply_to_ide(DapEntry(body=orjson.dumps(places)))
    assert s.hit_ids([7]) == []  # no id handed out here yet: none made up
    # the session's IDE sets them in another order, with one more line
    s.apply_to_worker(req(4, "setBreakpoints", bps("/p/a.py", 9, 5, 8), bp_ids=[1, 2, 3]))
    assert s.hit_ids([7]) == [1] and s.hit_ids([6]) == [3]
    assert s.hit_ids([6, 6, 99, "x", True]) == [3]  # never an id this session did not give
    assert s.to_adapter_id(7) == 1  # a ``breakpoint`` event about it: the same id
    # what debugpy answers the session's own request maps as before
    s.apply_to_ide(resp(4, "setBreakpoints", {"breakpoints": [{"id": 21}, {"id": 22}, {"id": 23}]}))
    assert s.hit_ids([23]) == [3]
    # a new process (an attempt's): debugpy's ids of the old one mean nothing
    s.apply_to_ide(StatusEntry(event=StatusEvent.STARTED))
    assert s.hit_ids([7, 23]) == []
    # nothing with an id, or a refusal: no event
    assert (
        places_event(worker, {"success": True, "body": {"breakpoints": [{"verified": False}]}})
        is None
    )
    assert places_event(worker, {"success": False, "message": "no"}) is None


def test_a_malformed_places_event_is_skipped() -> None:
    s = DebugSession(live=True)
    s.apply_to_worker(req(4, "setBreakpoints", bps("/p/a.py", 8), bp_ids=[1]))
    for body in ([1], {"command": "evaluate", "source": "/p/a.py", "keys": [8], "ids": [5]},
                 {"command": "setBreakpoints", "source": 3, "keys": [8], "ids": [5]},
                 {"command": "setBreakpoints", "source": "/p/a.py", "keys": [[8]], "ids": [5]},
                 {"command": "setBreakpoints", "source": "/p/a.py", "keys": 8, "ids": 5}):  # fmt: skip
        event = {"seq": 1, "type": "event", "event": PLACES_EVENT, "body": body}
        s.apply_to_ide(DapEntry(body=orjson.dumps(event)))
    assert s.hit_ids([5]) == []


def resp(request_seq: int, command: str, body: Any, *, origin: str = "a") -> DapEntry:
    msg = {"seq": 1, "type": "response", "request_seq": request_seq, "success": True}
    return DapEntry(origin=origin, body=orjson.dumps({**msg, "command": command, "body": body}))


def test_the_fold_keeps_breakpoint_requests_only_and_no_arguments_at_all() -> None:
    """A day of stepping and 15 MB evaluates must not grow the fold (adapter and shim both); a
    breakpoint request is kept after its answer: the next attempt's replay is answered again."""
    s = DebugSession()
    for seq in range(1, 1000):
        s.apply_to_worker(req(seq, "evaluate", {"expression": "x" * 1000}))
    s.apply_to_worker(req(1000, "setBreakpoints", bps("/p/a.py", 3), bp_ids=[1]))
    assert s.request_of("a", 5) is None and s.request_of("a", 1000) == ("setBreakpoints", [1], True)
    first = resp(1000, "setBreakpoints", {"breakpoints": [{"verified": True}]})
    assert s.apply_to_ide(first) == [1]
    assert s.apply_to_ide(resp(1000, "setBreakpoints", {"breakpoints": [{"id": 7}]})) == [1]
    assert s.to_adapter_id(7) == 1  # the next attempt's debugpy id, from its replay's answer
    assert "x" * 1000 not in repr(vars(s))


def test_malformed_messages_never_stop_the_fold() -> None:
    s = DebugSession()
    for arguments in ([1], "abc", {"source": 5, "breakpoints": [3]}, {"breakpoints": ["x"]}):
        s.apply_to_worker(req(1, "setBreakpoints", arguments, bp_ids=[1]))
    s.apply_to_worker(DapEntry(origin="a", body=b"[1, 2]"))
    assert s.configuration() == []
    s.apply_to_worker(req(2, "setBreakpoints", bps("/p/a.py", 3), bp_ids=[1]))
    for body in ([1], "x", {"breakpoints": "no"}, {"breakpoints": [1, None]}):
        assert s.apply_to_ide(resp(2, "setBreakpoints", body)) == []
    for event in (
        {"event": "stopped", "body": [1]},
        {"event": "breakpoint", "body": {"breakpoint": 3}},
    ):
        s.apply_to_ide(
            DapEntry(origin="w", body=orjson.dumps({"seq": 1, "type": "event", **event}))
        )
    assert [b.command for b in s.configuration()] == ["setBreakpoints"]


def test_status_events_are_str_enums_and_unknown_ones_still_fold() -> None:
    """A status a newer peer sends is kept as its text (the adapter shows it as it is)."""
    assert issubclass(StatusEvent, str) and StatusEvent.EXITED == "exited"
    s = DebugSession()
    s.apply_to_ide(StatusEntry(event="queued"))
    assert s.status is StatusEvent.QUEUED
    s.apply_to_ide(StatusEntry(event="teleported", detail="elsewhere"))
    assert (s.status, s.status_detail, s.live, s.finished) == (
        "teleported",
        "elsewhere",
        False,
        False,
    )


def test_a_cancelled_run_stays_cancelled_when_the_programs_exit_is_reported_after() -> None:
    s = DebugSession()
    s.apply_to_ide(StatusEntry(event=StatusEvent.CANCELLED, state="cancelled"))
    s.apply_to_ide(StatusEntry(event=StatusEvent.EXITED, exit_code=-15))
    assert (s.status, s.finished, s.exit_code) == (StatusEvent.CANCELLED, True, -15)
