"""The adapter's routing core, stepped message by message (no sockets, a hand-driven clock).

Every message the core sends to the IDE is checked against the official DAP schema.
"""

from __future__ import annotations

import gc
import tracemalloc
from typing import Any

import orjson
import pytest
from hand_clock import HandClock
from hypothesis import given
from hypothesis import strategies as st

from adapter.dap.core import (
    ADAPTER_CAPABILITIES,
    Action,
    AdapterCore,
    CancelRun,
    CloseIde,
    IdePhase,
    Publish,
    ToIde,
)
from protocol_specs.dap_schema import validate_message
from protocol_specs.session import StatusEvent
from protocol_specs.wire import DapEntry, PresenceEntry, StatusEntry, StreamName

MAIN = "/home/me/project/train.py"
DATA = "/home/me/project/data.py"


class Harness:
    """An IDE on one side of the core, the relay on the other."""

    def __init__(self, origin: str = "me", **kwargs: Any) -> None:
        self.clock = HandClock()
        self.core = AdapterCore("r1", origin=origin, clock=self.clock, **kwargs)
        self.ide_seq = 100  # the IDE's numbering differs from the adapter's on purpose
        self.published: list[DapEntry] = []
        self.presence: list[PresenceEntry] = []

    def sent(self, actions: list[Action]) -> list[dict[str, Any]]:
        out = []
        for action in actions:
            if isinstance(action, ToIde):
                validate_message(action.message)
                out.append(action.message)
            elif isinstance(action, Publish):
                if isinstance(action.entry, PresenceEntry):
                    self.presence.append(action.entry)
                else:
                    self.published.append(action.entry)
        return out

    def connect(self) -> None:
        self.sent(self.core.ide_connected())

    def request(self, command: str, arguments: Any = None) -> list[dict[str, Any]]:
        self.ide_seq += 1
        msg: dict[str, Any] = {"seq": self.ide_seq, "type": "request", "command": command}
        if arguments is not None:
            msg["arguments"] = arguments
        return self.sent(self.core.on_ide_message(msg))

    def handshake(self, **init: Any) -> list[dict[str, Any]]:
        out = self.request("initialize", {"adapterID": "debugpy", **init})
        out += self.request("attach", {"justMyCode": True})
        out += self.request("setBreakpoints", bp_args(MAIN, [11, 17]))
        out += self.request("setExceptionBreakpoints", {"filters": ["uncaught"]})
        out += self.request("configurationDone")
        return out

    def deliver(
        self, entry: DapEntry | StatusEntry, stream: StreamName = StreamName.TO_IDE
    ) -> list[dict[str, Any]]:
        return self.sent(self.core.on_delivery(stream, entry))

    def status(self, event: str, **fields: Any) -> list[dict[str, Any]]:
        return self.deliver(StatusEntry(event=event, **fields))

    def respond(
        self, entry: DapEntry, body: dict[str, Any] | None = None, success: bool = True
    ) -> list[dict[str, Any]]:
        """The worker's response to a published request."""
        req = orjson.loads(entry.body)
        msg: dict[str, Any] = {
            "seq": 900,
            "type": "response",
            "request_seq": req["seq"],
            "success": success,
            "command": req["command"],
        }
        if body is not None:
            msg["body"] = body
        return self.deliver(DapEntry(origin=entry.origin, body=orjson.dumps(msg)))

    def event(self, name: str, body: dict[str, Any] | None = None) -> list[dict[str, Any]]:
        msg: dict[str, Any] = {"seq": 901, "type": "event", "event": name}
        if body is not None:
            msg["body"] = body
        return self.deliver(DapEntry(body=orjson.dumps(msg)))

    def last_published(self, command: str) -> DapEntry:
        return next(
            e for e in reversed(self.published) if orjson.loads(e.body).get("command") == command
        )


def bp_args(path: str, lines: list[int]) -> dict[str, Any]:
    return {
        "source": {"name": path.rsplit("/", 1)[-1], "path": path},
        "breakpoints": [{"line": n} for n in lines],
        "lines": lines,
    }


def kinds(messages: list[dict[str, Any]]) -> list[str]:
    return [m.get("command") if m["type"] == "response" else m.get("event") for m in messages]  # type: ignore[misc]


