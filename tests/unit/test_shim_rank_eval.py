"""An expression evaluated in every paused rank by the worker (``tether eval``, the console's
``@all``): worker_shim/session/rank_eval.py wired into the shim's processes, message by message,
no sockets (the values' rendering: ``test_rank_values.py``)."""

from __future__ import annotations

import json
from typing import Any

import orjson
from test_shim_processes import Harness, child_live

from protocol_specs.wire.wire import DapEntry
from worker_shim.session.actions import EvalAnswered
from worker_shim.session.group import RankState
from worker_shim.session.rank_eval import EVAL_WAIT, STACK_LEVELS, user_frame, wrapped


def ranks(stop: str = "all") -> Harness:
    h = Harness(stop=stop)
    h.go_live()
    child_live(h, 201, [])  # rank 0
    child_live(h, 202, [])  # rank 1
    return h


def asked(h: Harness, key: str, command: str, **match: Any) -> dict[str, Any]:
    """The last ``command`` sent to ``key`` whose arguments have ``match``."""
    return next(
        m
        for m in reversed(h.sent.get(key, []))
        if m.get("command") == command and all(m["arguments"].get(k) == v for k, v in match.items())
    )


def answer(h: Harness, key: str, request: dict[str, Any], body: Any, ok: bool = True) -> None:
    msg = {"type": "response", "request_seq": request["seq"], "success": ok,
           "command": request["command"], "body": body}  # fmt: skip
    if not ok:
        msg["message"] = body
        msg["body"] = {}
    h.debugpy(key, msg)


def helper_says(value: dict[str, Any]) -> dict[str, Any]:
    return {"result": repr(json.dumps(value)), "variablesReference": 0}


FRAMES = [
    {"id": 9, "name": "all_reduce", "line": 2, "source": {"path": "/v/lib/python3.12/site-packages/torch/d.py"}},
    {"id": 8, "name": "step", "line": 40, "source": {"path": "/home/me/project/train.py"}},
]  # fmt: skip


def evaluate_in(h: Harness, key: str, frame: int, value: dict[str, Any]) -> None:
    """``key`` answers the stack and the helper's evaluation in ``frame``."""
    where = asked(h, key, "stackTrace", levels=STACK_LEVELS)
    answer(h, key, where, {"stackFrames": FRAMES, "totalFrames": 2})
    evaluation = asked(h, key, "evaluate")
    assert evaluation["arguments"] == {
        "expression": wrapped("loss"), "frameId": frame, "context": "repl"
    }  # fmt: skip
    answer(h, key, evaluation, helper_says(value))


def test_tether_eval_asks_each_paused_rank_in_its_user_frame_and_does_not_move_the_group() -> None:
    h = ranks()
    h.event("201", "stopped", {"reason": "breakpoint", "threadId": 7})
    h.event("202", "stopped", {"reason": "pause", "threadId": 3})  # the group's pause
    before = h.p.group.members["202"].state if h.p.group else None
    published = len(h.published)
    h.perform(h.p.evaluate("ask-1", "loss", None))
    assert asked(h, "201", "stackTrace", levels=STACK_LEVELS)["arguments"]["threadId"] == 7
    assert asked(h, "202", "stackTrace", levels=STACK_LEVELS)["arguments"]["threadId"] == 3
    evaluate_in(h, "201", 9, {"type": "float", "repr": "0.5", "number": 0.5})  # its breakpoint
    where = asked(h, "202", "stackTrace", levels=STACK_LEVELS)
    answer(h, "202", where, {"stackFrames": FRAMES})
    evaluation = asked(h, "202", "evaluate")
    assert evaluation["arguments"]["frameId"] == 8  # paused in torch: the user's frame
    done = h.debugpy("202", {"type": "response", "request_seq": evaluation["seq"],
                             "success": True, "command": "evaluate",
                             "body": helper_says({"type": "float", "repr": "nan",
                                                  "number": float("nan")})})  # fmt: skip
    [answered] = [a for a in done if isinstance(a, EvalAnswered)]
    assert answered.ask == "ask-1"
    assert [(v.rank, v.repr) for v in answered.values] == [(0, "0.5"), (1, "nan")]
    # nothing of it reached an IDE but each rank's "read your variables again", nothing moved a
    # rank, the group is as it was
    told = [orjson.loads(e.body) for e in h.published[published:] if isinstance(e, DapEntry)]
    assert [m["event"] for m in told] == ["invalidated", "invalidated"]
    assert len(h.published) == published + 2
    assert not any(m.get("command") in ("continue", "next", "pause") and m["seq"] > 0
                   for m in h.sent["201"][-3:])  # fmt: skip
    assert h.p.group is not None and h.p.group.members["202"].state == before == RankState.STOPPED


