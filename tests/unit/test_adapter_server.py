"""The adapter's trio loop (:class:`adapter.dap.server.AdapterServer`) driven over memory streams
and loopback sockets, with a fake relay link beside the real one (:class:`FakeLink`).

What is tested here is what the sans-I/O core cannot show: an IDE that stops reading stalls
nothing (not the relay link's deliveries, not another IDE taking over), what it has yet to read is
bounded, and the adapter keeps nothing of the requests it published once the relay has them.
"""

from __future__ import annotations

import gc
import socket
import tracemalloc
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from typing import Any

import orjson
import trio
import trio.testing

from adapter.dap.core import AdapterCore
from adapter.dap.outbox import OUTPUT_LIMIT
from adapter.dap.server import AdapterServer
from protocol_specs.dap.framing import DapFramer, encode_message
from protocol_specs.dap.schema import validate_message
from protocol_specs.session.session import StatusEvent
from protocol_specs.wire import wire
from protocol_specs.wire.wire import DapEntry, StatusEntry, StreamName


class FakeLink:
    """The relay link as the server sees it (:class:`adapter.dap.server.AdapterLink`): deliveries
    through a channel as bounded as the real one's, every publish stored and answered at once.
    It keeps what it was given only if asked to (``keep``)."""

    def __init__(self, *, keep: bool = True) -> None:
        self._send, self._receive = trio.open_memory_channel[wire.Deliver](256)
        self.keep = keep
        self.published: list[wire.AnyEntry] = []
        self.count = 0
        self._cursor = 0
        self._published = trio.Event()

    @property
    def deliveries(self) -> trio.MemoryReceiveChannel[wire.Deliver]:
        return self._receive

    @property
    def tails(self) -> dict[str, str]:
        return {}

    @property
    def answered(self) -> int:
        return self.count

    @property
    def failed(self) -> Exception | None:
        return None

    async def publish(self, entry: wire.AnyEntry) -> int:
        self.count += 1
        if self.keep:
            self.published.append(entry)
        self._published.set()
        self._published = trio.Event()
        return self.count

    async def flush(self) -> None:
        pass

    async def wait_published(self, count: int) -> None:
        while self.count < count:
            await self._published.wait()

    async def deliver(self, entry: wire.AnyEntry, stream: StreamName = StreamName.TO_IDE) -> None:
        self._cursor += 1
        data = wire.encode_entry(entry)
        await self._send.send(wire.Deliver(stream=stream, cursor=f"{self._cursor}-0", entry=data))


class Ide:
    """A scripted DAP client on any byte stream."""

    def __init__(self, stream: trio.abc.Stream) -> None:
        self.stream = stream
        self.framer = DapFramer()
        self.seq = 0
        self.seen: list[dict[str, Any]] = []

    async def send(self, command: str, arguments: Any = None) -> int:
        self.seq += 1
        msg: dict[str, Any] = {"seq": self.seq, "type": "request", "command": command}
        if arguments is not None:
            msg["arguments"] = arguments
        await self.stream.send_all(encode_message(msg))
        return self.seq

    async def receive(self) -> dict[str, Any] | None:
        """The next message, or None once the adapter closed the connection."""
        while (msg := self.framer.next_message()) is None:
            data = await self.stream.receive_some(1 << 20)
            if not data:
                return None
            self.framer.receive_data(data)
        validate_message(msg)
        self.seen.append(msg)
        return msg

    async def until(self, kind: str, name: str) -> dict[str, Any]:
        """The next response to ``name``, the next event ``name``, or (``kind`` "output") the next
        output event containing ``name``."""
        key = "command" if kind == "response" else "event"
        while (msg := await self.receive()) is not None:
            if kind == "output" and msg.get("event") == "output":
                if name in msg["body"]["output"]:
                    return msg
            elif msg["type"] == kind and msg.get(key) == name:
                return msg
        raise AssertionError(f"closed before a {kind} {name!r}")

    async def request(self, command: str, arguments: Any = None) -> dict[str, Any]:
        seq = await self.send(command, arguments)
        while (msg := await self.receive()) is not None:
            if msg["type"] == "response" and msg["request_seq"] == seq:
                return msg
        raise AssertionError(f"closed before answering {command!r}")

    async def handshake(self) -> None:
        assert (await self.request("initialize", {"adapterID": "debugpy"}))["success"]
        attach = await self.send("attach", {})
        await self.until("event", "initialized")
        done = await self.send("configurationDone")
        answered: set[int] = set()
        while answered != {attach, done}:
            msg = await self.receive()
            assert msg is not None
            if msg["type"] == "response":
                assert msg["success"], msg
                answered.add(msg["request_seq"])


