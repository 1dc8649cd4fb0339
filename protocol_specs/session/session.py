"""The debug session state: one fold over a run's two streams.

Theory of operation
-------------------
Everything tether needs to know about a debug session can be recomputed from the run's two streams:

- ``to_worker`` holds what the IDE side sent: its ``initialize`` and ``attach`` arguments, every
  configuration request (``setBreakpoints`` per source, function and exception breakpoints) with the
  breakpoint ids the adapter handed out, ``configurationDone``, and live requests.
- ``to_ide`` holds what the worker side sent: run status changes, debugpy's responses (which carry the
  real breakpoint verification) and events (threads starting and exiting, stops, continues).

:class:`DebugSession` folds entries from both streams in order (``apply_to_worker``,
``apply_to_ide``). It has three users: the adapter runs it live to answer the IDE and translate
breakpoint ids; the worker shim uses :meth:`configuration` to compute the replay (the *latest*
configuration per source: ``setBreakpoints`` has replace semantics, so earlier ones are superseded);
``tether attach`` rebuilds the IDE-facing state by folding both streams from the start.

Breakpoint ids: the adapter answers ``setBreakpoints`` before any debugger exists, so it hands out its
own ids (stable: the same source and line keep their id across requests). debugpy later assigns its
own ids from a process-global counter; the fold keeps the map from debugpy's ids to the adapter's so
``breakpoint`` events and ``stopped.hitBreakpointIds`` reach the IDE under the ids it already holds.
A child process is configured by the worker itself, before any IDE session exists for it: the
worker says which place (source and line, or function) each of debugpy's ids there is
(:data:`PLACES_EVENT`), and the child's session names it by the id it handed out for that place. A
stop names only ids the session holds (:meth:`DebugSession.hit_ids`).

Nothing here performs I/O; methods return plain data.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import orjson

from ..dap import models as dap_models
from ..dap.models import SetBreakpointsArguments, source_key

# StatusEvent is defined beside StatusEntry, which it types; users have always imported it from here
from ..wire.stream_entries import DapEntry, StatusEntry, StatusEvent

__all__ = [
    "CONFIGURATION_COMMANDS",
    "NOTICES",
    "PLACES_EVENT",
    "QUIET",
    "BreakpointSet",
    "DebugSession",
    "StatusEvent",
    "is_node_exit",
    "is_transient",
    "places_event",
]

CONFIGURATION_COMMANDS = frozenset(
    {"setBreakpoints", "setFunctionBreakpoints", "setExceptionBreakpoints"}
)
#: requests the fold keeps; answers to every other request only matter to the IDE that asked
FOLDED_REQUESTS = CONFIGURATION_COMMANDS | {"initialize", "attach", "configurationDone"}
#: the DAP event the worker sends when debugpy answered configuration the worker sent a child
#: process itself (never shown to the IDE): which place each of debugpy's ids is. ``body``:
#: ``{"command": "setBreakpoints" | "setFunctionBreakpoints", "source": source key (""
#: for functions), "keys": [line | function name, ...], "ids": [debugpy's id | null, ...]}``
PLACES_EVENT = "tetherBreakpointPlaces"
#: events the fold uses; the rest (output, module, loadedSource, ...) only matter live
FOLDED_EVENTS = frozenset(
    {
        "thread",
        "stopped",
        "continued",
        "process",
        "breakpoint",
        "terminated",
        "exited",
        PLACES_EVENT,
    }
)
#: configuration whose breakpoints have ids (and places)
_WITH_IDS = frozenset({"setBreakpoints", "setFunctionBreakpoints"})


def is_transient(msg: dict[str, Any], request_command: str | None = None) -> bool:
    """Whether a DAP message may be deleted once its reader received it (see ``DapEntry``).

    A response is transient when the request it answers (``request_command``) is.
    """
    kind = msg.get("type")
    if kind == "request":
        return msg.get("command") not in FOLDED_REQUESTS
    if kind == "response":
        return (request_command or msg.get("command")) not in FOLDED_REQUESTS
    if kind == "event":
        return msg.get("event") not in FOLDED_EVENTS
    return False


#: status events that report something about the run without moving its lifecycle
NOTICES = frozenset(
    {
        StatusEvent.UNATTENDED_STOP,
        StatusEvent.BUFFER_FULL,
        StatusEvent.PREEMPTING,
        StatusEvent.SUSPENDED,
    }
)
#: status events the debug session ignores (the IDE learns the same from debugpy's events)
QUIET = frozenset(
    {
        StatusEvent.PAUSED,
        StatusEvent.RESUMED,
        StatusEvent.WORKER_STOPPED,
        # about one process of the run, never a step of the run's lifecycle
        StatusEvent.PROCESS_STARTED,
        StatusEvent.PROCESS_EXITED,
    }
)


def is_node_exit(entry: StatusEntry) -> bool:
    """Node K's program of a run that spans nodes exited: news of one node, not the run's end
    (the relay tells that, once every node is done or one failed)."""
    return entry.event == StatusEvent.EXITED and isinstance(entry.data.get("node"), int)


@dataclass
class BreakpointSet:
    """The latest configuration request of one kind (per source for ``setBreakpoints``)."""

    command: str
    arguments: dict[str, Any]
    ids: list[int]
    origin: str
    seq: int


@dataclass
class _Request:
    """What the fold keeps of a breakpoint request: the ids it carries (a few bytes; the replay of
    every later attempt is answered under the same seq). Other requests, and arguments, are not
    kept: a long session's memory stays flat."""

    command: str
    bp_ids: list[int] | None
    local: bool


