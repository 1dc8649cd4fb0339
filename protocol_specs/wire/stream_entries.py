"""The entries of a run's streams: what the adapter, the worker and the relay write into Redis.

A run has three streams (:class:`StreamName`). Each entry is a msgpack map whose ``k`` key names its
kind (:class:`EntryKind`); entries travel as opaque ``bytes`` inside the link's ``Publish`` and
``Deliver`` frames, so the relay stores what a peer published without re-encoding it. DAP bodies
inside a :class:`DapEntry` are the raw JSON bytes the DAP peer sent: nothing is transcoded on the hot
path, and the everyday DAP entry is decoded by a hand-written fast path (:func:`decode_entry`).

Import these through :mod:`protocol_specs.wire.wire`, which re-exports them.
"""

from __future__ import annotations

from enum import StrEnum
from typing import Annotated, Any, Literal

import msgpack
from pydantic import BaseModel, Field, TypeAdapter, ValidationError, field_validator

from ..runs.metrics import MAX_NAMES, MAX_VALUES, NAME
from ..runs.runs import RunState
from .base import FROZEN, ErrorCode, WireError, short_reason

__all__ = [
    "MAX_DAP_BODY_BYTES",
    "AnyEntry",
    "ControlEntry",
    "DapEntry",
    "Entry",
    "EntryKind",
    "GroupEntry",
    "LogEntry",
    "MetricEntry",
    "PresenceEntry",
    "StatusEntry",
    "StatusEvent",
    "StreamName",
    "TunnelEntry",
    "decode_entry",
    "encode_entry",
]

#: Largest DAP message body carried in one entry (same as the adapter's DAP framer limit).
MAX_DAP_BODY_BYTES = 16 * 1024 * 1024


class StreamName(StrEnum):
    TO_WORKER = "to_worker"
    TO_IDE = "to_ide"
    LOGS = "logs"
    #: the program's metrics (``protocol_specs/runs/metrics.py``)
    METRICS = "metrics"
    #: a tunnel's two streams (``protocol_specs/wire/tunnels.py``): the user's side to the worker, back
    TUNNEL_UP = "up"
    TUNNEL_DOWN = "down"


class EntryKind(StrEnum):
    """The ``k`` key of a stream entry."""

    DAP = "dap"
    STATUS = "status"
    CONTROL = "control"
    LOG = "log"
    METRIC = "metric"
    PRESENCE = "presence"
    TUNNEL = "tunnel"
    GROUP = "group"


class StatusEvent(StrEnum):
    """Names of :class:`StatusEntry` events, in the order a run sees them."""

    QUEUED = "queued"  #: relay: run accepted and queued
    CLAIMED = "claimed"  #: relay: a worker took the run
    STARTED = "started"  #: worker: the program's process started (data: pid, run_dir, debugpy)
    WAITING_FOR_IDE = "waiting_for_ide"  #: worker: debugger ready, holding until the IDE configured
    DEBUGGER_LIVE = "debugger_live"  #: worker: configuration replayed; live traffic flows
    EXITED = "exited"  #: worker: the program ended (exit_code)
    START_FAILED = "start_failed"  #: worker: the program could not be started (detail)
    CANCELLED = "cancelled"  #: relay: the user cancelled the run
    WORKER_LOST = "worker_lost"  #: relay: the worker's lease expired; the run is lost
    UNATTENDED_STOP = "unattended_stop"  #: worker: stopped with no IDE attached (data: policy...)
    BUFFER_FULL = "buffer_full"  #: worker: the to_ide buffer is full; output is being dropped
    PAUSED = "paused"  #: worker: the program stopped (data: where, reason); for ``tether ls``
    RESUMED = "resumed"  #: worker: the program continued
    #: worker: the worker itself is stopping (``tether up`` or ``tether worker`` stopped, or it
    #: failed): the attempt is over, retried as configured; the relay says what follows
    WORKER_STOPPED = "worker_stopped"
    #: relay: the attempt failed or was lost and another follows (data: attempt, delay)
    RETRYING = "retrying"
    #: relay: the attempt is preempted (``tether preempt``/``pause``, a scheduler's warning): its
    #: program has ``data["grace"]`` s to checkpoint and exit
    PREEMPTING = "preempting"
    #: relay: the run is suspended (``tether pause``) until ``tether resume``
    SUSPENDED = "suspended"
    FINISHED = "finished"  #: relay, logs stream only: the run reached a terminal state
    #: worker: a child process of the program is debugged (data: ``processes.ProcessInfo``)
    PROCESS_STARTED = "process_started"
    #: worker: a debugged child process ended (``exit_code`` when known)
    PROCESS_EXITED = "process_exited"