def test_handshake_is_answered_at_once_while_queued() -> None:
    h = Harness()
    h.connect()
    out = h.request("initialize", {"adapterID": "debugpy", "supportsProgressReporting": True})
    assert out[0]["body"] == ADAPTER_CAPABILITIES
    assert out[0]["body"]["supportsConfigurationDoneRequest"] is True
    assert kinds(h.request("attach", {})) == ["initialized"]
    out = h.request("setBreakpoints", bp_args(MAIN, [11, 17]))
    bps = out[0]["body"]["breakpoints"]
    assert [(b["id"], b["verified"], b["line"]) for b in bps] == [(1, False, 11), (2, False, 17)]
    assert "waiting for a worker" in bps[0]["message"]
    assert h.published[-1].local and h.published[-1].bp_ids == [1, 2]
    out = h.request("configurationDone")
    # debugpy's order: configurationDone's response, then attach's, then status
    assert kinds(out) == ["configurationDone", "attach", "output", "progressStart"]
    assert "queued" in out[2]["body"]["output"]
    assert h.core.phase is IdePhase.CONFIGURED
    assert h.request("threads")[0]["body"] == {"threads": []}
    refused = h.request("evaluate", {"expression": "1"})[0]
    assert refused["success"] is False and "No debugger is attached yet" in refused["message"]


def test_breakpoint_ids_are_stable_across_edits() -> None:
    h = Harness()
    h.connect()
    h.handshake()
    out = h.request("setBreakpoints", bp_args(MAIN, [17, 20]))
    assert [b["id"] for b in out[0]["body"]["breakpoints"]] == [2, 3]  # 17 kept its id
    out = h.request("setBreakpoints", bp_args(DATA, [4]))
    assert [b["id"] for b in out[0]["body"]["breakpoints"]] == [4]


def test_worker_verification_becomes_breakpoint_events_under_the_ides_ids() -> None:
    h = Harness()
    h.connect()
    h.handshake(supportsProgressReporting=True)
    entry = h.last_published("setBreakpoints")
    assert kinds(h.status(StatusEvent.CLAIMED, detail="w-0")) == ["output", "progressUpdate"]
    out = h.respond(
        entry,
        {
            "breakpoints": [
                {"id": 0, "verified": True, "line": 11, "source": {"path": MAIN}},
                {
                    "id": 1,
                    "verified": True,
                    "line": 16,
                    "source": {"path": MAIN},
                },  # adjusted by debugpy
            ]
        },
    )
    assert kinds(out) == ["breakpoint", "breakpoint"]
    assert [
        (e["body"]["reason"], e["body"]["breakpoint"]["id"], e["body"]["breakpoint"]["line"])
        for e in out
    ] == [("changed", 1, 11), ("changed", 2, 16)]
    out = h.status(StatusEvent.DEBUGGER_LIVE)
    assert kinds(out) == ["output", "progressEnd"]
    # debugpy's own ids are translated in stops
    h.event("thread", {"reason": "started", "threadId": 1})
    out = h.event(
        "stopped",
        {"reason": "breakpoint", "threadId": 1, "allThreadsStopped": True, "hitBreakpointIds": [1]},
    )
    assert out[0]["body"]["hitBreakpointIds"] == [2]


def live_harness() -> Harness:
    h = Harness(request_timeout=5.0)
    h.connect()
    h.handshake()
    h.status(StatusEvent.DEBUGGER_LIVE)
    return h


def test_live_requests_are_forwarded_and_answers_mapped_back() -> None:
    h = live_harness()
    assert h.request("stackTrace", {"threadId": 1}) == []
    entry = h.last_published("stackTrace")
    assert entry.local is False and entry.origin == "me"
    published_seq = orjson.loads(entry.body)["seq"]
    assert published_seq != h.ide_seq  # the adapter's own numbering on this hop
    out = h.respond(entry, {"stackFrames": [], "totalFrames": 0})
    assert out[0]["request_seq"] == h.ide_seq and out[0]["command"] == "stackTrace"
    # someone else's response is not ours to forward
    other = DapEntry(
        origin="else",
        body=orjson.dumps(
            {
                "seq": 1,
                "type": "response",
                "request_seq": published_seq,
                "success": True,
                "command": "stackTrace",
            }
        ),
    )
    assert h.deliver(other) == []


