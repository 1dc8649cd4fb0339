"""The stop-time prefetch (``protocol_specs.session.prefetch``): what the worker asks debugpy at a stop,
what the adapter answers from it, and what makes it stale. Both cores, stepped by hand."""

from __future__ import annotations

from typing import Any

import orjson
from adapter_core_harness import Harness as IdeSide
from adapter_core_harness import kinds
from test_shim_core import live as live_shim

from protocol_specs.session.prefetch import FRAMES, PREFETCH_EVENT, Gathering, StopCache, WatchList
from protocol_specs.session.session import StatusEvent
from protocol_specs.wire.wire import DapEntry

FRAMES_25 = [{"id": i + 1, "name": f"f{i}", "line": i + 1, "column": 1} for i in range(25)]


def response(command: str, body: dict[str, Any], seq: int = 7) -> dict[str, Any]:
    return {"seq": 50, "type": "response", "request_seq": seq, "success": True,
            "command": command, "body": body}  # fmt: skip


def prefetch_body() -> dict[str, Any]:
    """What a worker sends after a stop 25 frames deep, with one watch."""
    frames = {"stackFrames": FRAMES_25[:FRAMES], "totalFrames": 25}
    locals_ = {"scopes": [{"name": "Locals", "variablesReference": 9, "expensive": False}]}
    x = {"variables": [{"name": "x", "value": "1", "variablesReference": 0}]}
    watch = {"expression": "x + 1", "frameId": 1, "context": "watch"}
    answers = [
        ("threads", {}, {"threads": [{"id": 1, "name": "MainThread"}]}),
        ("stackTrace", {"threadId": 1, "startFrame": 0, "levels": FRAMES}, frames),
        ("scopes", {"frameId": 1}, locals_),
        ("variables", {"variablesReference": 9}, x),
        ("evaluate", watch, {"result": "2", "variablesReference": 0}),
    ]
    return {
        "threadId": 1,
        "answers": [
            {"command": c, "arguments": a, "response": response(c, b)} for c, a, b in answers
        ],
        "skipped": 0,
    }


# --- the protocol ---------------------------------------------------------------------------------


def test_the_cache_serves_exact_requests_and_any_slice_of_the_frames() -> None:
    cache = StopCache()
    cache.fill(prefetch_body())
    top = cache.answer(
        {"seq": 3, "command": "stackTrace", "arguments": {"threadId": 1, "levels": 1}}
    )
    assert top is not None and top["request_seq"] == 3
    assert top["body"] == {"stackFrames": FRAMES_25[:1], "totalFrames": 25}
    more = cache.answer({"seq": 4, "command": "stackTrace",
                         "arguments": {"threadId": 1, "startFrame": 1, "levels": 19}})  # fmt: skip
    assert more is not None and more["body"]["stackFrames"] == FRAMES_25[1:20]
    # beyond what was fetched, another thread, a format: debugpy answers
    for args in ({"threadId": 1, "startFrame": 20, "levels": 5}, {"threadId": 1},
                 {"threadId": 2, "levels": 1}, {"threadId": 1, "format": {"hex": True}}):  # fmt: skip
        assert cache.answer({"seq": 5, "command": "stackTrace", "arguments": args}) is None
    assert cache.answer({"seq": 6, "command": "variables",
                         "arguments": {"variablesReference": 9}}) is not None  # fmt: skip
    assert cache.answer({"seq": 6, "command": "variables",
                         "arguments": {"variablesReference": 9, "start": 0}}) is None  # fmt: skip
    watch = {"expression": "x + 1", "frameId": 1, "context": "watch"}
    assert cache.answer({"seq": 8, "command": "evaluate", "arguments": watch}) is not None
    hover = {**watch, "context": "hover"}
    assert cache.answer({"seq": 9, "command": "evaluate", "arguments": hover}) is None


