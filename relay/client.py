"""Client side of the relay wire protocol, used by the CLI, the adapter and the worker shim.

- :func:`open_control` gives a :class:`ControlClient` (blobs, submit, rerun, cancel, list, get,
  claim, dispatch, report).
- :func:`follow_logs` yields a run's output and attempt markers, reconnecting as needed.
- :func:`open_run_link` gives a :class:`RunLink` bound to one run in the ``ide`` or ``worker`` role:
  ``publish`` entries (acknowledged by the relay once stored) and receive ``deliveries``.

Theory of operation: a link that survives
-----------------------------------------
A :class:`RunLink` outlives its WebSocket connections. It reconnects after any drop (backoff with
full jitter, :class:`LinkPolicy`) and resumes both directions without losing or repeating anything:

- *Outbound*: every publish gets the next number ``n`` of this link's ``producer`` and waits in a
  bounded outbox until the relay answers it (``ack``, or an ``error`` naming ``n``). After a
  reconnect, a single sender task re-sends the outbox in order; the relay stores each ``(producer,
  n)`` once and acknowledges re-sent duplicates without storing them again.
- *Inbound*: the link remembers the cursor of the last entry it handed to ``deliveries`` (per
  stream) and names it in the next ``hello``; an entry at or before that cursor is dropped. It
  reports what it received (``received`` frames) so the relay can trim transient entries.
- *Liveness*: WebSocket pings (``ping_interval``/``ping_timeout``) close a dead connection; the
  sender also sends a ``heartbeat`` frame every ``heartbeat`` seconds (a worker's renews its lease).

Only a refusal that retrying cannot fix (``no_such_run``, ``unauthorized``, ``unsupported_version``,
a failed handshake) or ``give_up_after`` seconds without a connection end the link: ``failed`` is
set, ``deliveries`` closes and ``publish`` raises :class:`RelayError`.
"""

from __future__ import annotations

import logging
import math
import os
import random
import ssl
import uuid
from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import asynccontextmanager
from dataclasses import dataclass, field, replace
from typing import Any, TypeVar

import trio
from websockets.exceptions import ConnectionClosed, InvalidURI, WebSocketException
from websockets.trio.client import ClientConnection, connect

from protocol_specs import wire
from protocol_specs.auth import Scope, TokenInfo
from protocol_specs.link import Cursor
from protocol_specs.runs import RunRecord, RunSpec
from protocol_specs.snapshots import BLOB_CHUNK, Manifest
from protocol_specs.wire import ErrorCode, Role, StreamName, WireError

__all__ = [
    "ControlClient",
    "Endpoint",
    "LinkPolicy",
    "RelayError",
    "RunLink",
    "Target",
    "endpoint",
    "follow_logs",
    "open_control",
    "open_run_link",
]

log = logging.getLogger("tether.relay.client")

_R = TypeVar("_R")

#: how long closing a run link waits for the relay to acknowledge what was published
FLUSH_TIMEOUT = 10.0


class RelayError(Exception):
    """The relay refused something; ``code`` is a :class:`~protocol_specs.wire.ErrorCode`."""

    def __init__(self, code: ErrorCode | str, message: str) -> None:
        super().__init__(f"{message} [{code}]")
        self.code = code
        self.message = message


@dataclass(frozen=True)
class Endpoint:
    """A relay and how to talk to it: its URL, the token to present, the CA file to verify a
    ``wss://`` relay with (empty: the system's CAs). The token is never shown (``repr``, ``str``)."""

    url: str
    token: str = field(default="", repr=False)
    ca_file: str = ""

    def __str__(self) -> str:
        return self.url

    def with_token(self, token: str) -> Endpoint:
        return replace(self, token=token)

    def connect_options(self) -> dict[str, Any]:
        """``websockets`` options: TLS verified against ``ca_file`` or the system CAs."""
        if not self.url.startswith("wss://"):
            return {}
        return {"ssl": ssl.create_default_context(cafile=self.ca_file or None)}


#: a relay: an :class:`Endpoint`, or just a URL (no token: only for a relay's refusals)
Target = Endpoint | str


def endpoint(target: Target) -> Endpoint:
    return target if isinstance(target, Endpoint) else Endpoint(target)