def test_live_breakpoints_are_answered_with_stable_ids() -> None:
    h = live_harness()
    assert h.request("setBreakpoints", bp_args(DATA, [3])) == []
    entry = h.last_published("setBreakpoints")
    assert entry.bp_ids == [3]
    out = h.respond(
        entry,
        {
            "breakpoints": [
                {"id": 7, "verified": False, "message": "Breakpoint in file that does not exist."}
            ]
        },
    )
    assert out[0]["body"]["breakpoints"] == [
        {"id": 3, "verified": False, "message": "Breakpoint in file that does not exist."}
    ]


def test_requests_debugpy_never_answers_are_refused_at_once() -> None:
    h = live_harness()
    out = h.request("loadedSources")
    assert out[0]["success"] is False and "not supported" in out[0]["message"]
    assert h.core.next_deadline is None


def test_unanswered_requests_time_out_with_an_error() -> None:
    h = live_harness()
    h.request("evaluate", {"expression": "input()"})
    assert h.core.next_deadline == pytest.approx(105.0)
    h.clock.now = 104.9
    assert h.sent(h.core.on_tick()) == []
    h.clock.now = 105.0
    out = h.sent(h.core.on_tick())
    assert out[0]["success"] is False and "did not answer 'evaluate'" in out[0]["message"]
    assert h.core.next_deadline is None


def test_responses_for_a_departed_ide_are_dropped_and_state_is_replayed() -> None:
    h = live_harness()
    h.event("thread", {"reason": "started", "threadId": 1})
    h.event("stopped", {"reason": "breakpoint", "threadId": 1, "allThreadsStopped": True})
    h.request("variables", {"variablesReference": 5})
    stale = h.last_published("variables")
    gen = h.core.generation
    h.sent(h.core.ide_disconnected(gen))
    h.connect()
    assert h.respond(stale, {"variables": []}) == []
    out = h.request("initialize", {"adapterID": "debugpy"})
    out += h.request("attach", {})
    out += h.request("configurationDone")
    assert kinds(out) == [
        "initialize",
        "initialized",
        "configurationDone",
        "attach",
        "thread",
        "stopped",
    ]
    assert out[-1]["body"]["threadId"] == 1 and out[-1]["body"]["reason"] == "breakpoint"


def test_second_ide_takes_over() -> None:
    h = Harness()
    h.connect()
    first = h.core.generation
    actions = h.core.ide_connected()
    assert actions[0] == CloseIde(first, "another IDE connection took over")
    assert [a.entry for a in actions[1:] if isinstance(a, Publish)] == [
        PresenceEntry(origin="me", epoch=2, attached=True)
    ]


def test_presence_follows_the_ide_and_the_relay_link() -> None:
    h = Harness()
    h.connect()
    h.handshake()
    h.request("disconnect", {"restart": False})
    h.sent(h.core.ide_disconnected(h.core.generation))  # the socket closes after: nothing new
    h.connect()
    h.handshake()
    out = h.sent(h.core.relay_link_changed(False, "connection reset"))
    assert "reconnecting" in out[0]["body"]["output"]
    out = h.sent(h.core.relay_link_changed(True, "reconnected to the relay (connection 2)"))
    assert "nothing was lost" in out[0]["body"]["output"]
    assert [(p.epoch, p.attached) for p in h.presence] == [
        (1, True),
        (2, False),
        (3, True),
        (4, True),  # re-announced after the reconnect
    ]


def test_a_refused_live_request_gets_an_error_response() -> None:
    h = Harness()
    h.connect()
    h.handshake()
    h.deliver(StatusEntry(event=StatusEvent.DEBUGGER_LIVE))
    assert h.request("evaluate", {"expression": "1"}) == []
    entry = h.published[-1]
    origin_seq = orjson.loads(entry.body)["seq"]
    (response,) = h.sent(h.core.publish_refused(origin_seq, "the run's buffer is full"))
    assert response["success"] is False and response["request_seq"] == h.ide_seq
    assert "buffer is full" in response["message"]
    assert h.core.next_deadline is None  # nothing left pending


