"""One IDE session per debugged process: :class:`adapter.dap.processes.Processes` stepped message by
message (no sockets, a hand-driven clock): which children the main IDE is offered, and when; then
the server serving a child's connection beside the main one over memory streams. A child's own
session: ``test_adapter_child_sessions.py``.

Every message sent to an IDE is checked against the official DAP schema, and every connection's
messages are numbered 1, 2, 3, ... whichever session numbered them
(``tests/adapter_processes_harness.py``).
"""

from __future__ import annotations

from typing import Any

import orjson
import trio
import trio.testing
from adapter_processes_harness import CHILD, Desk, names
from test_adapter_server import FakeLink, Ide, connect

from adapter.dap.core import AdapterCore
from adapter.dap.server import AdapterServer
from protocol_specs.dap.framing import encode_message
from protocol_specs.session.processes import ProcessInfo
from protocol_specs.session.session import StatusEvent
from protocol_specs.wire.wire import DapEntry, StatusEntry

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
