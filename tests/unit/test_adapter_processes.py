"""One IDE session per debugged process: :class:`adapter.dap.processes.Processes` stepped message by
message (no sockets, a hand-driven clock), then the server serving a child's connection beside
the main one over memory streams.

Every message sent to an IDE is checked against the official DAP schema, and every connection's
messages are numbered 1, 2, 3, ... whichever session numbered them.
"""

from __future__ import annotations

from collections import defaultdict
from typing import Any

import orjson
import pytest
import trio
import trio.testing
from hand_clock import HandClock
from test_adapter_server import FakeLink, Ide, connect

from adapter.dap.actions import Say
from adapter.dap.core import Action, AdapterCore, CancelRun, CloseIde, Publish, ToIde
from adapter.dap.processes import Processes
from adapter.dap.server import AdapterServer
from protocol_specs.dap_framing import encode_message
from protocol_specs.dap_schema import validate_message
from protocol_specs.processes import COLLECTIVE_TIMEOUT_HINT, ProcessInfo
from protocol_specs.session import PLACES_EVENT, StatusEvent
from protocol_specs.wire import DapEntry, PresenceEntry, StatusEntry, StreamName

CHILD = "4242"
ATTACH = {
    "name": "tether: r1",
    "type": "debugpy",
    "request": "attach",
    "connect": {"host": "127.0.0.1", "port": 7777},
    "justMyCode": False,
    "pathMappings": [{"localRoot": "/home/me/project", "remoteRoot": "."}],
    "processId": 17,
    "restart": True,
    "preLaunchTask": "build",
}


