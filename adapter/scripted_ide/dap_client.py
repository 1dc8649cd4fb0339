"""A small trio DAP client: the demo's scripted IDE and the Python test client.

Theory of operation. :func:`open_dap_client` connects and runs two tasks for the life of the
``async with`` block: a reader that splits the adapter's bytes into messages
(:class:`~protocol_specs.dap.framing.DapFramer`) and files them, and the one writer of the
connection, which sends queued messages in order. Everything else is plain bookkeeping:

- ``received`` keeps every message received, in order; tests validate them all against the schema.
- Events are buffered until a :meth:`DapClient.wait_event` takes them, so a wait never misses an
  event that arrived before it started (the trap of ``@vscode/debugadapter-testsupport``'s
  ``waitForEvent``, research/dap.md section 8).
- Responses are matched by ``request_seq``, never by arrival order: debugpy answers ``attach`` only
  after ``configurationDone``. Requests can be pipelined the way VS Code sends its configuration:
  :meth:`DapClient.send_request_nowait`, then :meth:`DapClient.response` for each.
- Reverse requests from the adapter (``runInTerminal``, ``startDebugging``) are answered
  ``success: false`` at once, so the adapter never waits on this client, except the commands the
  caller asked to serve (``serve=``): those are buffered like events until
  :meth:`DapClient.wait_reverse_request` takes them, and the caller answers each with
  :meth:`DapClient.answer` (a test that opens a child session for ``startDebugging``, as VS Code
  does).
- Waits take a timeout and raise :class:`TimeoutError` saying what did not arrive; once the
  connection is gone (closed by either side, or the adapter sent bytes that are not DAP) they raise
  :class:`ConnectionError` with the reason instead of waiting out the timeout.

Cancelling a wait leaves the client usable: a response that arrives later stays filed under its
``seq``. Leaving the ``async with`` block closes the connection.
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Callable, Collection
from contextlib import asynccontextmanager
from typing import Any

import trio

from protocol_specs.dap import models as dap
from protocol_specs.dap.framing import DapFramer, DapFramingError, encode_message

__all__ = ["DapClient", "open_dap_client", "open_dap_client_on_stream"]

_RECEIVE_SIZE = 65536
_CLOSE_TIMEOUT = 5.0


class DapClient:
    """The client side of one DAP connection. Create it with :func:`open_dap_client`."""

    def __init__(self, stream: trio.abc.Stream, *, serve: Collection[str] = ()) -> None:
        self._stream = stream
        self._serve = frozenset(serve)  # reverse request commands the caller answers itself
        self._reverse: list[dict[str, Any]] = []  # served reverse requests not yet taken, in order
        self._seq = 0
        self._outbox: list[bytes] = []  # encoded messages the writer has not sent yet
        self._commands: dict[int, str] = {}  # seq -> command of requests not yet answered
        self._responses: dict[int, dict[str, Any]] = {}  # request_seq -> response, until taken
        self._events: list[dict[str, Any]] = []  # events no wait_event() has taken, in order
        self._changed = trio.Event()  # set (and replaced) whenever anything above changes
        self._closed_because: str | None = None
        #: Every message received, in order (events, responses and reverse requests).
        self.received: list[dict[str, Any]] = []

    def __repr__(self) -> str:
        state = "open" if self._closed_because is None else f"closed ({self._closed_because})"
        return (
            f"<DapClient {state} sent={self._seq} received={len(self.received)}"
            f" pending={sorted(self._commands)} unconsumed_events={len(self._events)}>"
        )

    @property
    def closed(self) -> bool:
        """The connection is gone: nothing more will be received or sent."""
        return self._closed_because is not None

    @property
    def closed_because(self) -> str | None:
        """Why the connection is gone (``None`` while it is open)."""
        return self._closed_because

    def send_request_nowait(self, command: str, arguments: dict[str, Any] | None = None) -> int:
        """Queue a request for the writer (requests go out in call order); returns its ``seq``."""
        self._check_open(f"cannot send {command!r}")
        seq = self._queue(_request(command, arguments))
        self._commands[seq] = command
        return seq

    async def response(self, seq: int, *, timeout: float = 30) -> dict[str, Any]:
        """The response to request ``seq`` (even when ``success`` is false), waiting if needed."""
        what = f"request {seq} ({self._commands.get(seq, '?')!r})"
        try:
            with trio.fail_after(timeout):
                while seq not in self._responses:
                    self._check_open(f"no response to {what}")
                    await self._changed.wait()
        except trio.TooSlowError:
            raise TimeoutError(f"no response to {what} within {timeout} s") from None
        self._commands.pop(seq, None)
        return self._responses.pop(seq)

    async def request(
        self, command: str, arguments: dict[str, Any] | None = None, *, timeout: float = 30
    ) -> dict[str, Any]:
        """Send a request and wait for its response (returned even when ``success`` is false)."""
        seq = self.send_request_nowait(command, arguments)
        return await self.response(seq, timeout=timeout)

    async def wait_event(
        self,
        event: str,
        *,
        timeout: float = 30,
        predicate: Callable[[dict[str, Any]], bool] | None = None,
    ) -> dict[str, Any]:
        """Take the first unconsumed ``event`` matching ``predicate``, waiting for it if needed.

        Events that arrived before the call count: they are buffered until taken.
        """
        try:
            with trio.fail_after(timeout):
                while True:
                    for i, msg in enumerate(self._events):
                        if msg.get("event") == event and (predicate is None or predicate(msg)):
                            return self._events.pop(i)
                    self._check_open(f"no {event!r} event")
                    await self._changed.wait()
        except trio.TooSlowError:
            seen = [m.get("event") for m in self._events]
            raise TimeoutError(
                f"no {event!r} event{'' if predicate is None else ' matching the predicate'}"
                f" within {timeout} s (unconsumed events: {seen})"
            ) from None

    async def wait_reverse_request(self, command: str, *, timeout: float = 30) -> dict[str, Any]:
        """Take the first untaken reverse request ``command`` (one of those the client was opened
        to serve), waiting for it if needed; answer it with :meth:`answer`."""
        if command not in self._serve:
            raise ValueError(
                f"{command!r} requests are refused at once: open the client to serve it"
            )
        try:
            with trio.fail_after(timeout):
                while True:
                    for i, msg in enumerate(self._reverse):
                        if msg.get("command") == command:
                            return self._reverse.pop(i)
                    self._check_open(f"no {command!r} request")
                    await self._changed.wait()
        except trio.TooSlowError:
            raise TimeoutError(f"no {command!r} request within {timeout} s") from None

    def answer(
        self, request: dict[str, Any], body: dict[str, Any] | None = None, *, error: str = ""
    ) -> int:
        """Queue the response to a reverse request: success with ``body``, or a failure saying
        ``error``; returns its ``seq``."""
        self._check_open(f"cannot answer {request.get('command')!r}")
        if error:
            return self._queue(dap.error_response(request, error))
        return self._queue(dap.response(request, body))

    def discard_events(self, event: str) -> int:
        """Drop unconsumed ``event`` events (e.g. stale stops before the next step); returns how many."""
        before = len(self._events)
        self._events = [m for m in self._events if m.get("event") != event]
        return before - len(self._events)

    async def aclose(self) -> None:
        """Close the connection; waits in progress raise ConnectionError."""
        self._close("closed by the client")
        with trio.move_on_after(_CLOSE_TIMEOUT, shield=True):
            await self._stream.aclose()

    # -- internals -------------------------------------------------------------------------

    def _queue(self, message: dict[str, Any]) -> int:
        """Queue ``message`` under the next ``seq`` (one counter for everything this client sends)."""
        self._seq += 1
        self._outbox.append(encode_message({**message, "seq": self._seq}))
        self._notify()
        return self._seq

    def _check_open(self, what: str) -> None:
        if self._closed_because is not None:
            raise ConnectionError(f"{what}: the connection is {self._closed_because}")

    def _notify(self) -> None:
        self._changed.set()
        self._changed = trio.Event()

    def _close(self, reason: str) -> None:
        if self._closed_because is None:
            self._closed_because = reason
            self._notify()

    def _file(self, msg: dict[str, Any]) -> None:
        self.received.append(msg)
        kind = msg["type"]  # the framer guarantees request, response or event
        if kind == "response":
            request_seq = msg.get("request_seq")
            if isinstance(request_seq, int):
                self._responses[request_seq] = msg
        elif kind == "event":
            self._events.append(msg)
        elif msg.get("command") in self._serve:
            self._reverse.append(msg)
        else:  # a reverse request: this client serves none, and says so at once
            command = msg.get("command")
            text = f"the tether test client does not serve {command!r} requests"
            self._queue(dap.error_response(msg, text))
        self._notify()

    async def _read_loop(self) -> None:
        framer = DapFramer()
        reason = "closed (the client was cancelled)"
        try:
            while True:
                data = await self._stream.receive_some(_RECEIVE_SIZE)
                framer.receive_data(data)
                while (msg := framer.next_message()) is not None:
                    self._file(msg)
                if not data:
                    reason = "closed by the debug adapter"
                    break
        except DapFramingError as exc:
            reason = f"broken: the debug adapter sent invalid DAP ({exc})"
        except trio.ClosedResourceError:
            reason = "closed by the client"
        except trio.BrokenResourceError as exc:
            reason = f"broken ({exc!r})"
        finally:
            self._close(reason)

    async def _write_loop(self) -> None:
        try:
            while True:
                while not self._outbox:
                    if self.closed:
                        return
                    await self._changed.wait()
                data, self._outbox = b"".join(self._outbox), []
                await self._stream.send_all(data)
        except trio.ClosedResourceError:
            self._close("closed by the client")
        except trio.BrokenResourceError as exc:
            self._close(f"broken: sending failed ({exc!r})")


def _request(command: str, arguments: dict[str, Any] | None) -> dict[str, Any]:
    """A request (``seq`` 0 until queued), its envelope checked by ``dap_models.Message``: the
    models have builders for the responses and events an adapter sends, none for requests."""
    msg = dap.Message(type="request", command=command).model_dump(exclude_none=True)
    return msg if arguments is None else {**msg, "arguments": arguments}


@asynccontextmanager
async def open_dap_client_on_stream(
    stream: trio.abc.Stream, *, serve: Collection[str] = ()
) -> AsyncIterator[DapClient]:
    """Run a :class:`DapClient` over an open stream; the stream is closed on exit. ``serve``: the
    reverse request commands the caller answers (:meth:`DapClient.wait_reverse_request`)."""
    client = DapClient(stream, serve=serve)
    unwrapped: BaseException | None = None
    try:
        async with trio.open_nursery() as nursery:
            nursery.start_soon(client._read_loop)
            nursery.start_soon(client._write_loop)
            try:
                yield client
            finally:
                nursery.cancel_scope.cancel()
                await client.aclose()
    except BaseExceptionGroup as group:
        # The two tasks never raise, so a group holds the body's own exception: let it through
        # unwrapped, so that callers can catch TimeoutError or ConnectionError as they are.
        if len(group.exceptions) != 1:
            raise
        unwrapped = group.exceptions[0]
    if unwrapped is not None:
        raise unwrapped


@asynccontextmanager
async def open_dap_client(
    host: str, port: int, *, serve: Collection[str] = ()
) -> AsyncIterator[DapClient]:
    """Connect to a DAP server (a debug adapter) at ``host:port``; ``serve`` as for
    :func:`open_dap_client_on_stream`."""
    stream = await trio.open_tcp_stream(host, port)
    async with open_dap_client_on_stream(stream, serve=serve) as client:
        yield client
