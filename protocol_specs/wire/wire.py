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

This module holds the limits, the handshake and the link frames of run traffic, and the frame codec;
it re-exports the rest of the protocol so that ``from protocol_specs.wire import wire`` is all a peer
needs: the stream entries (:mod:`protocol_specs.wire.stream_entries`), the control-RPC frames
(:mod:`protocol_specs.wire.control_frames`) and the shared names (:mod:`protocol_specs.wire.base`).

The prose spec with limits and error codes is ``protocol_specs/relay-protocol.md``.
"""

from __future__ import annotations

from typing import Annotated, Any, Literal

import msgpack
from pydantic import BaseModel, Field, TypeAdapter, ValidationError, model_validator

from ..access.audit import AuditEntry, AuditEvent
from ..runs.runs import RunRecord
from .base import FROZEN, ErrorCode, FrameType, Role, WireError, short_reason
from .control_frames import (
    AnyControlFrame,
    Assigned,
    AuditLog,
    BlobData,
    Cancel,
    Claim,
    Confirm,
    CreateToken,
    Dispatch,
    GetAudit,
    GetBlob,
    GetRun,
    HaveBlobs,
    ListRuns,
    ListTokens,
    Missing,
    OpenTunnel,
    PutBlob,
    Report,
    ReportEvent,
    Rerun,
    RevokeToken,
    RunInfo,
    RunList,
    Stored,
    Submit,
    TokenCreated,
    TokenList,
    TunnelOpened,
    WebCode,
    WebLogin,
)
from .file_frames import (
    Checkpoints,
    CheckpointStored,
    GetCheckpoints,
    GetOutputs,
    Outputs,
    OutputsStored,
    Preempt,
    PutCheckpoint,
    PutOutputs,
    Resume,
)
from .link_kind import (
    AfterLink,
    AnyLink,
    IdeLink,
    Link,
    LinkKind,
    TunnelLink,
    WorkerLink,
    WorkerTunnelLink,
    link_problem,
)
from .stream_entries import (
    MAX_DAP_BODY_BYTES,
    AnyEntry,
    ControlEntry,
    DapEntry,
    Entry,
    EntryKind,
    GroupEntry,
    LogEntry,
    MetricEntry,
    PresenceEntry,
    StatusEntry,
    StatusEvent,
    StreamName,
    TunnelEntry,
    decode_entry,
    encode_entry,
)
from .sweep_frames import (
    CancelSweep,
    ClaimPause,
    GetSweep,
    ListSweeps,
    PauseClaimed,
    SubmitSweep,
    SweepInfo,
    SweepList,
)

__all__ = [
    "MAX_DAP_BODY_BYTES",
    "MAX_FRAME_BYTES",
    "MAX_HELLO_BYTES",
    "MAX_RUN_FRAME_BYTES",
    "PROTOCOL_VERSION",
    "Ack",
    "AfterLink",
    "AnyControlFrame",
    "AnyEntry",
    "AnyFrame",
    "AnyLink",
    "Assigned",
    "AuditEntry",
    "AuditEvent",
    "AuditLog",
    "BlobData",
    "Cancel",
    "CancelSweep",
    "CheckpointStored",
    "Checkpoints",
    "Claim",
    "ClaimPause",
    "Commit",
    "Confirm",
    "ControlEntry",
    "CreateToken",
    "DapEntry",
    "Deliver",
    "Dispatch",
    "Entry",
    "EntryKind",
    "Error",
    "ErrorCode",
    "Frame",
    "FrameType",
    "GetAudit",
    "GetBlob",
    "GetCheckpoints",
    "GetOutputs",
    "GetRun",
    "GetSweep",
    "GroupEntry",
    "HaveBlobs",
    "Heartbeat",
    "Hello",
    "IdeLink",
    "Link",
    "LinkKind",
    "ListRuns",
    "ListSweeps",
    "ListTokens",
    "LogEntry",
    "MetricEntry",
    "Missing",
    "OpenTunnel",
    "Outputs",
    "OutputsStored",
    "PauseClaimed",
    "Preempt",
    "PresenceEntry",
    "Publish",
    "PutBlob",
    "PutCheckpoint",
    "PutOutputs",
    "Received",
    "Report",
    "ReportEvent",
    "Rerun",
    "Resume",
    "RevokeToken",
    "Role",
    "RunInfo",
    "RunList",
    "StatusEntry",
    "StatusEvent",
    "Stored",
    "StreamName",
    "Submit",
    "SubmitSweep",
    "SweepInfo",
    "SweepList",
    "TokenCreated",
    "TokenList",
    "TunnelEntry",
    "TunnelLink",
    "TunnelOpened",
    "WebCode",
    "WebLogin",
    "Welcome",
    "WireError",
    "WorkerLink",
    "WorkerTunnelLink",
    "decode_entry",
    "decode_frame",
    "encode_entry",
    "encode_frame",
]

#: 2: a run connection's ``hello`` names its ``link`` (``protocol_specs/wire/link_kind.py``) where
#: version 1 sent ``history``, ``early``, ``tunnel`` and ``after`` apart
PROTOCOL_VERSION = 2
#: Largest WebSocket message the relay accepts (a submit frame carries the snapshot's manifest).
MAX_FRAME_BYTES = 80 * 1024 * 1024
#: Largest message before the handshake is done: nobody unauthenticated makes the relay buffer more.
MAX_HELLO_BYTES = 64 * 1024
#: Largest message on an ``ide``/``worker`` connection (a DAP body and its envelope).
MAX_RUN_FRAME_BYTES = MAX_DAP_BODY_BYTES + 64 * 1024


# --- the handshake and the link frames of run traffic ---------------------------------------------


class Hello(BaseModel):
    model_config = FROZEN
    t: Literal[FrameType.HELLO] = FrameType.HELLO
    v: int = PROTOCOL_VERSION
    role: Role
    run: str | None = None
    token: str | None = None
    #: resume cursor: deliver entries strictly after this stream id ("0" = from the beginning)
    cursor: str = "0"
    #: run connections (and only they): what the link is, with its options
    #: (``protocol_specs/wire/link_kind.py``: an IDE's with ``history``, a worker's, ...)
    link: Link | None = None
    #: an IDE's link with ``history``: deliver the run's to_worker entries after this one first
    history_cursor: str = "0"
    #: names the sender across reconnects: the relay keeps, per producer, the last ``Publish.n`` it
    #: stored and drops re-sent duplicates ("" = this connection only)
    producer: str = ""
    client: str = ""
    #: worker role: the attempt this worker runs (the relay refuses an attempt that is not current)
    attempt: int = 0
    #: ``logs`` role: which of the run's streams to read (``metrics``: its metric points)
    stream: Literal["logs", "metrics"] = "logs"

    @model_validator(mode="after")
    def _link_fits_role(self) -> Hello:
        problem = link_problem(self.role, self.link)
        if problem is not None:
            raise ValueError(problem)
        return self


class Welcome(BaseModel):
    model_config = FROZEN
    t: Literal[FrameType.WELCOME] = FrameType.WELCOME
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

    model_config = FROZEN
    t: Literal[FrameType.PUBLISH] = FrameType.PUBLISH
    n: int = Field(ge=1)
    entry: bytes


class Ack(BaseModel):
    """Publishes up to ``n`` are answered. ``duplicate``: ``n`` was stored before (a re-send)."""

    model_config = FROZEN
    t: Literal[FrameType.ACK] = FrameType.ACK
    n: int
    cursor: str
    duplicate: bool = False


class Received(BaseModel):
    """The peer has received every entry of ``stream`` up to ``cursor`` (lets the relay trim)."""

    model_config = FROZEN
    t: Literal[FrameType.RECEIVED] = FrameType.RECEIVED
    stream: StreamName
    cursor: str


class Heartbeat(BaseModel):
    """A run connection is alive; on a worker connection it renews the run's lease."""

    model_config = FROZEN
    t: Literal[FrameType.HEARTBEAT] = FrameType.HEARTBEAT