@asynccontextmanager
async def adapter(
    *, keep: bool = True, listeners: list[trio.SocketListener] | None = None
) -> AsyncIterator[tuple[AdapterServer, FakeLink, list[str], trio.Nursery]]:
    link = FakeLink(keep=keep)
    core = AdapterCore("r1", origin="me", clock=trio.current_time)
    events: list[str] = []
    server = AdapterServer("ws://127.0.0.1:9", link, core, on_event=events.append)
    async with trio.open_nursery() as nursery:
        nursery.start_soon(server.run, listeners or [])
        yield server, link, events, nursery
        nursery.cancel_scope.cancel()


def connect(server: AdapterServer, nursery: trio.Nursery) -> Ide:
    """An IDE on a lockstep stream: what it does not read, the adapter cannot write (no buffer)."""
    client, served = trio.testing.lockstep_stream_pair()
    nursery.start_soon(server.serve_connection, served)
    return Ide(client)


def output_entry(text: str, category: str = "stdout") -> DapEntry:
    body = {
        "seq": 0,
        "type": "event",
        "event": "output",
        "body": {"category": category, "output": text},
    }
    return DapEntry(body=orjson.dumps(body), transient=True)


def stopped_entry() -> DapEntry:
    body = {"reason": "pause", "threadId": 1, "allThreadsStopped": True}
    return DapEntry(
        body=orjson.dumps({"seq": 0, "type": "event", "event": "stopped", "body": body})
    )


def answer_to(server: AdapterServer, command: str, body: dict[str, Any]) -> DapEntry:
    """The debugger's answer to the request the adapter published last."""
    answer = {
        "seq": 9,
        "type": "response",
        "request_seq": server.core._origin_seq,
        "success": True,
        "command": command,
        "body": body,
    }
    return DapEntry(origin="me", body=orjson.dumps(answer), transient=True)


LINE = "x" * 9_999 + "\n"  # 10 KB of program output per event
FLOOD = 2_000  # 20 MB: far past the outbox's output limit and any buffer on the way


async def test_a_second_ide_is_answered_at_once_while_the_first_reads_nothing(
    autojump_clock: trio.testing.MockClock,
) -> None:
    async with adapter() as (server, link, _events, nursery):
        first = connect(server, nursery)
        await first.handshake()
        await link.deliver(StatusEntry(event=StatusEvent.DEBUGGER_LIVE))
        # ``first`` reads nothing from here on; the deliveries are consumed all the same
        with trio.fail_after(1):
            for _ in range(FLOOD):
                await link.deliver(output_entry(LINE))
            await link.deliver(stopped_entry())
        await trio.testing.wait_all_tasks_blocked()
        ide = server._ide
        assert ide is not None and OUTPUT_LIMIT < ide.outbox.bytes < OUTPUT_LIMIT + (1 << 20)
        with trio.fail_after(1):
            second = connect(server, nursery)
            answer = await second.request("initialize", {"adapterID": "debugpy"})
        assert answer["success"] and answer["request_seq"] == 1
        await second.send("attach", {})  # the main session's, not a child's: a takeover
        with trio.fail_after(1):  # the first connection was closed, not waited for
            while await first.stream.receive_some(1 << 20):
                pass
        await second.until("event", "initialized")
        await second.send("configurationDone")
        stopped = await second.until("event", "stopped")  # the new IDE sees the stop
        assert stopped["body"]["threadId"] == 1