def test_ranks_not_paused_are_not_evaluated_and_wanted_ranks_that_do_not_exist_are_said() -> None:
    h = ranks(stop="one")
    h.event("202", "stopped", {"reason": "breakpoint", "threadId": 3})
    h.perform(h.p.evaluate("a", "loss", [0, 1, 5]))
    assert "evaluate" not in [m.get("command") for m in h.sent["201"]]
    where = asked(h, "202", "stackTrace", levels=STACK_LEVELS)
    answer(h, "202", where, {"stackFrames": FRAMES})
    evaluation = asked(h, "202", "evaluate")
    done = h.debugpy("202", {"type": "response", "request_seq": evaluation["seq"],
                             "success": True, "command": "evaluate",
                             "body": helper_says({"error": "NameError: name 'loss' is not defined"})})  # fmt: skip
    [answered] = [a for a in done if isinstance(a, EvalAnswered)]
    assert [(v.rank, v.state) for v in answered.values] == [
        (0, "running"), (1, "error"), (5, "absent")
    ]  # fmt: skip
    assert answered.values[1].error == "NameError: name 'loss' is not defined"


def test_a_continued_rank_is_running_again() -> None:
    h = ranks(stop="one")
    h.event("201", "stopped", {"reason": "breakpoint", "threadId": 7})
    h.event("201", "continued", {"threadId": 7, "allThreadsContinued": True})
    done = h.perform(h.p.evaluate("a", "x", None))
    [answered] = [a for a in done if isinstance(a, EvalAnswered)]
    assert [v.state for v in answered.values] == ["running", "running"]


def test_without_the_helper_the_expression_itself_is_evaluated_and_debugpy_words_the_error() -> (
    None
):
    h = ranks(stop="one")
    h.event("201", "stopped", {"reason": "breakpoint", "threadId": 7})
    h.perform(h.p.evaluate("a", "loss", None))
    answer(h, "201", asked(h, "201", "stackTrace", levels=STACK_LEVELS), {"stackFrames": FRAMES})
    answer(h, "201", asked(h, "201", "evaluate"), "KeyError: '_tether_breakpoint'", ok=False)
    plain = asked(h, "201", "evaluate")
    assert plain["arguments"] == {"expression": "loss", "frameId": 9, "context": "repl"}
    done = h.debugpy("201", {"type": "response", "request_seq": plain["seq"], "success": False,
                             "command": "evaluate", "body": {},
                             "message": "NameError: name 'loss' is not defined"})  # fmt: skip
    [answered] = [a for a in done if isinstance(a, EvalAnswered)]
    assert [(v.rank, v.state, v.error) for v in answered.values] == [
        (0, "error", "NameError: name 'loss' is not defined"), (1, "running", "")
    ]  # fmt: skip