class Desk:
    """IDE connections on one side of the sessions, the relay on the other."""

    def __init__(self, mode: str = "stopped", port: int = 7777) -> None:
        self.clock = HandClock()
        self.main = AdapterCore("r1", origin="me", clock=self.clock)
        self.processes = Processes(self.main, mode=mode, port=port)
        self.seen: dict[int, list[dict[str, Any]]] = defaultdict(list)
        self.published: list[DapEntry] = []
        self.presence: list[PresenceEntry] = []
        self.closed: list[int] = []
        self.cancelled: list[str] = []
        self.said: list[str] = []  #: lines for the terminal
        self.seq: dict[int, int] = defaultdict(lambda: 100)  # the IDEs number from 101

    def perform(self, actions: list[Action]) -> None:
        for action in actions:
            if isinstance(action, ToIde):
                validate_message(action.message)
                seen = self.seen[action.generation]
                assert action.message["seq"] == len(seen) + 1, (action, seen)
                seen.append(action.message)
            elif isinstance(action, Publish):
                if isinstance(action.entry, PresenceEntry):
                    self.presence.append(action.entry)
                else:
                    self.published.append(action.entry)
            elif isinstance(action, CloseIde):
                self.closed.append(action.generation)
            elif isinstance(action, CancelRun):
                self.cancelled.append(action.detail)
            elif isinstance(action, Say):
                self.said.append(action.text)

    # --- the IDE side -----------------------------------------------------------------------------

    def connect(self) -> int:
        return self.processes.connected()

    def request(self, ide: int, command: str, arguments: Any = None) -> int:
        self.seq[ide] += 1
        msg: dict[str, Any] = {"seq": self.seq[ide], "type": "request", "command": command}
        if arguments is not None:
            msg["arguments"] = arguments
        self.perform(self.processes.on_ide_message(ide, msg))
        return self.seq[ide]

    def answer(self, ide: int, request: dict[str, Any], success: bool = True) -> None:
        self.seq[ide] += 1
        msg = {
            "seq": self.seq[ide],
            "type": "response",
            "request_seq": request["seq"],
            "command": request["command"],
            "success": success,
        }
        if not success:
            msg["message"] = "no debugger extension for this configuration"
        self.perform(self.processes.on_ide_message(ide, msg))

    def attach(self, attach: dict[str, Any] | None = None, **init: Any) -> int:
        ide = self.connect()
        self.request(ide, "initialize", {"adapterID": "debugpy", **init})
        self.request(ide, "attach", attach if attach is not None else ATTACH)
        self.request(ide, "configurationDone")
        return ide

    def attach_child(self, key: str = CHILD) -> int:
        return self.attach({**ATTACH, "subProcessId": int(key)})

    def disconnect(self, ide: int) -> None:
        self.perform(self.processes.ide_disconnected(ide))

    def new(self, ide: int) -> list[dict[str, Any]]:
        """What ``ide`` was sent since the last call."""
        seen = self.seen[ide]
        fresh = seen[getattr(self, f"_read_{ide}", 0) :]
        setattr(self, f"_read_{ide}", len(seen))
        return fresh

    def responses(self, ide: int) -> dict[int, dict[str, Any]]:
        return {m["request_seq"]: m for m in self.seen[ide] if m["type"] == "response"}

    def offers(self, ide: int) -> list[dict[str, Any]]:
        return [
            m
            for m in self.seen[ide]
            if m.get("command") == "startDebugging" or m.get("event") == "debugpyAttach"
        ]

    # --- the relay side ---------------------------------------------------------------------------

    def deliver(
        self, entry: DapEntry | StatusEntry, stream: StreamName = StreamName.TO_IDE
    ) -> None:
        self.perform(self.processes.on_delivery(stream, entry))

    def live(self) -> None:
        self.deliver(StatusEntry(event=StatusEvent.STARTED))
        self.deliver(StatusEntry(event=StatusEvent.DEBUGGER_LIVE))

    def started(self, key: str = CHILD, **info: Any) -> None:
        data = ProcessInfo(key=key, pid=int(key), host="gpu-node-7", **info).model_dump()
        self.deliver(StatusEntry(event=StatusEvent.PROCESS_STARTED, process=key, data=data))

    def event(self, name: str, body: dict[str, Any], key: str = CHILD) -> None:
        msg = {"seq": 7, "type": "event", "event": name, "body": body}
        self.deliver(DapEntry(body=orjson.dumps(msg), process=key))

    def stopped(self, key: str = CHILD, tid: int = 1) -> None:
        self.event("thread", {"reason": "started", "threadId": tid}, key)
        body = {"reason": "breakpoint", "threadId": tid, "allThreadsStopped": True}
        self.event("stopped", body, key)

    def respond(self, entry: DapEntry, body: dict[str, Any] | None = None) -> None:
        """The worker's answer to a published request, addressed as the worker addresses it."""
        req = orjson.loads(entry.body)
        msg: dict[str, Any] = {
            "seq": 900,
            "type": "response",
            "request_seq": req["seq"],
            "success": True,
            "command": req["command"],
        }
        if body is not None:
            msg["body"] = body
        self.deliver(DapEntry(origin=entry.origin, body=orjson.dumps(msg), process=entry.process))

    def last_published(self, command: str) -> DapEntry:
        return next(
            e for e in reversed(self.published) if orjson.loads(e.body).get("command") == command
        )


def names(messages: list[dict[str, Any]]) -> list[str]:
    return [m.get("event") or m.get("command") or "" for m in messages]


# --- offers -------------------------------------------------------------------------------------


def test_a_child_is_offered_when_it_first_stops() -> None:
    d = Desk()
    main = d.attach(supportsStartDebuggingRequest=True)
    d.live()
    d.started(rank=1, world_size=2)
    d.event("thread", {"reason": "started", "threadId": 1})
    assert d.offers(main) == []  # running: no session for it yet (8 ranks, 8 sessions)
    d.stopped()
    [offer] = d.offers(main)
    assert offer["type"] == "request" and offer["arguments"]["request"] == "attach"
    assert offer["arguments"]["configuration"] == {
        "name": "rank 1 (pid 4242) on gpu-node-7",
        "type": "debugpy",
        "request": "attach",
        "connect": {"host": "127.0.0.1", "port": 7777},
        "justMyCode": False,
        "pathMappings": [{"localRoot": "/home/me/project", "remoteRoot": "."}],
        "subProcessId": 4242,
    }
    d.answer(main, offer)  # swallowed: the core never sees it
    d.new(main)
    d.event("continued", {"threadId": 1, "allThreadsContinued": True})
    d.stopped()
    assert len(d.offers(main)) == 1 and d.new(main) == []  # once per process per connection
    assert d.seen.keys() == {main}  # the child's events reached no IDE


