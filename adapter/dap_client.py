"""A small trio DAP client: the demo's scripted IDE and the Python test client.

Every message received is kept in ``received`` (tests validate them all against the DAP schema) and
events are buffered, so a wait never misses an event that arrived before it started (the trap of
``@vscode/debugadapter-testsupport``'s ``waitForEvent``). Requests can be pipelined the way VS Code
sends its configuration: ``send_request_nowait`` then ``response``.
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager
from typing import Any

import trio

from protocol_specs.dap_framing import DapFramer, encode_message

__all__ = ["DapClient", "open_dap_client"]


class DapClient:
    def __init__(self, stream: trio.SocketStream) -> None:
        self._stream = stream
        self._seq = 0
        self._responses: dict[int, dict[str, Any]] = {}
        self._events: list[dict[str, Any]] = []  # unconsumed
        self._changed = trio.Event()
        self._outbox: list[bytes] = []
        self._send_lock = trio.Lock()
        self.received: list[dict[str, Any]] = []
        self.closed = False

    def send_request_nowait(self, command: str, arguments: dict[str, Any] | None = None) -> int:
        """Queue a request (sent in order by the writer); returns its ``seq``."""
        self._seq += 1
        msg: dict[str, Any] = {"seq": self._seq, "type": "request", "command": command}
        if arguments is not None:
            msg["arguments"] = arguments
        self._outbox.append(encode_message(msg))
        self._notify()
        return self._seq

    async def response(self, seq: int, *, timeout: float = 30) -> dict[str, Any]:
        with trio.fail_after(timeout):
            while seq not in self._responses:
                if self.closed:
                    raise ConnectionError(f"connection closed before the response to request {seq}")
                await self._changed.wait()
        return self._responses.pop(seq)

    async def request(
        self, command: str, arguments: dict[str, Any] | None = None, *, timeout: float = 30
    ) -> dict[str, Any]:
        """Send a request and wait for its response (returned even when ``success`` is false)."""
        seq = self.send_request_nowait(command, arguments)
        try:
            return await self.response(seq, timeout=timeout)
        except trio.TooSlowError:
            raise TimeoutError(f"no response to {command!r} within {timeout} s") from None

    async def wait_event(
        self,
        event: str,
        *,
        timeout: float = 30,
        predicate: Callable[[dict[str, Any]], bool] | None = None,
    ) -> dict[str, Any]:
        """The first unconsumed ``event`` (matching ``predicate``), waiting for it if needed."""
        try:
            with trio.fail_after(timeout):
                while True:
                    for i, msg in enumerate(self._events):
                        if msg.get("event") == event and (predicate is None or predicate(msg)):
                            return self._events.pop(i)
                    if self.closed:
                        raise ConnectionError(f"connection closed while waiting for {event!r}")
                    await self._changed.wait()
        except trio.TooSlowError:
            seen = [m.get("event") for m in self._events]
            raise TimeoutError(
                f"no {event!r} event within {timeout} s (unconsumed events: {seen})"
            ) from None

    def discard_events(self, event: str) -> int:
        """Drop unconsumed ``event`` events (e.g. stale stops before the next step); returns how many."""
        before = len(self._events)
        self._events = [m for m in self._events if m.get("event") != event]
        return before - len(self._events)

    def _notify(self) -> None:
        self._changed.set()
        self._changed = trio.Event()

    async def _writer(self) -> None:
        while True:
            while not self._outbox:
                await self._changed.wait()
            data, self._outbox = b"".join(self._outbox), []
            await self._stream.send_all(data)

    async def _reader(self) -> None:
        framer = DapFramer()
        try:
            while data := await self._stream.receive_some(65536):
                framer.receive_data(data)
                while (msg := framer.next_message()) is not None:
                    self.received.append(msg)
                    kind = msg.get("type")
                    if kind == "response":
                        self._responses[msg.get("request_seq", -1)] = msg
                    elif kind == "event":
                        self._events.append(msg)
                    elif kind == "request":  # reverse requests: this client serves none
                        self._seq += 1
                        self._outbox.append(
                            encode_message(
                                {
                                    "seq": self._seq,
                                    "type": "response",
                                    "request_seq": msg.get("seq", 0),
                                    "success": False,
                                    "command": msg.get("command", ""),
                                    "message": "not supported",
                                }
                            )
                        )
                    self._notify()
        except (trio.BrokenResourceError, trio.ClosedResourceError):
            pass
        finally:
            self.closed = True
            self._notify()


@asynccontextmanager
async def open_dap_client(host: str, port: int) -> AsyncIterator[DapClient]:
    stream = await trio.open_tcp_stream(host, port)
    client = DapClient(stream)
    async with trio.open_nursery() as nursery:
        nursery.start_soon(client._reader)
        nursery.start_soon(client._writer)
        try:
            yield client
        finally:
            nursery.cancel_scope.cancel()
            with trio.CancelScope(shield=True):
                await stream.aclose()
