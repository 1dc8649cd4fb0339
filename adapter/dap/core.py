"""The adapter's routing core: what to answer the IDE, what to publish, decided synchronously.

Theory of operation
-------------------
The IDE believes it talks to debugpy. Until a worker is live (the run is queued, or starting), the core
answers everything itself, at once, the way debugpy would: ``initialize`` with the pinned capabilities,
``initialized`` after ``attach``, breakpoints with stable ids and ``verified: false``, no threads. The
configuration requests are also published into the run's ``to_worker`` stream (``local=True``: already
answered), where the worker shim will find them when it starts.

Once the worker reports ``debugger_live``, requests are published (``local=False``) and answered when the
worker's response comes back through ``to_ide``. ``seq`` is rewritten at this hop: the IDE's
``seq`` is mapped to the core's own counter (``origin_seq``, unique for this adapter instance, named by
``origin``) and responses are mapped back; the core numbers what it sends to the IDE itself, per IDE
connection. A request nobody answers gets an error response after ``request_timeout`` (debugpy ignores
requests it does not know).

Breakpoint ids are the adapter's (see ``protocol_specs.session.session``): the worker's answers to
configuration the core answered earlier become ``breakpoint`` events (reason ``changed``) under the ids
the IDE already holds.

An IDE leaving (socket closed, or ``disconnect`` without ``terminateDebuggee``) only detaches; with
``terminateDebuggee: true`` the core asks for the run to be cancelled. A new IDE connection gets the
handshake answered locally and, when the worker is live, ``thread``/``stopped`` events rebuilt from the
session fold (a ``threads`` response has no stopped flag).

Requests are checked where they enter (:mod:`adapter.dap.checks`). Every request gets exactly one
response: from the core, from the worker, or an error (refused, timed out, the run ended).

A child process of the program gets a session of its own (:mod:`adapter.dap.children`, dispatched by
:mod:`adapter.dap.processes`, which also decides when the main session's IDE is offered it).

Every method returns a list of actions; :mod:`adapter.dap.server` performs them. What the IDE
is told about the run itself (status lines, progress, retries, notices, the end, the state a new
IDE connection is greeted with) is decided by :class:`adapter.dap.status.RunNews`; the core
numbers it. The requests it forwards, and their deadlines, are kept by :mod:`adapter.dap.forwarding`.
"""

from __future__ import annotations

import logging
import uuid
from collections.abc import Callable
from typing import Any

import orjson

from protocol_specs.dap import models as dap
from protocol_specs.dap.capabilities import DEBUGPY_CAPABILITIES, DEBUGPY_VERSION, debugpy_answers
from protocol_specs.session.prefetch import PREFETCH_EVENT
from protocol_specs.session.processes import MAIN
from protocol_specs.session.session import (
    NOTICES,
    QUIET,
    DebugSession,
    StatusEvent,
    is_node_exit,
)
from protocol_specs.wire.wire import AnyEntry, DapEntry, PresenceEntry, StatusEntry, StreamName

from .actions import Action, CancelRun, CloseIde, IdePhase, Origin, Publish, ToIde
from .checks import check_request, editor_attach, garbage_note
from .forwarding import Pending, PendingRequests, answer_for_ide, event_for_ide, request_entry
from .status import RunNews, is_unattended_announcement
from .stop_answers import StopAnswers

__all__ = [
    "ADAPTER_CAPABILITIES",
    "Action",
    "AdapterCore",
    "CancelRun",
    "CloseIde",
    "IdePhase",
    "Origin",
    "Publish",
    "ToIde",
    "is_unattended_announcement",
]

log = logging.getLogger("tether.adapter")

#: debugpy's pinned capabilities, plus the correctly spelled ``supportTerminateDebuggee`` so VS Code
#: keeps ``terminateDebuggee`` on its Stop button (debugpy only sends the misspelled key, so VS Code
#: drops the flag; with tether, Stop cancels the run and Disconnect detaches).
ADAPTER_CAPABILITIES: dict[str, Any] = {**DEBUGPY_CAPABILITIES, "supportTerminateDebuggee": True}


