"""The worker shim's core, stepped message by message (no sockets, a hand-driven clock).

debugpy on one side, the relay on the other. Every DAP message the core sends debugpy, and every
one it publishes, is checked against the official DAP schema.
"""

from __future__ import annotations

from typing import Any

import orjson
import pytest
from hand_clock import HandClock

from protocol_specs.dap.capabilities import DEBUGPY_CAPABILITIES
from protocol_specs.dap.schema import validate_message
from protocol_specs.link.link import Cursor
from protocol_specs.runs.runs import RunRecord
from protocol_specs.runs.spec import RunSpec
from protocol_specs.session.session import StatusEvent
from protocol_specs.wire.wire import (
    ControlEntry,
    DapEntry,
    Deliver,
    PresenceEntry,
    StatusEntry,
    StreamName,
    encode_entry,
)
from worker_shim.session.actions import (
    Action,
    PipeOutputToIde,
    Publish,
    ReplayFailed,
    Say,
    Settle,
    Terminate,
    ToDebugpy,
)
from worker_shim.session.core import ShimCore, exit_status
from worker_shim.session.replay import (
    DEFAULT_INITIALIZE,
    HANDSHAKE_TIMEOUT,
    TRANSITIONS,
    IllegalTransition,
    ReplayPhase,
    next_phase,
)

WORKDIR = "/home/me/project"
RUN_DIR = "/runs/r1-1"
MAIN = f"{WORKDIR}/train.py"
DATA = f"{WORKDIR}/data.py"
WALL = 1_790_000_000.0


class Harness:
    """A fake debugpy on one side of the core, a fake relay link on the other."""

    def __init__(self, *, tail: str = "0-0", attempt: int = 1, **spec: Any) -> None:
        self.clock = HandClock(5_000.0)  # a monotonic clock: nothing like the wall clock
        # post-mortem's own configuration is tested on its own (``post_mortem=True``)
        fields: dict[str, Any] = {"command": ["python", "train.py"], "workdir": WORKDIR,
                                  "post_mortem": False, **spec}  # fmt: skip
        self.record = RunRecord(id="r1", spec=RunSpec(**fields), attempt=attempt)
        self.core = ShimCore(
            self.record, RUN_DIR, tail=Cursor.parse(tail), clock=self.clock, wall=lambda: WALL
        )
        self.to_debugpy: list[dict[str, Any]] = []
        self.prefetch: list[dict[str, Any]] = []
        self.published: list[DapEntry | StatusEntry] = []
        self.n = 0  # publish numbers the fake link hands out
        self.answered = 0  # the highest one the fake relay answered
        self.cursor = 0
        self.debugpy_seq = 1000

    # --- performing -------------------------------------------------------------------------------

    def perform(self, actions: list[Action]) -> list[Action]:
        for action in actions:
            if isinstance(action, ToDebugpy):
                validate_message(action.message)
                # a stop's prefetch requests are kept apart (test_prefetch_* look at them)
                (self.prefetch if action.prefetch else self.to_debugpy).append(action.message)
            elif isinstance(action, Publish):
                self.n += 1
                if isinstance(action.entry, DapEntry):
                    validate_message(orjson.loads(action.entry.body))
                else:
                    assert action.entry.at == WALL  # every stored time is the wall clock
                self.published.append(action.entry)
                if action.output:
                    self.core.output_published(self.n)
        return actions

    def sent(self, command: str) -> dict[str, Any]:
        """The last request of ``command`` sent to debugpy."""
        return next(m for m in reversed(self.to_debugpy) if m.get("command") == command)

    def statuses(self) -> list[StatusEntry]:
        return [e for e in self.published if isinstance(e, StatusEntry)]

    def dap(self) -> list[dict[str, Any]]:
        return [orjson.loads(e.body) for e in self.published if isinstance(e, DapEntry)]

    # --- from the relay ---------------------------------------------------------------------------

    def deliver(self, entry: DapEntry | PresenceEntry | ControlEntry) -> list[Action]:
        self.cursor += 1
        delivery = Deliver(
            stream=StreamName.TO_WORKER, cursor=f"{self.cursor}-0", entry=encode_entry(entry)
        )
        return self.perform(self.core.on_delivery(delivery))

    def ide(
        self, command: str, arguments: Any, seq: int, *, local: bool = False, origin: str = "ide1"
    ) -> list[Action]:
        msg: dict[str, Any] = {"seq": seq, "type": "request", "command": command}
        if arguments is not None:
            msg["arguments"] = arguments
        bp_ids = list(range(seq * 10, seq * 10 + 2)) if command == "setBreakpoints" else None
        entry = DapEntry(origin=origin, body=orjson.dumps(msg), local=local, bp_ids=bp_ids)
        return self.deliver(entry)

    def configure_ide(self) -> None:
        """An IDE's handshake, answered by the adapter (``local``), as the shim finds it."""
        self.ide("initialize", {"adapterID": "debugpy", "clientID": "vscode"}, 1, local=True)
        self.ide("attach", {"justMyCode": False}, 2, local=True)
        self.ide("setBreakpoints", bp_args(MAIN, [3]), 3, local=True)
        self.ide("setBreakpoints", bp_args(MAIN, [11, 17]), 4, local=True)  # replaces seq 3
        self.ide("setBreakpoints", bp_args(DATA, [5]), 5, local=True)
        self.ide("setFunctionBreakpoints", {"breakpoints": [{"name": "main"}]}, 6, local=True)
        self.ide("setExceptionBreakpoints", {"filters": ["uncaught"]}, 7, local=True)
        self.ide("configurationDone", None, 8, local=True)

    # --- from debugpy -----------------------------------------------------------------------------

    def from_debugpy(self, msg: dict[str, Any]) -> list[Action]:
        self.debugpy_seq += 1
        raw = orjson.dumps({"seq": self.debugpy_seq, **msg})
        return self.perform(self.core.on_debugpy_message(raw, self.answered))

    def respond(
        self, request: dict[str, Any], body: dict[str, Any] | None = None, *, success: bool = True
    ) -> list[Action]:
        msg: dict[str, Any] = {
            "type": "response",
            "request_seq": request["seq"],
            "success": success,
            "command": request["command"],
        }
        if body is None and request["command"] in ("setBreakpoints", "setFunctionBreakpoints"):
            body = {"breakpoints": []}
        if body is not None:
            msg["body"] = body
        if not success:
            msg["message"] = "no"
        return self.from_debugpy(msg)

    def event(self, name: str, body: dict[str, Any] | None = None) -> list[Action]:
        msg: dict[str, Any] = {"type": "event", "event": name}
        if body is not None:
            msg["body"] = body
        return self.from_debugpy(msg)

    def output(self, text: str, category: str = "console") -> list[Action]:
        return self.event("output", {"category": category, "output": text})

    def tick(self, to: float) -> list[Action]:
        self.clock.now = to
        return self.perform(self.core.on_tick())

    # --- whole phases -----------------------------------------------------------------------------

    def go_live(self) -> None:
        """A run that does not wait for an IDE, replayed with nothing configured."""
        self.perform(self.core.start(4242))
        self.respond(self.sent("initialize"), {"supportsConfigurationDoneRequest": True})
        self.event("initialized")
        self.respond(self.sent("configurationDone"))
        self.respond(self.sent("attach"))
        assert self.core.live
        self.to_debugpy.clear()
        self.published.clear()