def test_with_processes_all_a_child_is_offered_when_it_starts() -> None:
    d = Desk(mode="all")
    main = d.attach(supportsStartDebuggingRequest=True)
    d.live()
    d.started()
    [offer] = d.offers(main)
    assert (
        offer["arguments"]["configuration"]["name"]
        == "worker of the main process (pid 4242) on gpu-node-7"
    )
    d.stopped()
    assert len(d.offers(main)) == 1


def test_with_processes_main_no_child_is_offered() -> None:
    d = Desk(mode="main")
    main = d.attach(supportsStartDebuggingRequest=True)
    d.live()
    d.started()
    d.stopped()
    assert d.offers(main) == []
    later = d.attach(supportsStartDebuggingRequest=True)
    assert d.offers(later) == []


def test_a_client_without_start_debugging_gets_the_debugpy_attach_event() -> None:
    d = Desk()
    main = d.attach()  # its initialize did not say supportsStartDebuggingRequest
    d.live()
    d.started()
    d.stopped()
    [offer] = d.offers(main)
    assert offer["type"] == "event" and offer["body"]["subProcessId"] == 4242
    assert offer["body"]["connect"] == {"host": "127.0.0.1", "port": 7777}


def test_the_offer_names_the_port_the_main_ide_attached_to_when_none_is_known() -> None:
    d = Desk(port=0)
    main = d.attach({"connect": {"host": "localhost", "port": 5999}})
    d.live()
    d.started()
    d.stopped()
    [offer] = d.offers(main)
    assert offer["body"]["connect"] == {"host": "127.0.0.1", "port": 5999}


def test_a_main_ide_that_attaches_later_is_offered_every_paused_child() -> None:
    d = Desk()
    d.live()
    d.started("4242")
    d.started("4243")
    d.stopped("4242")  # nobody to offer it to yet
    main = d.attach(supportsStartDebuggingRequest=True)
    offered = [o["arguments"]["configuration"]["subProcessId"] for o in d.offers(main)]
    assert offered == [4242]  # 4243 runs: not offered
    assert names(d.seen[main])[-1] == "startDebugging"  # after the greeting
    again = d.attach(supportsStartDebuggingRequest=True)  # a new main connection: offered again
    assert len(d.offers(again)) == 1 and main in d.closed


def test_with_processes_all_a_main_ide_that_attaches_later_is_offered_every_live_child() -> None:
    d = Desk(mode="all")
    d.live()
    d.started("4242")
    d.started("4243")
    d.deliver(StatusEntry(event=StatusEvent.PROCESS_EXITED, process="4243", exit_code=0))
    main = d.attach(supportsStartDebuggingRequest=True)
    assert [o["arguments"]["configuration"]["subProcessId"] for o in d.offers(main)] == [4242]


def test_a_refused_offer_is_said_once_in_the_main_console() -> None:
    d = Desk()
    main = d.attach(supportsStartDebuggingRequest=True)
    d.live()
    for key in ("4242", "4243"):
        d.started(key)
        d.stopped(key)
    first, second = d.offers(main)
    d.new(main)
    d.answer(main, first, success=False)
    d.answer(main, second, success=False)
    [said] = d.new(main)
    assert said["event"] == "output" and "(pid 4242)" in said["body"]["output"]
    assert "no debugger extension" in said["body"]["output"]


# --- a child's session --------------------------------------------------------------------------


def test_a_child_connection_is_an_extra_session_with_its_own_traffic() -> None:
    d = Desk()
    main = d.attach(supportsStartDebuggingRequest=True)
    d.live()
    d.started()
    d.stopped()
    published = len(d.published)
    child = d.attach_child()
    assert main not in d.closed and d.main.configured  # not a takeover
    assert names(d.seen[child])[:2] == ["initialize", "initialized"]
    assert {"thread", "stopped"} <= set(names(d.seen[child]))  # the stop it was offered for
    assert len(d.published) == published  # its handshake is not the worker's business
    assert d.presence[-1].attached
    d.new(main)
    seq = d.request(child, "stackTrace", {"threadId": 1})
    entry = d.last_published("stackTrace")
    assert (entry.process, entry.origin, entry.local) == (CHILD, "me", False)
    assert orjson.loads(entry.body)["seq"] != seq  # rewritten into the adapter's seq space
    d.respond(entry, {"stackFrames": [], "totalFrames": 0})
    answer = d.responses(child)[seq]
    assert answer["success"] and answer["command"] == "stackTrace"
    assert d.new(main) == []  # the main IDE saw none of it
    # the main session is unaffected: its own requests go to the main process
    main_seq = d.request(main, "threads")
    main_entry = d.last_published("threads")
    assert main_entry.process == ""
    d.respond(main_entry, {"threads": [{"id": 5, "name": "MainThread"}]})
    assert d.responses(main)[main_seq]["body"]["threads"][0]["id"] == 5
    assert not any(m.get("command") == "threads" for m in d.seen[child])


