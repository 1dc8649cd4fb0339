"""The focus on the worker (``tetherFocus`` recorded in ``to_worker``): a rank outside it is
configured with no breakpoints, a live rank whose side of it changes is configured anew; the last
focus in the stream wins (``worker_shim/session/processes.py``)."""

from __future__ import annotations

from typing import Any

import orjson
from test_shim_processes import WORKDIR, Harness, src

from protocol_specs.session.focus import focus_request
from protocol_specs.session.session import BreakpointSet
from protocol_specs.wire.wire import DapEntry
from worker_shim.session.replay import cleared


def focus(h: Harness, ranks: list[int] | None, seq: int) -> None:
    body = orjson.dumps({**focus_request(ranks), "seq": seq})
    h.deliver(DapEntry(origin="ide1", body=body, local=True))


def configured(h: Harness, key: str) -> list[tuple[str, Any]]:
    """What ``key`` was sent since its handshake: (command, breakpoints or filters)."""
    out = []
    for m in h.sent[key]:
        args = m.get("arguments") or {}
        if m["command"] == "setBreakpoints":
            out.append((m["command"], [b["line"] for b in args["breakpoints"]]))
        elif m["command"] == "setExceptionBreakpoints":
            out.append((m["command"], args["filters"]))
    return out


def start(h: Harness, pid: int) -> None:
    h.announce("", pid)
    h.respond(str(pid), "initialize", {})
    h.event(str(pid), "initialized")
    for command in ("setBreakpoints", "setExceptionBreakpoints", "configurationDone", "attach"):
        if any(m["command"] == command for m in h.sent[str(pid)]):
            h.respond(str(pid), command)


def test_a_rank_outside_the_focus_gets_no_breakpoints_and_a_new_focus_reconfigures_live_ranks():
    h = Harness()
    h.ide("setBreakpoints", src("train.py"), 1)
    focus(h, [0], 3)  # recorded while queued: the worker reads it before any rank starts
    h.go_live()
    start(h, 201)  # rank 0: in focus
    start(h, 202)  # rank 1: not
    assert configured(h, "201") == [("setBreakpoints", [3])]
    assert configured(h, "202") == []
    h.sent["201"].clear()
    h.sent["202"].clear()
    focus(h, [1], 4)  # the focus moves to rank 1: rank 0 is cleared, rank 1 configured
    assert configured(h, "201") == [("setBreakpoints", [])]
    assert h.sent["201"][0]["arguments"]["source"] == {"path": f"{WORKDIR}/train.py"}
    assert configured(h, "202") == [("setBreakpoints", [3])]
    h.sent["201"].clear()
    h.sent["202"].clear()
    focus(h, [1], 5)  # the same again: nothing to do
    assert h.sent["201"] == h.sent["202"] == []
    focus(h, None, 6)  # no focus: every rank (no RunSpec.ranks)
    assert configured(h, "201") == [("setBreakpoints", [3])]
    assert h.sent["202"] == []


def test_without_a_session_focus_run_spec_ranks_holds_and_a_focus_replaces_it() -> None:
    h = Harness(ranks=[0])
    h.ide("setBreakpoints", src("train.py"), 1)
    h.go_live()
    start(h, 201)
    start(h, 202)
    assert configured(h, "202") == []
    focus(h, [0, 1], 2)
    assert configured(h, "202") == [("setBreakpoints", [3])]


def test_what_clears_each_kind_of_configuration() -> None:
    sets = [
        BreakpointSet("setExceptionBreakpoints", {"filters": ["raised"]}, [], "a", 1),
        BreakpointSet("setFunctionBreakpoints", {"breakpoints": [{"name": "f"}]}, [1], "a", 2),
        BreakpointSet("setBreakpoints", src("t.py"), [2], "a", 3),
    ]
    assert [cleared(b).arguments for b in sets] == [
        {"filters": []},
        {"breakpoints": []},
        {"source": {"path": f"{WORKDIR}/t.py"}, "breakpoints": []},
    ]


def test_a_malformed_focus_is_skipped() -> None:
    h = Harness()
    h.go_live()
    body = orjson.dumps({**focus_request(None), "arguments": {"ranks": "all"}, "seq": 2})
    assert h.deliver(DapEntry(origin="ide1", body=body, local=True)) == []
    assert h.p.focus is None


def answers(h: Harness, key: str) -> list[dict[str, Any]]:
    """The responses published for ``key``'s session (the worker's own, not debugpy's)."""
    out = []
    for e in h.published:
        if isinstance(e, DapEntry) and e.process == key:
            msg = orjson.loads(e.body)
            if msg.get("type") == "response":
                out.append(msg)
    return out


def test_a_session_of_a_rank_outside_the_focus_sets_no_breakpoints_in_it() -> None:
    h = Harness()
    h.ide("setBreakpoints", src("train.py"), 1)
    focus(h, [0], 2)
    h.go_live()
    start(h, 201)
    start(h, 202)  # rank 1: outside the focus, its session open (``--processes all``)
    h.sent["201"].clear()
    h.sent["202"].clear()
    h.published.clear()
    h.ide("setBreakpoints", {**src("t.py"), "breakpoints": [{"line": 7}, {"line": 8}]}, 3, "202")
    h.ide("setExceptionBreakpoints", {"filters": ["raised"]}, 4, "202")
    assert h.sent["202"] == []  # nothing reached rank 1's debugpy
    bps, exc = answers(h, "202")
    assert (bps["request_seq"], bps["success"], exc["request_seq"]) == (3, True, 4)
    why = "rank 1 is outside the focus (rank 0): its breakpoints are not set there; focus on it"
    assert [b["verified"] for b in bps["body"]["breakpoints"]] == [False, False]
    assert bps["body"]["breakpoints"][0]["message"].startswith(why)
    assert exc["body"]["breakpoints"] == [bps["body"]["breakpoints"][0]]
    # one the adapter answered itself (``local``) is not answered again, nor sent
    body = orjson.dumps({"seq": 5, "type": "request", "command": "setBreakpoints",
                         "arguments": src("x.py")})  # fmt: skip
    h.deliver(DapEntry(origin="ide1", body=body, local=True, bp_ids=[9], process="202"))
    assert h.sent["202"] == [] and len(answers(h, "202")) == 2
    # rank 0's session sets its own as ever
    h.ide("setBreakpoints", {**src("t.py"), "breakpoints": [{"line": 7}]}, 6, "201")
    assert configured(h, "201") == [("setBreakpoints", [7])]
    # entering the focus, rank 1 gets the run's configuration, its session's breakpoints in it
    h.sent["202"].clear()
    focus(h, [0, 1], 7)
    assert sorted(configured(h, "202")) == [
        ("setBreakpoints", [3]),
        ("setBreakpoints", [3]),
        ("setBreakpoints", [7]),
        ("setExceptionBreakpoints", ["raised"]),
    ]
    # and in the focus, its session's requests reach it
    h.ide("setBreakpoints", {**src("t.py"), "breakpoints": [{"line": 9}]}, 8, "202")
    assert configured(h, "202")[-1] == ("setBreakpoints", [9])


def test_outside_run_spec_ranks_the_answer_names_them() -> None:
    h = Harness(ranks=[0])
    h.go_live()
    start(h, 202)
    h.published.clear()
    h.ide("setBreakpoints", src("t.py"), 2, "202")
    (answer,) = answers(h, "202")
    assert answer["body"]["breakpoints"][0]["message"].startswith(
        "rank 1 is outside --ranks 0: its breakpoints are not set there"
    )