class Deliver(BaseModel):
    """An entry of the peer's inbound stream, in stream order.

    ``cursor`` is its stream id, or ``""`` for an entry handed to an ``early`` peer before Redis
    stored it (a :class:`Commit` follows once it is). ``producer`` and ``n`` name the publish that
    wrote it (``""`` and 0 for the relay's own entries, and on connections without ``early``): a
    peer that took the entry early recognises it by them when it comes again from Redis.
    """

    model_config = FROZEN
    t: Literal[FrameType.DELIVER] = FrameType.DELIVER
    stream: StreamName
    cursor: str
    entry: bytes
    producer: str = ""
    n: int = Field(default=0, ge=0)

    @property
    def early(self) -> bool:
        """Handed over before Redis stored it: no cursor yet."""
        return not self.cursor


class Commit(BaseModel):
    """The entry ``producer`` published as ``n``, which this peer took early, is stored at
    ``cursor``; every entry of ``stream`` before it was delivered (the peer's cursor moves there)."""

    model_config = FROZEN
    t: Literal[FrameType.COMMIT] = FrameType.COMMIT
    stream: StreamName
    cursor: str
    producer: str
    n: int = Field(ge=1)


class Error(BaseModel):
    model_config = FROZEN
    t: Literal[FrameType.ERROR] = FrameType.ERROR
    code: ErrorCode
    message: str
    fatal: bool = False
    rid: int | None = None
    n: int | None = None


