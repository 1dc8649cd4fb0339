"""The relay wire protocol, version 1: msgpack frames over a WebSocket.

Theory of operation
-------------------
Every WebSocket message is one binary frame: a msgpack map whose ``t`` key names the frame type. The
first frame a peer sends is :class:`Hello`; the relay answers :class:`Welcome` or :class:`Error` (and
closes). After that a peer's frames depend on its role:

- ``ide`` (the adapter, one run): :class:`Publish` entries into the run's ``to_worker`` stream; the relay
  answers each with :class:`Ack` once the entry is stored in Redis, and pushes :class:`Deliver` frames
  from the run's ``to_ide`` stream, starting after the cursor given in ``Hello``.
- ``worker`` (the worker shim, one run): the mirror image (publishes ``to_ide``, receives ``to_worker``).
- ``control`` (the CLI, the worker pool and scheduler backends): request/reply frames correlated by
  ``rid``: upload snapshot blobs, submit, rerun, cancel, list and get runs, claim the next queued run,
  report a scheduler's view of an attempt.
- ``logs`` (``tether logs``, one run): the relay pushes :class:`Deliver` frames from the run's ``logs``
  stream (:class:`LogEntry` output chunks, and :class:`StatusEntry` markers such as an attempt
  starting or the run ending) after the cursor given in ``Hello``, following it live.

Stream entries (:class:`DapEntry`, :class:`StatusEntry`, :class:`ControlEntry`) are themselves msgpack
maps, carried as opaque ``bytes`` inside ``Publish``/``Deliver``; DAP bodies inside a ``DapEntry`` are
the raw JSON bytes the DAP peer sent, so nothing is transcoded on the hot path.

The prose spec with limits and error codes is ``protocol_specs/relay-protocol.md``.
"""

from __future__ import annotations

from enum import StrEnum
from typing import Annotated, Any, Literal

import msgpack
from pydantic import BaseModel, ConfigDict, Field, TypeAdapter, ValidationError

from .auth import Scope, TokenInfo
from .runs import RunRecord, RunSpec
from .snapshots import BLOB_CHUNK, Digest, Manifest

__all__ = [
    "MAX_DAP_BODY_BYTES",
    "MAX_FRAME_BYTES",
    "MAX_HELLO_BYTES",
    "MAX_RUN_FRAME_BYTES",
    "PROTOCOL_VERSION",
    "Ack",
    "AnyEntry",
    "Assigned",
    "AuditEntry",
    "AuditLog",
    "BlobData",
    "Cancel",
    "Claim",
    "ControlEntry",
    "CreateToken",
    "DapEntry",
    "Deliver",
    "Dispatch",
    "Entry",
    "Error",
    "ErrorCode",
    "Frame",
    "GetAudit",
    "GetBlob",
    "GetRun",
    "HaveBlobs",
    "Heartbeat",
    "Hello",
    "ListRuns",
    "ListTokens",
    "LogEntry",
    "Missing",
    "PresenceEntry",
    "Publish",
    "PutBlob",
    "Received",
    "Report",
    "Rerun",
    "RevokeToken",
    "Role",
    "RunInfo",
    "RunList",
    "StatusEntry",
    "Stored",
    "StreamName",
    "Submit",
    "TokenCreated",
    "TokenList",
    "Welcome",
    "WireError",
    "decode_entry",
    "decode_frame",
    "encode_entry",
    "encode_frame",
]

PROTOCOL_VERSION = 1
#: Largest WebSocket message the relay accepts (a submit frame carries the snapshot's manifest).
MAX_FRAME_BYTES = 80 * 1024 * 1024
#: Largest DAP message body carried in one entry (same as the adapter's DAP framer limit).
MAX_DAP_BODY_BYTES = 16 * 1024 * 1024
#: Largest message before the handshake is done: nobody unauthenticated makes the relay buffer more.
MAX_HELLO_BYTES = 64 * 1024
#: Largest message on an ``ide``/``worker`` connection (a DAP body and its envelope).
MAX_RUN_FRAME_BYTES = MAX_DAP_BODY_BYTES + 64 * 1024


class Role(StrEnum):
    IDE = "ide"
    WORKER = "worker"
    CONTROL = "control"
    LOGS = "logs"


