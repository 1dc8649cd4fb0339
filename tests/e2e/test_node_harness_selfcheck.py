"""The DebugClient harness against a scripted fake adapter: what debugpy never does.

debugpy verifies breakpoints in its answers, sends no ``breakpoint`` events and no reverse requests
to a client that declined them, and answers every request it knows. tether's adapter does the
first two and the harness must not hang on the third, so those paths are checked here against a
few lines of scripted DAP server.
"""

from __future__ import annotations

import json
import socket
from functools import partial
from pathlib import Path
from typing import Any

import pytest
import trio
from node_harness import open_vscode_session, run_vscode_session, scenario

pytestmark = [pytest.mark.slow, pytest.mark.timeout(120)]

HEADER_END = b"\r\n\r\n"


def frame(message: dict[str, Any]) -> bytes:
    body = json.dumps(message).encode()
    return b"Content-Length: %d\r\n\r\n" % len(body) + body


class FakeAdapter:
    """Answers the VS Code handshake like a relay that has no worker yet: breakpoints unverified,
    attach answered after configurationDone. ``emit`` pushes events later; ``loadedSources`` is
    never answered (like pydevd with commands it does not implement)."""

    def __init__(self) -> None:
        self.received: list[dict[str, Any]] = []
        self.stream: trio.SocketStream | None = None
        self.connected = trio.Event()
        self._seq = 0
        self._attach: dict[str, Any] | None = None

    async def send(self, message: dict[str, Any]) -> None:
        assert self.stream is not None
        self._seq += 1
        await self.stream.send_all(frame({"seq": self._seq, **message}))

    async def event(self, event: str, body: dict[str, Any] | None = None) -> None:
        await self.send({"type": "event", "event": event, **({"body": body} if body else {})})

    async def respond(self, request: dict[str, Any], body: dict[str, Any] | None = None) -> None:
        await self.send(
            {
                "type": "response",
                "request_seq": request["seq"],
                "command": request["command"],
                "success": True,
                **({"body": body} if body is not None else {}),
            }
        )

    async def handle(self, stream: trio.SocketStream) -> None:
        self.stream = stream
        self.connected.set()
        buffer = b""
        async for chunk in stream:
            buffer += chunk
            while HEADER_END in buffer:
                header, rest = buffer.split(HEADER_END, 1)
                length = int(header.split(b":")[1])
                if len(rest) < length:
                    break
                message = json.loads(rest[:length])
                buffer = rest[length:]
                self.received.append(message)
                if message["type"] == "request":
                    await self.on_request(message)

    async def on_request(self, request: dict[str, Any]) -> None:
        command, args = request["command"], request.get("arguments", {})
        if command == "initialize":
            await self.respond(request, {"supportsConfigurationDoneRequest": True})
        elif command == "attach":
            self._attach = request
            await self.event("initialized")
        elif command == "setBreakpoints":
            bps = [
                {"id": 100 + i, "verified": False, "line": b["line"], "message": "pending"}
                for i, b in enumerate(args["breakpoints"])
            ]
            await self.respond(request, {"breakpoints": bps})
        elif command == "setFunctionBreakpoints":
            await self.respond(request, {"breakpoints": []})
        elif command in ("setExceptionBreakpoints", "configurationDone"):
            await self.respond(request)
            if command == "configurationDone":
                assert self._attach is not None
                await self.respond(self._attach)
                await self.send(
                    {
                        "type": "request",
                        "command": "runInTerminal",
                        "arguments": {"cwd": "/", "args": ["true"]},
                    }
                )
        elif command == "threads":
            await self.respond(request, {"threads": [{"id": 7, "name": "worker"}]})
        elif command == "stackTrace":
            frame_ = {"id": 1000, "name": "fn", "line": 3, "column": 1, "source": {"path": "/x.py"}}
            await self.respond(request, {"stackFrames": [frame_], "totalFrames": 1})
        elif command == "disconnect":
            await self.respond(request)
        # anything else (loadedSources): no answer at all


