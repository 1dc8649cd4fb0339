"""Client side of the relay wire protocol, used by the CLI, the adapter and the worker shim.

- :func:`open_control` gives a :class:`ControlClient` (submit, cancel, get, claim).
- :func:`open_run_link` gives a :class:`RunLink` bound to one run in the ``ide`` or ``worker`` role:
  ``publish`` entries (acknowledged by the relay once stored) and receive ``deliveries``.
"""

from __future__ import annotations

import logging
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from dataclasses import dataclass, field

import trio
from websockets.exceptions import ConnectionClosed
from websockets.trio.client import ClientConnection, connect

from protocol_specs import wire
from protocol_specs.runs import RunRecord, RunSpec
from protocol_specs.wire import ErrorCode, Role, WireError

__all__ = ["ControlClient", "RelayError", "RunLink", "open_control", "open_run_link"]

log = logging.getLogger("tether.relay.client")

#: how long closing a run link waits for the relay to acknowledge what was published
FLUSH_TIMEOUT = 10.0


class RelayError(Exception):
    """The relay refused something; ``code`` is a :class:`~protocol_specs.wire.ErrorCode`."""

    def __init__(self, code: ErrorCode | str, message: str) -> None:
        super().__init__(f"{message} [{code}]")
        self.code = code
        self.message = message


@asynccontextmanager
async def _connect(
    url: str, hello: wire.Hello
) -> AsyncIterator[tuple[ClientConnection, wire.Welcome]]:
    try:
        async with connect(
            url, compression=None, max_size=wire.MAX_FRAME_BYTES, open_timeout=10
        ) as ws:
            await ws.send(wire.encode_frame(hello))
            frame = wire.decode_frame(await ws.recv())
            if isinstance(frame, wire.Error):
                raise RelayError(frame.code, frame.message)
            if not isinstance(frame, wire.Welcome):
                raise RelayError(ErrorCode.BAD_FRAME, f"expected 'welcome', got {frame.t!r}")
            yield ws, frame
    except OSError as exc:
        raise RelayError("unreachable", f"cannot reach the relay at {url}: {exc}") from exc


class ControlClient:
    def __init__(self, ws: ClientConnection) -> None:
        self._ws = ws
        self._rid = 0
        self._lock = trio.Lock()

    async def _call(self, frame_type: type, **fields: object) -> wire.RunInfo | wire.Assigned:
        async with self._lock:
            self._rid += 1
            frame = frame_type(rid=self._rid, **fields)
            await self._ws.send(wire.encode_frame(frame))
            while True:
                reply = wire.decode_frame(await self._ws.recv())
                if getattr(reply, "rid", None) != self._rid:
                    continue
                if isinstance(reply, wire.Error):
                    raise RelayError(reply.code, reply.message)
                if isinstance(reply, wire.RunInfo | wire.Assigned):
                    return reply
                raise RelayError(ErrorCode.BAD_FRAME, f"unexpected reply {reply.t!r}")

    async def submit(self, spec: RunSpec, snapshot: bytes = b"") -> RunRecord:
        return (await self._call(wire.Submit, spec=spec, snapshot=snapshot)).run

    async def cancel(self, run: str, detail: str = "cancelled by the user") -> RunRecord:
        return (await self._call(wire.Cancel, run=run, detail=detail)).run

    async def get_run(self, run: str) -> RunRecord:
        return (await self._call(wire.GetRun, run=run)).run

    async def claim(self, worker: str) -> tuple[RunRecord, bytes]:
        reply = await self._call(wire.Claim, worker=worker)
        assert isinstance(reply, wire.Assigned)
        return reply.run, reply.snapshot


@asynccontextmanager
async def open_control(url: str, *, client: str = "") -> AsyncIterator[ControlClient]:
    async with _connect(url, wire.Hello(role=Role.CONTROL, client=client)) as (ws, _):
        yield ControlClient(ws)


@dataclass
class RunLink:
    """One run's connection in the ``ide`` or ``worker`` role.

    Publishes go out in order; ``acked`` is the cursor of the last acknowledged one. Entries from the
    other direction arrive on ``deliveries`` (and, for ``history=True``, first the ``to_worker``
    history). ``welcome.tails`` says where each stream ended when the link opened.
    """

    welcome: wire.Welcome
    deliveries: trio.MemoryReceiveChannel[wire.Deliver]
    _ws: ClientConnection
    _send_lock: trio.Lock = field(default_factory=trio.Lock)
    _n: int = 0
    _answered: int = 0  # highest frame number the relay acknowledged or refused
    _answer: trio.Event = field(default_factory=trio.Event)
    acked: str = ""
    errors: list[wire.Error] = field(default_factory=list)
    closed: bool = False

    @property
    def run(self) -> RunRecord:
        assert self.welcome.run is not None
        return self.welcome.run

    async def publish(self, entry: wire.DapEntry | wire.StatusEntry) -> int:
        """Send one entry; returns its frame number. Raises ``RelayError`` if the link is gone."""
        data = wire.encode_entry(entry)
        async with self._send_lock:
            self._n += 1
            try:
                await self._ws.send(wire.encode_frame(wire.Publish(n=self._n, entry=data)))
            except ConnectionClosed as exc:
                raise RelayError("closed", f"relay connection closed: {exc}") from exc
            return self._n

    async def flush(self) -> None:
        """Wait until the relay answered every publish so far (stored, or refused with an error)."""
        while self._answered < self._n and not self.closed:
            await self._answer.wait()

    def _answered_up_to(self, n: int) -> None:
        self._answered = max(self._answered, n)
        self._answer.set()
        self._answer = trio.Event()

    async def _receive(self, send: trio.MemorySendChannel[wire.Deliver]) -> None:
        async with send:
            try:
                while True:
                    data = await self._ws.recv()
                    try:
                        frame = wire.decode_frame(data)
                    except WireError as exc:
                        log.warning("bad frame from the relay: %s", exc.message)
                        continue
                    if isinstance(frame, wire.Deliver):
                        await send.send(frame)
                    elif isinstance(frame, wire.Ack):
                        self.acked = frame.cursor
                        self._answered_up_to(frame.n)
                    elif isinstance(frame, wire.Error):
                        log.warning("relay error %s: %s", frame.code.value, frame.message)
                        self.errors.append(frame)
                        if frame.n is not None:
                            self._answered_up_to(frame.n)
            except ConnectionClosed:
                pass
            finally:
                self.closed = True
                self._answer.set()


@asynccontextmanager
async def open_run_link(
    url: str, *, role: Role, run: str, cursor: str = "0", history: bool = False, client: str = ""
) -> AsyncIterator[RunLink]:
    hello = wire.Hello(role=role, run=run, cursor=cursor, history=history, client=client)
    async with _connect(url, hello) as (ws, welcome), trio.open_nursery() as nursery:
        send, receive = trio.open_memory_channel[wire.Deliver](256)
        link = RunLink(welcome=welcome, deliveries=receive, _ws=ws)
        nursery.start_soon(link._receive, send)
        try:
            yield link
            with trio.move_on_after(FLUSH_TIMEOUT):
                await link.flush()  # a clean exit leaves nothing unstored
        finally:
            nursery.cancel_scope.cancel()