class AdapterCore:
    """The IDE session of one debugged process (the main one; :mod:`adapter.dap.children` for the
    others): one IDE connection at a time, the fold of that process's entries."""

    def __init__(
        self,
        run_id: str,
        *,
        session: DebugSession | None = None,
        request_timeout: float = 30.0,
        origin: str | None = None,
        clock: Callable[[], float],
        shared: Origin | None = None,
        process: str = MAIN,
        news: RunNews | None = None,
    ) -> None:
        self.run_id = run_id
        self.session = session or DebugSession()
        self.request_timeout = request_timeout
        self.shared = shared or Origin(origin or uuid.uuid4().hex[:12])
        self.origin = self.shared.name
        #: the debugged process this session is for (:mod:`protocol_specs.session.processes`)
        self.process = process
        self.clock = clock
        self.phase = IdePhase.NONE
        self.generation = 0
        self._ide_seq = 0
        #: the forwarded requests waiting for the worker's answer
        self._pending = PendingRequests()
        self._attach_request: dict[str, Any] | None = None
        #: the ``initialize`` arguments of the IDE connected now (what the client supports)
        self.client_args: dict[str, Any] = {}
        #: the ``attach`` arguments of the IDE connected now (what a child session is offered with)
        self.attach_args: dict[str, Any] = {}
        if shared is None:
            self.shared.attached = lambda: self.phase is not IdePhase.NONE
        #: the worker's answers for the current stop, and the requests waiting for them
        self.stop = StopAnswers(clock)
        #: what this IDE connection is told about the run (status lines, progress, the end)
        self.news = news or RunNews(run_id, self.session)
        self._handlers: dict[str, Callable[[dict[str, Any]], list[Action]]] = {
            "initialize": self._initialize,
            "attach": self._attach,
            "launch": self._launch,
            "configurationDone": self._configuration_done,
            "setBreakpoints": self._configure,
            "setFunctionBreakpoints": self._configure,
            "setExceptionBreakpoints": self._configure,
            "threads": self._threads,
            "disconnect": self._disconnect,
            "terminate": self._terminate,
        }

    @property
    def configured(self) -> bool:
        """An IDE is connected and configured: events flow to it."""
        return self.phase is IdePhase.CONFIGURED

    @property
    def _origin_seq(self) -> int:
        """The ``seq`` of the latest request published under this adapter's origin."""
        return self.shared.seq

    def __repr__(self) -> str:
        return (
            f"<AdapterCore run={self.run_id} ide={self.phase.value} gen={self.generation} "
            f"pending={len(self._pending)} {self.session!r}>"
        )

    # --- IDE connection lifecycle -----------------------------------------------------------------

    def ide_connected(
        self, generation: int | None = None, *, greeted: dict[str, Any] | None = None, sent: int = 0
    ) -> list[Action]:
        """A new IDE connection replaces any previous one (returns the close for the old one).

        ``generation`` numbers the connection (a new number if None); ``greeted`` is the
        ``initialize`` request it sent before it was bound to this session, already answered,
        and ``sent`` how many messages it was sent meanwhile (this session numbers on from there).
        """
        actions: list[Action] = []
        if self.phase is not IdePhase.NONE:
            actions.append(CloseIde(self.generation, "another IDE connection took over"))
        self.generation = generation if generation is not None else self.shared.next_generation()
        self.phase = IdePhase.CONNECTED
        self._ide_seq = sent
        self._attach_request = None
        self.client_args = {}
        self.attach_args = {}
        self.news.reset()
        actions.append(self._presence())
        if greeted is not None:
            try:
                actions.extend(self._note_initialize(greeted))
            except ValueError:
                pass  # too large to record: it was answered all the same
        return actions

    def ide_disconnected(self, generation: int) -> list[Action]:
        """The IDE went away: detach only. Its pending requests will be dropped when answered."""
        if generation != self.generation or self.phase is IdePhase.NONE:
            return []
        self.phase = IdePhase.NONE
        self.stop.drop()  # its held requests go with it
        return [self._presence()]

    def _presence(self) -> Publish:
        """Tell the worker whether an IDE is attached here (it decides about unattended stops)."""
        self.shared.epoch += 1
        attached = self.shared.attached()
        return Publish(
            PresenceEntry(origin=self.origin, epoch=self.shared.epoch, attached=attached)
        )

    # --- the relay link ---------------------------------------------------------------------------

    def relay_link_changed(self, up: bool, detail: str) -> list[Action]:
        """The relay link dropped or came back (publishes wait in the link's outbox meanwhile)."""
        actions: list[Action] = []
        if up:
            actions.append(self._presence())  # the relay may have recorded us as gone
            text = f"tether: {detail}; nothing was lost.\n"
        else:
            text = f"tether: lost the relay connection ({detail}); reconnecting.\n"
        if self.phase is IdePhase.CONFIGURED:
            actions.append(self._emit(dap.event("output", {"category": "console", "output": text})))
        return actions

    def publish_refused(self, origin_seq: int | None, message: str) -> list[Action]:
        """The relay refused an entry (e.g. the run's buffer is full): fail the request it carried.

        ``origin_seq`` is the one its :class:`Publish` named (None: a presence entry)."""
        text = f"tether: the relay refused a message: {message}"
        pending = self._pending.answered(origin_seq)
        if pending is not None:
            return self._refuse(pending, text)
        if self.phase is not IdePhase.CONFIGURED:
            return []
        out = {"category": "important", "output": text + "\n"}
        return [self._emit(dap.event("output", out))]

    # --- from the IDE -----------------------------------------------------------------------------

    def on_ide_message(self, msg: dict[str, Any]) -> list[Action]:
        """One message from the IDE connected now (none connected: ignored). Never raises."""
        if self.phase is IdePhase.NONE or msg.get("type") != "request":
            return []  # responses to reverse requests (:mod:`adapter.dap.processes`), stray events
        checked = check_request(msg)
        if isinstance(checked, str):
            return self.on_ide_garbage(checked)
        if checked.get("type") == "response":
            return [self._emit(checked)]
        msg = checked
        if self.phase is IdePhase.CONFIGURED and self.stop.deadline is not None:
            if self.stop.holds(msg):
                self.stop.held.append(msg)  # answered, in order, once the prefetch is here
                return []
            return [*self._release(self.stop.release()), *self.on_ide_message(msg)]
        answer = self.stop.request(msg)
        if answer is not None and self.session.live:
            return self._prefetched(msg, answer)
        handler = self._handlers.get(msg["command"])
        if handler is None:
            handler = self._forward_or_refuse
        try:
            return handler(msg)
        except ValueError as exc:
            # handlers publish before they change any state: a refused request left none behind
            return [self._emit(dap.error_response(msg, str(exc)))]

    def _prefetched(self, msg: dict[str, Any], answer: dict[str, Any]) -> list[Action]:
        """``msg`` answered from the stop's prefetch; a watch is also recorded for the worker
        (it evaluates the IDE's watches at the next stop)."""
        actions: list[Action] = [self._emit(answer)]
        if msg["command"] == "evaluate":
            try:
                actions.append(self._publish(msg, local=True))
            except ValueError:
                pass  # too large to record: answered all the same
        return actions

    def _release(self, held: list[dict[str, Any]]) -> list[Action]:
        """The requests that waited for a stop's prefetch, in order."""
        return [action for msg in held for action in self.on_ide_message(msg)]

    def on_ide_garbage(self, reason: str) -> list[Action]:
        """The IDE sent something that is not a DAP request (the stream stays usable).

        With no ``seq`` to answer, there is no response to give: say it in the debug console.
        """
        return [self._emit(garbage_note(reason))]

    def _initialize(self, msg: dict[str, Any]) -> list[Action]:
        noted = self._note_initialize(msg)
        return [*noted, self._emit(dap.response(msg, ADAPTER_CAPABILITIES))]

    def _note_initialize(self, msg: dict[str, Any]) -> list[Action]:
        """Record the IDE's ``initialize`` (its arguments tell what the client supports)."""
        published = self._publish(msg, local=True)
        self.client_args = msg.get("arguments", {})
        return [published]

    def _attach(self, msg: dict[str, Any]) -> list[Action]:
        # debugpy answers attach only after configurationDone; do the same.
        if self._attach_request is not None or self.phase is IdePhase.CONFIGURED:
            # each request is answered once: a second attach would replace the one pending
            return [self._emit(dap.error_response(msg, "This IDE connection is already attached."))]
        actions: list[Action] = []
        if not self.session.live and not self.session.finished:
            actions.append(self._publish(msg, local=True))
        self._attach_request = {"seq": msg["seq"], "command": msg["command"]}  # all it needs
        self.attach_args = msg.get("arguments", {})
        actions.append(self._emit(dap.event("initialized")))
        return actions

    def _launch(self, msg: dict[str, Any]) -> list[Action]:
        arguments = msg.get("arguments") or {}
        if arguments.get("tetherRun") != self.run_id:
            text = '"attach" expected: tether runs the program on a worker, use "attach".'
            return [self._emit(dap.error_response(msg, text, show_user=True))]
        # the editor extension's launch: it submitted this run, so debugging it is an attach
        # (published as one, without the extension's own keys, and replayed to debugpy); the
        # response still answers the launch
        actions = self._attach({**msg, "command": "attach", "arguments": editor_attach(arguments)})
        self.attach_args = arguments  # what its child processes' sessions inherit
        if self._attach_request is not None:
            self._attach_request["command"] = "launch"
        return actions

    def _configuration_done(self, msg: dict[str, Any]) -> list[Action]:
        actions: list[Action] = []
        if not self.session.live and not self.session.finished:
            actions.append(self._publish(msg, local=True))
        actions.append(self._emit(dap.response(msg)))
        if self._attach_request is not None:
            actions.append(self._emit(dap.response(self._attach_request)))
            self._attach_request = None
        self.phase = IdePhase.CONFIGURED
        actions.extend(self._greet())
        return actions

    def _greet(self) -> list[Action]:
        """What a freshly configured IDE needs to see of the current state."""
        return self._emit_all(self.news.greeting(self.client_args, self.generation))

    def _configure(self, msg: dict[str, Any]) -> list[Action]:
        command = msg["command"]
        arguments = dap.parse_arguments(command, msg.get("arguments"))
        raw_args = msg.get("arguments") or {}
        bp_ids = self.session.assign_breakpoint_ids(command, raw_args)
        if self.session.live:
            return self._forward(
                msg, bp_ids=bp_ids if command != "setExceptionBreakpoints" else None
            )
        entry_action = self._publish(
            msg, local=True, bp_ids=bp_ids if command != "setExceptionBreakpoints" else None
        )
        if command == "setExceptionBreakpoints":
            return [entry_action, self._emit(dap.response(msg))]
        bps = self.news.unverified(command, arguments, bp_ids)
        return [entry_action, self._emit(dap.response(msg, {"breakpoints": bps}))]

    def _threads(self, msg: dict[str, Any]) -> list[Action]:
        if self.session.live:
            return self._forward(msg)
        return [self._emit(dap.response(msg, {"threads": []}))]

    def _disconnect(self, msg: dict[str, Any]) -> list[Action]:
        args = msg.get("arguments", {})
        actions: list[Action] = []
        if args.get("terminateDebuggee") is True and not self._only_detach(args):
            actions.append(CancelRun("the IDE disconnected with terminateDebuggee"))
        actions.append(self._emit(dap.response(msg)))
        actions.append(CloseIde(self.generation, "the IDE disconnected", flush=True))
        actions.extend(self.ide_disconnected(self.generation))
        return actions

    def _terminate(self, msg: dict[str, Any]) -> list[Action]:
        # never forwarded: debugpy would end the program with exit code 0 (a run "succeeded")
        args = msg.get("arguments") or {}
        actions: list[Action] = [] if self._only_detach(args) else [CancelRun("the IDE stopped it")]
        return [*actions, self._emit(dap.response(msg))]

    def _only_detach(self, args: dict[str, Any]) -> bool:
        """A restart only detaches (the IDE attaches again); a finished run has nothing to stop."""
        return args.get("restart") is True or self.session.finished

    def _forward_or_refuse(self, msg: dict[str, Any]) -> list[Action]:
        command = msg["command"]
        if not debugpy_answers(command):
            # debugpy would never answer, and would stall every later request meanwhile
            text = f"{command!r} is not supported by the debugger (debugpy {DEBUGPY_VERSION})."
            return [self._emit(dap.error_response(msg, text))]
        if self.session.live:
            return self._forward(msg)
        return [
            self._emit(dap.error_response(msg, self.news.not_live_text(msg.get("command", ""))))
        ]

    def _forward(self, msg: dict[str, Any], *, bp_ids: list[int] | None = None) -> list[Action]:
        action = self._publish(msg, local=False, bp_ids=bp_ids)
        self._pending.add(
            self._origin_seq,
            Pending(
                self.generation,
                msg["seq"],
                msg["command"],
                self.clock() + self.request_timeout,
                bp_ids,
            ),
        )
        return [action]

    def _publish(
        self, msg: dict[str, Any], *, local: bool, bp_ids: list[int] | None = None
    ) -> Publish:
        """The entry carrying ``msg``, the next request of this adapter's ``seq`` space; raises
        ``ValueError`` (and changes nothing) if it cannot be one (:func:`request_entry`)."""
        origin_seq = self._origin_seq + 1
        entry = request_entry(
            msg, origin_seq, origin=self.origin, process=self.process, local=local, bp_ids=bp_ids
        )
        self.shared.seq = origin_seq
        self.session.apply_to_worker(entry)  # keeps breakpoint requests only, never arguments
        return Publish(entry, origin_seq)

    # --- from the relay -------------------------------------------------------------------------

    def on_delivery(
        self, stream: StreamName, entry: AnyEntry | Any, *, replaying: bool = False
    ) -> list[Action]:
        """Fold one delivered entry; unless ``replaying`` history, produce what the IDE must see."""
        if stream is StreamName.TO_WORKER:
            # our own requests were folded when we published them
            if isinstance(entry, DapEntry) and entry.origin != self.origin:
                # another adapter of the run (`tether attach`); anyone holding the user's token
                # can write one: the fold skips what is not a well-formed request
                try:
                    self.session.apply_to_worker(entry)
                except ValueError as exc:
                    log.warning("skipping a malformed to_worker entry of %s: %s", entry.origin, exc)
            return []
        if isinstance(entry, StatusEntry):
            was_live = self.session.live
            threads, stopped = list(self.session.threads), bool(self.session.stopped)
            self.session.apply_to_ide(entry)
            if replaying or entry.event in QUIET or is_node_exit(entry):
                return []
            if entry.event in NOTICES:
                return self._on_notice(entry)
            if entry.event == StatusEvent.RETRYING:
                return self._on_retry(entry, threads, stopped)
            if entry.event == StatusEvent.EXITED and entry.data.get("final") is False:
                return []  # the relay's ``retrying`` says what happens next
            return self._on_status(entry, was_live)
        if not isinstance(entry, DapEntry):
            return []
        msg = orjson.loads(entry.body)
        changed = self.session.apply_to_ide(entry)
        if replaying:
            return []
        kind = msg.get("type")
        if kind == "response":
            if entry.origin != self.origin:
                return self._breakpoint_events(changed)  # configuration another adapter recorded
            return self._on_response(msg, changed)
        if kind == "event":
            return self._on_event(msg)
        return []

    def _on_response(self, msg: dict[str, Any], changed: list[int]) -> list[Action]:
        pending = self._pending.answered(msg.get("request_seq", -1))
        if pending is None:
            # the answer to configuration we answered locally: tell the IDE what really happened
            return self._breakpoint_events(changed)
        if pending.generation != self.generation or self.phase is IdePhase.NONE:
            return []  # meant for an IDE connection that is gone
        return [self._emit(answer_for_ide(msg, pending, self.session))]

    def _breakpoint_events(self, ids: list[int]) -> list[Action]:
        if self.phase is not IdePhase.CONFIGURED:
            return []
        return [
            self._emit(
                dap.event(
                    "breakpoint", {"reason": "changed", "breakpoint": self.session.verification[i]}
                )
            )
            for i in ids
        ]

    def _on_event(self, msg: dict[str, Any]) -> list[Action]:
        name = msg.get("event")
        body = msg.get("body")
        if name == PREFETCH_EVENT:  # the worker's answers for this stop: never the IDE's
            return self._release(self.stop.filled(body))
        self.stop.event(str(name))
        if name == "stopped" and self.session.prefetch and self.phase is IdePhase.CONFIGURED:
            self.stop.stopped()
        if self.phase is not IdePhase.CONFIGURED:
            return []
        if name == "terminated":
            if self.news.terminated_sent:
                return []
            self.news.terminated_sent = True
        if name == "invalidated" and self.client_args.get("supportsInvalidatedEvent") is not True:
            return []  # the spec's rule: only to a client that said it takes one
        return [self._emit(event_for_ide(msg, self.session))]

    def _on_status(self, entry: StatusEntry, was_live: bool) -> list[Action]:
        actions: list[Action] = []
        if not self.session.live:
            actions += self._release(self.stop.ended())  # refused now: nobody will answer
        if self.session.finished:
            actions.extend(self._fail_pending("the run ended"))
        if self.phase is IdePhase.CONFIGURED:
            actions.extend(self._emit_all(self.news.on_status(was_live)))
        return actions

    def _on_retry(self, entry: StatusEntry, threads: list[int], stopped: bool) -> list[Action]:
        actions = self._fail_pending(f"attempt {entry.data.get('previous')} ended")
        if self.phase is IdePhase.CONFIGURED:
            actions.extend(self._emit_all(self.news.on_retry(entry, threads, stopped)))
        return actions

    def _on_notice(self, entry: StatusEntry) -> list[Action]:
        if self.phase is not IdePhase.CONFIGURED:
            return []
        return self._emit_all(self.news.on_notice(entry))

    # --- timeouts -------------------------------------------------------------------------------

    @property
    def next_deadline(self) -> float | None:
        """When :meth:`on_tick` has something to do: a request's or the stop's prefetch's."""
        deadlines = (self._pending.next_deadline, self.stop.deadline)
        return min((d for d in deadlines if d is not None), default=None)

    def on_tick(self) -> list[Action]:
        now = self.clock()
        actions: list[Action] = []
        if self.stop.due():
            log.warning("no prefetch came for the stop: the held requests go to the worker")
            actions += self._release(self.stop.release())
        for p in self._pending.due(now):
            text = (
                f"The debugger did not answer {p.command!r} within {self.request_timeout:g} s "
                "(debugpy does not answer requests it does not support)."
            )
            actions += self._refuse(p, text)
        return actions

    def _fail_pending(self, reason: str) -> list[Action]:
        return [a for p in self._pending.drain() for a in self._refuse(p, reason)]

    def _refuse(self, p: Pending, text: str) -> list[Action]:
        """The error response to a pending request, if the IDE that asked is still here."""
        if p.generation != self.generation or self.phase is IdePhase.NONE:
            return []
        return [self._emit(dap.error_response({"seq": p.ide_seq, "command": p.command}, text))]

    # --- text -----------------------------------------------------------------------------------

    def status_text(self) -> str:
        """The run's status in a sentence (the debug console and ``tether debug`` print it)."""
        return self.news.status_text()

    # --- plumbing -------------------------------------------------------------------------------

    def emit(self, msg: dict[str, Any]) -> ToIde:
        """``msg`` for the IDE connected now, numbered in its ``seq`` space: a message decided
        elsewhere (the offer of a child's session, :mod:`adapter.dap.processes`)."""
        return self._emit(msg)

    def _emit(self, msg: dict[str, Any]) -> ToIde:
        """``msg`` for the IDE connected now, numbered in its ``seq`` space."""
        self._ide_seq += 1
        return ToIde({**msg, "seq": self._ide_seq}, self.generation)

    def _emit_all(self, messages: list[dict[str, Any]]) -> list[Action]:
        return [self._emit(msg) for msg in messages]
