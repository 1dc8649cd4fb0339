"""The adapter's routing core, stepped message by message (no sockets, a hand-driven clock): the
handshake while queued, requests forwarded and answered, IDE connections, the run's end, unattended
stops and protocol details users noticed. Arguments of every JSON type and memory:
``test_adapter_core_arguments.py``.

Every message the core sends to the IDE is checked against the official DAP schema
(``tests/adapter_core_harness.py``).
"""

from __future__ import annotations

import orjson
import pytest
from adapter_core_harness import DATA, MAIN, Harness, bp_args, kinds, live_harness

from adapter.dap.core import (
    ADAPTER_CAPABILITIES,
    CancelRun,
    CloseIde,
    IdePhase,
    Publish,
)
from protocol_specs.session.session import StatusEvent
from protocol_specs.wire.wire import DapEntry, PresenceEntry, StatusEntry, StreamName


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


def test_a_reattach_replays_an_all_threads_stop_once_on_the_thread_that_stopped() -> None:
    """debugpy says "thread 1 stopped, and every thread with it" in one event; replayed once per
    thread, the last (a DataLoader's queue feeder) would take the IDE's focus from thread 1."""
    h = live_harness()
    for tid in (1, 2, 3):
        h.event("thread", {"reason": "started", "threadId": tid})
    h.event("stopped", {"reason": "breakpoint", "threadId": 1, "allThreadsStopped": True})
    h.sent(h.core.ide_disconnected(h.core.generation))
    h.connect()
    out = h.request("initialize", {"adapterID": "debugpy"})
    out += h.request("attach", {})
    out += h.request("configurationDone")
    stops = [m["body"] for m in out if m.get("event") == "stopped"]
    assert stops == [{"reason": "breakpoint", "threadId": 1, "allThreadsStopped": True}]
    assert [m["body"]["threadId"] for m in out if m.get("event") == "thread"] == [1, 2, 3]


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


@pytest.mark.parametrize("supported", [True, False])
def test_invalidated_reaches_only_a_client_that_takes_it(supported: bool) -> None:
    """The worker says a rank's variables changed (an ``@all`` ran code there): the IDE hears it
    only if its ``initialize`` said ``supportsInvalidatedEvent`` (the spec's rule)."""
    h = Harness()
    h.connect()
    h.handshake(**({"supportsInvalidatedEvent": True} if supported else {}))
    out = h.event("invalidated", {"areas": ["variables"]})
    assert [m.get("event") for m in out] == (["invalidated"] if supported else [])
