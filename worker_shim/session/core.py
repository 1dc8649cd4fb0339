"""The worker shim's routing core: what to send debugpy and what to publish, decided synchronously.

Theory of operation
-------------------
The shim is debugpy's single client. :class:`ShimCore` numbers every request it sends debugpy with
its own ``seq`` and remembers who asked (:mod:`worker_shim.session.channel`): a request forwarded
from the run's ``to_worker`` stream carries the origin (the adapter instance) and the seq the
adapter gave it, so debugpy's response is published back into ``to_ide`` under that seq; the shim's
own requests (the replay's handshake, the one-frame ``stackTrace`` of a pause report, ``continue``
after an unattended stop timed out) are answered to the core only. The connection's own state
(the numbering, the prefetch, the watch's look-ups) is the core's
:class:`~worker_shim.session.channel.DebugpyChannel`, which asks the core what only it knows
(:meth:`ShimCore.answered`).

From debugpy, events are published as they come except those about the shim's own connection
(:data:`~worker_shim.session.channel.DROPPED_EVENTS`) and telemetry; reverse requests are refused
with an error response, except ``startDebugging`` (a child process to debug), which
:class:`worker_shim.session.processes.DebuggedProcesses` answers before this core sees it. This
core is the main process's; each child process has a
:class:`worker_shim.session.child.ChildSession` of its own.
Responses, ``stopped`` and the end of the program wait for the output barrier
(:class:`~worker_shim.session.actions.Settle`): a line printed before a stop is shown before it.
debugpy's own plain ``output`` events (logpoints, the console) are held while the relay has not
answered the previous one, and merged (:func:`protocol_specs.dap.models.coalesce_output`): Nagle's
idea, no timer.

From the relay, the ``to_worker`` stream is folded into a :class:`DebugSession` until the replay
is under way (:mod:`worker_shim.session.replay`), queued while it finishes, forwarded once live;
``terminate`` control entries end the program, presence entries feed
:class:`worker_shim.session.watch.Watch` (unattended stops and pause reports).

Timers are deadlines (:attr:`ShimCore.next_deadline`, :meth:`ShimCore.on_tick`): the replay's
steps (:data:`~worker_shim.session.replay.HANDSHAKE_TIMEOUT` each), the watch's. Every method
returns a list of :mod:`worker_shim.session.actions`; :mod:`worker_shim.shim` performs them.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from typing import Any

import orjson

from protocol_specs.dap import models as dap
from protocol_specs.dap.capabilities import (
    DEBUGPY_CAPABILITIES,
    DEBUGPY_VERSION,
    capabilities_delta,
)
from protocol_specs.link.link import START, Cursor, InvalidCursor
from protocol_specs.runs.runs import RunRecord, retry_delay
from protocol_specs.session.processes import MAIN, node_main
from protocol_specs.session.session import DebugSession, StatusEvent
from protocol_specs.wire import wire
from protocol_specs.wire.wire import DapEntry, PresenceEntry, StatusEntry, WireError

from .actions import (
    Action,
    OpenTunnel,
    PipeOutputToIde,
    Publish,
    ReplayFailed,
    Say,
    Terminate,
    status_entry,
)
from .channel import DebugpyChannel, Sent, StatusStamp
from .replay import (
    HANDSHAKE_TIMEOUT,
    ConfigurationPlan,
    ReplayPhase,
    attach_arguments,
    initialize_arguments,
)
from .watch import Watch

__all__ = [
    "ShimCore",
    "exit_status",
    "parse_delivery",
    "request_of",
    "terminates",
]

log = logging.getLogger("tether.worker")

#: the phases in which ``to_worker`` configuration is folded (the replay picks it up)
_FOLDING = frozenset(
    {ReplayPhase.FOLDING, ReplayPhase.INITIALIZING, ReplayPhase.ATTACHING, ReplayPhase.CONFIGURING}
)
_REPLAYING = _FOLDING - {ReplayPhase.FOLDING} | {ReplayPhase.FINISHING}


class ShimCore:
    def __init__(
        self,
        record: RunRecord,
        run_dir: str,
        *,
        tail: Cursor = START,
        clock: Callable[[], float],
        wall: Callable[[], float] = time.time,
        node: int = 0,
    ) -> None:
        """``tail``: where the ``to_worker`` stream ended when the link connected (the fold waits
        until it got there); ``clock`` is monotonic (deadlines), ``wall`` stamps statuses.
        ``node``: the node of a run that spans nodes whose program this is: on node K >= 1 its
        key is :func:`~protocol_specs.session.processes.node_main` (``"nK"``), and it folds the
        main process's (``""``) configuration as node 0 does, but forwards only its own key's
        requests (node 0's worker answers the main process's)."""
        self.record = record
        self.run_dir = run_dir
        self.clock = clock
        self.wall = wall
        self.node = node
        self.key = node_main(node)
        self._status = StatusStamp(self.key, wall)
        self.session = DebugSession()
        self.watch = Watch(record, run_dir, self._status)
        self.channel = DebugpyChannel(self, key=self.key, clock=clock, watch=self.watch)
        self.plan = ConfigurationPlan(post_mortem=record.spec.post_mortem)
        self._tail = tail
        self._seen = START
        self._waiting_said = False
        self._waits = record.spec.wait_for_ide  #: for the IDE's configuration before the replay
        self._initialized = False  #: debugpy said ``initialized``
        self._batch: set[int] = set()  #: configuration requests of the replay in flight
        self._answered: set[str] = set()  #: the replay's own requests answered so far
        self._replay_deadline: float | None = None
        self._queued: list[DapEntry] = []  #: requests that came while the replay finished
        self._output: list[bytes] = []  #: plain output events held back, in order
        #: the publish number of the last output event sent (:meth:`output_published`)
        self.output_in_flight = 0
        self.terminating = False
        #: debugpy said ``terminated`` (after every event of the program) or the connection closed
        self.finished = False

    def __repr__(self) -> str:
        return (
            f"<ShimCore run={self.record.id} {self.channel!r} held={len(self._output)} "
            f"{self.watch!r}>"
        )

    @property
    def phase(self) -> ReplayPhase:
        return self.channel.phase

    @property
    def live(self) -> bool:
        return self.channel.live

    # --- start ------------------------------------------------------------------------------------

    def start(
        self,
        pid: int,
        *,
        late: bool = False,
        post_mortem: bool = False,
        started: dict[str, Any] | None = None,
    ) -> list[Action]:
        """The program started under debugpy (nothing of the user's code ran yet); ``late``: a
        plain run that has been running since its ``started``, now debugged (an IDE attached);
        ``post_mortem``: that, for an uncaught exception, with no IDE to wait for; ``started``:
        more for the ``started`` status (node 0's rendezvous)."""
        if post_mortem:
            self._waits = False
            late = True
        if late:
            return self._maybe_replay()
        data = {
            "pid": pid,
            "run_dir": self.run_dir,
            "debugpy": DEBUGPY_VERSION,
            "attempt": self.record.attempt,
            **(started or {}),
        }
        return [Publish(self._status(StatusEvent.STARTED, data=data)), *self._maybe_replay()]

    def _maybe_replay(self) -> list[Action]:
        """Start the replay once the fold caught up with the stream and the IDE side finished its
        configuration (or the run does not wait for an IDE)."""
        if self.phase is not ReplayPhase.FOLDING or self.terminating or self._seen < self._tail:
            return []
        if self.session.configuration_done or not self._waits:
            self.channel.enter(ReplayPhase.INITIALIZING, "caught up and configured")
            self._replay_deadline = self.clock() + HANDSHAKE_TIMEOUT
            self.watch.held(False, self.clock())
            return self.channel.send("initialize", initialize_arguments(self.session))
        if self._waiting_said:
            return []
        self._waiting_said = True
        status = self._status(
            StatusEvent.WAITING_FOR_IDE, detail="waiting for the IDE's configuration"
        )
        text = f"run {self.record.id}: debugger ready, waiting for the IDE's configuration"
        # held with no IDE attached is an unattended stop: the run's policy ends the wait
        self.watch.held(True, self.clock())
        return [Publish(status), Say(text), *self.channel.watch_step()]

    def stop_holding(self) -> list[Action]:
        """The program held for an IDE goes on without one (the unattended policy said so)."""
        self._waits = False
        return self._maybe_replay()

    # --- from the relay ---------------------------------------------------------------------------

    def on_delivery(self, delivery: wire.Deliver) -> list[Action]:
        """One entry of the run's ``to_worker`` stream."""
        return self.on_entry(*parse_delivery(delivery))

    def on_entry(self, cursor: Cursor | None, entry: wire.AnyEntry | None) -> list[Action]:
        """One entry of ``to_worker`` at ``cursor`` (``entry`` None: malformed, or another
        process's, :mod:`worker_shim.session.processes`: only the stream position counts)."""
        if cursor is not None:
            self._seen = max(self._seen, cursor)
        if entry is None:
            return self._maybe_replay()
        actions: list[Action] = []
        if isinstance(entry, wire.ControlEntry):
            if terminates(entry, self.record):
                actions += self._terminate()
            elif entry.action == "tunnel":
                actions.append(OpenTunnel(entry))
        elif isinstance(entry, PresenceEntry):
            self.watch.presence(entry, self.clock())
            actions += self.channel.watch_step()
        elif isinstance(entry, DapEntry) and entry.process == self.key:
            actions += self._on_request(entry)
        elif isinstance(entry, DapEntry) and entry.process == MAIN and self.phase in _FOLDING:
            self._fold(entry)  # node K: the run's configuration, as node 0 replays it
        return actions + self._maybe_replay()

    def _on_request(self, entry: DapEntry) -> list[Action]:
        if self.phase in _FOLDING:
            # before debugpy starts the program, configuration is only ever folded: the replay
            # sends the latest of it
            self._fold(entry)
            return []
        if self.phase is ReplayPhase.FINISHING:
            self._queued.append(entry)  # forwarded once live, after ``debugger_live``
            return []
        if self.phase is not ReplayPhase.LIVE:
            return []
        msg = request_of(entry)
        if msg is None:
            return []  # not a request debugpy could take (anyone with the user's token can write)
        return self.channel.forward(entry, msg)

    def _fold(self, entry: DapEntry) -> None:
        try:
            self.session.apply_to_worker(entry)
        except ValueError as exc:
            log.warning("skipping a malformed to_worker entry of %s: %s", entry.origin, exc)

    def end_run(self) -> list[Action]:
        """The run was ended (cancelled, or lost) while the link was down."""
        return self._terminate()

    def _terminate(self) -> list[Action]:
        if self.terminating:
            return []
        self.terminating = True
        return [Say(f"run {self.record.id}: terminating on request"), Terminate()]

    # --- from debugpy -----------------------------------------------------------------------------

    def on_debugpy_message(self, raw: bytes, answered: int) -> list[Action]:
        """One message debugpy sent; ``answered``: the relay's highest answered publish number.

        pydevd sends an event per ``write()``: a plain output event while the previous output
        event is unanswered is held and goes out merged, so debugpy is read as fast as it
        writes (pydevd drops what it has not sent when the program exits)."""
        if dap.plain_output(raw) is not None:
            if self._output or answered < self.output_in_flight:
                self._output.append(raw)
                return []
            return self._dispatch(raw)
        return [*self.flush_output(), *self._dispatch(raw)]

    @property
    def output_held(self) -> bool:
        """Output is held: :meth:`flush_output` once the relay answered :attr:`output_in_flight`."""
        return bool(self._output)

    def flush_output(self) -> list[Action]:
        held, self._output = self._output, []
        actions: list[Action] = []
        for raw in dap.coalesce_output(held):
            actions += self._dispatch(raw)
        return actions

    def output_published(self, n: int) -> None:
        """An output event was published as number ``n``."""
        self.output_in_flight = max(self.output_in_flight, n)

    def debugpy_closed(self) -> list[Action]:
        """debugpy closed the connection: nothing more is answered."""
        self.finished = True
        self.channel.close()
        self._batch.clear()
        if self.phase not in (ReplayPhase.LIVE, ReplayPhase.ENDED):
            # the program ended (terminated) before going live
            self.channel.enter(ReplayPhase.ENDED, "debugpy closed the connection")
            self._replay_deadline = None
        return self.channel.watch_step()

    def _dispatch(self, raw: bytes) -> list[Action]:
        try:
            msg = orjson.loads(raw)
        except orjson.JSONDecodeError:
            log.error("debugpy sent a message that is not JSON: %r", raw[:200])
            return []
        if not isinstance(msg, dict):
            return []
        kind = msg.get("type")
        if kind == "response":
            return self.channel.on_response(msg)
        if kind == "event":
            return self._on_event(msg, raw)
        if kind == "request":
            # reverse requests (runInTerminal): not supported; ``startDebugging`` never gets here
            # (:class:`worker_shim.session.processes.DebuggedProcesses` answers it)
            return self.channel.answer(msg, "not supported by tether's worker")
        return []

    def answered(self, seq: int, sent: Sent, msg: dict[str, Any]) -> list[Action]:
        """debugpy's answer to request ``seq`` (:class:`~worker_shim.session.channel.ChannelOwner`):
        the replay's configuration batch, or the replay's handshake."""
        if seq in self._batch:  # the replay's (the worker's own: POST_MORTEM)
            self._batch.discard(seq)
            if not self._batch and self.phase is ReplayPhase.CONFIGURING:
                return self._configure()
            return []
        if sent.origin is None:
            return self._own_response(sent.command, msg)
        return []

    def _on_event(self, msg: dict[str, Any], raw: bytes) -> list[Action]:
        name = msg.get("event")
        if name == "terminated":
            self.finished = True
        if name == "initialized":
            self._initialized = True
            if self.phase is ReplayPhase.ATTACHING:
                return self._configure()
        return self.channel.publish_event(msg, raw, output=name == "output")

    # --- the replay -------------------------------------------------------------------------------

    def _own_response(self, command: str, msg: dict[str, Any]) -> list[Action]:
        if command not in ("initialize", "attach", "configurationDone"):
            return []  # ``continue`` after an unattended stop: nothing to do with the answer
        if self.phase not in _REPLAYING:
            return []
        if command != "attach" and not msg.get("success"):
            self.channel.enter(ReplayPhase.ENDED, f"{command} refused")
            self._replay_deadline = None
            return [ReplayFailed(f"debugpy refused {command!r}: {msg.get('message')}")]
        self._answered.add(command)
        if command == "initialize":
            body = msg.get("body")
            self.session.capabilities_delta = capabilities_delta(
                DEBUGPY_CAPABILITIES, body if isinstance(body, dict) else {}
            )
            args = attach_arguments(self.session, self.record.spec.workdir, self.run_dir)
            self.channel.enter(ReplayPhase.ATTACHING, "initialize answered")
            self._replay_deadline = self.clock() + HANDSHAKE_TIMEOUT
            actions: list[Action] = [PipeOutputToIde(), *self.channel.send("attach", args)]
            if self._initialized:
                actions += self._configure()
            return actions
        return self._maybe_live()

    def _configure(self) -> list[Action]:
        """The next batch of configuration; once a batch brings nothing new, ``configurationDone``
        (configuration folded while a batch was in flight goes out before it)."""
        self._replay_deadline = self.clock() + HANDSHAKE_TIMEOUT
        batch = self.plan.next_batch(self.session)
        if not batch:
            self.channel.enter(ReplayPhase.FINISHING, "configuration sent")
            return self.channel.send("configurationDone", None)
        self.channel.enter(ReplayPhase.CONFIGURING, "configuration to send")
        actions: list[Action] = []
        for bset in batch:
            # the worker's own (POST_MORTEM, origin ""): its answer is nobody's
            origin = bset.origin or None
            actions += self.channel.send(bset.command, bset.arguments, origin=origin, seq=bset.seq)
            self._batch.add(self.channel.seq)
        return actions

    def _maybe_live(self) -> list[Action]:
        if self.phase is not ReplayPhase.FINISHING:
            return []
        if not {"attach", "configurationDone"} <= self._answered:
            return []
        self.channel.enter(ReplayPhase.LIVE, "configurationDone and attach answered")
        self._replay_deadline = None
        # prefetch: every stop's ``stopped`` is followed by a prefetch event (protocol_specs.session.prefetch)
        data = {"capabilities_delta": self.session.capabilities_delta, "prefetch": True}
        actions: list[Action] = [
            Publish(self._status(StatusEvent.DEBUGGER_LIVE, data=data)),
            Say(f"run {self.record.id}: debugger live"),
        ]
        queued, self._queued = self._queued, []
        for entry in queued:
            actions += self._on_request(entry)
        return actions

    # --- time -------------------------------------------------------------------------------------

    @property
    def next_deadline(self) -> float | None:
        times = [self._replay_deadline, self.watch.next_deadline]
        return min((t for t in times if t is not None), default=None)

    def on_tick(self) -> list[Action]:
        now = self.clock()
        if self._replay_deadline is not None and now >= self._replay_deadline:
            phase = self.phase
            self.channel.enter(ReplayPhase.ENDED, "a step timed out")
            self._replay_deadline = None
            text = f"debugpy did not answer within {HANDSHAKE_TIMEOUT:g} s ({phase.value})"
            return [ReplayFailed(text, timed_out=True)]
        return self.channel.watch_step()

    def watch_terminates(self, step: Terminate) -> list[Action]:
        """The unattended policy ends the run (a
        :class:`~worker_shim.session.channel.ChannelOwner`'s decision)."""
        return self._terminate()

    # --- plumbing ---------------------------------------------------------------------------------


def parse_delivery(delivery: wire.Deliver) -> tuple[Cursor | None, wire.AnyEntry | None]:
    """A delivery's cursor and entry (None for what is malformed: logged, skipped)."""
    cursor: Cursor | None = None
    try:
        if delivery.cursor:  # none yet: an early entry, live traffic after the history
            cursor = Cursor.parse(delivery.cursor)
    except InvalidCursor:
        log.warning("delivery with a bad cursor %r", delivery.cursor)
    try:
        return cursor, wire.decode_entry(delivery.entry)
    except WireError as exc:
        log.warning("skipping malformed entry %s: %s", delivery.cursor, exc.message)
        return cursor, None


def terminates(entry: wire.AnyEntry | None, record: RunRecord) -> bool:
    """A ``terminate`` meant for this attempt (not one an earlier attempt was sent)."""
    return (
        isinstance(entry, wire.ControlEntry)
        and entry.action == "terminate"
        and entry.attempt in (0, record.attempt)
    )


def exit_status(
    record: RunRecord,
    code: int,
    wall: Callable[[], float] = time.time,
    *,
    process: str = MAIN,
    node: int = 0,
) -> StatusEntry:
    """The program's exit status; ``final``: no further attempt follows. ``process``, ``node``:
    node K's program's key and K, for a run that spans nodes: ``data["node"]`` says it is that
    node's exit, not the run's (the relay tells the run's, ``is_node_exit``)."""
    spec = record.spec
    failures = record.failures + 1  # preempted attempts use no retry
    final = code == 0 or retry_delay(failures, spec.max_retries, spec.retry_backoff) is None
    data: dict[str, Any] = {"attempt": record.attempt, "final": final}
    if spec.resources.nodes > 1:
        data["node"] = node
    return status_entry(StatusEvent.EXITED, wall, exit_code=code, data=data, process=process)


def request_of(entry: DapEntry) -> dict[str, Any] | None:
    """The DAP request ``entry`` carries, if it is a well-formed one: an object with a string
    ``command``, an integer ``seq`` and ``arguments`` absent or an object."""
    try:
        msg = orjson.loads(entry.body)
    except orjson.JSONDecodeError:
        return None
    if not isinstance(msg, dict) or msg.get("type") != "request":
        return None
    seq = msg.get("seq")
    if not isinstance(msg.get("command"), str) or not isinstance(seq, int) or isinstance(seq, bool):
        return None
    if not isinstance(msg.get("arguments", {}), dict | None):
        return None
    return msg
