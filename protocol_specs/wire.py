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
- ``control`` (the CLI and the worker pool): request/reply frames correlated by ``rid``: submit, cancel,
  get a run, claim the next queued run, report.

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

from .runs import RunRecord, RunSpec

__all__ = [
    "MAX_DAP_BODY_BYTES",
    "MAX_FRAME_BYTES",
    "MAX_SNAPSHOT_BYTES",
    "PROTOCOL_VERSION",
    "Ack",
    "AnyEntry",
    "Assigned",
    "Cancel",
    "Claim",
    "ControlEntry",
    "DapEntry",
    "Deliver",
    "Entry",
    "Error",
    "ErrorCode",
    "Frame",
    "GetRun",
    "Heartbeat",
    "Hello",
    "PresenceEntry",
    "Publish",
    "Received",
    "Role",
    "RunInfo",
    "StatusEntry",
    "StreamName",
    "Submit",
    "Welcome",
    "WireError",
    "decode_entry",
    "decode_frame",
    "encode_entry",
    "encode_frame",
]

PROTOCOL_VERSION = 1
#: Largest WebSocket message the relay accepts (a submit frame carries the working-directory snapshot).
MAX_FRAME_BYTES = 80 * 1024 * 1024
#: Largest working-directory snapshot (compressed) a run may carry.
MAX_SNAPSHOT_BYTES = 64 * 1024 * 1024
#: Largest DAP message body carried in one entry (same as the adapter's DAP framer limit).
MAX_DAP_BODY_BYTES = 16 * 1024 * 1024


class Role(StrEnum):
    IDE = "ide"
    WORKER = "worker"
    CONTROL = "control"


class StreamName(StrEnum):
    TO_WORKER = "to_worker"
    TO_IDE = "to_ide"


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
    """An instruction for the worker shim, written into ``to_worker`` (e.g. ``terminate``)."""

    model_config = _FROZEN
    k: Literal["control"] = "control"
    action: Literal["terminate"]
    detail: str = ""


class PresenceEntry(BaseModel):
    """Whether an IDE is attached to the adapter ``origin``, written into ``to_worker``.

    The adapter writes one when an IDE connects or leaves and after every reconnect of its relay
    link; the relay writes ``attached=False`` when an ``ide`` connection that last reported
    ``attached=True`` closes. ``epoch`` numbers the adapter's relay connections: an entry for an
    older epoch than one already seen for the same origin is stale and ignored.
    """

    model_config = _FROZEN
    k: Literal["presence"] = "presence"
    origin: str
    epoch: int = Field(ge=0)
    attached: bool


AnyEntry = DapEntry | StatusEntry | ControlEntry | PresenceEntry
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
    try:
        return _ENTRY.validate_python(raw)
    except ValidationError as exc:
        raise WireError(ErrorCode.BAD_ENTRY, f"invalid entry: {_short(exc)}") from exc


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


class Welcome(BaseModel):
    model_config = _FROZEN
    t: Literal["welcome"] = "welcome"
    v: int = PROTOCOL_VERSION
    server: str = ""
    run: RunRecord | None = None
    #: run connections: the last entry id of each of the run's streams when the connection began
    tails: dict[str, str] = Field(default_factory=dict)
    #: send a ``heartbeat`` frame at least this often (seconds; 0: the peer's own default)
    heartbeat: float = 0.0


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
    model_config = _FROZEN
    t: Literal["submit"] = "submit"
    rid: int
    spec: RunSpec
    snapshot: bytes = Field(default=b"", max_length=MAX_SNAPSHOT_BYTES)


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
    """Worker pool: block until a queued run is available, then take it."""

    model_config = _FROZEN
    t: Literal["claim"] = "claim"
    rid: int
    worker: str


class RunInfo(BaseModel):
    model_config = _FROZEN
    t: Literal["run"] = "run"
    rid: int
    run: RunRecord


class Assigned(BaseModel):
    model_config = _FROZEN
    t: Literal["assigned"] = "assigned"
    rid: int
    run: RunRecord
    snapshot: bytes = b""


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
    | Cancel
    | GetRun
    | Claim
    | RunInfo
    | Assigned
    | Error
)
Frame = Annotated[AnyFrame, Field(discriminator="t")]
_FRAME: TypeAdapter[AnyFrame] = TypeAdapter(Frame)


def encode_frame(frame: AnyFrame) -> bytes:
    return msgpack.packb(frame.model_dump(mode="python"), use_bin_type=True)  # type: ignore[no-any-return]


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