class StreamName(StrEnum):
    TO_WORKER = "to_worker"
    TO_IDE = "to_ide"
    LOGS = "logs"


class ErrorCode(StrEnum):
    """Error codes a relay sends; ``fatal`` errors are followed by a close."""

    BAD_FRAME = "bad_frame"  #: not msgpack, or not a known frame, or invalid fields
    BAD_ENTRY = "bad_entry"  #: a published entry is malformed
    UNSUPPORTED_VERSION = "unsupported_version"
    HANDSHAKE_REQUIRED = "handshake_required"
    NOT_ALLOWED = "not_allowed"  #: the frame is not valid for this role
    UNAUTHORIZED = "unauthorized"
    NO_SUCH_RUN = "no_such_run"
    RUN_FINISHED = "run_finished"
    TOO_LARGE = "too_large"
    #: a publish skipped a frame number of its producer (resend from the first unacknowledged)
    OUT_OF_ORDER = "out_of_order"
    #: the run's buffer for this stream is full (entries or bytes not yet read by the other side)
    BUFFER_FULL = "buffer_full"
    #: the worker's lease on the run expired; the run was marked lost
    LEASE_LOST = "lease_lost"
    BAD_SPEC = "bad_spec"
    #: a submit names blobs the relay does not hold (upload them first)
    MISSING_BLOBS = "missing_blobs"
    #: an uploaded blob's bytes do not match its digest
    BAD_BLOB = "bad_blob"
    NO_SUCH_BLOB = "no_such_blob"
    #: a worker of an attempt that is no longer the run's current one
    STALE_ATTEMPT = "stale_attempt"
    #: the token may not do this: a wrong role or scope, or another run's worker token
    FORBIDDEN = "forbidden"
    #: too many failed authentications from this address lately: answers are slowed down
    TOO_MANY_FAILURES = "too_many_failures"
    #: the user has ``RelayConfig.max_connections`` connections open on this relay already
    TOO_MANY_CONNECTIONS = "too_many_connections"
    #: the user has ``RelayConfig.max_active_runs`` runs not yet finished
    TOO_MANY_RUNS = "too_many_runs"
    NO_SUCH_TOKEN = "no_such_token"
    INTERNAL = "internal"


class WireError(Exception):
    """A frame or entry could not be decoded; ``code`` says what to send back."""

    def __init__(self, code: ErrorCode, message: str) -> None:
        super().__init__(message)
        self.code = code
        self.message = message


_FROZEN = ConfigDict(frozen=True, extra="forbid")


# --- stream entries -------------------------------------------------------------------------------


class DapEntry(BaseModel):
    """One DAP message in a run stream.

    ``origin`` names the adapter instance that sent a request (in ``to_worker``) or the adapter a
    response is addressed to (in ``to_ide``); events carry ``origin=""``. ``body`` is the raw JSON.
    ``local`` marks a request the adapter already answered itself (configuration recorded while no
    worker was live): the worker applies it but answers into the stream without an IDE waiting.
    ``bp_ids`` are the breakpoint ids the adapter handed out for a ``setBreakpoints`` /
    ``setFunctionBreakpoints`` request, in order.
    """

    model_config = _FROZEN
    k: Literal["dap"] = "dap"
    origin: str = ""
    body: bytes = Field(max_length=MAX_DAP_BODY_BYTES)
    local: bool = False
    bp_ids: list[int] | None = None
    #: not needed to rebuild the session (output, answers to live requests): the relay may delete
    #: it once the other side has received it (``protocol_specs.session.is_transient``)
    transient: bool = False


class StatusEntry(BaseModel):
    """A run or debugger status change, written by the relay or the worker into ``to_ide``."""

    model_config = _FROZEN
    k: Literal["status"] = "status"
    event: str
    state: str | None = None
    detail: str = ""
    at: float = 0.0
    exit_code: int | None = None
    data: dict[str, Any] = Field(default_factory=dict)


class ControlEntry(BaseModel):
    """An instruction for the worker shim, written into ``to_worker`` (e.g. ``terminate``).

    ``attempt`` names the attempt it is for (0: every attempt); a later attempt ignores it.
    """

    model_config = _FROZEN
    k: Literal["control"] = "control"
    action: Literal["terminate"]
    detail: str = ""
    attempt: int = 0