def test_what_runs_the_program_or_may_change_values_makes_answers_stale() -> None:
    cache = StopCache()
    cache.fill(prefetch_body())
    cache.on_evaluate({"expression": "y", "context": "watch"})  # a watch changes nothing
    assert len(cache.answers) == 5
    cache.on_evaluate({"expression": "x = 5"})  # the REPL may change anything
    assert list(cache.answers) == [("threads",)]
    cache.fill(prefetch_body())
    cache.on_request("setVariable")
    assert list(cache.answers) == [("threads",)]
    cache.on_event("thread")
    assert cache.answers == {}
    for ends in ("next", "continue", "goto", "pause"):
        cache.fill(prefetch_body())
        cache.on_request(ends)
        assert cache.answers == {}
    for ends in ("stopped", "continued", "exited", "terminated", "invalidated"):
        cache.fill(prefetch_body())
        cache.on_event(ends)
        assert cache.answers == {}
    # a failed answer is never served
    failed = prefetch_body()
    failed["answers"][0]["response"]["success"] = False
    cache.fill(failed)
    assert ("threads",) not in cache.answers


def test_the_gathering_asks_what_vs_code_will_one_frame_request_at_a_time() -> None:
    g = Gathering(thread=1, watches=["x + 1", "y"])
    first = g.start()
    assert first == [
        ("threads", {}),
        ("stackTrace", {"threadId": 1, "startFrame": 0, "levels": 20}),
    ]
    assert g.answered(*first[0], response("threads", {"threads": []})) == []
    frames = response("stackTrace", {"stackFrames": FRAMES_25[:20], "totalFrames": 25})
    assert g.answered(*first[1], frames) == [("scopes", {"frameId": 1})]
    scopes = response("scopes", {"scopes": [
        {"name": "Globals", "variablesReference": 8, "expensive": True},
        {"name": "Locals", "variablesReference": 9, "expensive": False}]})  # fmt: skip
    assert g.answered("scopes", {"frameId": 1}, scopes) == [
        ("variables", {"variablesReference": 9})
    ]
    # the watches, one after the other (pydevd stalls 0.2 s on a third request in flight)
    after = g.answered("variables", {"variablesReference": 9}, response("variables", {}))
    assert after == [("evaluate", {"expression": "x + 1", "frameId": 1, "context": "watch"})]
    failed = {**response("evaluate", {}), "success": False}  # kept out; the next one follows
    after = g.answered(*after[0], failed)
    assert after == [("evaluate", {"expression": "y", "frameId": 1, "context": "watch"})]
    assert not g.done
    assert g.answered(*after[0], response("evaluate", {"result": "3"})) == []
    assert g.done
    assert [a["command"] for a in g.body()["answers"]] == [
        "threads", "stackTrace", "scopes", "variables", "evaluate"
    ]  # fmt: skip


def test_answers_past_the_byte_cap_are_left_out() -> None:
    g = Gathering(thread=1, watches=[], max_bytes=400)
    asked = g.start()
    g.answered(*asked[0], response("threads", {"threads": [{"id": 1, "name": "t" * 100}]}))
    big = response("stackTrace", {"stackFrames": FRAMES_25[:20], "totalFrames": 25})
    assert g.answered(*asked[1], big) == []  # too big: nothing follows from it
    assert g.done and g.body()["skipped"] == 1 and len(g.body()["answers"]) == 1


def test_the_watch_list_is_what_was_evaluated_as_a_watch_since_the_last_stop() -> None:
    w = WatchList()
    w.note("evaluate", {"expression": "a", "context": "watch", "frameId": 1})
    w.note("evaluate", {"expression": "a", "context": "watch", "frameId": 2})
    w.note("evaluate", {"expression": "b", "context": "repl"})
    w.note("evaluate", {"expression": "c", "context": "hover"})
    assert w.take() == ["a"] and w.take() == []


# --- the worker -----------------------------------------------------------------------------------


