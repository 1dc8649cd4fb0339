"""The ``ide`` and ``worker`` roles: :class:`RunLink`, one run's link that outlives its connections.

:func:`open_run_link` gives a :class:`RunLink` bound to one run: ``publish`` entries (answered by the
relay once stored) and receive ``deliveries``.

Theory of operation: a link that survives
-----------------------------------------
A :class:`RunLink` outlives its WebSocket connections. It reconnects after any drop (backoff with
full jitter, :class:`LinkPolicy`) and resumes both directions without losing or repeating anything.
What to send and what a frame means is decided by :class:`protocol_specs.link.link.LinkState` (the
outbox and its numbering, answers, cursors, dedup, ``received`` reports, heartbeats; unit-tested
without sockets); this module does the I/O around it:

- *Outbound*: ``publish`` waits while the state's outbox is full, then queues the entry; one sender
  task per connection sends what the state says is due (after a reconnect: every unanswered
  publish, in order) and sleeps until the state's next deadline or a wake-up.
- *Inbound*: the receiver hands each new entry to ``deliveries`` (bounded: a slow reader slows the
  relay), then tells the state, which moves the stream's cursor. A live entry may come before
  Redis stored it (``early``): it has no cursor then, and a ``commit`` moves the cursor later.
- *Liveness*: WebSocket pings (``ping_interval``/``ping_timeout``) close a dead connection; the
  sender also sends a ``heartbeat`` frame every ``heartbeat`` seconds (a worker's renews its lease).

Only a refusal that retrying cannot fix (``no_such_run``, ``unauthorized``, ``unsupported_version``,
a failed handshake) or ``give_up_after`` seconds without a connection end the link: ``failed`` is
set, ``deliveries`` closes and ``publish`` raises :class:`RelayError`. Cancelling ``maintain``
leaves the outbox as it was (``unanswered`` says how much the relay may not have stored).
"""

from __future__ import annotations

import logging
import os
import random
import ssl
import uuid
from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager
from dataclasses import dataclass

import trio
from websockets.exceptions import ConnectionClosed, InvalidURI, WebSocketException
from websockets.trio.client import ClientConnection, connect

from protocol_specs.link.link import Answered, LinkClosed, LinkState, Moved, NewEntry, Refused
from protocol_specs.runs.runs import RunRecord
from protocol_specs.wire import wire
from protocol_specs.wire.wire import AnyLink, ErrorCode, Role, StreamName, WireError

from . import ws_flow
from .connect import RelayError, Target, endpoint

__all__ = ["FLUSH_TIMEOUT", "LinkPolicy", "RunLink", "open_run_link", "tunnel_steps"]

log = logging.getLogger("tether.relay.client")

#: how long closing a run link waits for the relay to acknowledge what was published
FLUSH_TIMEOUT = 10.0


@dataclass(frozen=True)
class LinkPolicy:
    """How a :class:`RunLink` keeps its connection; the defaults suit a laptop on Wi-Fi."""

    #: first and largest pause between reconnect attempts (each pause is random in [0, bound])
    backoff_initial: float = 0.1
    backoff_max: float = 5.0
    #: give up after this long without a connection (None: never; the first connect: see below)
    give_up_after: float | None = None
    #: how long the *first* connection may take to succeed (0: fail at the first error)
    first_connect_within: float = 0.0
    ping_interval: float = 15.0
    ping_timeout: float = 15.0
    close_timeout: float = 5.0
    #: heartbeat frames (a worker's renew the run's lease)
    heartbeat: float = 10.0
    #: the outbox holds at most this many unanswered publishes / bytes; ``publish`` waits beyond
    outbox_entries: int = 10_000
    outbox_bytes: int = 64 * 1024 * 1024
    #: tell the relay what was received after this many entries, or this long after the first
    report_every: int = 100
    report_after: float = 0.2

    @classmethod
    def from_env(cls, **overrides: float) -> LinkPolicy:
        """The defaults, with ``TETHER_PING_INTERVAL`` / ``TETHER_PING_TIMEOUT`` (seconds) applied."""
        env: dict[str, float] = {}
        for name, field_name in (
            ("TETHER_PING_INTERVAL", "ping_interval"),
            ("TETHER_PING_TIMEOUT", "ping_timeout"),
        ):
            if value := os.environ.get(name):
                env[field_name] = float(value)
        return cls(**{**env, **overrides})  # type: ignore[arg-type]

    def backoff(self, attempt: int) -> float:
        return random.uniform(0, min(self.backoff_max, self.backoff_initial * 2**attempt))


