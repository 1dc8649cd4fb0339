"""The trio DAP test client against a scripted adapter on in-memory streams."""

from __future__ import annotations

import re
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from typing import Any

import pytest
import trio
import trio.testing

from adapter.scripted_ide.dap_client import DapClient, open_dap_client_on_stream
from protocol_specs.dap.framing import DapFramer, encode_message


class ScriptedAdapter:
    """The adapter side of the connection, driven step by step by the test."""

    def __init__(self, stream: trio.abc.Stream) -> None:
        self.stream = stream
        self.framer = DapFramer()
        self.seq = 0

    async def send(self, **message: Any) -> None:
        self.seq += 1
        await self.stream.send_all(encode_message({"seq": self.seq, **message}))

    async def event(self, event: str, body: dict[str, Any] | None = None) -> None:
        await self.send(type="event", event=event, **({} if body is None else {"body": body}))

    async def answer(self, request: dict[str, Any], **body: Any) -> None:
        await self.send(
            type="response",
            request_seq=request["seq"],
            success=True,
            command=request["command"],
            body=body,
        )

    async def receive(self) -> dict[str, Any]:
        while (msg := self.framer.next_message()) is None:
            self.framer.receive_data(await self.stream.receive_some())
        return msg


@asynccontextmanager
async def connected() -> AsyncIterator[tuple[DapClient, ScriptedAdapter]]:
    client_end, adapter_end = trio.testing.memory_stream_pair()
    async with open_dap_client_on_stream(client_end) as client:
        yield client, ScriptedAdapter(adapter_end)


async def test_request_and_response() -> None:
    async with connected() as (client, adapter):
        async with trio.open_nursery() as nursery:

            async def serve() -> None:
                request = await adapter.receive()
                assert request == {"seq": 1, "type": "request", "command": "threads"}
                await adapter.answer(request, threads=[])

            nursery.start_soon(serve)
            response = await client.request("threads")
        assert response["body"] == {"threads": []}
        assert client.received == [response]


async def test_arguments_are_sent_and_failed_responses_returned() -> None:
    async with connected() as (client, adapter):
        seq = client.send_request_nowait("evaluate", {"expression": "x"})
        request = await adapter.receive()
        assert request["arguments"] == {"expression": "x"}
        await adapter.send(
            type="response", request_seq=seq, success=False, command="evaluate", message="no"
        )
        response = await client.response(seq)
        assert response["success"] is False and response["message"] == "no"


async def test_events_that_arrived_before_the_wait_are_not_lost() -> None:
    async with connected() as (client, adapter):
        await adapter.event("output", {"output": "a"})
        await adapter.event("stopped", {"reason": "breakpoint", "threadId": 1})
        await adapter.event("output", {"output": "b"})
        await trio.testing.wait_all_tasks_blocked()
        assert [m["event"] for m in client.received] == ["output", "stopped", "output"]
        stopped = await client.wait_event("stopped")
        assert stopped["body"]["reason"] == "breakpoint"
        # In order, each taken once; a predicate skips the ones that do not match.
        second = await client.wait_event("output", predicate=lambda m: m["body"]["output"] == "b")
        assert second["body"]["output"] == "b"
        first = await client.wait_event("output")
        assert first["body"]["output"] == "a"
        assert client.discard_events("output") == 0


async def test_discard_events() -> None:
    async with connected() as (client, adapter):
        for _ in range(3):
            await adapter.event("stopped", {"reason": "step"})
        await trio.testing.wait_all_tasks_blocked()
        assert client.discard_events("stopped") == 3
        assert len(client.received) == 3  # received keeps everything


async def test_pipelined_requests_are_matched_by_request_seq_not_order() -> None:
    async with connected() as (client, adapter):
        attach = client.send_request_nowait("attach", {})
        done = client.send_request_nowait("configurationDone")
        assert (attach, done) == (1, 2)
        requests = [await adapter.receive(), await adapter.receive()]
        assert [r["command"] for r in requests] == ["attach", "configurationDone"]
        await adapter.answer(requests[1])  # debugpy answers configurationDone first
        await adapter.answer(requests[0])
        assert (await client.response(attach))["command"] == "attach"
        assert (await client.response(done))["command"] == "configurationDone"


async def test_reverse_requests_are_refused_at_once() -> None:
    async with connected() as (client, adapter):
        await adapter.send(
            type="request", command="startDebugging", arguments={"request": "attach"}
        )
        reply = await adapter.receive()
        text = "the tether test client does not serve 'startDebugging' requests"
        assert reply == {
            "seq": 1,
            "type": "response",
            "request_seq": 1,
            "success": False,
            "command": "startDebugging",
            "message": text,
            "body": {"error": {"id": 1, "format": text}},
        }
        assert client.received[0]["command"] == "startDebugging"
        assert client.send_request_nowait("threads") == 2  # one seq counter for everything sent


