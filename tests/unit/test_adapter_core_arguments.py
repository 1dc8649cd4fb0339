"""The adapter's routing core given arguments of every JSON type (each request answered once,
whatever it carries, in every phase) and keeping no memory it does not need; stepped message by
message with a hand-driven clock (``tests/adapter_core_harness.py``).
"""

from __future__ import annotations

import gc
import tracemalloc
from typing import Any

import orjson
from adapter_core_harness import MAIN, Harness, bp_args, kinds, live_harness
from hypothesis import given
from hypothesis import strategies as st

from adapter.dap.core import (
    Action,
    AdapterCore,
    CancelRun,
    CloseIde,
    IdePhase,
    Publish,
    ToIde,
)
from protocol_specs.dap.schema import validate_message
from protocol_specs.session.session import StatusEvent
from protocol_specs.wire.wire import DapEntry, StreamName

# --- arguments of every JSON type --------------------------------------------------------------


def test_disconnect_with_an_array_for_arguments_is_answered_with_an_error() -> None:
    """It used to raise ``'list' object has no attribute 'get'`` and end `tether debug`."""
    h = Harness()
    h.connect()
    h.handshake()
    (answer,) = h.request("disconnect", [1])
    assert answer["success"] is False and answer["request_seq"] == h.ide_seq
    assert "'arguments' must be a JSON object, not a JSON array" in answer["message"]
    assert h.core.phase is IdePhase.CONFIGURED  # nothing happened: still attached
    assert h.request("threads")[0]["success"] is True


def test_initialize_with_a_string_for_arguments_does_not_break_the_handshake() -> None:
    """``initialize`` with ``"abc"``, then ``attach`` and ``configurationDone`` while queued: the
    last used to raise ``'str' object has no attribute 'get'``."""
    h = Harness()
    h.connect()
    (refused,) = h.request("initialize", "abc")
    assert refused["success"] is False and "JSON string" in refused["message"]
    assert not h.published  # nothing of it reached the run's stream
    assert kinds(h.request("attach", {})) == ["initialized"]
    out = h.request("configurationDone")
    assert kinds(out) == ["configurationDone", "attach", "output"]
    assert all(m.get("success", True) for m in out)


def test_null_arguments_count_as_none_and_threads_ignores_what_it_is_given() -> None:
    h = live_harness()
    out = h.request("disconnect", None)
    assert out[0]["success"] is True and "arguments" not in orjson.dumps(out[0]).decode()
    h.connect()
    h.handshake()
    assert h.request("threads", "whatever") == []  # forwarded, without the stray arguments
    assert "arguments" not in orjson.loads(h.last_published("threads").body)


def test_a_second_attach_is_refused_so_each_request_is_answered_once() -> None:
    h = Harness()
    h.connect()
    h.request("initialize", {"adapterID": "debugpy"})
    first = h.ide_seq + 1
    assert kinds(h.request("attach", {})) == ["initialized"]
    (again,) = h.request("attach", {})
    assert again["success"] is False and again["request_seq"] == first + 1
    out = h.request("configurationDone")
    assert [m["request_seq"] for m in out if m["type"] == "response"] == [first + 2, first]
    assert h.request("attach", {})[0]["success"] is False  # after configurationDone too


def test_terminate_debuggee_must_be_true_not_truthy() -> None:
    h = Harness()
    h.connect()
    h.handshake()
    actions = h.core.on_ide_message(
        {
            "seq": 9,
            "type": "request",
            "command": "disconnect",
            "arguments": {"terminateDebuggee": "no"},
        }
    )
    assert not any(isinstance(a, CancelRun) for a in actions)


def _deep(depth: int) -> Any:
    value: Any = []
    for _ in range(depth):
        value = [value]
    return value


def test_arguments_too_deep_to_encode_are_refused_without_a_trace() -> None:
    """orjson reads 1,024 levels but writes 254: a request between the two could not be published."""
    h = Harness()
    h.connect()
    (answer,) = h.request("initialize", {"adapterID": "x", "deep": _deep(300)})
    assert answer["success"] is False and "Invalid arguments for 'initialize'" in answer["message"]
    assert not h.published and h.core.session.initialize_args is None
    h.handshake()
    h.status(StatusEvent.DEBUGGER_LIVE)
    (answer,) = h.request("evaluate", {"expression": _deep(300)})
    assert answer["success"] is False and h.core.next_deadline is None