class LogEntry(BaseModel):
    """A chunk of the program's stdout or stderr, written by the worker into the ``logs`` stream."""

    model_config = _FROZEN
    k: Literal["log"] = "log"
    stream: Literal["stdout", "stderr"]
    data: bytes = Field(max_length=1024 * 1024)
    attempt: int = 1


class PresenceEntry(BaseModel):
    """Whether an IDE is attached to the adapter ``origin``, written into ``to_worker``.

    The adapter writes one when an IDE connects or leaves and after every reconnect of its relay
    link; the relay writes ``attached=False, link_lost=True`` when an ``ide`` connection that last
    reported ``attached=True`` closes. ``epoch`` numbers the adapter's relay connections: an entry for an
    older epoch than one already seen for the same origin is stale and ignored.
    """

    model_config = _FROZEN
    k: Literal["presence"] = "presence"
    origin: str
    epoch: int = Field(ge=0)
    attached: bool
    #: written by the relay because the adapter's relay link closed (not because its IDE left):
    #: the adapter may be back in a moment, and the worker gives it a little while
    link_lost: bool = False


AnyEntry = DapEntry | StatusEntry | ControlEntry | PresenceEntry | LogEntry
Entry = Annotated[AnyEntry, Field(discriminator="k")]
_ENTRY: TypeAdapter[AnyEntry] = TypeAdapter(Entry)


def encode_entry(entry: AnyEntry) -> bytes:
    return msgpack.packb(entry.model_dump(exclude_defaults=False), use_bin_type=True)  # type: ignore[no-any-return]


def decode_entry(data: bytes) -> AnyEntry:
    """Decode a stream entry; raises :class:`WireError` (``bad_entry``)."""
    try:
        raw = msgpack.unpackb(data, raw=False)
    except Exception as exc:
        raise WireError(ErrorCode.BAD_ENTRY, f"entry is not msgpack: {exc}") from exc
    plain = _plain_dap_entry(raw)
    if plain is not None:
        return plain
    try:
        return _ENTRY.validate_python(raw)
    except ValidationError as exc:
        raise WireError(ErrorCode.BAD_ENTRY, f"invalid entry: {_short(exc)}") from exc


_DAP_ENTRY_KEYS = frozenset({"k", "origin", "body", "local", "bp_ids", "transient"})


def _plain_dap_entry(raw: object) -> DapEntry | None:
    """The everyday DAP entry checked by hand, exactly as its model would; ``None``: validate it.

    Every message of a session is parsed like this by the relay and both peers, and pydantic's
    general validation was the largest single cost of a hop (see ``bench/``).
    """
    if not isinstance(raw, dict) or raw.get("k") != "dap" or not raw.keys() <= _DAP_ENTRY_KEYS:
        return None
    body = raw.get("body")
    if type(body) is not bytes or len(body) > MAX_DAP_BODY_BYTES:
        return None
    origin = raw.get("origin", "")
    local = raw.get("local", False)
    transient = raw.get("transient", False)
    if type(origin) is not str or type(local) is not bool or type(transient) is not bool:
        return None
    if raw.get("bp_ids") is not None:
        return None  # lists of ints: leave them to pydantic
    return DapEntry.model_construct(
        origin=origin, body=body, local=local, bp_ids=None, transient=transient
    )


# --- frames ---------------------------------------------------------------------------------------


class Hello(BaseModel):
    model_config = _FROZEN
    t: Literal["hello"] = "hello"
    v: int = PROTOCOL_VERSION
    role: Role
    run: str | None = None
    token: str | None = None
    #: resume cursor: deliver entries strictly after this stream id ("0" = from the beginning)
    cursor: str = "0"
    #: ide role only: first deliver the run's to_worker entries after ``history_cursor``
    history: bool = False
    history_cursor: str = "0"
    #: names the sender across reconnects: the relay keeps, per producer, the last ``Publish.n`` it
    #: stored and drops re-sent duplicates ("" = this connection only)
    producer: str = ""
    client: str = ""
    #: worker role: the attempt this worker runs (the relay refuses an attempt that is not current)
    attempt: int = 0