@asynccontextmanager
async def _connect(
    target: Target, hello: wire.Hello
) -> AsyncIterator[tuple[ClientConnection, wire.Welcome]]:
    ep = endpoint(target)
    url = ep.url
    hello = hello.model_copy(update={"token": ep.token or None})
    welcomed = False
    try:
        async with connect(
            url,
            compression=None,
            max_size=wire.MAX_FRAME_BYTES,
            open_timeout=10,
            **ep.connect_options(),
        ) as ws:
            await ws.send(wire.encode_frame(hello))
            frame = wire.decode_frame(await ws.recv())
            if isinstance(frame, wire.Error):
                raise RelayError(frame.code, frame.message)
            if not isinstance(frame, wire.Welcome):
                raise RelayError(ErrorCode.BAD_FRAME, f"expected 'welcome', got {frame.t!r}")
            welcomed = True
            yield ws, frame
    except WebSocketException as exc:
        if welcomed:
            raise
        # no WebSocket there (a proxy whose relay is down, a load balancer's error page) or the
        # connection closed before the welcome: as unreachable as a refused connection
        raise RelayError("unreachable", f"no relay answering at {url}: {exc}") from exc
    except ssl.SSLError as exc:
        raise RelayError("tls", f"TLS with the relay at {url} failed: {exc}") from exc
    except trio.BrokenResourceError as exc:
        if isinstance(exc.__cause__, ssl.SSLError):  # trio's SSLStream wraps the handshake's
            raise RelayError("tls", f"TLS with the relay at {url} failed: {exc.__cause__}") from exc
        raise RelayError("unreachable", f"lost the relay at {url}: {exc}") from exc
    except OSError as exc:
        raise RelayError("unreachable", f"cannot reach the relay at {url}: {exc}") from exc