@dataclass
class DebugSession:
    initialize_args: dict[str, Any] | None = None
    attach_args: dict[str, Any] | None = None
    configuration_done: bool = False
    breakpoints: dict[str, BreakpointSet] = field(default_factory=dict)
    function_breakpoints: BreakpointSet | None = None
    exception_breakpoints: BreakpointSet | None = None
    #: adapter id -> the latest breakpoint body the worker reported (ids already translated)
    verification: dict[int, dict[str, Any]] = field(default_factory=dict)
    run_state: str | None = None
    status: str | None = None
    status_detail: str = ""
    live: bool = False
    finished: bool = False
    exit_code: int | None = None
    threads: dict[int, str] = field(default_factory=dict)
    stopped: dict[int, dict[str, Any]] = field(default_factory=dict)
    process_event: dict[str, Any] | None = None
    capabilities_delta: dict[str, Any] = field(default_factory=dict)
    #: the worker follows every ``stopped`` with a prefetch (``protocol_specs.session.prefetch``)
    prefetch: bool = False
    #: the latest notice (:data:`NOTICES`) about the run
    notice: StatusEntry | None = None
    #: the attempt the latest status was about
    attempt: int = 1
    _next_id: int = 1
    _debugpy_ids: dict[int, int] = field(default_factory=dict)
    #: debugpy id -> (command, source key, line or function name) of a breakpoint the worker set
    #: in this process itself (:data:`PLACES_EVENT`)
    _places: dict[int, tuple[str, str, Any]] = field(default_factory=dict)
    _requests: dict[tuple[str, int], _Request] = field(default_factory=dict)

    def __repr__(self) -> str:
        return (
            f"<DebugSession status={self.status} live={self.live} finished={self.finished} "
            f"sources={len(self.breakpoints)} threads={sorted(self.threads)} "
            f"stopped={sorted(self.stopped)}>"
        )

    # --- ids --------------------------------------------------------------------------------------

    def assign_breakpoint_ids(self, command: str, arguments: dict[str, Any]) -> list[int]:
        """Ids for the breakpoints of a configuration request, reusing ids for unchanged lines.

        Reserves the new ids (so two requests in flight never share one); the request's entry,
        folded with :meth:`apply_to_worker`, records them.
        """
        if command == "setBreakpoints":
            args = SetBreakpointsArguments.model_validate(arguments)
            previous = self.breakpoints.get(source_key(args.source))
            keys: list[Any] = args.lines_in_order()
            old_keys = _keys_of(previous) if previous else []
        elif command == "setFunctionBreakpoints":
            keys = [bp.get("name") for bp in arguments.get("breakpoints", [])]
            previous = self.function_breakpoints
            old_keys = _keys_of(previous) if previous else []
        else:
            return []
        reuse: dict[Any, int] = {}
        if previous:
            for key, old_id in zip(old_keys, previous.ids, strict=False):
                reuse.setdefault(key, old_id)
        ids: list[int] = []
        for key in keys:
            if key in reuse:
                ids.append(reuse.pop(key))
            else:
                ids.append(self._next_id)
                self._next_id += 1
        return ids

    def to_adapter_id(self, debugpy_id: int) -> int:
        """The adapter's id for a breakpoint debugpy reports; new ids for ones it never handed out."""
        placed = self._placed_id(debugpy_id)
        if placed is not None:
            return placed
        known = self._debugpy_ids.get(debugpy_id)
        if known is None:
            known = self._next_id
            self._next_id += 1
            self._debugpy_ids[debugpy_id] = known
        return known

    def hit_ids(self, debugpy_ids: list[Any]) -> list[int]:
        """A ``stopped`` event's ``hitBreakpointIds`` as this session's IDE knows them: debugpy's
        id of a breakpoint the IDE set becomes the id the adapter answered it with, one the worker
        set at the same place (a child's configuration) the id of that place; an id of a
        breakpoint this session holds no id for is left out, never made up."""
        held = {i for bset in self.configuration() for i in bset.ids}
        out: list[int] = []
        for debugpy_id in debugpy_ids:
            if not isinstance(debugpy_id, int) or isinstance(debugpy_id, bool):
                continue
            adapter_id = self._placed_id(debugpy_id)
            if adapter_id is None:
                adapter_id = self._debugpy_ids.get(debugpy_id)
            if adapter_id in held and adapter_id not in out:
                out.append(adapter_id)
        return out

    def _placed_id(self, debugpy_id: int) -> int | None:
        """The id this session holds for the place of a breakpoint the worker set (None: it set
        none with that id, or this session has none there)."""
        place = self._places.get(debugpy_id)
        if place is None:
            return None
        command, source, key = place
        if command == "setBreakpoints":
            bset = self.breakpoints.get(source)
        else:
            bset = self.function_breakpoints
        if bset is None:
            return None
        for known, adapter_id in zip(_keys_of(bset), bset.ids, strict=False):
            if known == key:
                return adapter_id
        return None

    # --- folding ----------------------------------------------------------------------------------

    def apply_to_worker(self, entry: DapEntry) -> None:
        """Fold one entry of the ``to_worker`` stream (an IDE-side request)."""
        msg = _object(orjson.loads(entry.body))
        arguments = msg.get("arguments", {})
        if msg.get("type") != "request" or not isinstance(arguments, dict):
            return  # not a request any debugger would take: nothing to fold
        command = str(msg.get("command", ""))
        try:
            dap_models.parse_arguments(command, arguments)
        except ValueError:
            return  # configuration the IDE side would have been refused: never replayed
        seq = msg.get("seq", 0)
        if entry.bp_ids is not None:
            self._requests[(entry.origin, seq)] = _Request(command, entry.bp_ids, entry.local)
        if entry.bp_ids:
            self._next_id = max(self._next_id, max(entry.bp_ids) + 1)
        if command == "initialize":
            self.initialize_args = arguments
        elif command == "attach":
            self.attach_args = arguments
        elif command == "configurationDone":
            self.configuration_done = True
        elif command == "setBreakpoints":
            key = source_key(arguments.get("source") or {})
            self.breakpoints[key] = BreakpointSet(
                command, arguments, list(entry.bp_ids or []), entry.origin, seq
            )
        elif command == "setFunctionBreakpoints":
            self.function_breakpoints = BreakpointSet(
                command, arguments, list(entry.bp_ids or []), entry.origin, seq
            )
        elif command == "setExceptionBreakpoints":
            self.exception_breakpoints = BreakpointSet(command, arguments, [], entry.origin, seq)

    def apply_to_ide(self, entry: DapEntry | StatusEntry) -> list[int]:
        """Fold one entry of the ``to_ide`` stream.

        Returns the adapter ids of breakpoints whose verification changed because of it.
        """
        if isinstance(entry, StatusEntry):
            self._apply_status(entry)
            return []
        msg = _object(orjson.loads(entry.body))
        kind = msg.get("type")
        if kind == "response":
            return self._apply_response(entry.origin, msg)
        if kind == "event":
            return self._apply_event(msg)
        return []

    def request_of(self, origin: str, seq: int) -> tuple[str, list[int] | None, bool] | None:
        """``(command, bp_ids, local)`` of a folded request, if known."""
        req = self._requests.get((origin, seq))
        return (req.command, req.bp_ids, req.local) if req else None

    def _apply_status(self, entry: StatusEntry) -> None:
        if entry.event in QUIET or is_node_exit(entry):
            return
        if entry.event in NOTICES:
            self.notice = entry  # news about the run, not a step of its lifecycle
            return
        if (
            entry.event == StatusEvent.EXITED
            and self.finished
            and self.status in (StatusEvent.CANCELLED, StatusEvent.WORKER_LOST)
        ):
            # the relay's verdict came first (the worker ends the program after a cancel): the
            # run stays cancelled, whatever moment the program's exit is reported at
            if entry.exit_code is not None:
                self.exit_code = entry.exit_code
            return
        self.status = entry.event
        self.status_detail = entry.detail
        if entry.state:
            self.run_state = entry.state
        if isinstance(entry.data.get("attempt"), int):
            self.attempt = entry.data["attempt"]
        if entry.event == StatusEvent.RETRYING or (
            entry.event in (StatusEvent.EXITED, StatusEvent.WORKER_LOST)
            and entry.data.get("final") is False
        ):
            # this attempt is over and another follows: the session goes on
            self.live = False
            self.threads.clear()
            self.stopped.clear()
            return
        if entry.event == StatusEvent.STARTED:
            # a new process: old threads, stops and debugpy ids belong to the previous one
            self.threads.clear()
            self.stopped.clear()
            self._debugpy_ids.clear()
            self._places.clear()
            self.live = False
        elif entry.event == StatusEvent.DEBUGGER_LIVE:
            self.live = True
            self.prefetch = entry.data.get("prefetch") is True
            delta = entry.data.get("capabilities_delta")
            if isinstance(delta, dict):
                self.capabilities_delta = delta
        elif entry.event in (
            StatusEvent.EXITED,
            StatusEvent.START_FAILED,
            StatusEvent.CANCELLED,
            StatusEvent.WORKER_LOST,
        ):
            self.live = False
            self.finished = True
            self.threads.clear()
            self.stopped.clear()
            if entry.exit_code is not None:
                self.exit_code = entry.exit_code

    def _apply_response(self, origin: str, msg: dict[str, Any]) -> list[int]:
        # kept after its answer: each later attempt's replay is answered under the same seq
        req = self._requests.get((origin, msg.get("request_seq", -1)))
        if req is None or not msg.get("success") or req.bp_ids is None:
            return []
        reported = _object(msg.get("body")).get("breakpoints") or []
        changed: list[int] = []
        for adapter_id, bp in zip(
            req.bp_ids, reported if isinstance(reported, list) else [], strict=False
        ):
            if not isinstance(bp, dict):
                continue
            if isinstance(bp.get("id"), int):
                self._debugpy_ids[bp["id"]] = adapter_id
            self.verification[adapter_id] = {**bp, "id": adapter_id}
            changed.append(adapter_id)
        return changed

    def _apply_event(self, msg: dict[str, Any]) -> list[int]:
        name = msg.get("event")
        body = _object(msg.get("body"))
        if name == "thread":
            tid = body.get("threadId")
            if isinstance(tid, int):
                if body.get("reason") == "exited":
                    self.threads.pop(tid, None)
                    self.stopped.pop(tid, None)
                else:
                    self.threads.setdefault(tid, "")
        elif name == "stopped":
            tid = body.get("threadId")
            if body.get("allThreadsStopped"):
                for t in self.threads:
                    self.stopped[t] = body
            if isinstance(tid, int):
                self.threads.setdefault(tid, "")
                self.stopped[tid] = body
        elif name == "continued":
            tid = body.get("threadId")
            if body.get("allThreadsContinued", True):
                self.stopped.clear()
            elif isinstance(tid, int):
                self.stopped.pop(tid, None)
        elif name == "process":
            self.process_event = body
        elif name == "breakpoint":
            bp = _object(body.get("breakpoint"))
            if isinstance(bp.get("id"), int):
                adapter_id = self.to_adapter_id(bp["id"])
                self.verification[adapter_id] = {**bp, "id": adapter_id}
                return [adapter_id]
        elif name == "terminated":
            self.stopped.clear()
        elif name == PLACES_EVENT:
            self._fold_places(body)
        return []

    def _fold_places(self, body: dict[str, Any]) -> None:
        command, source = body.get("command"), body.get("source")
        keys, ids = body.get("keys"), body.get("ids")
        if command not in _WITH_IDS or not isinstance(source, str):
            return
        if not isinstance(keys, list) or not isinstance(ids, list):
            return
        for key, debugpy_id in zip(keys, ids, strict=False):
            if isinstance(debugpy_id, int) and isinstance(key, int | str):
                self._places[debugpy_id] = (command, source, key)

    # --- what the users of the fold need -----------------------------------------------------------

    def configuration(self) -> list[BreakpointSet]:
        """The compacted configuration to replay into a debugger, in replay order."""
        plan = list(self.breakpoints.values())
        if self.function_breakpoints is not None:
            plan.append(self.function_breakpoints)
        if self.exception_breakpoints is not None:
            plan.append(self.exception_breakpoints)
        return plan

    def current_breakpoints(self) -> list[dict[str, Any]]:
        """Every breakpoint of the current configuration with its latest known verification."""
        result = []
        for bset in self.configuration():
            for adapter_id in bset.ids:
                if adapter_id in self.verification:
                    result.append(self.verification[adapter_id])
        return result