def test_the_worker_publishes_the_answers_after_the_stopped_event() -> None:
    h = live_shim()
    h.ide("evaluate", {"expression": "x + 1", "frameId": 3, "context": "watch"}, 9)
    h.event("stopped", {"reason": "breakpoint", "threadId": 1})
    assert [m["command"] for m in h.prefetch] == ["threads", "stackTrace"]
    threads, frames = h.prefetch
    h.respond(threads, {"threads": [{"id": 1, "name": "MainThread"}]})
    h.respond(frames, {"stackFrames": FRAMES_25[:20], "totalFrames": 25})
    assert [m["command"] for m in h.prefetch[2:]] == ["scopes"]
    locals_ = {"scopes": [{"name": "Locals", "variablesReference": 9, "expensive": False}]}
    h.respond(h.prefetch[2], locals_)
    h.respond(h.prefetch[3], {"variables": []})
    assert not [m for m in h.dap() if m.get("event") == PREFETCH_EVENT]  # the watch to come
    assert h.prefetch[4]["arguments"] == {"expression": "x + 1", "frameId": 1, "context": "watch"}
    h.respond(h.prefetch[4], {"result": "2", "variablesReference": 0})
    events = [m.get("event") or m.get("command") for m in h.dap()]
    assert events[-2:] == ["stopped", PREFETCH_EVENT]
    body = h.dap()[-1]["body"]
    assert [a["command"] for a in body["answers"]] == [
        "threads", "stackTrace", "scopes", "variables", "evaluate"
    ]  # fmt: skip
    assert all(a["response"]["success"] for a in body["answers"])
    prefetched = [e for e in h.published if isinstance(e, DapEntry)][-1]
    assert prefetched.transient and prefetched.origin == ""
    # the prefetch's own answers never reach the IDE as responses
    assert not [m for m in h.dap() if m.get("type") == "response"]


def test_an_event_that_ends_the_stop_sends_what_was_gathered_first() -> None:
    h = live_shim()
    h.event("stopped", {"reason": "step", "threadId": 1})
    h.respond(h.prefetch[0], {"threads": []})
    h.event("continued", {"threadId": 1})
    names = [m.get("event") for m in h.dap()]
    assert names[-3:] == ["stopped", PREFETCH_EVENT, "continued"]
    assert [a["command"] for a in h.dap()[-2]["body"]["answers"]] == ["threads"]
    h.respond(h.prefetch[1], {"stackFrames": [], "totalFrames": 0})  # late: dropped
    assert [m.get("event") for m in h.dap()][-1] == "continued"


def test_a_step_ends_the_prefetch_with_what_it_has_and_asks_debugpy_nothing_more() -> None:
    h = live_shim()
    h.event("stopped", {"reason": "step", "threadId": 1})
    threads, frames = h.prefetch
    h.respond(threads, {"threads": []})
    h.ide("next", {"threadId": 1}, 12)  # while ``stackTrace`` is in flight
    names = [m.get("event") for m in h.dap()]
    assert names[-2:] == ["stopped", PREFETCH_EVENT]
    assert [a["command"] for a in h.dap()[-1]["body"]["answers"]] == ["threads"]
    assert h.to_debugpy[-1]["command"] == "next"  # it goes at once, before the prefetch
    h.respond(frames, {"stackFrames": FRAMES_25[:20], "totalFrames": 25})  # late: dropped
    assert len(h.prefetch) == 2  # no ``scopes`` asked after it
    assert [m.get("event") for m in h.dap()][-1] == PREFETCH_EVENT


# --- the adapter ----------------------------------------------------------------------------------


def prefetching_ide() -> IdeSide:
    h = IdeSide(request_timeout=5.0)
    h.connect()
    h.handshake()
    h.status(StatusEvent.DEBUGGER_LIVE, data={"prefetch": True})
    return h


def prefetch_entry(body: dict[str, Any]) -> DapEntry:
    event = {"seq": 1, "type": "event", "event": PREFETCH_EVENT, "body": body}
    return DapEntry(body=orjson.dumps(event), transient=True)