class Welcome(BaseModel):
    model_config = _FROZEN
    t: Literal["welcome"] = "welcome"
    v: int = PROTOCOL_VERSION
    server: str = ""
    run: RunRecord | None = None
    #: run connections: the last entry id of each of the run's streams when the connection began
    tails: dict[str, str] = Field(default_factory=dict)
    #: send a ``heartbeat`` frame at least this often (seconds; 0: none needed, only workers send them)
    heartbeat: float = 0.0
    #: who the relay took the token's holder to be (a user name, or ``worker``)
    user: str = ""


class Publish(BaseModel):
    """Store ``entry`` in the role's outbound stream.

    ``n`` numbers the producer's entries 1, 2, 3, ... without gaps, across reconnects: a sender
    re-sends every unacknowledged publish, in order, after reconnecting.
    """

    model_config = _FROZEN
    t: Literal["publish"] = "publish"
    n: int = Field(ge=1)
    entry: bytes


class Ack(BaseModel):
    """Publishes up to ``n`` are answered. ``duplicate``: ``n`` was stored before (a re-send)."""

    model_config = _FROZEN
    t: Literal["ack"] = "ack"
    n: int
    cursor: str
    duplicate: bool = False


class Received(BaseModel):
    """The peer has received every entry of ``stream`` up to ``cursor`` (lets the relay trim)."""

    model_config = _FROZEN
    t: Literal["received"] = "received"
    stream: StreamName
    cursor: str


class Heartbeat(BaseModel):
    """A run connection is alive; on a worker connection it renews the run's lease."""

    model_config = _FROZEN
    t: Literal["heartbeat"] = "heartbeat"


class Deliver(BaseModel):
    model_config = _FROZEN
    t: Literal["deliver"] = "deliver"
    stream: StreamName
    cursor: str
    entry: bytes


class Submit(BaseModel):
    """Queue a run of ``spec`` on the snapshot ``manifest`` (whose blobs the relay must hold)."""

    model_config = _FROZEN
    t: Literal["submit"] = "submit"
    rid: int
    spec: RunSpec
    manifest: Manifest = Field(default_factory=Manifest)


class Rerun(BaseModel):
    """Queue a new run with the spec and snapshot of ``run`` (reproduction)."""

    model_config = _FROZEN
    t: Literal["rerun"] = "rerun"
    rid: int
    run: str


class HaveBlobs(BaseModel):
    """Which of ``digests`` does the relay lack? Answered by :class:`Missing`."""

    model_config = _FROZEN
    t: Literal["have_blobs"] = "have_blobs"
    rid: int
    digests: list[Digest] = Field(max_length=10_000)


class Missing(BaseModel):
    model_config = _FROZEN
    t: Literal["missing"] = "missing"
    rid: int
    digests: list[str]


class PutBlob(BaseModel):
    """One piece of a blob of ``size`` bytes, at ``offset`` (pieces in order, from 0).

    The relay checks the digest when the last piece arrives and answers :class:`Stored`.
    """

    model_config = _FROZEN
    t: Literal["put_blob"] = "put_blob"
    rid: int
    digest: Digest
    size: int = Field(ge=0)
    offset: int = Field(ge=0)
    data: bytes = Field(max_length=BLOB_CHUNK)


class Stored(BaseModel):
    """``received`` bytes of the blob are held; ``complete`` once all of it was checked."""

    model_config = _FROZEN
    t: Literal["stored"] = "stored"
    rid: int
    received: int
    complete: bool = False


class GetBlob(BaseModel):
    model_config = _FROZEN
    t: Literal["get_blob"] = "get_blob"
    rid: int
    digest: Digest
    offset: int = Field(default=0, ge=0)
    length: int = Field(default=BLOB_CHUNK, ge=1, le=BLOB_CHUNK)


class BlobData(BaseModel):
    model_config = _FROZEN
    t: Literal["blob"] = "blob"
    rid: int
    size: int
    offset: int
    data: bytes


class ListRuns(BaseModel):
    model_config = _FROZEN
    t: Literal["list_runs"] = "list_runs"
    rid: int
    limit: int = Field(default=50, ge=1, le=1000)


class RunList(BaseModel):
    model_config = _FROZEN
    t: Literal["runs"] = "runs"
    rid: int
    runs: list[RunRecord]


class Report(BaseModel):
    """A scheduler backend's news about an attempt it launched.

    ``job``: the scheduler accepted it (``job`` is its id); ``lost``: the job ended, was cancelled
    or preempted without the worker finishing the attempt (retried like a lost lease).
    """

    model_config = _FROZEN
    t: Literal["report"] = "report"
    rid: int
    run: str
    attempt: int = Field(ge=1)
    event: Literal["job", "lost"]
    job: str = Field(default="", max_length=200)
    detail: str = Field(default="", max_length=2000)