def test_disconnect_detaches_and_terminate_debuggee_cancels() -> None:
    h = Harness()
    h.connect()
    h.handshake()
    actions = h.core.on_ide_message(
        {"seq": 50, "type": "request", "command": "disconnect", "arguments": {"restart": False}}
    )
    assert not any(isinstance(a, CancelRun) for a in actions)
    assert any(isinstance(a, CloseIde) for a in actions)
    h.connect()
    actions = h.core.on_ide_message(
        {
            "seq": 51,
            "type": "request",
            "command": "disconnect",
            "arguments": {"terminateDebuggee": True},
        }
    )
    assert any(isinstance(a, CancelRun) for a in actions)


def test_run_end_gives_exited_and_terminated_once() -> None:
    h = live_harness()
    h.request("threads")
    out = h.status(StatusEvent.EXITED, exit_code=3, state="failed")
    assert kinds(out) == ["threads", "output", "exited", "terminated"]
    assert out[0]["success"] is False  # the pending request was failed
    assert out[2]["body"] == {"exitCode": 3}
    assert h.event("terminated") == []


def test_launch_is_refused_and_garbage_is_reported() -> None:
    h = Harness()
    h.connect()
    out = h.request("launch", {"program": "x.py"})
    assert out[0]["success"] is False and '"attach" expected' in out[0]["message"]
    out = h.request("launch", {"program": "x.py", "tetherRun": "another run"})
    assert out[0]["success"] is False and '"attach" expected' in out[0]["message"]
    out = h.sent(h.core.on_ide_garbage("body is not JSON"))
    assert out[0]["event"] == "output" and "body is not JSON" in out[0]["body"]["output"]
    out = h.sent(h.core.on_ide_message({"type": "request", "command": "threads"}))
    assert out[0]["event"] == "output" and "seq" in out[0]["body"]["output"]
    out = h.sent(h.core.on_ide_message({"seq": 7, "type": "request", "command": 3}))
    assert out[0]["success"] is False and out[0]["request_seq"] == 7
    out = h.request("setBreakpoints", {"source": {}, "breakpoints": [{"line": "x"}]})
    assert out[0]["success"] is False and "Invalid arguments" in out[0]["message"]


def test_the_extensions_launch_of_its_own_run_is_debugged_as_an_attach() -> None:
    """The editor extension submits the run, then launches naming it (``tetherRun``): published
    (and so replayed to debugpy) as an attach, answered as the launch it was, after
    configurationDone as debugpy does."""
    h = Harness()
    h.connect()
    h.request("initialize", {"adapterID": "tether", "supportsProgressReporting": True})
    out = h.request("launch", {"program": "train.py", "tetherRun": "r1", "gpus": 1})
    assert kinds(out) == ["initialized"]
    published = orjson.loads(h.published[-1].body)
    assert published["command"] == "attach" and published["arguments"]["tetherRun"] == "r1"
    out = h.request("configurationDone")
    assert kinds(out)[:2] == ["configurationDone", "launch"] and out[1]["success"] is True
    assert "Run r1 is queued" in out[-1]["body"]["message"]  # the progress VS Code shows
    again = h.request("launch", {"tetherRun": "r1"})
    assert again[0]["success"] is False and "already attached" in again[0]["message"]


def test_an_editors_launch_keys_are_not_told_to_debugpy() -> None:
    """debugpy's attach refuses ``noDebug``, and ``tetherArgs`` may hold a secret: the published
    attach has neither; the IDE's own arguments stay for its child processes' sessions."""
    h = Harness()
    h.connect()
    h.request("initialize", {"adapterID": "tether"})
    launch = {"tetherRun": "r1", "justMyCode": False, "noDebug": True, "program": "t.py",
              "tetherArgs": ["--secret", "TOKEN=hunter2"], "env": {"A": "1"}, "tetherPort": 4711}  # fmt: skip
    h.request("launch", launch)
    published = orjson.loads(h.published[-1].body)["arguments"]
    assert published == {"tetherRun": "r1", "justMyCode": False}
    assert h.core.attach_args == launch