# --- the codec ------------------------------------------------------------------------------------

AnyFrame = (
    Hello
    | Welcome
    | Publish
    | Ack
    | Received
    | Heartbeat
    | Deliver
    | Commit
    | AnyControlFrame
    | Error
)
Frame = Annotated[AnyFrame, Field(discriminator="t")]
_FRAME: TypeAdapter[AnyFrame] = TypeAdapter(Frame)
_DELIVER_KEYS = frozenset({"t", "stream", "cursor", "entry"})
_DELIVER_ORIGIN_KEYS = _DELIVER_KEYS | {"producer", "n"}
_COMMIT_KEYS = frozenset({"t", "stream", "cursor", "producer", "n"})
_PUBLISH_KEYS = frozenset({"t", "n", "entry"})
_ACK_KEYS = frozenset({"t", "n", "cursor", "duplicate"})
_STREAM_NAMES = frozenset(name.value for name in StreamName)


def encode_frame(frame: AnyFrame) -> bytes:
    kind = type(frame)
    if kind is Deliver:
        fields = frame.__dict__
        if not fields["producer"] and not fields["n"]:  # what a peer without ``early`` reads
            fields = {k: fields[k] for k in ("t", "stream", "cursor", "entry")}
        return msgpack.packb(fields, use_bin_type=True)  # type: ignore[no-any-return]
    if kind is Ack or kind is Publish or kind is Received or kind is Commit:
        # the frames of live traffic: their fields as they are (what model_dump gives, faster)
        return msgpack.packb(frame.__dict__, use_bin_type=True)  # type: ignore[no-any-return]
    return msgpack.packb(frame.model_dump(mode="python"), use_bin_type=True)  # type: ignore[no-any-return]


def _plain_frame(raw: dict[Any, Any]) -> AnyFrame | None:
    """A live-traffic frame checked by hand, exactly as its model would; ``None``: validate it."""
    t = raw["t"]
    # plain strings, not ``FrameType`` members: an enum attribute lookup per frame costs on this path
    if t == "deliver":
        keys = raw.keys()
        if keys == _DELIVER_KEYS or keys == _DELIVER_ORIGIN_KEYS:
            stream, cursor, entry = raw["stream"], raw["cursor"], raw["entry"]
            producer, n = raw.get("producer", ""), raw.get("n", 0)
            if (
                type(stream) is str
                and stream in _STREAM_NAMES
                and type(cursor) is str
                and type(entry) is bytes
                and type(producer) is str
                and type(n) is int
                and n >= 0
            ):
                return Deliver.model_construct(
                    stream=StreamName(stream), cursor=cursor, entry=entry, producer=producer, n=n
                )
    elif t == "commit":
        stream, cursor = raw.get("stream"), raw.get("cursor")
        producer, n = raw.get("producer"), raw.get("n")
        if (
            raw.keys() == _COMMIT_KEYS
            and type(stream) is str
            and stream in _STREAM_NAMES
            and type(cursor) is str
            and type(producer) is str
            and type(n) is int
            and n >= 1
        ):
            return Commit.model_construct(
                stream=StreamName(stream), cursor=cursor, producer=producer, n=n
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
    if raw["t"] == "hello" and raw.get("v", PROTOCOL_VERSION) != PROTOCOL_VERSION:
        # before its fields are checked: another version's hello has other fields
        raise WireError(
            ErrorCode.UNSUPPORTED_VERSION,
            f"protocol version {raw.get('v')} is not supported; this relay speaks "
            f"{PROTOCOL_VERSION}",
        )
    plain = _plain_frame(raw)
    if plain is not None:
        return plain
    try:
        return _FRAME.validate_python(raw)
    except ValidationError as exc:
        code = ErrorCode.TOO_LARGE if "too_long" in str(exc) else ErrorCode.BAD_FRAME
        if (
            raw.get("t") in (FrameType.SUBMIT, FrameType.SUBMIT_SWEEP)
            and code is ErrorCode.BAD_FRAME
        ):
            code = ErrorCode.BAD_SPEC
        raise WireError(code, f"invalid {raw.get('t')!r} frame: {short_reason(exc)}") from exc