def test_the_ides_requests_after_a_stop_are_answered_from_the_prefetch() -> None:
    h = prefetching_ide()
    assert kinds(h.event("stopped", {"reason": "breakpoint", "threadId": 1})) == ["stopped"]
    published = len(h.published)
    assert h.request("threads") == []  # held: the prefetch is on its way
    out = h.deliver(prefetch_entry(prefetch_body()))
    assert kinds(out) == ["threads"] and out[0]["request_seq"] == h.ide_seq
    top = h.request("stackTrace", {"threadId": 1, "startFrame": 0, "levels": 1})
    assert top[0]["body"]["stackFrames"] == FRAMES_25[:1] and top[0]["body"]["totalFrames"] == 25
    assert h.request("scopes", {"frameId": 1})[0]["body"]["scopes"][0]["variablesReference"] == 9
    assert (
        h.request("variables", {"variablesReference": 9})[0]["body"]["variables"][0]["name"] == "x"
    )
    watch = {"expression": "x + 1", "frameId": 1, "context": "watch"}
    assert h.request("evaluate", watch)[0]["body"]["result"] == "2"
    # nothing went to the worker but the watch, recorded as answered (for the next stop)
    [recorded] = h.published[published:]
    assert recorded.local and orjson.loads(recorded.body)["arguments"] == watch
    # what was not prefetched goes to the worker
    assert h.request("evaluate", {**watch, "context": "hover"}) == []
    assert orjson.loads(h.published[-1].body)["command"] == "evaluate"
    # a step makes every answer stale: the next stop's come with it
    assert h.request("next", {"threadId": 1}) == []
    assert h.core.stop.cache.answers == {}


def test_without_a_prefetch_the_held_requests_go_to_the_worker_after_a_while() -> None:
    h = prefetching_ide()
    h.event("stopped", {"reason": "breakpoint", "threadId": 1})
    assert h.request("threads") == [] and h.request("stackTrace", {"threadId": 1}) == []
    deadline = h.core.next_deadline
    assert deadline is not None and deadline < h.clock.now + 5.0
    h.clock.now = deadline
    h.sent(h.core.on_tick())
    assert [orjson.loads(e.body)["command"] for e in h.published[-2:]] == ["threads", "stackTrace"]


def test_a_worker_that_does_not_prefetch_is_asked_at_once() -> None:
    h = IdeSide(request_timeout=5.0)
    h.connect()
    h.handshake()
    h.status(StatusEvent.DEBUGGER_LIVE)  # no "prefetch" in its data
    h.event("stopped", {"reason": "breakpoint", "threadId": 1})
    assert h.request("threads") == []
    assert orjson.loads(h.published[-1].body)["command"] == "threads"


def test_the_prefetch_event_is_never_shown_and_an_ide_leaving_drops_its_held_requests() -> None:
    h = prefetching_ide()
    h.event("stopped", {"reason": "breakpoint", "threadId": 1})
    h.request("threads")
    h.sent(h.core.ide_disconnected(h.core.generation))
    assert h.deliver(prefetch_entry(prefetch_body())) == []
    assert h.core.stop.held == [] and len(h.core.stop.cache.answers) == 5


def test_a_stop_without_a_thread_still_gets_its_prefetch_event() -> None:
    h = live_shim()
    h.event("stopped", {"reason": "pause", "allThreadsStopped": True})
    assert h.prefetch == []
    assert h.dap()[-1]["event"] == PREFETCH_EVENT and h.dap()[-1]["body"]["answers"] == []


def test_a_step_is_not_held_and_the_late_prefetch_of_its_stop_is_not_kept() -> None:
    h = prefetching_ide()
    h.event("stopped", {"reason": "step", "threadId": 1})
    assert h.request("threads") == []  # held
    assert h.request("next", {"threadId": 1}) == []  # not held: threads, then next, go out
    assert [orjson.loads(e.body)["command"] for e in h.published[-2:]] == ["threads", "next"]
    assert h.deliver(prefetch_entry(prefetch_body())) == []  # of a stop that is over
    assert h.core.stop.cache.answers == {}