def bp_args(path: str, lines: list[int]) -> dict[str, Any]:
    return {"source": {"path": path}, "breakpoints": [{"line": n} for n in lines]}


def live(**spec: Any) -> Harness:
    h = Harness(wait_for_ide=False, **spec)
    h.go_live()
    return h


# --- the replay -----------------------------------------------------------------------------------


def test_a_plain_run_attached_late_replays_without_saying_started_again() -> None:
    """A debuggable plain run an IDE attached to: the program has run since its ``started``;
    the replay waits for the IDE's configuration as a debug run's does, then goes on."""
    h = Harness(tail="8-0", debug=False)
    h.perform(h.core.start(4242, late=True))
    assert h.statuses() == []
    assert h.core.phase is ReplayPhase.FOLDING  # the IDE's configuration is still to come
    h.configure_ide()
    assert h.core.phase is ReplayPhase.INITIALIZING
    assert h.sent("initialize")["command"] == "initialize"


def test_a_post_mortem_run_stops_on_uncaught_exceptions_unless_the_ide_said_otherwise() -> None:
    """Nobody configured exception breakpoints: the worker asks for uncaught ones itself, and
    its answer is nobody's; an IDE's own choice (here: none at all) always wins."""
    h = Harness(wait_for_ide=False, post_mortem=True)
    h.perform(h.core.start(4242))
    h.respond(h.sent("initialize"), {"supportsConfigurationDoneRequest": True})
    h.event("initialized")
    own = h.sent("setExceptionBreakpoints")
    assert own["arguments"] == {"filters": ["uncaught"]}
    assert "configurationDone" not in [m["command"] for m in h.to_debugpy]
    h.respond(own, {"breakpoints": []})
    h.respond(h.sent("configurationDone"))
    h.respond(h.sent("attach"))
    assert h.core.live and h.dap() == []  # the worker's own request: nothing published

    h = Harness(post_mortem=True)
    h.perform(h.core.start(4242))
    h.configure_ide()
    h.ide("setExceptionBreakpoints", {"filters": []}, 9, local=True)  # the user turned it off
    h.respond(h.sent("initialize"), {})
    h.event("initialized")
    sent = [m for m in h.to_debugpy if m["command"] == "setExceptionBreakpoints"]
    assert [m["arguments"] for m in sent] == [{"filters": []}]