class Cancel(BaseModel):
    model_config = _FROZEN
    t: Literal["cancel"] = "cancel"
    rid: int
    run: str
    detail: str = "cancelled by the user"


class GetRun(BaseModel):
    model_config = _FROZEN
    t: Literal["get_run"] = "get_run"
    rid: int
    run: str


class Claim(BaseModel):
    """Block until a queued run of ``backend`` is available, then take it.

    With ``run``: take that run (a worker a scheduler started for it), if it is queued for
    ``attempt``.
    """

    model_config = _FROZEN
    t: Literal["claim"] = "claim"
    rid: int
    worker: str
    backend: str = "local"
    run: str = ""
    attempt: int = 0


class Dispatch(BaseModel):
    """A scheduler backend: block until a run is queued for ``backend``, then hand it over (the
    run stays ``queued`` until the worker its job starts claims it, naming its attempt)."""

    model_config = _FROZEN
    t: Literal["dispatch"] = "dispatch"
    rid: int
    backend: str
    dispatcher: str


class RunInfo(BaseModel):
    model_config = _FROZEN
    t: Literal["run"] = "run"
    rid: int
    run: RunRecord


class Assigned(BaseModel):
    """A run's attempt handed to a worker (``claim``) or a scheduler backend (``dispatch``), with
    the worker token minted for it ("" when the claimer already holds that attempt's token)."""

    model_config = _FROZEN
    t: Literal["assigned"] = "assigned"
    rid: int
    run: RunRecord
    manifest: Manifest = Field(default_factory=Manifest)
    token: str = ""


class CreateToken(BaseModel):
    """A new user token; ``user`` other than one's own, or ``admin``/``backend`` scopes need an
    admin token. ``expires_in`` seconds (0: never)."""

    model_config = _FROZEN
    t: Literal["create_token"] = "create_token"
    rid: int
    user: str = Field(default="", max_length=64)
    scopes: list[Scope] = Field(default_factory=lambda: [Scope.RUNS], max_length=3)
    label: str = Field(default="", max_length=200)
    expires_in: float = Field(default=0.0, ge=0)


class TokenCreated(BaseModel):
    """The new token: the only time the relay ever sends one."""

    model_config = _FROZEN
    t: Literal["token_created"] = "token_created"
    rid: int
    token: str
    info: TokenInfo


class ListTokens(BaseModel):
    """One's own tokens (admins: everyone's, or ``user``'s)."""

    model_config = _FROZEN
    t: Literal["list_tokens"] = "list_tokens"
    rid: int
    user: str = Field(default="", max_length=64)


class TokenList(BaseModel):
    model_config = _FROZEN
    t: Literal["tokens"] = "tokens"
    rid: int
    tokens: list[TokenInfo]


class RevokeToken(BaseModel):
    model_config = _FROZEN
    t: Literal["revoke_token"] = "revoke_token"
    rid: int
    id: str = Field(max_length=64)


class AuditEntry(BaseModel):
    """Who did what to a run, and when: kept per run by the relay, read with ``tether audit``."""

    model_config = _FROZEN
    at: float
    #: ``submit``, ``attach``, ``detach``, ``logs``, ``cancel``, ``rerun``, ``worker``, ``refused``
    event: str
    user: str = ""
    token: str = ""  #: the token's id
    role: str = ""
    source: str = ""  #: the peer's address
    client: str = ""
    detail: str = ""


class GetAudit(BaseModel):
    model_config = _FROZEN
    t: Literal["get_audit"] = "get_audit"
    rid: int
    run: str


class AuditLog(BaseModel):
    model_config = _FROZEN
    t: Literal["audit"] = "audit"
    rid: int
    run: str
    entries: list[AuditEntry]


class Error(BaseModel):
    model_config = _FROZEN
    t: Literal["error"] = "error"
    code: ErrorCode
    message: str
    fatal: bool = False
    rid: int | None = None
    n: int | None = None