def test_a_child_sessions_breakpoints_are_forwarded_for_its_process() -> None:
    d = Desk()
    d.attach()
    d.live()
    d.started()
    child = d.attach_child()
    args = {"source": {"path": "/home/me/project/worker.py"}, "breakpoints": [{"line": 9}]}
    seq = d.request(child, "setBreakpoints", args)
    entry = d.last_published("setBreakpoints")
    assert (entry.process, entry.local, entry.bp_ids) == (CHILD, False, [1])
    d.respond(entry, {"breakpoints": [{"id": 77, "verified": True, "line": 9}]})
    assert d.responses(child)[seq]["body"]["breakpoints"] == [
        {"id": 1, "verified": True, "line": 9}
    ]


def test_a_childs_stop_names_the_ids_its_own_session_gave_also_after_a_reattach() -> None:
    """The worker configured the child with the run's breakpoints before its session existed
    (debugpy's ids 31 and 32 there); its stop names them by the ids the child session's own
    ``setBreakpoints`` answered, to this IDE and to the next one."""
    d = Desk()
    d.attach()
    d.live()
    d.started()
    path = "/home/me/project/worker.py"
    places = {"command": "setBreakpoints", "source": path, "keys": [8, 9], "ids": [31, 32]}
    d.event(PLACES_EVENT, places)
    d.event("thread", {"reason": "started", "threadId": 1})
    d.event("stopped", {"reason": "breakpoint", "threadId": 1, "hitBreakpointIds": [32]})
    for _ in range(2):  # the IDE that attaches, then one that attaches again
        child = d.connect()
        d.request(child, "initialize", {"adapterID": "debugpy"})
        d.request(child, "attach", {**ATTACH, "subProcessId": int(CHILD)})
        args = {"source": {"path": path}, "breakpoints": [{"line": 9}, {"line": 12}]}
        seq = d.request(child, "setBreakpoints", args)
        answer = [{"id": 40, "verified": True}, {"id": 41, "verified": True}]
        d.respond(d.last_published("setBreakpoints"), {"breakpoints": answer})
        ids = [bp["id"] for bp in d.responses(child)[seq]["body"]["breakpoints"]]
        d.request(child, "configurationDone")
        [stopped] = [m for m in d.seen[child] if m.get("event") == "stopped"]
        assert stopped["body"]["hitBreakpointIds"] == [ids[0]]
        assert PLACES_EVENT not in names(d.seen[child])
        d.disconnect(child)
    # live, to the IDE attached: the same
    child = d.attach_child()
    d.event("continued", {"threadId": 1, "allThreadsContinued": True}, CHILD)
    d.event("stopped", {"reason": "breakpoint", "threadId": 1, "hitBreakpointIds": [41, 31]})
    stopped = d.new(child)[-1]
    assert stopped["event"] == "stopped" and stopped["body"]["hitBreakpointIds"] == [ids[1]]


def test_a_second_connection_for_a_child_takes_its_session_over() -> None:
    d = Desk()
    main = d.attach()
    d.live()
    d.started()
    first = d.attach_child()
    second = d.attach_child()
    assert d.closed == [first]  # the child's previous connection, and nothing else
    assert d.main.configured and d.processes.core_of(main) is d.main
    d.stopped()
    assert "stopped" in names(d.seen[second]) and "stopped" not in names(d.seen[first])


