"""What a run's page shows of its debug session: the breakpoints with whether each is verified,
and where each process is stopped with its stack, read-only.

Both come from the run's two streams, folded as ``tether attach`` folds them to rebuild a session
(:class:`protocol_specs.session.session.DebugSession`): ``to_worker`` holds the IDE's configuration (every
``setBreakpoints``, kept until the run ends), ``to_ide`` debugpy's answers and events (which say
whether each breakpoint is verified) and the worker's ``paused`` reports (where a process stopped,
with its frames: ``worker_shim/session/watch.py``). Nothing is asked of the worker: a page never
touches the program, and shows the same whether or not an IDE is attached. A stream longer than
:data:`MAX_ENTRIES` is folded that far (the page says so).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import PurePosixPath, PureWindowsPath
from typing import Any, Literal

from protocol_specs.runs.runs import RunRecord
from protocol_specs.session.session import DebugSession, StatusEvent
from protocol_specs.wire.wire import DapEntry, StatusEntry, StreamName, WireError, decode_entry

from ..store import Store, keys

__all__ = ["MAX_ENTRIES", "Breakpoint", "DebugView", "Stop", "debug_view", "fold", "stopped_key"]

#: entries of each stream a page folds, at most
MAX_ENTRIES = 20_000
_BATCH = 1000


@dataclass(frozen=True)
class Breakpoint:
    where: str  #: ``train.py:18`` (the path relative to the run's workdir when under it)
    condition: str
    #: ``pending``: no debugger has seen it yet (the run waits for a worker)
    state: Literal["verified", "unverified", "pending"]
    message: str = ""
    path: str = ""  #: the file, relative to the run's workdir when under it
    line: int = 0


@dataclass(frozen=True)
class Stop:
    """Where one process is stopped: the worker's ``paused`` report."""

    process: str  #: ``""``: the main one
    where: str
    reason: str
    stack: list[dict[str, Any]]


@dataclass
class DebugView:
    breakpoints: list[Breakpoint] = field(default_factory=list)
    #: function breakpoints by name, exception filters (``raised``, ``uncaught``...)
    functions: list[str] = field(default_factory=list)
    exceptions: list[str] = field(default_factory=list)
    stops: dict[str, Stop] = field(default_factory=dict)
    #: every entry of both streams was folded
    complete: bool = True

    @property
    def empty(self) -> bool:
        return not (self.breakpoints or self.functions or self.exceptions or self.stops)


def stopped_key(record: RunRecord) -> tuple[str, int, tuple[str, ...]]:
    """What the debugger view of a run depends on, as far as its record tells: its state, its
    attempt, where each process stopped (a new view is folded when this changes)."""
    where = tuple(f"{key}:{row.where}" for key, row in record.processes.items() if row.where)
    return record.state.value, record.attempt, where


async def debug_view(store: Store, record: RunRecord) -> DebugView:
    entries: dict[str, list[DapEntry | StatusEntry]] = {}
    complete = True
    for name in (StreamName.TO_WORKER, StreamName.TO_IDE):
        entries[name], whole = await _read(store, keys.stream(record.id, name))
        complete = complete and whole
    view = fold(record, entries[StreamName.TO_WORKER], entries[StreamName.TO_IDE])
    view.complete = complete
    return view


async def _read(store: Store, stream: str) -> tuple[list[DapEntry | StatusEntry], bool]:
    out: list[DapEntry | StatusEntry] = []
    cursor, read = "0", 0
    while read < MAX_ENTRIES:
        batch = await store.read_after(stream, cursor, count=_BATCH)
        for cursor, payload in batch:  # noqa: B007 (the last id is the next cursor)
            try:
                entry = decode_entry(payload)
            except WireError:
                continue
            if isinstance(entry, DapEntry | StatusEntry):
                out.append(entry)
        read += len(batch)
        if len(batch) < _BATCH:
            return out, True
    return out, False


def fold(
    record: RunRecord,
    to_worker: list[DapEntry | StatusEntry],
    to_ide: list[DapEntry | StatusEntry],
) -> DebugView:
    """The view of a run's session from its streams' entries (the main process's DAP traffic;
    every process's ``paused`` reports)."""
    session = DebugSession()
    for entry in to_worker:
        if isinstance(entry, DapEntry) and not entry.process:
            session.apply_to_worker(entry)
    stops: dict[str, Stop] = {}
    for entry in to_ide:
        if isinstance(entry, StatusEntry):
            _status(stops, entry)
        elif not entry.process:
            session.apply_to_ide(entry)
    view = DebugView(stops=stops)
    for bset in session.configuration():
        args = bset.arguments
        if bset.command == "setBreakpoints":
            source = args.get("source") or {}
            path = _relative(str(source.get("path") or source.get("name") or "?"), record)
            for bp, bp_id in zip(args.get("breakpoints") or [], bset.ids, strict=False):
                view.breakpoints.append(_breakpoint(path, bp, session.verification.get(bp_id)))
        elif bset.command == "setFunctionBreakpoints":
            view.functions = [str(bp.get("name")) for bp in args.get("breakpoints") or []]
        else:
            view.exceptions = [str(f) for f in args.get("filters") or []]
    return view


def _status(stops: dict[str, Stop], entry: StatusEntry) -> None:
    match entry.event:
        case StatusEvent.PAUSED:
            data = entry.data
            stack = data.get("stack")
            stops[entry.process] = Stop(
                entry.process,
                str(data.get("where") or entry.detail)[:300],
                str(data.get("reason") or ""),
                [f for f in stack if isinstance(f, dict)] if isinstance(stack, list) else [],
            )
        case StatusEvent.RESUMED | StatusEvent.PROCESS_EXITED:
            stops.pop(entry.process, None)
        case (
            StatusEvent.CLAIMED
            | StatusEvent.STARTED
            | StatusEvent.EXITED
            | StatusEvent.RETRYING
            | StatusEvent.CANCELLED
            | StatusEvent.WORKER_LOST
        ):
            stops.clear()


def _breakpoint(path: str, bp: dict[str, Any], seen: dict[str, Any] | None) -> Breakpoint:
    line = bp.get("line")
    at = line if isinstance(line, int) else 0
    condition = str(bp.get("condition") or bp.get("hitCondition") or bp.get("logMessage") or "")
    if seen is None:
        return Breakpoint(f"{path}:{line}", condition, "pending", path=path, line=at)
    moved = seen.get("line")
    where = f"{path}:{line}" + (f" (now {moved})" if moved and moved != line else "")
    state: Literal["verified", "unverified"] = "verified" if seen.get("verified") else "unverified"
    message = str(seen.get("message") or "")[:300]
    return Breakpoint(where, condition, state, message, path=path, line=at)


def _relative(path: str, record: RunRecord) -> str:
    pure = PureWindowsPath if record.spec.client_os == "windows" else PurePosixPath
    try:
        return str(pure(path).relative_to(record.spec.workdir))
    except ValueError:
        return path