class RunLink:
    """One run in the ``ide`` or ``worker`` role, across any number of connections.

    ``welcome`` is the first connection's welcome (``tails`` say where each stream ended then);
    ``latest`` the current one's. ``on_refused(n, error)`` hears about publishes the relay refused;
    ``on_state(connected, detail)`` about the connection coming and going.
    """

    def __init__(
        self,
        target: Target,
        *,
        link: AnyLink,
        run: str,
        cursor: str = "0",
        producer: str | None = None,
        client: str = "",
        policy: LinkPolicy | None = None,
        on_refused: Callable[[int, wire.Error], None] | None = None,
        on_state: Callable[[bool, str], None] | None = None,
        attempt: int = 0,
    ) -> None:
        self.endpoint = endpoint(target)
        self.url = self.endpoint.url
        self.attempt = attempt
        self.role: Role = link.role
        self.run_id = run
        self.policy = p = policy or LinkPolicy()
        self.state = LinkState(
            link=link,
            run=run,
            producer=producer or f"{link.role.value}-{uuid.uuid4().hex[:12]}",
            cursor=cursor,
            client=client,
            attempt=attempt,
            outbox_entries=p.outbox_entries,
            outbox_bytes=p.outbox_bytes,
            report_every=p.report_every,
            report_after=p.report_after,
            heartbeat=p.heartbeat,
        )
        self.on_refused = on_refused or (lambda _n, _error: None)
        self.on_state = on_state or (lambda _up, _detail: None)
        self._send_deliveries, self.deliveries = trio.open_memory_channel[wire.Deliver](256)
        self.connected = False
        self.failed: RelayError | None = None
        self._changed = trio.Event()  # answers, failure: wakes flush and a full outbox
        self._wake = trio.Event()  # new publishes or deliveries to report: wakes the sender

    def __repr__(self) -> str:
        state = "failed" if self.failed else "up" if self.connected else "down"
        return (
            f"<RunLink {self.role.value} run={self.run_id} {state} epoch={self.epoch} "
            f"outbox={self.unanswered}>"
        )

    # --- what the state knows ---------------------------------------------------------------------

    @property
    def producer(self) -> str:
        return self.state.producer

    @property
    def link(self) -> AnyLink:
        """What the link is (``protocol_specs/wire/link_kind.py``)."""
        return self.state.link

    @property
    def client(self) -> str:
        return self.state.client

    @property
    def inbound(self) -> StreamName:
        return self.state.inbound

    @property
    def cursors(self) -> dict[StreamName, str]:
        """The newest entry handed over per stream ("0": none yet)."""
        return self.state.cursors

    @property
    def welcome(self) -> wire.Welcome | None:
        return self.state.welcome

    @property
    def latest(self) -> wire.Welcome | None:
        return self.state.latest

    @property
    def epoch(self) -> int:
        """Connections made so far."""
        return self.state.epoch

    @property
    def acked(self) -> str:
        """Cursor of the last entry the relay stored for us."""
        return self.state.acked

    @property
    def errors(self) -> list[wire.Error]:
        return self.state.errors

    @property
    def duplicates(self) -> int:
        """Re-sent publishes the relay had already stored."""
        return self.state.duplicates

    @property
    def run(self) -> RunRecord:
        """The run record as of the latest connection."""
        welcome = self.latest or self.welcome
        assert welcome is not None and welcome.run is not None
        return welcome.run

    @property
    def tails(self) -> dict[str, str]:
        """Where each of the run's streams ended when the first connection began."""
        assert self.welcome is not None
        return self.welcome.tails

    @property
    def unanswered(self) -> int:
        return self.state.unanswered

    @property
    def answered(self) -> int:
        """The highest publish number the relay answered."""
        return self.state.answered

    # --- publishing -------------------------------------------------------------------------------

    async def publish(self, entry: wire.AnyEntry) -> int:
        """Queue one entry for the relay; returns its number. Waits while the outbox is full.

        Raises :class:`RelayError` once the link has failed for good.
        """
        data = wire.encode_entry(entry)
        while not self.state.has_room(len(data)):
            if self.failed:
                raise self.failed
            await self._changed.wait()
        if self.failed:
            raise self.failed
        n = self.state.publish(data)
        self._wake.set()
        return n

    def report_now(self) -> None:
        """Tell the relay what was received before anything published after this call."""
        self.state.report_now()
        self._wake.set()

    async def wait_answered(self, n: int) -> None:
        """Wait until the relay answered publish ``n`` (or the link failed)."""
        while self.state.answered < n and not self.failed:
            await self._changed.wait()

    async def flush(self) -> None:
        """Wait until the relay answered every publish so far (or the link failed)."""
        while self.state.answered < self.state.published and not self.failed:
            await self._changed.wait()

    def _notify_changed(self) -> None:
        self._changed.set()
        self._changed = trio.Event()

    def _fail(self, error: RelayError) -> None:
        if self.failed is None:
            self.failed = error
            log.warning("run link %s gave up: %s", self.run_id, error)
        self._send_deliveries.close()
        self._changed.set()

    # --- the connection loop ----------------------------------------------------------------------

    async def maintain(
        self, *, task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED
    ) -> None:
        """Connect, serve, reconnect; ``task_status.started`` after the first welcome."""
        started = False
        attempt = 0
        down_since = trio.current_time()
        first_deadline = down_since + self.policy.first_connect_within
        try:
            while True:
                detail = await self._connect_once(task_status if not started else None)
                if self.failed:
                    if not started:
                        raise self.failed
                    return
                if self.epoch and not started:
                    started = True
                if self.connected:
                    self.connected = False
                    down_since = trio.current_time()
                    attempt = 0
                    self.on_state(False, detail)
                now = trio.current_time()
                if not started and now >= first_deadline:
                    self._fail(RelayError(ErrorCode.UNREACHABLE, detail))
                    raise self.failed  # type: ignore[misc]
                give_up = self.policy.give_up_after
                if started and give_up is not None and now - down_since >= give_up:
                    error = f"no relay for {give_up:g} s: {detail}"
                    self._fail(RelayError(ErrorCode.UNREACHABLE, error))
                    return
                await trio.sleep(self.policy.backoff(attempt))
                attempt += 1
        finally:
            self._send_deliveries.close()

    async def _connect_once(self, task_status: trio.TaskStatus[None] | None) -> str:
        """One connection, served until it drops; returns why it ended ("" if it never began)."""
        hello = self.state.hello(token=self.endpoint.token or None)
        p = self.policy
        ws_flow.apply()
        try:
            async with connect(
                self.url,
                compression=None,
                max_size=wire.MAX_FRAME_BYTES,
                open_timeout=10,
                ping_interval=p.ping_interval,
                ping_timeout=p.ping_timeout,
                close_timeout=p.close_timeout,
                **self.endpoint.connect_options(),
            ) as ws:
                await ws.send(wire.encode_frame(hello))
                with trio.fail_after(10):
                    frame = wire.decode_frame(await ws.recv())
                refusal = self.state.on_handshake(frame, trio.current_time())
                if refusal is not None:
                    if refusal.permanent:
                        self._fail(RelayError(refusal.code, refusal.message))
                    if not isinstance(frame, wire.Error):
                        return "bad handshake"
                    return f"the relay refused the connection: {refusal.message}"
                self.connected = True
                if self.epoch > 1:
                    self.on_state(True, f"reconnected to the relay (connection {self.epoch})")
                if task_status is not None:
                    task_status.started()
                try:
                    return await self._serve(ws)
                finally:
                    self.state.connection_lost()
        except InvalidURI as exc:
            self._fail(RelayError(ErrorCode.BAD_URL, str(exc)))
            return str(exc)
        except ssl.SSLCertVerificationError as exc:
            self._fail(RelayError(ErrorCode.TLS, f"the relay's certificate is not trusted: {exc}"))
            return str(exc)
        except trio.BrokenResourceError as exc:
            if isinstance(exc.__cause__, ssl.SSLCertVerificationError):
                error = f"the relay's certificate is not trusted: {exc.__cause__}"
                self._fail(RelayError(ErrorCode.TLS, error))
                return error
            return f"lost the relay at {self.url}: {exc}"
        except (OSError, WebSocketException, TimeoutError, trio.TooSlowError, WireError) as exc:
            return f"cannot reach the relay at {self.url}: {exc or type(exc).__name__}"

    async def _serve(self, ws: ClientConnection) -> str:
        async with trio.open_nursery() as nursery:
            nursery.start_soon(self._sender, ws)
            reason = await self._receiver(ws)
            nursery.cancel_scope.cancel()
        return reason

    async def _sender(self, ws: ClientConnection) -> None:
        try:
            while True:
                self._wake = trio.Event()  # anything after this point wakes the wait below
                for frame in self.state.due(trio.current_time()):
                    await ws.send(frame)
                if self._wake.is_set():
                    continue  # published or reported meanwhile
                with trio.move_on_at(self.state.wake_at()):
                    await self._wake.wait()
        except ConnectionClosed:
            pass  # the receiver sees it too and ends the connection

    async def _receiver(self, ws: ClientConnection) -> str:
        try:
            while True:
                data = await ws.recv()
                try:
                    frame = wire.decode_frame(data)
                except WireError as exc:
                    log.warning("bad frame from the relay: %s", exc.message)
                    continue
                if isinstance(frame, wire.Error):
                    log.warning("relay error %s: %s", frame.code.value, frame.message)
                event = self.state.receive(frame)
                if isinstance(event, NewEntry):
                    try:
                        await self._send_deliveries.send(event.frame)
                    except (trio.ClosedResourceError, trio.BrokenResourceError):
                        return "closed"
                    if self.state.handed_over(event.frame):
                        self._wake.set()
                elif isinstance(event, Moved):
                    if event.report_due:
                        self._wake.set()
                elif isinstance(event, Answered):
                    self._notify_changed()
                elif isinstance(event, Refused):
                    self._notify_changed()
                    self.on_refused(event.n, event.error)
                elif isinstance(event, LinkClosed):
                    return event.reason
        except ConnectionClosed as exc:
            return f"the relay connection closed: {exc}"