def test_the_replay_sends_the_latest_configuration_in_order_before_configuration_done() -> None:
    h = Harness(tail="8-0")
    h.perform(h.core.start(4242))
    [started] = h.statuses()
    assert started.event == StatusEvent.STARTED
    assert started.data == {"pid": 4242, "run_dir": RUN_DIR, "debugpy": "1.8.22", "attempt": 1}
    h.configure_ide()
    assert h.core.phase is ReplayPhase.INITIALIZING  # caught up with the stream, configured
    init = h.sent("initialize")
    assert init["arguments"]["clientID"] == "vscode"
    assert init["arguments"]["supportsRunInTerminalRequest"] is False
    assert init["arguments"]["supportsStartDebuggingRequest"] is True

    actions = h.respond(init, {**DEBUGPY_CAPABILITIES, "supportsStepBack": True})
    assert isinstance(actions[0], PipeOutputToIde)
    attach = h.sent("attach")["arguments"]
    assert attach["justMyCode"] is False
    assert attach["pathMappings"] == [{"localRoot": WORKDIR, "remoteRoot": RUN_DIR}]
    assert attach["redirectOutput"] is False and attach["isOutputRedirected"] is True
    assert h.core.phase is ReplayPhase.ATTACHING

    before = len(h.to_debugpy)
    h.event("initialized")
    batch = h.to_debugpy[before:]
    assert [(m["command"], m["arguments"].get("source", {}).get("path")) for m in batch] == [
        ("setBreakpoints", MAIN),
        ("setBreakpoints", DATA),
        ("setFunctionBreakpoints", None),
        ("setExceptionBreakpoints", None),
    ]
    assert batch[0]["arguments"] == bp_args(MAIN, [11, 17])  # the latest per source only
    seqs = [m["seq"] for m in h.to_debugpy]
    assert seqs == list(range(1, len(seqs) + 1))  # the shim's own numbering

    # debugpy's answers go to the adapter, under the seq the IDE side gave each request
    for msg in batch[:-1]:
        h.respond(msg)
        assert "configurationDone" not in [m["command"] for m in h.to_debugpy]
    h.respond(batch[-1])
    answers = [(e.origin, orjson.loads(e.body)["request_seq"]) for e in h.published[1:]]
    assert answers == [("ide1", 4), ("ide1", 5), ("ide1", 6), ("ide1", 7)]
    done = h.sent("configurationDone")

    h.respond(done)
    assert not h.core.live  # the attach is answered after configurationDone
    h.respond(h.sent("attach"))
    assert h.core.live
    live_status = h.statuses()[-1]
    assert live_status.event == StatusEvent.DEBUGGER_LIVE
    assert live_status.data == {"capabilities_delta": {"supportsStepBack": True}, "prefetch": True}


def test_configuration_folded_during_a_batch_goes_out_before_configuration_done() -> None:
    h = Harness(tail="8-0")
    h.perform(h.core.start(1))
    h.configure_ide()
    h.respond(h.sent("initialize"))
    before = len(h.to_debugpy)
    h.event("initialized")
    first = h.to_debugpy[before:]
    h.ide("setBreakpoints", bp_args(MAIN, [30]), 9, local=True)  # arrives meanwhile: folded
    assert len(h.to_debugpy) == before + len(first)
    for msg in first:
        h.respond(msg)
    again = h.sent("setBreakpoints")
    assert again["arguments"] == bp_args(MAIN, [30])
    assert "configurationDone" not in [m["command"] for m in h.to_debugpy]
    h.respond(again)
    assert h.to_debugpy[-1]["command"] == "configurationDone"