JSON_SCALARS = (
    st.none()
    | st.booleans()
    | st.integers(min_value=-(2**63), max_value=2**64 - 1)  # what orjson reads as int
    | st.floats(allow_nan=False, allow_infinity=False)
    | st.text(max_size=12)
)
JSON_VALUES = st.recursive(
    JSON_SCALARS,
    lambda inner: (
        st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=6), inner, max_size=3)
    ),
    max_leaves=10,
)
#: argument names the core or the debugger look at, so objects reach deep into the handlers
ARGUMENT_KEYS = st.sampled_from(
    [
        "adapterID", "supportsProgressReporting", "terminateDebuggee", "restart", "source",
        "breakpoints", "lines", "filters", "filterOptions", "threadId", "frameId", "expression",
        "variablesReference", "name", "line", "path", "context",
    ]
) | st.text(max_size=6)  # fmt: skip


def _objects(values: st.SearchStrategy[Any]) -> st.SearchStrategy[dict[str, Any]]:
    return st.dictionaries(ARGUMENT_KEYS, values, max_size=4)


#: arguments of every JSON type, objects shaped a little like the real ones
ARGUMENTS = st.one_of(
    st.none(),
    st.booleans(),
    st.integers(min_value=-(2**63), max_value=2**64 - 1),
    st.floats(allow_nan=False, allow_infinity=False),
    st.text(max_size=20),
    st.lists(JSON_VALUES, max_size=4),
    _objects(JSON_VALUES),
    _objects(_objects(JSON_VALUES) | st.lists(_objects(JSON_VALUES), max_size=3)),
    st.builds(
        lambda lines, extra: {**bp_args(MAIN, lines), **extra},
        st.lists(st.integers(min_value=-3, max_value=40), max_size=4),
        _objects(JSON_VALUES),
    ),
    st.just({"expression": _deep(300)}),
)
#: every command in the core's handler table, forwarded ones, refused ones and an unknown one
COMMANDS = st.sampled_from(
    [
        *AdapterCore("r", clock=lambda: 0.0)._handlers,
        "continue", "next", "stepIn", "stepOut", "pause", "stackTrace", "scopes", "variables",
        "evaluate", "setVariable", "setExpression", "source", "exceptionInfo", "completions",
        "modules", "goto", "gotoTargets", "stepInTargets", "restart", "setDebuggerProperty",
        "loadedSources", "cancel", "readMemory", "bogus",
    ]
)  # fmt: skip
PHASES = st.sampled_from(["connected", "queued", "live", "paused"])


def phase_harness(phase: str) -> Harness:
    h = Harness(request_timeout=5.0)
    h.connect()
    if phase == "connected":
        return h
    h.handshake()
    if phase in ("live", "paused"):
        h.status(StatusEvent.DEBUGGER_LIVE)
    if phase == "paused":
        h.event("thread", {"reason": "started", "threadId": 1})
        h.event("stopped", {"reason": "breakpoint", "threadId": 1, "allThreadsStopped": True})
    return h


class Ledger:
    """Every request the IDE sent, and the responses it got for each (exactly one is owed)."""

    def __init__(self, h: Harness) -> None:
        self.h = h
        self.answers: dict[int, int] = {}
        self.owed: dict[int, int] = {}  # request seq -> generation it was sent on
        self.forwarded: list[DapEntry] = []
        self.closed: set[int] = set()  # generations the core closed

    def step(self, actions: list[Action]) -> None:
        for action in actions:
            if isinstance(action, ToIde):
                validate_message(action.message)
                if action.message["type"] == "response":
                    seq = action.message["request_seq"]
                    assert action.generation == self.owed[seq], action
                    self.answers[seq] = self.answers.get(seq, 0) + 1
                    assert self.answers[seq] == 1, f"request {seq} answered twice"
            elif isinstance(action, Publish) and isinstance(action.entry, DapEntry):
                if not action.entry.local:
                    self.forwarded.append(action.entry)
            elif isinstance(action, CloseIde):
                self.closed.add(action.generation)

    def request(self, command: str, arguments: Any, *, with_arguments: bool = True) -> int:
        h = self.h
        h.ide_seq += 1
        msg: dict[str, Any] = {"seq": h.ide_seq, "type": "request", "command": command}
        if with_arguments:
            msg["arguments"] = arguments
        self.owed[h.ide_seq] = h.core.generation
        self.step(h.core.on_ide_message(msg))
        return h.ide_seq

    def worker_answers(self, *, success: bool) -> None:
        """The debugger answers everything forwarded (an error, as debugpy does for junk)."""
        while self.forwarded:
            entry = self.forwarded.pop(0)
            req = orjson.loads(entry.body)
            msg: dict[str, Any] = {
                "seq": 900,
                "type": "response",
                "request_seq": req["seq"],
                "success": success,
                "command": req["command"],
            }
            if not success:
                msg["message"] = "the debugger could not make sense of it"
            elif req["command"] == "threads":
                msg["body"] = {"threads": []}
            self.step(
                self.h.core.on_delivery(
                    StreamName.TO_IDE, DapEntry(origin="me", body=orjson.dumps(msg))
                )
            )

    def unanswered(self) -> list[int]:
        """Requests owed an answer on a connection that is still open."""
        return [
            seq
            for seq, gen in self.owed.items()
            if gen not in self.closed and self.answers.get(seq, 0) == 0
        ]