AnyFrame = (
    Hello
    | Welcome
    | Publish
    | Ack
    | Received
    | Heartbeat
    | Deliver
    | Submit
    | Rerun
    | HaveBlobs
    | Missing
    | PutBlob
    | Stored
    | GetBlob
    | BlobData
    | ListRuns
    | RunList
    | Report
    | Cancel
    | GetRun
    | Claim
    | Dispatch
    | RunInfo
    | Assigned
    | CreateToken
    | TokenCreated
    | ListTokens
    | TokenList
    | RevokeToken
    | GetAudit
    | AuditLog
    | Error
)
Frame = Annotated[AnyFrame, Field(discriminator="t")]
_FRAME: TypeAdapter[AnyFrame] = TypeAdapter(Frame)
_DELIVER_KEYS = frozenset({"t", "stream", "cursor", "entry"})
_PUBLISH_KEYS = frozenset({"t", "n", "entry"})
_ACK_KEYS = frozenset({"t", "n", "cursor", "duplicate"})
_STREAM_NAMES = frozenset(name.value for name in StreamName)


def encode_frame(frame: AnyFrame) -> bytes:
    kind = type(frame)
    if kind is Deliver or kind is Ack or kind is Publish or kind is Received:
        # the frames of live traffic: their fields as they are (what model_dump gives, faster)
        return msgpack.packb(frame.__dict__, use_bin_type=True)  # type: ignore[no-any-return]
    return msgpack.packb(frame.model_dump(mode="python"), use_bin_type=True)  # type: ignore[no-any-return]


def _plain_frame(raw: dict[Any, Any]) -> AnyFrame | None:
    """A live-traffic frame checked by hand, exactly as its model would; ``None``: validate it."""
    t = raw["t"]
    if t == "deliver":
        if raw.keys() == _DELIVER_KEYS:
            stream, cursor, entry = raw["stream"], raw["cursor"], raw["entry"]
            if (
                type(stream) is str
                and stream in _STREAM_NAMES
                and type(cursor) is str
                and type(entry) is bytes
            ):
                return Deliver.model_construct(
                    stream=StreamName(stream), cursor=cursor, entry=entry
                )
    elif t == "publish":
        n, entry = raw.get("n"), raw.get("entry")
        if raw.keys() == _PUBLISH_KEYS and type(n) is int and n >= 1 and type(entry) is bytes:
            return Publish.model_construct(n=n, entry=entry)
    elif t == "ack":
        n, cursor, duplicate = raw.get("n"), raw.get("cursor"), raw.get("duplicate")
        if (
            raw.keys() == _ACK_KEYS
            and type(n) is int
            and type(cursor) is str
            and type(duplicate) is bool
        ):
            return Ack.model_construct(n=n, cursor=cursor, duplicate=duplicate)
    return None


def decode_frame(data: bytes | str) -> AnyFrame:
    """Decode one frame; raises :class:`WireError` with a code saying what to answer."""
    if isinstance(data, str):
        raise WireError(
            ErrorCode.BAD_FRAME, "text WebSocket messages are not frames; send binary msgpack"
        )
    if len(data) > MAX_FRAME_BYTES:
        raise WireError(
            ErrorCode.TOO_LARGE, f"frame of {len(data)} bytes exceeds {MAX_FRAME_BYTES}"
        )
    try:
        raw = msgpack.unpackb(data, raw=False)
    except Exception as exc:
        raise WireError(ErrorCode.BAD_FRAME, f"frame is not msgpack: {exc}") from exc
    if not isinstance(raw, dict) or "t" not in raw:
        raise WireError(ErrorCode.BAD_FRAME, "frame must be a msgpack map with a 't' key")
    plain = _plain_frame(raw)
    if plain is not None:
        return plain
    try:
        return _FRAME.validate_python(raw)
    except ValidationError as exc:
        code = ErrorCode.TOO_LARGE if "too_long" in str(exc) else ErrorCode.BAD_FRAME
        if raw.get("t") == "submit" and code is ErrorCode.BAD_FRAME:
            code = ErrorCode.BAD_SPEC
        raise WireError(code, f"invalid {raw.get('t')!r} frame: {_short(exc)}") from exc


def _short(exc: ValidationError) -> str:
    parts = []
    for err in exc.errors()[:3]:
        loc = ".".join(str(p) for p in err["loc"])
        parts.append(f"{loc}: {err['msg']}")
    return "; ".join(parts)