class ControlClient:
    def __init__(self, ws: ClientConnection, user: str = "") -> None:
        self._ws = ws
        self.user = user  #: who the relay took us to be
        self._rid = 0
        self._lock = trio.Lock()

    async def _call(self, frame_type: type, expect: type[_R], **fields: object) -> _R:
        """One request and its reply; a lost connection is a :class:`RelayError`
        (``unreachable``), like a relay that cannot be reached at all."""
        try:
            return await self._exchange(frame_type, expect, **fields)
        except ConnectionClosed as exc:
            raise RelayError("unreachable", f"lost the relay: {exc}") from exc
        except (trio.BrokenResourceError, OSError) as exc:
            raise RelayError("unreachable", f"lost the relay: {exc}") from exc

    async def _exchange(self, frame_type: type, expect: type[_R], **fields: object) -> _R:
        async with self._lock:
            self._rid += 1
            frame = frame_type(rid=self._rid, **fields)
            await self._ws.send(wire.encode_frame(frame))
            while True:
                reply = wire.decode_frame(await self._ws.recv())
                if isinstance(reply, wire.Error) and reply.fatal:
                    raise RelayError(reply.code, reply.message)  # the relay closes: why
                if getattr(reply, "rid", None) != self._rid:
                    continue
                if isinstance(reply, wire.Error):
                    raise RelayError(reply.code, reply.message)
                if isinstance(reply, expect):
                    return reply
                raise RelayError(ErrorCode.BAD_FRAME, f"unexpected reply {reply.t!r}")

    async def _run(self, frame_type: type, **fields: object) -> RunRecord:
        return (await self._call(frame_type, wire.RunInfo, **fields)).run

    async def missing_blobs(self, digests: list[str]) -> list[str]:
        """Which of ``digests`` the relay lacks (asked in batches)."""
        out: list[str] = []
        for i in range(0, len(digests), 5000):
            reply = await self._call(wire.HaveBlobs, wire.Missing, digests=digests[i : i + 5000])
            out += reply.digests
        return out

    async def put_blob(
        self,
        digest: str,
        data: bytes | tuple[int, Callable[[int, int], Awaitable[bytes]]],
        on_bytes: Callable[[int], None] = lambda _n: None,
    ) -> None:
        """Upload one blob in :data:`~protocol_specs.snapshots.BLOB_CHUNK` pieces: ``data`` is
        its bytes, or ``(size, read(offset, length))``."""
        if isinstance(data, bytes):
            size, read = len(data), _reader(data)
        else:
            size, read = data
        offset = 0
        while True:
            piece = await read(offset, BLOB_CHUNK)
            reply = await self._call(
                wire.PutBlob, wire.Stored, digest=digest, size=size, offset=offset, data=piece
            )
            offset += len(piece)
            on_bytes(len(piece))
            if reply.complete:
                return
            if not piece:
                raise RelayError(ErrorCode.BAD_BLOB, f"blob {digest[:12]}: upload incomplete")

    async def read_blob(self, digest: str, offset: int = 0) -> tuple[int, bytes]:
        """``(blob size, up to one chunk of bytes from offset)``."""
        reply = await self._call(wire.GetBlob, wire.BlobData, digest=digest, offset=offset)
        return reply.size, reply.data

    async def get_blob(self, digest: str) -> bytes:
        parts: list[bytes] = []
        offset = 0
        while True:
            reply = await self._call(wire.GetBlob, wire.BlobData, digest=digest, offset=offset)
            parts.append(reply.data)
            offset += len(reply.data)
            if offset >= reply.size or not reply.data:
                return b"".join(parts)

    async def submit(self, spec: RunSpec, manifest: Manifest | None = None) -> RunRecord:
        return await self._run(wire.Submit, spec=spec, manifest=manifest or Manifest())

    async def rerun(self, run: str) -> RunRecord:
        return await self._run(wire.Rerun, run=run)

    async def cancel(self, run: str, detail: str = "cancelled by the user") -> RunRecord:
        return await self._run(wire.Cancel, run=run, detail=detail)

    async def get_run(self, run: str) -> RunRecord:
        return await self._run(wire.GetRun, run=run)

    async def list_runs(self, limit: int = 50) -> list[RunRecord]:
        return (await self._call(wire.ListRuns, wire.RunList, limit=limit)).runs

    async def claim(
        self, worker: str, *, backend: str = "local", run: str = "", attempt: int = 0
    ) -> wire.Assigned:
        """The next queued run of ``backend`` (blocks), or with ``run``: that run's ``attempt``;
        with the worker token for the attempt (``token``)."""
        return await self._call(
            wire.Claim, wire.Assigned, worker=worker, backend=backend, run=run, attempt=attempt
        )

    async def dispatch(self, backend: str, dispatcher: str) -> wire.Assigned:
        """The next run queued for ``backend``, and a worker token for its attempt."""
        return await self._call(
            wire.Dispatch, wire.Assigned, backend=backend, dispatcher=dispatcher
        )

    async def create_token(
        self,
        *,
        user: str = "",
        scopes: list[Scope] | None = None,
        label: str = "",
        expires_in: float = 0.0,
    ) -> tuple[str, TokenInfo]:
        reply = await self._call(
            wire.CreateToken,
            wire.TokenCreated,
            user=user,
            scopes=scopes or [Scope.RUNS],
            label=label,
            expires_in=expires_in,
        )
        return reply.token, reply.info

    async def list_tokens(self, user: str = "") -> list[TokenInfo]:
        return (await self._call(wire.ListTokens, wire.TokenList, user=user)).tokens

    async def revoke_token(self, token_id: str) -> TokenInfo:
        return (await self._call(wire.RevokeToken, wire.TokenList, id=token_id)).tokens[0]

    async def audit(self, run: str) -> list[wire.AuditEntry]:
        return (await self._call(wire.GetAudit, wire.AuditLog, run=run)).entries

    async def report(
        self, run: str, attempt: int, event: str, *, job: str = "", detail: str = ""
    ) -> RunRecord:
        return await self._run(
            wire.Report, run=run, attempt=attempt, event=event, job=job, detail=detail
        )


def _reader(data: bytes) -> Callable[[int, int], Awaitable[bytes]]:
    async def read(offset: int, length: int) -> bytes:
        return data[offset : offset + length]

    return read


@asynccontextmanager
async def open_control(target: Target, *, client: str = "") -> AsyncIterator[ControlClient]:
    async with _connect(target, wire.Hello(role=Role.CONTROL, client=client)) as (ws, welcome):
        yield ControlClient(ws, welcome.user)