def test_a_rank_that_does_not_answer_in_time_is_said_and_its_late_answer_dropped() -> None:
    h = ranks(stop="one")
    h.event("201", "stopped", {"reason": "breakpoint", "threadId": 7})
    h.perform(h.p.evaluate("a", "loss", None))
    where = asked(h, "201", "stackTrace", levels=STACK_LEVELS)
    assert h.p.next_deadline is not None and h.p.next_deadline <= h.now + EVAL_WAIT
    h.now += EVAL_WAIT
    [answered] = [a for a in h.perform(h.p.on_tick()) if isinstance(a, EvalAnswered)]
    assert answered.values[0].error.startswith("no answer within 20 s")
    published = len(h.published)
    answer(h, "201", where, {"stackFrames": FRAMES})  # late: nothing more is asked, or said
    assert len(h.published) == published
    assert "evaluate" not in [m.get("command") for m in h.sent["201"]]


def console(h: Harness, expression: str, process: str = "202") -> list[dict[str, Any]]:
    """The IDE's debug console evaluates ``expression`` in ``process``'s session: the responses
    the worker published for it."""
    h.ide("evaluate", {"expression": expression, "context": "repl", "frameId": 1}, 77,
          process=process)  # fmt: skip
    return responses(h)


def responses(h: Harness) -> list[dict[str, Any]]:
    out = []
    for e in h.published:
        if isinstance(e, DapEntry) and e.origin == "ide1":
            msg = orjson.loads(e.body)
            if msg.get("type") == "response" and msg.get("request_seq") == 77:
                out.append(msg)
    return out


def test_the_consoles_at_all_is_answered_with_every_ranks_value_and_never_reaches_debugpy() -> None:
    h = ranks()
    h.event("201", "stopped", {"reason": "breakpoint", "threadId": 7})
    h.event("202", "stopped", {"reason": "pause", "threadId": 3})
    assert console(h, "@all loss") == []
    assert "@all" not in json.dumps(h.sent["202"]) + json.dumps(h.sent["201"])
    evaluate_in(h, "201", 9, {"type": "float", "repr": "0.5", "number": 0.5})
    where = asked(h, "202", "stackTrace", levels=STACK_LEVELS)
    answer(h, "202", where, {"stackFrames": FRAMES})
    answer(
        h,
        "202",
        asked(h, "202", "evaluate"),
        helper_says({"type": "float", "repr": "0.5", "number": 0.5}),
    )
    [reply] = responses(h)
    assert reply["success"] and reply["command"] == "evaluate"
    assert reply["body"]["result"].splitlines() == [
        "ranks 0-1: 0.5",
        "summary: numbers: min 0.5 (ranks 0-1), max 0.5 (ranks 0-1), mean 0.5 of 2",
        "  all 2 evaluated ranks agree",
    ]
    assert reply["body"]["variablesReference"] == 0
    # the expression ran in both ranks: each session reads its variables again
    for key in ("201", "202"):
        [told] = [
            orjson.loads(e.body)
            for e in h.published
            if isinstance(e, DapEntry) and e.process == key and b'"invalidated"' in e.body
        ]
        assert told["body"] == {"areas": ["variables"]}


def test_the_consoles_prefix_errors_and_ordinary_evaluates_untouched() -> None:
    h = ranks()
    [bad] = console(h, "@ranks x y")
    assert not bad["success"] and bad["message"].startswith("@ranks: 'x': give ranks like")
    h.published.clear()
    [idle] = console(h, "@all loss", process="")  # the main process's session; nobody paused
    assert not idle["success"]
    assert idle["message"] == "no rank is paused (ranks 0-1 running): pause the run first"
    h.published.clear()
    h.event("202", "stopped", {"reason": "breakpoint", "threadId": 3})
    console(h, "loss")  # an ordinary evaluate: to debugpy, as ever
    assert asked(h, "202", "evaluate")["arguments"]["expression"] == "loss"
    h.ide("evaluate", {"expression": "@all x", "context": "watch", "frameId": 1}, 78, process="202")
    assert asked(h, "202", "evaluate")["arguments"]["expression"] == "@all x"  # not the console's