def test_stop_cancels_the_run_even_when_live_and_a_restart_only_detaches() -> None:
    h = live_harness()
    out = h.sent(h.core.on_ide_message({"seq": 500, "type": "request", "command": "terminate"}))
    assert kinds(out) == ["terminate"] and out[0]["success"] is True
    actions = h.core.on_ide_message(
        {"seq": 501, "type": "request", "command": "terminate", "arguments": {}}
    )
    assert any(isinstance(a, CancelRun) for a in actions)
    assert not any(orjson.loads(e.body).get("command") == "terminate" for e in h.published)
    restart = {"restart": True}
    for command, args in (
        ("terminate", restart),
        ("disconnect", {**restart, "terminateDebuggee": True}),
    ):
        actions = h.core.on_ide_message(
            {"seq": 502, "type": "request", "command": command, "arguments": args}
        )
        assert not any(isinstance(a, CancelRun) for a in actions), command


def test_queued_progress_says_where_the_run_waits() -> None:
    h = Harness()
    h.connect()
    h.request("initialize", {"adapterID": "tether", "supportsProgressReporting": True})
    h.request("attach", {})
    h.request("configurationDone")
    out = h.status(StatusEvent.QUEUED, detail="queued on slurm: waiting for a worker")
    assert out[-1]["body"]["message"] == "Run r1 is queued on slurm: waiting for a worker."
    out = h.status(StatusEvent.QUEUED, detail="slurm job 4242 submitted")
    assert out[-1]["event"] == "progressUpdate"
    assert out[-1]["body"]["message"] == "Run r1: slurm job 4242 submitted."


def test_history_replay_folds_without_talking() -> None:
    """`tether attach`: a new adapter folds another adapter's streams, then serves an IDE."""
    first = Harness()
    first.connect()
    first.handshake()
    entries = list(first.published)
    h = Harness(origin="second")
    for e in entries:
        assert h.sent(h.core.on_delivery(StreamName.TO_WORKER, e, replaying=True)) == []
    assert (
        h.sent(
            h.core.on_delivery(
                StreamName.TO_IDE, StatusEntry(event=StatusEvent.DEBUGGER_LIVE), replaying=True
            )
        )
        == []
    )
    assert h.core.session.configuration_done and h.core.session.live
    assert list(h.core.session.breakpoints) == [MAIN]
    # the new adapter never reuses the ids the first one handed out
    h.connect()
    h.request("initialize", {})
    h.request("attach", {})
    h.request("setBreakpoints", bp_args(DATA, [1]))
    assert h.last_published("setBreakpoints").bp_ids == [3]


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


# --- unattended stops --------------------------------------------------------------------------

UNATTENDED = (
    "Run r1 is paused at app.py:11 (breakpoint) and no IDE is attached. If no IDE attaches within "
    "5 s, it will continue."
)


def test_an_unattended_stop_is_not_announced_to_the_ide_attached_here() -> None:
    """After a relay link blip the worker may report an unattended stop it decided while it
    could not see this adapter's presence: stale by construction when an IDE is attached here."""
    h = live_harness()
    h.sent(h.core.relay_link_changed(False, "connection reset"))
    h.sent(h.core.relay_link_changed(True, "reconnected to the relay (connection 2)"))
    out = h.status(StatusEvent.UNATTENDED_STOP, detail=UNATTENDED, data={"policy": "continue"})
    assert all("no IDE is attached" not in m["body"]["output"] for m in out), out
    assert all(m["body"]["category"] != "important" for m in out), out
    assert h.core.session.notice is not None  # folded all the same (the terminal reports it)
    # what the worker does after all is still said (it happens), and other notices too
    out = h.status(StatusEvent.UNATTENDED_STOP, detail="Terminating: unattended for 30 s.")
    assert out[0]["body"]["category"] == "important" and "Terminating" in out[0]["body"]["output"]
    out = h.status(StatusEvent.BUFFER_FULL, detail="the run's buffer is full; output is dropped")
    assert (
        out[0]["body"]["category"] == "important" and "buffer is full" in out[0]["body"]["output"]
    )