def test_reattach_to_a_paused_child_replays_its_stop() -> None:
    d = Desk()
    d.attach()
    d.live()
    d.started()
    d.stopped(tid=3)
    first = d.attach_child()
    d.perform(
        d.processes.on_ide_message(first, {"seq": 50, "type": "request", "command": "disconnect"})
    )
    assert first in d.closed and not d.cancelled
    d.disconnect(first)
    again = d.attach_child()
    events = [m for m in d.seen[again] if m["type"] == "event"]
    assert [(m["event"], m.get("body", {}).get("threadId")) for m in events[-2:]] == [
        ("thread", 3),
        ("stopped", 3),
    ]


def test_a_child_session_ends_when_its_process_exits() -> None:
    d = Desk()
    main = d.attach()
    d.live()
    d.started()
    child = d.attach_child()
    seq = d.request(child, "threads")
    d.new(main)
    d.new(child)
    d.deliver(StatusEntry(event=StatusEvent.PROCESS_EXITED, process=CHILD, exit_code=3))
    fresh = d.new(child)
    assert d.responses(child)[seq]["success"] is False  # answered, exactly once
    assert names(fresh)[-2:] == ["exited", "terminated"] and fresh[-2]["body"]["exitCode"] == 3
    assert d.new(main) == []
    d.disconnect(child)
    late = d.connect()  # the process is gone: nothing to attach to, nothing taken over
    d.request(late, "initialize", {"adapterID": "debugpy"})
    seq = d.request(late, "attach", {**ATTACH, "subProcessId": 4242})
    assert d.responses(late)[seq]["success"] is False and d.main.configured


def test_the_end_of_the_run_ends_every_child_session() -> None:
    d = Desk()
    main = d.attach()
    d.live()
    d.started("4242")
    d.started("4243")
    children = [d.attach_child("4242"), d.attach_child("4243")]
    d.deliver(StatusEntry(event=StatusEvent.EXITED, exit_code=0))
    for child in children:
        assert names(d.seen[child])[-1] == "terminated"
    assert names(d.seen[main])[-1] == "terminated"


def test_a_child_session_never_cancels_the_run() -> None:
    d = Desk()
    d.attach()
    d.live()
    d.started()
    child = d.attach_child()
    published = len(d.published)
    seq = d.request(child, "terminate")
    assert d.responses(child)[seq]["success"] and names(d.seen[child])[-1] == "terminated"
    seq = d.request(child, "disconnect", {"terminateDebuggee": True})
    assert d.responses(child)[seq]["success"] and child in d.closed
    assert not d.cancelled and len(d.published) == published


def test_a_disconnect_before_attach_takes_nothing_over() -> None:
    d = Desk()
    main = d.attach()
    stray = d.connect()
    d.request(stray, "initialize", {"adapterID": "debugpy"})
    seq = d.request(stray, "disconnect")
    assert d.responses(stray)[seq]["success"] and d.closed == [stray] and d.main.configured
    assert d.processes.core_of(main) is d.main


@pytest.mark.parametrize(("world_size", "hinted"), [(2, True), (None, False)])
def test_a_paused_rank_of_a_distributed_job_is_warned_once(
    world_size: int | None, hinted: bool
) -> None:
    d = Desk()
    d.attach()
    d.live()
    d.started(rank=1, world_size=world_size)
    child = d.attach_child()
    d.stopped()
    d.event("continued", {"threadId": 1, "allThreadsContinued": True})
    d.stopped()
    hints = [
        m for m in d.seen[child] if COLLECTIVE_TIMEOUT_HINT in m.get("body", {}).get("output", "")
    ]
    assert len(hints) == (1 if hinted else 0)
    # the terminal hears it too, once, whether an IDE shows the child or not
    paused = StatusEntry(event=StatusEvent.PAUSED, process=CHILD, data={"where": "w.py:3"})
    d.deliver(paused)
    d.deliver(paused)
    assert d.said == (
        [f"rank 1 (pid 4242) on gpu-node-7 is paused: {COLLECTIVE_TIMEOUT_HINT}"] if hinted else []
    )


def test_deliveries_go_to_the_session_of_their_process() -> None:
    d = Desk()
    main = d.attach()
    d.live()
    d.started()
    child = d.attach_child()
    d.new(main)
    d.new(child)
    d.event("output", {"category": "stdout", "output": "main\n"}, key="")
    d.event("thread", {"reason": "started", "threadId": 8})
    assert names(d.new(main)) == ["output"]
    assert names(d.new(child)) == ["thread"]