class DapEntry(BaseModel):
    """One DAP message in a run stream.

    ``origin`` names the adapter instance that sent a request (in ``to_worker``) or the adapter a
    response is addressed to (in ``to_ide``); events carry ``origin=""``. ``body`` is the raw JSON.
    ``local`` marks a request the adapter already answered itself (configuration recorded while no
    worker was live): the worker applies it but answers into the stream without an IDE waiting.
    ``bp_ids`` are the breakpoint ids the adapter handed out for a ``setBreakpoints`` /
    ``setFunctionBreakpoints`` request, in order. ``process`` is the debugged process the message
    is from or for: ``""`` the program tether started, else a child's key
    (:mod:`protocol_specs.session.processes`).
    """

    model_config = FROZEN
    k: Literal[EntryKind.DAP] = EntryKind.DAP
    origin: str = ""
    body: bytes = Field(max_length=MAX_DAP_BODY_BYTES)
    local: bool = False
    bp_ids: list[int] | None = None
    #: not needed to rebuild the session (output, answers to live requests): the relay may delete
    #: it once the other side has received it (``protocol_specs.session.session.is_transient``)
    transient: bool = False
    process: str = Field(default="", max_length=32)


class StatusEntry(BaseModel):
    """A run or debugger status change, written by the relay or the worker into ``to_ide``.

    ``at`` is wall-clock time (``time.time()``: seconds since the Unix epoch) when the writer saw
    the change: the relay shows it to people (the unattended-stop webhook), so never a monotonic
    clock. ``event`` and ``state`` are read into :class:`StatusEvent` and
    :class:`~protocol_specs.runs.runs.RunState` when they are known names; a name this version does not
    know is kept as the plain string (a newer peer's event still decodes, and is shown as it is).
    """

    model_config = FROZEN
    k: Literal[EntryKind.STATUS] = EntryKind.STATUS
    event: StatusEvent | str = Field(union_mode="left_to_right")
    state: RunState | str | None = Field(default=None, union_mode="left_to_right")
    detail: str = ""
    at: float = 0.0
    exit_code: int | None = None
    data: dict[str, Any] = Field(default_factory=dict)
    #: the debugged process it is about (``paused``, ``resumed``, ``unattended_stop``,
    #: ``process_started``, ``process_exited``): ``""`` the main one (:mod:`protocol_specs.session.processes`)
    process: str = Field(default="", max_length=32)


class ControlEntry(BaseModel):
    """An instruction for the worker shim, written into ``to_worker`` by the relay: ``terminate``,
    ``tunnel`` (open the tunnel named ``detail``, as ``data`` says:
    :class:`protocol_specs.wire.tunnels.TunnelSpec`), ``stop`` (a sweep pruned the trial: the
    program's ``tether.should_stop()`` turns true), ``suspend`` / ``resume`` (its sweep holds its
    other trials while one is paused for debugging: the program's process group is stopped and
    continued), ``rendezvous`` (a multi-node run's node 0 started: ``data`` is its
    ``{"addr": str, "port": int}``, which the other nodes' programs meet at), ``preempt`` (the
    attempt is preempted: ``data`` is ``{"grace": float, "then": "retry" | "suspend"}``,
    ``detail`` says why; the program's ``tether.should_preempt()`` turns true, it gets the
    warning signal, and it is ended after the grace).

    ``attempt`` names the attempt it is for (0: every attempt); a later attempt ignores it.
    """

    model_config = FROZEN
    k: Literal[EntryKind.CONTROL] = EntryKind.CONTROL
    action: Literal["terminate", "tunnel", "stop", "suspend", "resume", "rendezvous", "preempt"]
    detail: str = ""
    attempt: int = 0
    data: dict[str, Any] = Field(default_factory=dict)


class LogEntry(BaseModel):
    """A chunk of the program's stdout or stderr, written by the worker into the ``logs`` stream."""

    model_config = FROZEN
    k: Literal[EntryKind.LOG] = EntryKind.LOG
    stream: Literal["stdout", "stderr"]
    data: bytes = Field(max_length=1024 * 1024)
    attempt: int = 1
    #: the node whose program wrote it (a multi-node run's; 0 otherwise)
    node: int = Field(default=0, ge=0, le=63)


class MetricEntry(BaseModel):
    """Points the program reported (``protocol_specs/runs/metrics.py``), written by the worker into the
    ``metrics`` stream: each ``[step, at, {name: value}]``."""

    model_config = FROZEN
    k: Literal[EntryKind.METRIC] = EntryKind.METRIC
    points: list[tuple[int, float, dict[str, float]]] = Field(min_length=1, max_length=1000)
    attempt: int = 1

    @field_validator("points")
    @classmethod
    def _names(
        cls, value: list[tuple[int, float, dict[str, float]]]
    ) -> list[tuple[int, float, dict[str, float]]]:
        if sum(len(values) for _step, _at, values in value) > MAX_VALUES:
            raise ValueError(f"an entry carries at most {MAX_VALUES} values")
        for step, _at, values in value:
            if step < 0 or not values or len(values) > MAX_NAMES:
                raise ValueError("a point has a step from 0 and 1 to 64 values")
            if not all(NAME.fullmatch(name) for name in values):
                raise ValueError("a metric name is a letter or _, then letters, digits, _./-")
        return value