async def follow_logs(
    target: Target,
    run: str,
    on_entry: Callable[[wire.LogEntry | wire.StatusEntry], None],
    *,
    cursor: str = "0",
    follow: bool = True,
    from_end: bool = False,
    policy: LinkPolicy | None = None,
) -> str:
    """Hand a run's logs stream after ``cursor`` to ``on_entry``: output chunks and status
    markers, in order; returns the cursor of the last entry handed over. ``from_end``: only what
    comes after the stream's end as it is at the first connection.

    Without ``follow``, ends once the stream's current end is reached; with it, ends after the
    run's ``finished`` marker. Reconnects after a drop and resumes after the last entry handed over.
    """
    policy = policy or LinkPolicy()
    attempt = 0
    down_since: float | None = None
    while True:
        try:
            async with _connect(target, wire.Hello(role=Role.LOGS, run=run, cursor=cursor)) as (
                ws,
                welcome,
            ):
                attempt, down_since = 0, None
                tail = welcome.tails.get(StreamName.LOGS.value, "0")
                if from_end:
                    cursor, from_end = tail, False
                    continue  # reconnect, naming the end as the cursor
                finished = welcome.run is not None and welcome.run.finished
                while True:
                    if (not follow or finished) and not _after(tail, cursor):
                        return cursor  # caught up with the end as it was when we asked
                    frame = wire.decode_frame(await ws.recv())
                    if isinstance(frame, wire.Error):
                        raise RelayError(frame.code, frame.message)
                    if not isinstance(frame, wire.Deliver):
                        continue
                    cursor = frame.cursor
                    entry = wire.decode_entry(frame.entry)
                    if isinstance(entry, wire.LogEntry | wire.StatusEntry):
                        on_entry(entry)
                        if isinstance(entry, wire.StatusEntry) and entry.event == "finished":
                            finished = True
                            if follow:
                                return cursor
        except (ConnectionClosed, RelayError) as exc:
            if isinstance(exc, RelayError) and exc.code != "unreachable":
                raise
            down_since = trio.current_time() if down_since is None else down_since
            if trio.current_time() - down_since > 60:
                raise RelayError("unreachable", f"lost the relay at {target}: {exc}") from exc
            await trio.sleep(policy.backoff(attempt))
            attempt += 1


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


#: handshake refusals that reconnecting cannot fix
_PERMANENT = frozenset(
    {
        ErrorCode.NO_SUCH_RUN,
        ErrorCode.UNAUTHORIZED,
        ErrorCode.UNSUPPORTED_VERSION,
        ErrorCode.HANDSHAKE_REQUIRED,
        ErrorCode.BAD_FRAME,
        ErrorCode.STALE_ATTEMPT,
        ErrorCode.FORBIDDEN,
        ErrorCode.TOO_MANY_FAILURES,
    }
)