async def test_breakpoint_events_reverse_requests_and_watchdog(tmp_path: Path) -> None:
    fake = FakeAdapter()
    path = str(tmp_path / "x.py")
    steps: list[dict[str, Any]] = [
        {"op": "mark", "name": "configured", "wait": True},
        {"op": "wait_breakpoints_verified", "label": "verified"},
        {
            "op": "wait_breakpoint_event",
            "label": "second",
            "reason": "changed",
            "id": {"$ref": "handshake.setBreakpoints.0.breakpoints.1.id"},
            "verified": True,
        },
        {"op": "wait_stopped", "label": "stopped", "reason": "breakpoint", "line": 3},
        {"op": "request", "command": "loadedSources", "timeoutMs": 500},
        {"op": "disconnect"},
    ]
    async with trio.open_nursery() as nursery:
        listeners = await nursery.start(partial(trio.serve_tcp, fake.handle, 0, host="127.0.0.1"))
        port = listeners[0].socket.getsockname()[1]
        spec = scenario(port, tmp_path, steps, breakpoints={path: [3, 4]})
        async with open_vscode_session(spec, timeout=60) as session:
            await session.wait_mark("configured")
            # sent before the runner waits for them: buffered, not lost
            for i, line in enumerate([3, 4]):
                await fake.event(
                    "breakpoint",
                    {
                        "reason": "changed",
                        "breakpoint": {"id": 100 + i, "verified": True, "line": line},
                    },
                )
            await fake.event(
                "stopped", {"reason": "breakpoint", "threadId": 7, "hitBreakpointIds": [100]}
            )
            await session.release("configured")
            result, messages = await session.result(check=False)
        nursery.cancel_scope.cancel()

    labels = result["labels"]
    assert [b["verified"] for b in labels["handshake"]["setBreakpoints"][0]["breakpoints"]] == [
        False,
        False,
    ]
    assert labels["verified"]["breakpoints"] == {
        "100": {"id": 100, "verified": True, "line": 3, "path": path, "reason": "changed"},
        "101": {"id": 101, "verified": True, "line": 4, "path": path, "reason": "changed"},
    }
    assert labels["second"]["breakpoint"] == {"id": 101, "verified": True, "line": 4}
    assert (labels["stopped"]["threadId"], labels["stopped"]["function"]) == (7, "fn")
    # the watchdog: an unanswered request fails its step, with the reason, and ends the run
    assert result["ok"] is False and result["failedStep"] == 4
    assert "no response to 'loadedSources'" in result["error"]
    assert "within 500 ms" in result["error"]
    # the reverse request was answered (DebugClient alone would have dropped it)
    [reverse] = result["sessions"][0]["reverseRequests"]
    assert reverse["command"] == "runInTerminal"
    [reply] = [m for m in fake.received if m["type"] == "response"]
    assert reply["request_seq"] == reverse["seq"] and reply["success"] is False
    # VS Code's order: attach before initialized; configuration concurrently, then the rest
    commands = [m["command"] for m in fake.received if m["type"] == "request"]
    assert commands[:7] == [
        "initialize",
        "attach",
        "setBreakpoints",
        "setFunctionBreakpoints",
        "setExceptionBreakpoints",
        "configurationDone",
        "threads",
    ]
    assert messages[0]["command"] == "initialize" and len(messages) == result["messageCount"]


def test_invalid_scenario_and_refused_connection(tmp_path: Path) -> None:
    result, _ = run_vscode_session(
        {"port": 1, "steps": [{"op": "evaluate"}, {"op": "fly"}]}, timeout=30, check=False
    )
    assert result["ok"] is False
    assert "'expression' is required" in result["error"]
    assert 'unknown op "fly"' in result["error"]

    with socket.socket() as bound:  # bound but not listening: connections are refused
        bound.bind(("127.0.0.1", 0))
        port = bound.getsockname()[1]
        result, messages = run_vscode_session(scenario(port, tmp_path, []), timeout=30, check=False)
    assert result["ok"] is False and "cannot connect" in result["error"]
    assert messages == []