def test_user_frame_for_a_pause_skips_library_stdlib_and_tethers_frames() -> None:
    frames = [
        {"id": 1, "source": {"path": "/usr/lib/python3.12/threading.py"}},
        {"id": 2, "source": {"path": "/opt/w/_tether_breakpoint.py"}},
        {"id": 3, "source": {"path": "/x/debugpy/_vendored/pydevd/pydevd.py"}},
        {"id": 4, "source": {"path": "/home/me/train.py"}},
    ]
    assert user_frame(frames, "pause") == 4
    assert user_frame(frames, "breakpoint") == 1
    assert user_frame(frames[:3], "pause") == 1
    assert user_frame([], "pause") is None


def test_the_process_end_completes_the_evaluation() -> None:
    h = ranks(stop="one")
    h.event("201", "stopped", {"reason": "breakpoint", "threadId": 7})
    h.perform(h.p.evaluate("a", "loss", None))
    [answered] = [a for a in h.perform(h.p.closed("201")) if isinstance(a, EvalAnswered)]
    assert [(v.rank, v.state, v.error) for v in answered.values] == [
        (0, "error", "the process ended"), (1, "running", "")
    ]  # fmt: skip
    assert h.p.evals.paused == {} and h.p.evals.next_deadline is None


def test_a_stops_prefetched_stack_spares_the_evaluation_its_own_stack_trace() -> None:
    """The stop's prefetch read the paused thread's frames: the evaluation asks ``evaluate`` in
    the user's frame at once (one round trip to each rank, as one rank's evaluate); after the
    rank moved, its next stop's frames are not known until read again."""
    h = ranks()
    h.event("201", "stopped", {"reason": "breakpoint", "threadId": 7})
    h.event("202", "stopped", {"reason": "pause", "threadId": 3})
    prefetch = asked(h, "202", "stackTrace", threadId=3, startFrame=0)
    answer(h, "202", prefetch, {"stackFrames": FRAMES, "totalFrames": 2})
    stacks = sum(1 for m in h.sent["202"] if m.get("command") == "stackTrace")
    h.perform(h.p.evaluate("ask-1", "loss", None))
    assert sum(1 for m in h.sent["202"] if m.get("command") == "stackTrace") == stacks
    evaluation = asked(h, "202", "evaluate")
    assert evaluation["arguments"] == {
        "expression": wrapped("loss"), "frameId": 8, "context": "repl"
    }  # fmt: skip
    h.event("202", "continued", {"threadId": 3, "allThreadsContinued": True})
    h.event("202", "stopped", {"reason": "pause", "threadId": 3})
    h.perform(h.p.evaluate("ask-2", "loss", None))
    assert asked(h, "202", "stackTrace", levels=STACK_LEVELS)["arguments"]["threadId"] == 3


def test_without_the_helper_a_long_repr_is_cut_to_one_line_of_160_characters() -> None:
    h = ranks(stop="one")
    h.event("201", "stopped", {"reason": "breakpoint", "threadId": 7})
    h.perform(h.p.evaluate("a", "loss", None))
    answer(h, "201", asked(h, "201", "stackTrace", levels=STACK_LEVELS), {"stackFrames": FRAMES})
    answer(h, "201", asked(h, "201", "evaluate"), "KeyError: '_tether_breakpoint'", ok=False)
    plain = asked(h, "201", "evaluate")
    long = "[" + ",\n ".join(str(n) for n in range(10_000)) + "]"
    done = h.debugpy("201", {"type": "response", "request_seq": plain["seq"], "success": True,
                             "command": "evaluate", "body": {"result": long, "type": "list"}})  # fmt: skip
    [answered] = [a for a in done if isinstance(a, EvalAnswered)]
    value = answered.values[0]
    assert (value.type, len(value.repr)) == ("list", 160)
    assert value.repr.startswith("[0, 1, 2,") and value.repr.endswith("...")