async def test_an_ide_that_reads_late_gets_a_notice_for_the_output_it_missed(
    autojump_clock: trio.testing.MockClock,
) -> None:
    async with adapter() as (server, link, _events, nursery):
        ide = connect(server, nursery)
        await ide.handshake()
        await link.deliver(StatusEntry(event=StatusEvent.DEBUGGER_LIVE))
        for _ in range(FLOOD):
            await link.deliver(output_entry(LINE))
        await link.deliver(stopped_entry())
        await trio.testing.wait_all_tasks_blocked()
        # now it reads: output up to the limit, one notice for the rest, the stop after both
        text = 0
        notice = None
        while (msg := await ide.receive()) is not None:
            if msg.get("event") == "stopped":
                break
            if msg.get("event") == "output" and msg["body"]["category"] == "stdout":
                assert notice is None  # nothing after the notice was output
                text += len(msg["body"]["output"])
            elif msg.get("event") == "output" and "skipped" in msg["body"]["output"]:
                notice = msg["body"]["output"]
        assert notice is not None and "tether logs r1" in notice
        skipped = int(notice.split("skipped ")[1].split(" bytes")[0].replace(",", ""))
        assert text + skipped == FLOOD * len(LINE)
        assert OUTPUT_LIMIT - (1 << 20) < text < OUTPUT_LIMIT + (1 << 20)
        seq = await ide.send("threads")  # and the session goes on
        await trio.testing.wait_all_tasks_blocked()
        await link.deliver(answer_to(server, "threads", {"threads": []}))
        answer = await ide.until("response", "threads")
        assert answer["success"] and answer["request_seq"] == seq


async def test_an_ide_that_reads_nothing_at_all_is_closed_when_its_answers_pile_up(
    autojump_clock: trio.testing.MockClock,
) -> None:
    async with adapter() as (server, link, events, nursery):
        ide = connect(server, nursery)
        await ide.handshake()
        await link.deliver(StatusEntry(event=StatusEvent.DEBUGGER_LIVE))
        big = {
            "seq": 0,
            "type": "event",
            "event": "module",
            "body": {"reason": "new", "module": {"id": 1, "name": "m" * (1 << 20)}},
        }
        with trio.fail_after(1):
            for _ in range(70):  # events are never dropped: 70 MiB of them is over the hard cap
                await link.deliver(DapEntry(body=orjson.dumps(big), transient=True))
        await trio.testing.wait_all_tasks_blocked()  # all of it handled, none of it read
        with trio.fail_after(1):
            while await ide.stream.receive_some(1 << 20):
                pass
        assert any("it stopped reading" in e for e in events), events
        await trio.testing.wait_all_tasks_blocked()
        assert server._ide is None and server.core.session.live


async def test_disconnect_is_answered_before_the_connection_closes(
    autojump_clock: trio.testing.MockClock,
) -> None:
    async with adapter() as (server, _link, events, nursery):
        ide = connect(server, nursery)
        await ide.handshake()
        answer = await ide.request("disconnect", {"restart": False})
        assert answer["success"]
        assert await ide.receive() is None
        await trio.testing.wait_all_tasks_blocked()
        assert "the IDE disconnected" in events and server._ide is None
        with trio.fail_after(1):
            again = connect(server, nursery)
            await again.handshake()


async def test_malformed_arguments_are_answered_and_the_adapter_stays_up(
    autojump_clock: trio.testing.MockClock,
) -> None:
    """The two requests that used to end `tether debug` with a traceback."""
    async with adapter() as (server, _link, _events, nursery):
        ide = connect(server, nursery)
        refused = await ide.request("initialize", "abc")
        assert refused["success"] is False
        await ide.send("attach", {})
        await ide.until("event", "initialized")
        assert (await ide.request("configurationDone"))["success"]
        refused = await ide.request("disconnect", [1])
        assert refused["success"] is False and "JSON array" in refused["message"]
        assert (await ide.request("threads"))["body"] == {"threads": []}