def test_the_run_waits_for_the_ides_configuration_unless_told_not_to() -> None:
    h = Harness()
    actions = h.perform(h.core.start(1))
    assert [s.event for s in h.statuses()] == [StatusEvent.STARTED, StatusEvent.WAITING_FOR_IDE]
    assert any(isinstance(a, Say) and "waiting for the IDE" in a.text for a in actions)
    assert h.to_debugpy == []
    h.ide("initialize", {"adapterID": "debugpy"}, 1, local=True)
    h.ide("setBreakpoints", bp_args(MAIN, [1]), 2, local=True)
    assert h.to_debugpy == []  # folded only
    h.ide("configurationDone", None, 3, local=True)
    assert h.sent("initialize")
    assert len(h.statuses()) == 2  # said once

    eager = Harness(wait_for_ide=False)
    eager.perform(eager.core.start(1))
    init = eager.sent("initialize")["arguments"]
    assert init["clientID"] == DEFAULT_INITIALIZE["clientID"] == "tether"
    assert [s.event for s in eager.statuses()] == [StatusEvent.STARTED]


def test_the_fold_waits_for_the_stream_it_found_stored() -> None:
    h = Harness(tail="2-0", wait_for_ide=False)
    h.perform(h.core.start(1))
    assert h.to_debugpy == []
    h.ide("setBreakpoints", bp_args(MAIN, [1]), 1, local=True)
    assert h.to_debugpy == []
    h.ide("setBreakpoints", bp_args(MAIN, [2]), 2, local=True)
    assert h.sent("initialize")


def test_requests_while_the_replay_finishes_are_forwarded_once_live() -> None:
    h = Harness(wait_for_ide=False)
    h.perform(h.core.start(1))
    h.respond(h.sent("initialize"))
    h.event("initialized")
    assert h.core.phase is ReplayPhase.FINISHING
    h.ide("threads", None, 50)
    assert "threads" not in [m["command"] for m in h.to_debugpy]
    h.respond(h.sent("configurationDone"))
    actions = h.respond(h.sent("attach"))
    kinds = [type(a) for a in actions]
    assert kinds.index(Publish) < kinds.index(ToDebugpy)  # after ``debugger_live``
    assert h.sent("threads")


def test_a_refused_or_unanswered_handshake_fails_the_start() -> None:
    h = Harness(wait_for_ide=False)
    h.perform(h.core.start(1))
    [failed] = h.respond(h.sent("initialize"), success=False)
    assert isinstance(failed, ReplayFailed) and not failed.timed_out
    assert "initialize" in failed.detail

    slow = Harness(wait_for_ide=False)
    slow.perform(slow.core.start(1))
    assert slow.core.next_deadline == slow.clock.now + HANDSHAKE_TIMEOUT
    assert slow.tick(slow.clock.now + HANDSHAKE_TIMEOUT - 1) == []
    [timeout] = slow.tick(slow.clock.now + 1)
    assert isinstance(timeout, ReplayFailed) and timeout.timed_out
    assert slow.core.next_deadline is None


# --- live routing ---------------------------------------------------------------------------------


def test_responses_go_back_under_the_ides_seq_and_origin() -> None:
    h = live()
    h.ide("evaluate", {"expression": "1+1"}, 77, origin="adapterA")
    h.ide("threads", None, 77, origin="adapterB")  # the same seq from another adapter
    evaluate, threads = h.to_debugpy
    assert evaluate["seq"] != threads["seq"]
    actions = h.respond(threads, {"threads": [{"id": 1, "name": "MainThread"}]})
    assert isinstance(actions[0], Settle)  # the program's output first
    h.respond(evaluate, {"result": "2", "variablesReference": 0})
    [(t_origin, t_msg), (e_origin, e_msg)] = [
        (e.origin, orjson.loads(e.body)) for e in h.published if isinstance(e, DapEntry)
    ]
    assert (t_origin, t_msg["request_seq"], t_msg["command"]) == ("adapterB", 77, "threads")
    assert (e_origin, e_msg["request_seq"], e_msg["command"]) == ("adapterA", 77, "evaluate")
    assert all(e.transient for e in h.published if isinstance(e, DapEntry))
    # an answer to nothing the shim sent, or a second answer: dropped
    assert h.respond(evaluate) == []
    assert h.respond({"seq": 999, "command": "threads"}) == []


def test_what_is_not_forwarded() -> None:
    h = live()
    h.ide("initialize", {"adapterID": "x"}, 1, local=True)  # answered by the adapter
    h.ide("evaluate", [1], 2)  # arguments not an object
    h.deliver(DapEntry(origin="x", body=b"not json"))
    assert h.to_debugpy == []
    h.ide("setBreakpoints", bp_args(MAIN, [2]), 3, local=True)  # configuration always goes
    assert h.sent("setBreakpoints")["arguments"] == bp_args(MAIN, [2])