def test_a_rank_that_continues_before_its_evaluate_is_running_not_a_debugpy_error() -> None:
    h = ranks(stop="one")
    h.event("201", "stopped", {"reason": "breakpoint", "threadId": 7})
    h.event("202", "stopped", {"reason": "breakpoint", "threadId": 3})
    h.perform(h.p.evaluate("a", "loss", None))
    where = asked(h, "201", "stackTrace", levels=STACK_LEVELS)
    h.event("201", "continued", {"threadId": 7, "allThreadsContinued": True})
    answer(h, "201", where, {"stackFrames": FRAMES})
    assert "evaluate" not in [m.get("command") for m in h.sent["201"]]  # nothing to evaluate in
    # one asked already, continued before debugpy answered: its refusal is not the value
    answer(h, "202", asked(h, "202", "stackTrace", levels=STACK_LEVELS), {"stackFrames": FRAMES})
    evaluation = asked(h, "202", "evaluate")
    h.event("202", "continued", {"threadId": 3, "allThreadsContinued": True})
    done = h.debugpy("202", {"type": "response", "request_seq": evaluation["seq"],
                             "success": False, "command": "evaluate", "body": {},
                             "message": "Unable to find thread for evaluation"})  # fmt: skip
    [answered] = [a for a in done if isinstance(a, EvalAnswered)]
    assert [(v.rank, v.text()) for v in answered.values] == [
        (0, "running (not evaluated)"), (1, "running (not evaluated)")
    ]  # fmt: skip


def test_a_rank_replaced_by_exec_is_gone_for_the_evaluations() -> None:
    """exec in a rank's pid: its old connection's evaluation state ends with it, so the new
    connection (whose request numbers start again) has its answers, and is not thought paused."""
    h = ranks(stop="one")
    h.event("201", "stopped", {"reason": "breakpoint", "threadId": 7})
    h.perform(h.p.evaluate("a", "loss", None))
    where = asked(h, "201", "stackTrace", levels=STACK_LEVELS)
    config = {"name": "Subprocess 201", "subProcessId": 201,
              "connect": {"host": "127.0.0.1", "port": 5678}}  # fmt: skip
    actions = h.debugpy("", {"type": "event", "event": "debugpyAttach",
                             "body": {**config, "request": "attach"}})  # fmt: skip
    [answered] = [a for a in actions if isinstance(a, EvalAnswered)]
    assert [(v.rank, v.state, v.error) for v in answered.values] == [
        (0, "error", "the process ended"), (1, "running", "")
    ]  # fmt: skip
    h.respond("201", "initialize", {})
    h.event("201", "initialized")
    for command in ("configurationDone", "attach"):
        h.respond("201", command)
    assert h.p.children["201"].live
    done = h.perform(h.p.evaluate("b", "loss", None))  # not thought paused
    [answered] = [a for a in done if isinstance(a, EvalAnswered)]
    assert [v.state for v in answered.values] == ["running", "running"]
    # its first stop's look-ups (a prefetch) reach the old ask's number: that answer is theirs
    h.event("201", "stopped", {"reason": "breakpoint", "threadId": 7})
    h.respond("201", "threads", {"threads": [{"id": 7, "name": "MainThread"}]})
    prefetch = asked(h, "201", "stackTrace", startFrame=0)
    answer(h, "201", prefetch, {"stackFrames": FRAMES, "totalFrames": 2})
    same = h.sent["201"][-1]
    assert same["seq"] == where["seq"] and same["command"] == "scopes"
    scopes = {"scopes": [{"name": "Locals", "variablesReference": 5, "expensive": False}]}
    assert not [a for a in h.respond("201", "scopes", scopes) if isinstance(a, EvalAnswered)]
    assert h.sent["201"][-1]["command"] == "variables"  # the prefetch went on with it


def test_the_consoles_at_all_of_the_streams_past_is_not_answered_again() -> None:
    """Each attempt reads ``to_worker`` from its start: an ``@all`` read before the session is
    live was answered by the attempt it was asked of."""
    h = Harness(stop="all")
    assert console(h, "@all loss") == [] and console(h, "@ranks x y") == []
    h.go_live()
    assert responses(h) == []
    [reply] = console(h, "@all loss")  # asked now: answered (no rank is paused)
    assert not reply["success"]