def test_a_malformed_request_of_another_adapter_is_skipped_not_fatal() -> None:
    """Anyone holding the user's token can write into ``to_worker``: the fold must not raise."""
    h = live_harness()
    for arguments in ([1], {"source": 5, "breakpoints": [3]}, {"breakpoints": ["x"]}):
        for command in ("setBreakpoints", "setFunctionBreakpoints", "initialize"):
            body = {"seq": 3, "type": "request", "command": command, "arguments": arguments}
            entry = DapEntry(origin="other", body=orjson.dumps(body))
            assert h.sent(h.core.on_delivery(StreamName.TO_WORKER, entry)) == []
    entry = DapEntry(origin="other", body=b"[1, 2]")
    assert h.sent(h.core.on_delivery(StreamName.TO_WORKER, entry)) == []
    assert h.request("setBreakpoints", bp_args(MAIN, [3])) == []  # and the session goes on


# --- protocol details a user noticed --------------------------------------------------------------


def _paused_with_debugpy_ids() -> Harness:
    """A live session whose breakpoint at line 17 debugpy calls 5, stopped there."""
    h = live_harness()
    answer = {
        "breakpoints": [
            {"id": 4, "verified": True, "line": 11},
            {"id": 5, "verified": True, "line": 17},
        ]
    }
    h.respond(h.last_published("setBreakpoints"), answer)
    h.event("thread", {"reason": "started", "threadId": 1})
    h.event("stopped", {"reason": "breakpoint", "threadId": 1, "hitBreakpointIds": [5]})
    return h


def test_a_stop_replayed_to_an_ide_that_attaches_later_carries_the_adapters_breakpoint_ids() -> (
    None
):
    h = _paused_with_debugpy_ids()
    h.connect()  # a second IDE (or the same one, restarted)
    out = h.handshake()
    (stopped,) = [m for m in out if m.get("event") == "stopped"]
    assert stopped["body"]["hitBreakpointIds"] == [2]  # the id this IDE holds, not debugpy's 5


def test_a_stop_names_only_breakpoint_ids_the_ide_was_given() -> None:
    """The main session after a re-attach: debugpy's ids map to the ids the IDE holds, and an id
    of a breakpoint the IDE no longer has (removed while the stop was on its way) is left out."""
    h = _paused_with_debugpy_ids()
    h.connect()
    h.handshake()
    h.request("setBreakpoints", bp_args(MAIN, [17]))  # 11 removed: 17 keeps id 2
    out = h.event("stopped", {"reason": "breakpoint", "threadId": 1, "hitBreakpointIds": [4, 5]})
    assert out[0]["body"]["hitBreakpointIds"] == [2]
    out = h.event("stopped", {"reason": "breakpoint", "threadId": 1, "hitBreakpointIds": [4]})
    assert "hitBreakpointIds" not in out[0]["body"]


def test_the_run_status_is_said_once_per_change() -> None:
    h = Harness()
    h.connect()
    h.handshake()
    h.status(StatusEvent.CLAIMED, detail="w-0")
    said = [
        m["body"]["output"] for m in h.status(StatusEvent.STARTED) if m.get("event") == "output"
    ]
    again = [m for m in h.status(StatusEvent.WAITING_FOR_IDE) if m.get("event") == "output"]
    assert len(said) == 1 and "started on a worker" in said[0] and again == []


def test_the_program_is_never_said_to_be_local() -> None:
    h = live_harness()
    body = {
        "name": "train.py",
        "systemProcessId": 7,
        "isLocalProcess": True,
        "startMethod": "attach",
    }
    (event,) = h.event("process", body)
    assert event["body"]["isLocalProcess"] is False
    h.connect()
    (replayed,) = [m for m in h.handshake() if m.get("event") == "process"]
    assert replayed["body"]["isLocalProcess"] is False


def test_stop_asks_the_relay_to_cancel_before_it_answers_or_detaches() -> None:
    h = live_harness()
    h.ide_seq += 1
    actions = h.core.on_ide_message(
        {
            "seq": h.ide_seq,
            "type": "request",
            "command": "disconnect",
            "arguments": {"terminateDebuggee": True},
        }
    )
    assert isinstance(actions[0], CancelRun)  # performed (awaited) before what follows it
    assert [type(a).__name__ for a in actions[1:]] == ["ToIde", "CloseIde", "Publish"]