# --- the server ---------------------------------------------------------------------------------


async def test_the_server_serves_a_child_connection_beside_the_main_one(
    autojump_clock: trio.testing.MockClock,
) -> None:
    link = FakeLink()
    core = AdapterCore("r1", origin="me", clock=trio.current_time)
    server = AdapterServer("ws://127.0.0.1:9", link, core, port=7777)
    async with trio.open_nursery() as nursery:
        nursery.start_soon(server.run, [])
        main = connect(server, nursery)
        await handshake(main, {"adapterID": "debugpy", "supportsStartDebuggingRequest": True})
        await link.deliver(StatusEntry(event=StatusEvent.DEBUGGER_LIVE))
        data = ProcessInfo(key=CHILD, pid=4242, rank=1, world_size=2).model_dump()
        await link.deliver(StatusEntry(event=StatusEvent.PROCESS_STARTED, process=CHILD, data=data))
        for name, body in (
            ("thread", {"reason": "started", "threadId": 1}),
            ("stopped", {"reason": "breakpoint", "threadId": 1, "allThreadsStopped": True}),
        ):
            msg = {"seq": 3, "type": "event", "event": name, "body": body}
            await link.deliver(DapEntry(body=orjson.dumps(msg), process=CHILD))
        while (offer := await main.receive()) is not None:
            if offer["type"] == "request" and offer["command"] == "startDebugging":
                break
        assert offer is not None
        configuration = offer["arguments"]["configuration"]
        assert configuration["subProcessId"] == 4242
        assert configuration["connect"] == {"host": "127.0.0.1", "port": 7777}
        answer = {"type": "response", "request_seq": offer["seq"], "success": True}
        await send(main, {**answer, "command": "startDebugging", "seq": 50})

        child = connect(server, nursery)  # as VS Code does: a new connection, that configuration
        await handshake(child, {"adapterID": "debugpy"}, configuration)
        stopped = await child.until("event", "stopped")
        assert stopped["body"]["threadId"] == 1
        await child.until("output", "time out")  # a paused rank of a torch.distributed job
        seq = await child.send("stackTrace", {"threadId": 1})
        await trio.testing.wait_all_tasks_blocked()
        entry = link.published[-1]
        assert isinstance(entry, DapEntry) and entry.process == CHILD
        request = orjson.loads(entry.body)
        response = {
            "seq": 9,
            "type": "response",
            "request_seq": request["seq"],
            "success": True,
            "command": "stackTrace",
            "body": {"stackFrames": [], "totalFrames": 0},
        }
        await link.deliver(DapEntry(origin="me", body=orjson.dumps(response), process=CHILD))
        got = await child.until("response", "stackTrace")
        assert got["request_seq"] == seq and got["success"]
        assert server._ide is not None and server.core.configured  # the main IDE is still there
        await link.deliver(
            StatusEntry(event=StatusEvent.PROCESS_EXITED, process=CHILD, exit_code=0)
        )
        await child.until("event", "terminated")
        seq = await main.send("threads")  # the main session goes on
        await trio.testing.wait_all_tasks_blocked()
        response = {**response, "command": "threads", "body": {"threads": []}}
        asked = link.published[-1]
        assert isinstance(asked, DapEntry) and asked.process == ""
        response["request_seq"] = orjson.loads(asked.body)["seq"]
        await link.deliver(DapEntry(origin="me", body=orjson.dumps(response)))
        assert (await main.until("response", "threads"))["request_seq"] == seq
        assert all(m.get("command") != "threads" for m in child.seen)
        nursery.cancel_scope.cancel()


async def send(ide: Ide, msg: dict[str, Any]) -> None:
    await ide.stream.send_all(encode_message(msg))


async def handshake(
    ide: Ide, initialize: dict[str, Any], attach: dict[str, Any] | None = None
) -> None:
    assert (await ide.request("initialize", initialize))["success"]
    await ide.send("attach", attach or {})
    await ide.until("event", "initialized")
    assert (await ide.request("configurationDone"))["success"]