@asynccontextmanager
async def open_run_link(
    target: Target,
    *,
    link: AnyLink,
    run: str,
    cursor: str = "0",
    client: str = "",
    producer: str | None = None,
    policy: LinkPolicy | None = None,
    on_refused: Callable[[int, wire.Error], None] | None = None,
    on_state: Callable[[bool, str], None] | None = None,
    attempt: int = 0,
) -> AsyncIterator[RunLink]:
    """A :class:`RunLink`, connected once before this returns (else :class:`RelayError`).

    ``link`` says what it is (``protocol_specs/wire/link_kind.py``), and so its role: an IDE's or a
    worker's link to the run, one that takes live entries before Redis stored them (``early``:
    ``deliveries`` then hands over entries without a cursor; see ``protocol_specs/link/link.py``), an
    end of a tunnel (``protocol_specs/wire/tunnels.py``)."""
    run_link = RunLink(
        target,
        attempt=attempt,
        link=link,
        run=run,
        cursor=cursor,
        producer=producer,
        client=client,
        policy=policy,
        on_refused=on_refused,
        on_state=on_state,
    )
    async with trio.open_nursery() as nursery:
        await nursery.start(run_link.maintain)
        try:
            yield run_link
            with trio.move_on_after(FLUSH_TIMEOUT):
                await run_link.flush()  # a clean exit leaves nothing unstored
        finally:
            nursery.cancel_scope.cancel()


def tunnel_steps(link: RunLink) -> AsyncIterator[wire.TunnelEntry]:
    """The :class:`~protocol_specs.wire.wire.TunnelEntry` steps a tunnel's link delivers, in order
    (anything else, or malformed, is skipped: it cannot come from a well-behaved peer). An
    iterator over the link's deliveries, not a generator: leaving a loop over it early leaves
    nothing to finalise."""
    return _TunnelSteps(link)


class _TunnelSteps:
    def __init__(self, link: RunLink) -> None:
        self._deliveries = link.deliveries

    def __aiter__(self) -> _TunnelSteps:
        return self

    async def __anext__(self) -> wire.TunnelEntry:
        while True:
            delivery = await self._deliveries.__anext__()  # StopAsyncIteration: the link ended
            try:
                entry = wire.decode_entry(delivery.entry)
            except WireError:
                continue
            if isinstance(entry, wire.TunnelEntry):
                return entry