class PresenceEntry(BaseModel):
    """Whether an IDE is attached to the adapter ``origin``, written into ``to_worker``.

    The adapter writes one when an IDE connects or leaves and after every reconnect of its relay
    link; the relay writes ``attached=False, link_lost=True`` when an ``ide`` connection that last
    reported ``attached=True`` closes. ``epoch`` numbers the adapter's relay connections: an entry for an
    older epoch than one already seen for the same origin is stale and ignored.
    """

    model_config = FROZEN
    k: Literal[EntryKind.PRESENCE] = EntryKind.PRESENCE
    origin: str
    epoch: int = Field(ge=0)
    attached: bool
    #: written by the relay because the adapter's relay link closed (not because its IDE left):
    #: the adapter may be back in a moment, and the worker gives it a little while
    link_lost: bool = False


class TunnelEntry(BaseModel):
    """One step of a tunnel (``protocol_specs/wire/tunnels.py``), in its ``up`` or ``down`` stream.

    ``op``: ``data`` (``data`` bytes; ``fd`` 1 or 2 for a command's stdout and stderr, 0 for
    what goes to it), ``eof`` (no more of ``fd``), ``resize`` (``cols``, ``rows``), ``signal``
    (``detail``: ``SIGINT``...), ``exit`` (the worker's last word: ``code``, and ``detail`` when
    it could not run or was refused).
    """

    model_config = FROZEN
    k: Literal[EntryKind.TUNNEL] = EntryKind.TUNNEL
    op: Literal["data", "eof", "resize", "signal", "exit"]
    data: bytes = Field(default=b"", max_length=1024 * 1024)
    fd: int = Field(default=0, ge=0, le=2)
    cols: int = Field(default=0, ge=0, le=10_000)
    rows: int = Field(default=0, ge=0, le=10_000)
    code: int | None = None
    detail: str = Field(default="", max_length=4096)
    #: not needed once received (every ``data`` entry): deleted when the reader says so
    transient: bool = False


class GroupEntry(BaseModel):
    """A rank group's move on one node of a run that spans nodes, for the other nodes' workers.

    A node's worker publishes it on its worker link when one of ITS ranks stopped on its own
    (``op="stop"``: a breakpoint, an exception, ``breakpoint()``) or an IDE moved
    (``op="move"``: ``command`` ``continue`` / ``next`` / ``stepIn`` / ``stepOut`` with its
    ``arguments``) or paused (``op="pause"``) one of its ranks; ``rank`` is that rank. The relay
    stores it in the run's ``to_worker`` stream (not the link's ``to_ide``), so every node's
    worker reads it in order with the IDEs' requests; each ignores its own node's and other
    attempts' (``worker_shim/session/node_group.py``). Only a worker link may publish it; the
    other readers of ``to_worker`` skip it.
    """

    model_config = FROZEN
    k: Literal[EntryKind.GROUP] = EntryKind.GROUP
    op: Literal["stop", "move", "pause"]
    node: int = Field(default=0, ge=0, le=63)  #: the publishing node
    attempt: int = Field(default=1, ge=0)
    rank: int = Field(ge=0)
    command: Literal["", "continue", "next", "stepIn", "stepOut"] = ""
    arguments: dict[str, Any] = Field(default_factory=dict, max_length=16)
    at: float = 0.0  #: wall-clock time (``time.time()``) the worker decided it


AnyEntry = (
    DapEntry
    | StatusEntry
    | ControlEntry
    | PresenceEntry
    | LogEntry
    | TunnelEntry
    | MetricEntry
    | GroupEntry
)
Entry = Annotated[AnyEntry, Field(discriminator="k")]
_ENTRY: TypeAdapter[AnyEntry] = TypeAdapter(Entry)


def encode_entry(entry: AnyEntry) -> bytes:
    # msgpack packs a StrEnum member as its string
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
        raise WireError(ErrorCode.BAD_ENTRY, f"invalid entry: {short_reason(exc)}") from exc


_DAP_ENTRY_KEYS = frozenset({"k", "origin", "body", "local", "bp_ids", "transient", "process"})


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
    process = raw.get("process", "")
    if type(origin) is not str or type(local) is not bool or type(transient) is not bool:
        return None
    if type(process) is not str or len(process) > 32:
        return None
    if raw.get("bp_ids") is not None:
        return None  # lists of ints: leave them to pydantic
    return DapEntry.model_construct(
        origin=origin, body=body, local=local, bp_ids=None, transient=transient, process=process
    )