def test_reverse_requests_are_refused() -> None:
    h = live()
    args = {"kind": "integrated", "args": ["python"], "cwd": "/"}
    h.from_debugpy({"type": "request", "command": "runInTerminal", "arguments": args})
    [refusal] = h.to_debugpy
    assert refusal["type"] == "response" and refusal["success"] is False
    assert refusal["request_seq"] == h.debugpy_seq and refusal["command"] == "runInTerminal"
    assert h.published == []


def test_events_about_the_shims_own_connection_are_dropped() -> None:
    h = live()
    for name in ("initialized", "debugpySockets", "debugpyWaitingForServer"):
        assert h.event(name, {}) == []
    assert h.output("{}", "telemetry") == []
    assert h.published == []
    assert not h.core.finished
    assert h.event("terminated") == []
    assert h.core.finished
    actions = h.event("stopped", {"reason": "breakpoint", "threadId": 1})
    assert isinstance(actions[0], Settle)
    h.event("module", {"reason": "new", "module": {"id": 1, "name": "m"}})
    stopped, module = h.published
    assert isinstance(stopped, DapEntry) and not stopped.transient
    assert isinstance(module, DapEntry) and module.transient


# --- output ---------------------------------------------------------------------------------------


def test_output_is_held_while_the_previous_one_is_unanswered_then_merged() -> None:
    h = live()
    [published] = [a for a in h.output("a") if isinstance(a, Publish)]
    assert published.output and h.core.output_in_flight == h.n
    assert h.output("b") == [] and h.output("c") == []  # the relay has not answered "a"
    assert h.core.output_held
    h.answered = h.n
    h.perform(h.core.flush_output())
    assert [m["body"]["output"] for m in h.dap()] == ["a", "bc"]
    assert not h.core.output_held


def test_other_messages_wait_for_held_output() -> None:
    h = live()
    h.output("a")
    h.output("b")
    h.event("stopped", {"reason": "step", "threadId": 1})
    assert [m.get("event") for m in h.dap()] == ["output", "output", "stopped"]
    h.answered = h.n
    h.output("c")  # answered: goes at once
    assert h.dap()[-1]["body"]["output"] == "c"


# --- terminate ------------------------------------------------------------------------------------


def test_terminate_is_for_this_attempt_and_once() -> None:
    h = live(attempt=2)
    assert h.deliver(ControlEntry(action="terminate", attempt=1)) == []  # an earlier attempt's
    actions = h.deliver(ControlEntry(action="terminate", attempt=2))
    assert [type(a) for a in actions] == [Say, Terminate]
    assert h.deliver(ControlEntry(action="terminate", attempt=0)) == []


def test_a_terminate_before_the_replay_means_no_replay() -> None:
    h = Harness()
    h.perform(h.core.start(1))
    h.deliver(ControlEntry(action="terminate"))
    h.ide("configurationDone", None, 1, local=True)
    assert h.to_debugpy == []
    h.perform(h.core.debugpy_closed())
    assert h.core.phase is ReplayPhase.ENDED and h.core.finished


# --- statuses -------------------------------------------------------------------------------------


@pytest.mark.parametrize(("code", "retries", "final"), [(0, 3, True), (1, 3, False), (1, 0, True)])
def test_the_exit_status_says_whether_another_attempt_follows(
    code: int, retries: int, final: bool
) -> None:
    record = RunRecord(id="r", spec=RunSpec(command=["x"], workdir="/w", max_retries=retries))
    entry = exit_status(record, code, wall=lambda: WALL)
    assert (entry.event, entry.exit_code, entry.data["final"], entry.at) == (
        StatusEvent.EXITED,
        code,
        final,
        WALL,
    )


def test_the_replay_phases_are_a_table() -> None:
    assert set(TRANSITIONS) == set(ReplayPhase)
    assert (
        next_phase(ReplayPhase.FOLDING, ReplayPhase.INITIALIZING, "x") is ReplayPhase.INITIALIZING
    )
    with pytest.raises(IllegalTransition, match="closed in phase live cannot lead to folding"):
        next_phase(ReplayPhase.LIVE, ReplayPhase.FOLDING, "closed")
    # every phase before live can end (debugpy gone, terminated, refused, timed out)
    assert all(
        ReplayPhase.ENDED in TRANSITIONS[p]
        for p in set(ReplayPhase) - {ReplayPhase.LIVE, ReplayPhase.ENDED}
    )