def _after(cursor: str, than: str) -> bool:
    return Cursor.parse(cursor) > Cursor.parse(than)


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
        role: Role,
        run: str,
        cursor: str = "0",
        history: bool = False,
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
        self.role = role
        self.run_id = run
        self.history = history
        self.producer = producer or f"{role.value}-{uuid.uuid4().hex[:12]}"
        self.client = client
        self.policy = policy or LinkPolicy()
        self.on_refused = on_refused or (lambda _n, _error: None)
        self.on_state = on_state or (lambda _up, _detail: None)
        self.inbound = StreamName.TO_IDE if role is Role.IDE else StreamName.TO_WORKER
        self.cursors = {name: "0" for name in StreamName}
        self.cursors[self.inbound] = cursor
        self._send_deliveries, self.deliveries = trio.open_memory_channel[wire.Deliver](256)
        self.welcome: wire.Welcome | None = None
        self.latest: wire.Welcome | None = None
        self.epoch = 0  #: connections made so far
        self.connected = False
        self.failed: RelayError | None = None
        self.acked = ""  #: cursor of the last entry the relay stored for us
        self.errors: list[wire.Error] = []
        self.duplicates = 0  #: re-sent publishes the relay had already stored
        self._n = 0
        self._answered = 0
        self._outbox: dict[int, bytes] = {}
        self._outbox_bytes = 0
        self._changed = trio.Event()  # answers, failure: wakes flush and a full outbox
        self._wake = trio.Event()  # new publishes or deliveries to report: wakes the sender
        self._unreported = 0
        self._reported: dict[StreamName, str] = {}
        self._report_now = False

    def __repr__(self) -> str:
        state = "failed" if self.failed else "up" if self.connected else "down"
        return (
            f"<RunLink {self.role.value} run={self.run_id} {state} epoch={self.epoch} "
            f"outbox={len(self._outbox)}>"
        )

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
        return len(self._outbox)

    # --- publishing -------------------------------------------------------------------------------

    async def publish(self, entry: wire.AnyEntry) -> int:
        """Queue one entry for the relay; returns its number. Waits while the outbox is full.

        Raises :class:`RelayError` once the link has failed for good.
        """
        data = wire.encode_entry(entry)
        while not self._outbox_has_room(len(data)):
            if self.failed:
                raise self.failed
            await self._changed.wait()
        if self.failed:
            raise self.failed
        self._n += 1
        frame = wire.encode_frame(wire.Publish(n=self._n, entry=data))
        self._outbox[self._n] = frame
        self._outbox_bytes += len(frame)
        self._wake.set()
        return self._n

    def _outbox_has_room(self, size: int) -> bool:
        if not self._outbox:
            return True  # one entry always fits, whatever its size
        return (
            len(self._outbox) < self.policy.outbox_entries
            and self._outbox_bytes + size <= self.policy.outbox_bytes
        )

    def report_now(self) -> None:
        """Tell the relay what was received before anything published after this call."""
        self._report_now = True
        self._wake.set()

    @property
    def answered(self) -> int:
        """The highest publish number the relay answered."""
        return self._answered

    async def wait_answered(self, n: int) -> None:
        """Wait until the relay answered publish ``n`` (or the link failed)."""
        while self._answered < n and not self.failed:
            await self._changed.wait()

    async def flush(self) -> None:
        """Wait until the relay answered every publish so far (or the link failed)."""
        while self._answered < self._n and not self.failed:
            await self._changed.wait()

    def _answer(self, n: int) -> None:
        # the outbox is in publish order: answered numbers are at its front
        while self._outbox:
            number = next(iter(self._outbox))
            if number > n:
                break
            self._outbox_bytes -= len(self._outbox.pop(number))
        self._answered = max(self._answered, n)
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
                    self._fail(RelayError("unreachable", detail))
                    raise self.failed  # type: ignore[misc]
                give_up = self.policy.give_up_after
                if started and give_up is not None and now - down_since >= give_up:
                    self._fail(RelayError("unreachable", f"no relay for {give_up:g} s: {detail}"))
                    return
                await trio.sleep(self.policy.backoff(attempt))
                attempt += 1
        finally:
            self._send_deliveries.close()

    async def _connect_once(self, task_status: trio.TaskStatus[None] | None) -> str:
        """One connection, served until it drops; returns why it ended ("" if it never began)."""
        hello = wire.Hello(
            role=self.role,
            run=self.run_id,
            cursor=self.cursors[self.inbound],
            history=self.history,
            history_cursor=self.cursors[StreamName.TO_WORKER],
            producer=self.producer,
            client=self.client,
            attempt=self.attempt,
            token=self.endpoint.token or None,
        )
        p = self.policy
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
                if isinstance(frame, wire.Error):
                    if frame.code in _PERMANENT:
                        self._fail(RelayError(frame.code, frame.message))
                    return f"the relay refused the connection: {frame.message}"
                if not isinstance(frame, wire.Welcome) or frame.run is None:
                    self._fail(
                        RelayError(ErrorCode.BAD_FRAME, f"expected 'welcome', got {frame.t!r}")
                    )
                    return "bad handshake"
                self.welcome = self.welcome or frame
                self.latest = frame
                self.epoch += 1
                self.connected = True
                if self.epoch > 1:
                    self.on_state(True, f"reconnected to the relay (connection {self.epoch})")
                if task_status is not None:
                    task_status.started()
                return await self._serve(ws)
        except InvalidURI as exc:
            self._fail(RelayError("bad_url", str(exc)))
            return str(exc)
        except ssl.SSLCertVerificationError as exc:
            self._fail(RelayError("tls", f"the relay's certificate is not trusted: {exc}"))
            return str(exc)
        except trio.BrokenResourceError as exc:
            if isinstance(exc.__cause__, ssl.SSLCertVerificationError):
                error = f"the relay's certificate is not trusted: {exc.__cause__}"
                self._fail(RelayError("tls", error))
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
        next_n = self._answered + 1
        p = self.policy
        every = p.heartbeat
        if self.latest is not None and self.latest.heartbeat > 0:
            every = min(every, self.latest.heartbeat)
        elif self.latest is not None:
            every = math.inf  # the relay wants no heartbeats on this link (WebSocket pings stay)
        heartbeat_at = trio.current_time() + every
        report_at: float | None = None
        try:
            while True:
                self._wake = trio.Event()  # anything after this point wakes the wait below
                if self._report_now:
                    self._report_now = False
                    await self._report(ws)
                    report_at = None
                while next_n <= self._n:
                    frame = self._outbox.get(next_n)
                    if frame is not None:
                        await ws.send(frame)
                    next_n += 1
                now = trio.current_time()
                if self._unreported and report_at is None:
                    report_at = now + p.report_after
                if report_at is not None and (
                    now >= report_at or self._unreported >= p.report_every
                ):
                    await self._report(ws)
                    report_at = None
                if now >= heartbeat_at:
                    await ws.send(wire.encode_frame(wire.Heartbeat()))
                    heartbeat_at = now + every
                if next_n <= self._n or self._report_now:
                    continue
                with trio.move_on_at(min(heartbeat_at, report_at or heartbeat_at)):
                    await self._wake.wait()
        except ConnectionClosed:
            pass  # the receiver sees it too and ends the connection

    async def _report(self, ws: ClientConnection) -> None:
        self._unreported = 0
        for name, cursor in self.cursors.items():
            if cursor != "0" and self._reported.get(name) != cursor:
                await ws.send(wire.encode_frame(wire.Received(stream=name, cursor=cursor)))
                self._reported[name] = cursor

    async def _receiver(self, ws: ClientConnection) -> str:
        try:
            while True:
                data = await ws.recv()
                try:
                    frame = wire.decode_frame(data)
                except WireError as exc:
                    log.warning("bad frame from the relay: %s", exc.message)
                    continue
                if isinstance(frame, wire.Deliver):
                    if not _after(frame.cursor, self.cursors[frame.stream]):
                        continue  # already handed over before a reconnect
                    try:
                        await self._send_deliveries.send(frame)
                    except (trio.ClosedResourceError, trio.BrokenResourceError):
                        return "closed"
                    self.cursors[frame.stream] = frame.cursor
                    self._unreported += 1
                    if self._unreported >= self.policy.report_every or self._unreported == 1:
                        self._wake.set()
                elif isinstance(frame, wire.Ack):
                    if frame.cursor:
                        self.acked = frame.cursor
                    self.duplicates += frame.duplicate
                    self._answer(frame.n)
                elif isinstance(frame, wire.Error):
                    log.warning("relay error %s: %s", frame.code.value, frame.message)
                    self.errors.append(frame)
                    if frame.n is not None and not frame.fatal:
                        self._answer(frame.n)
                        self.on_refused(frame.n, frame)
                    if frame.fatal:
                        return f"the relay closed the connection: {frame.message}"
        except ConnectionClosed as exc:
            return f"the relay connection closed: {exc}"


@asynccontextmanager
async def open_run_link(
    target: Target,
    *,
    role: Role,
    run: str,
    cursor: str = "0",
    history: bool = False,
    client: str = "",
    producer: str | None = None,
    policy: LinkPolicy | None = None,
    on_refused: Callable[[int, wire.Error], None] | None = None,
    on_state: Callable[[bool, str], None] | None = None,
    attempt: int = 0,
) -> AsyncIterator[RunLink]:
    """A :class:`RunLink`, connected once before this returns (else :class:`RelayError`)."""
    link = RunLink(
        target,
        attempt=attempt,
        role=role,
        run=run,
        cursor=cursor,
        history=history,
        producer=producer,
        client=client,
        policy=policy,
        on_refused=on_refused,
        on_state=on_state,
    )
    async with trio.open_nursery() as nursery:
        await nursery.start(link.maintain)
        try:
            yield link
            with trio.move_on_after(FLUSH_TIMEOUT):
                await link.flush()  # a clean exit leaves nothing unstored
        finally:
            nursery.cancel_scope.cancel()