async def test_published_requests_leave_nothing_behind_once_the_relay_has_them() -> None:
    """Three 5 MB ``evaluate`` requests over loopback: once the relay stored them and the debugger
    answered, the adapter holds nothing of them (it kept the last 10,000 published entries, bodies
    included, and the session fold kept every request's arguments: 47 -> 189 MB of RSS)."""
    listeners = await trio.open_tcp_listeners(0, host="127.0.0.1")
    port = listeners[0].socket.getsockname()[1]
    async with adapter(keep=False, listeners=listeners) as (server, link, _events, _nursery):
        ide = Ide(await trio.open_tcp_stream("127.0.0.1", port))
        with trio.fail_after(10):
            await ide.handshake()
            await link.deliver(StatusEntry(event=StatusEvent.DEBUGGER_LIVE))
            await ide.until("output", "is live")  # the adapter knows it now
        gc.collect()
        tracemalloc.start()
        try:
            before = tracemalloc.get_traced_memory()[0]
            for _ in range(3):
                with trio.fail_after(10):
                    published = link.count
                    seq = await ide.send("evaluate", {"expression": "x" * 5_000_000})
                    await link.wait_published(published + 1)
                    result = {"result": "1", "variablesReference": 0}
                    await link.deliver(answer_to(server, "evaluate", result))
                    got = await ide.until("response", "evaluate")
                assert got["request_seq"] == seq and got["success"]
            gc.collect()
            kept = tracemalloc.get_traced_memory()[0] - before
        finally:
            tracemalloc.stop()
        assert kept < 2_000_000, f"{kept:,} bytes kept after three 5 MB requests"
        await ide.stream.aclose()


async def test_over_loopback_an_ide_that_stops_reading_stalls_nothing() -> None:
    """The bug as it was seen: a real socket whose peer stops reading (small receive buffer)
    while the program floods output; a new IDE's ``initialize`` went unanswered for as long as the
    flood lasted, and the relay link's deliveries stopped being consumed."""
    listeners = await trio.open_tcp_listeners(0, host="127.0.0.1")
    port = listeners[0].socket.getsockname()[1]
    async with adapter(listeners=listeners) as (_server, link, _events, _nursery):
        sock = trio.socket.socket()
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
        await sock.connect(("127.0.0.1", port))
        first = Ide(trio.SocketStream(sock))
        with trio.fail_after(10):
            await first.handshake()
        await link.deliver(StatusEntry(event=StatusEvent.DEBUGGER_LIVE))
        with trio.fail_after(10):  # took until the IDE read again (forever), past 256 entries
            for _ in range(FLOOD):
                await link.deliver(output_entry(LINE))
        started = trio.current_time()
        with trio.fail_after(5):
            second = Ide(await trio.open_tcp_stream("127.0.0.1", port))
            answer = await second.request("initialize", {"adapterID": "debugpy"})
        assert answer["success"]
        print(f"initialize answered in {1000 * (trio.current_time() - started):.1f} ms")
        await first.stream.aclose()
        await second.stream.aclose()


async def test_a_new_connection_is_answered_in_schema_until_it_says_initialize(
    autojump_clock: trio.testing.MockClock,
) -> None:
    """A malformed message before ``initialize`` is noted in the debug console; a first request
    that is not ``initialize`` gets an error response and the connection closes (every message
    checked against the DAP schema by ``Ide.receive``)."""
    async with adapter() as (server, _link, events, nursery):
        ide = connect(server, nursery)
        await ide.stream.send_all(b"Content-Length: 2\r\n\r\n[]")
        note = await ide.receive()
        assert note is not None and note["event"] == "output"
        assert "ignored a malformed DAP message" in note["body"]["output"]
        await ide.send("threads")
        refused = await ide.receive()
        assert refused is not None and refused["success"] is False
        assert (refused["seq"], refused["command"], refused["request_seq"]) == (1, "threads", 1)
        assert refused["message"] == "a DAP session starts with an 'initialize' request"
        assert await ide.receive() is None
        assert any("not an initialize request" in e for e in events)