@given(
    phase=PHASES,
    requests=st.lists(st.tuples(COMMANDS, ARGUMENTS, st.booleans()), min_size=1, max_size=6),
)
def test_any_arguments_to_any_command_in_any_phase_get_one_answer(
    phase: str, requests: list[tuple[str, Any, bool]]
) -> None:
    """Never raises; every response is schema-valid; every request is answered exactly once (by
    the core, the debugger, or ``configurationDone`` for ``attach``); non-object arguments get an
    error at once and publish nothing; afterwards a well-behaved request still works."""
    h = phase_harness(phase)
    ledger = Ledger(h)
    for command, arguments, present in requests:
        if ledger.closed:  # the IDE disconnected: a new one attaches
            ledger.closed.clear()
            h.connect()
            ledger.request("initialize", {"adapterID": "debugpy"})
        forwarded = len(ledger.forwarded)
        seq = ledger.request(command, arguments, with_arguments=present)
        if present and not isinstance(arguments, dict | None) and command != "threads":
            assert ledger.answers.get(seq) == 1  # refused at once...
            assert len(ledger.forwarded) == forwarded  # ...and not sent on
        ledger.worker_answers(success=False)
    if not ledger.closed and h.core.phase is not IdePhase.CONFIGURED:
        ledger.request("configurationDone", None, with_arguments=False)  # attach is answered now
    ledger.worker_answers(success=False)
    assert ledger.unanswered() == []
    if ledger.closed:
        h.connect()
        h.handshake()
    ledger.owed.clear()
    seq = ledger.request("threads", None, with_arguments=False)
    ledger.worker_answers(success=True)
    assert ledger.answers[seq] == 1


# --- memory -------------------------------------------------------------------------------------


def test_the_session_keeps_no_arguments_of_requests_it_does_not_need() -> None:
    """Three large ``evaluate`` requests and their answers leave nothing of them behind (the fold
    used to keep every request's arguments for the life of the adapter)."""
    h = live_harness()
    h.published.clear()
    gc.collect()
    tracemalloc.start()
    try:
        before = tracemalloc.get_traced_memory()[0]
        for _ in range(3):
            h.ide_seq += 1
            request = {
                "seq": h.ide_seq,
                "type": "request",
                "command": "evaluate",
                "arguments": {"expression": "x" * 5_000_000, "context": "repl"},
            }
            (publish,) = h.core.on_ide_message(request)
            assert isinstance(publish, Publish) and isinstance(publish.entry, DapEntry)
            answer = {
                "seq": 900,
                "type": "response",
                "request_seq": orjson.loads(publish.entry.body)["seq"],
                "success": True,
                "command": "evaluate",
                "body": {"result": "'xxx...'", "variablesReference": 0},
            }
            del request, publish
            (response,) = h.deliver(DapEntry(origin="me", body=orjson.dumps(answer)))
            assert response["request_seq"] == h.ide_seq
        gc.collect()
        kept = tracemalloc.get_traced_memory()[0] - before
    finally:
        tracemalloc.stop()
    assert kept < 1_000_000, f"{kept:,} bytes kept after 3 x 5 MB requests"


def test_another_adapters_large_requests_are_not_kept() -> None:
    h = live_harness()
    body = orjson.dumps(
        {
            "seq": 5,
            "type": "request",
            "command": "evaluate",
            "arguments": {"expression": "y" * 1000},
        }
    )
    h.sent(
        h.core.on_delivery(
            StreamName.TO_WORKER, DapEntry(origin="other", body=body, transient=True)
        )
    )
    assert h.core.session.request_of("other", 5) is None  # the fold keeps breakpoint requests only
    assert "y" * 1000 not in repr(h.core.session.__dict__)