def places_event(bset: BreakpointSet, answer: dict[str, Any]) -> dict[str, Any] | None:
    """The :data:`PLACES_EVENT` for debugpy's successful ``answer`` to ``bset``, sent by the
    worker itself (None: nothing with an id in it)."""
    reported = _object(answer.get("body")).get("breakpoints")
    if bset.command not in _WITH_IDS or not answer.get("success") or not isinstance(reported, list):
        return None
    ids = [_object(bp).get("id") for bp in reported]
    ids = [i if isinstance(i, int) and not isinstance(i, bool) else None for i in ids]
    if not any(i is not None for i in ids):
        return None
    source = ""
    if bset.command == "setBreakpoints":
        source = source_key(bset.arguments.get("source") or {})
    body = {"command": bset.command, "source": source, "keys": _keys_of(bset), "ids": ids}
    return {"seq": 1, "type": "event", "event": PLACES_EVENT, "body": body}


def _keys_of(bset: BreakpointSet) -> list[Any]:
    if bset.command == "setBreakpoints":
        return SetBreakpointsArguments.model_validate(bset.arguments).lines_in_order()
    return [bp.get("name") for bp in bset.arguments.get("breakpoints", [])]


def _object(value: object) -> dict[str, Any]:
    """``value`` if it is a JSON object, else an empty one: the fold reads what peers wrote, and a
    malformed message must never stop it."""
    return value if isinstance(value, dict) else {}