async def test_served_reverse_requests_wait_for_the_callers_answer(
    autojump_clock: trio.testing.MockClock,
) -> None:
    client_end, adapter_end = trio.testing.memory_stream_pair()
    adapter = ScriptedAdapter(adapter_end)
    async with open_dap_client_on_stream(client_end, serve={"startDebugging"}) as client:
        configuration = {"request": "attach", "subProcessId": 42}
        await adapter.send(
            type="request",
            command="startDebugging",
            arguments={"request": "attach", "configuration": configuration},
        )
        # other reverse requests are still refused at once
        await adapter.send(type="request", command="runInTerminal", arguments={"args": ["x"]})
        refusal = await adapter.receive()
        assert refusal["command"] == "runInTerminal" and refusal["success"] is False
        offer = await client.wait_reverse_request("startDebugging")  # filed before the wait
        assert offer["arguments"]["configuration"] == configuration
        assert client.answer(offer) == 2
        assert await adapter.receive() == {
            "seq": 2,
            "type": "response",
            "request_seq": 1,
            "success": True,
            "command": "startDebugging",
        }
        with pytest.raises(TimeoutError, match="no 'startDebugging' request within 3 s"):
            await client.wait_reverse_request("startDebugging", timeout=3)
        with pytest.raises(ValueError, match="refused at once"):
            await client.wait_reverse_request("runInTerminal")
        await adapter.send(type="request", command="startDebugging", arguments={})
        client.answer(await client.wait_reverse_request("startDebugging"), error="not now")
        reply = await adapter.receive()
        assert reply["success"] is False and reply["message"] == "not now"
        await adapter.stream.aclose()
        with pytest.raises(ConnectionError, match="no 'startDebugging' request"):
            await client.wait_reverse_request("startDebugging")


async def test_timeouts_say_what_did_not_arrive(autojump_clock: trio.testing.MockClock) -> None:
    async with connected() as (client, adapter):
        await adapter.event("output", {"output": "x"})
        with pytest.raises(
            TimeoutError, match=re.escape("no response to request 1 ('threads') within 5 s")
        ):
            await client.request("threads", timeout=5)
        with pytest.raises(
            TimeoutError,
            match=re.escape("no 'stopped' event within 2 s (unconsumed events: ['output'])"),
        ):
            await client.wait_event("stopped", timeout=2)
        # A late answer is still filed under its seq.
        await adapter.answer(await adapter.receive(), threads=[])
        assert (await client.response(1))["body"] == {"threads": []}


async def test_the_adapter_closing_wakes_every_wait() -> None:
    async with connected() as (client, adapter):
        seq = client.send_request_nowait("continue", {"threadId": 1})
        await adapter.receive()
        await adapter.stream.aclose()
        with pytest.raises(
            ConnectionError,
            match=re.escape(
                "no response to request 1 ('continue'): the connection is closed by the debug adapter"
            ),
        ):
            await client.response(seq)
        with pytest.raises(
            ConnectionError, match="no 'terminated' event: the connection is closed"
        ):
            await client.wait_event("terminated")
        with pytest.raises(ConnectionError, match="cannot send 'disconnect'"):
            client.send_request_nowait("disconnect")
        assert client.closed and "closed" in repr(client)


async def test_events_received_before_the_close_can_still_be_taken() -> None:
    async with connected() as (client, adapter):
        await adapter.event("terminated")
        await adapter.stream.aclose()
        await trio.testing.wait_all_tasks_blocked()
        assert client.closed
        assert (await client.wait_event("terminated"))["event"] == "terminated"


async def test_invalid_dap_from_the_adapter_breaks_the_connection() -> None:
    async with connected() as (client, adapter):
        await adapter.stream.send_all(b"Content-Length: banana\r\n\r\n")
        with pytest.raises(ConnectionError, match=r"the debug adapter sent invalid DAP .*banana"):
            await client.wait_event("initialized")
        assert client.closed_because is not None and "banana" in client.closed_because


async def test_a_half_message_before_the_close_is_reported() -> None:
    async with connected() as (client, adapter):
        await adapter.stream.send_all(
            encode_message({"seq": 1, "type": "event", "event": "x"})[:-2]
        )
        await adapter.stream.aclose()
        with pytest.raises(ConnectionError, match="connection closed after"):
            await client.wait_event("x")


async def test_aclose_wakes_waits() -> None:
    async with connected() as (client, _adapter):
        await client.aclose()
        assert client.closed_because == "closed by the client"
        with pytest.raises(ConnectionError, match="closed by the client"):
            await client.request("threads")


async def test_errors_leave_the_block_unwrapped() -> None:
    async def fail_inside() -> None:
        async with connected():
            raise KeyError("from the body")

    with pytest.raises(KeyError):  # not an ExceptionGroup
        await fail_inside()
