"""The processes of a debugged run on the worker: who they are, and which connection a message is for.

Theory of operation
-------------------
With subprocess debugging on, debugpy's adapter announces each new Python process of the program
to the client of its parent's session, here one of the shim's connections: the standard
``startDebugging`` reverse request (the shim claims ``supportsStartDebuggingRequest``) or, from a
debugpy that would not send it, its own ``debugpyAttach`` event. Either can come on ANY
connection (children of children; a Python process a non-Python command started, connected by
``_tether_sitecustomize.py``, comes the same way). :class:`DebuggedProcesses` answers it, names
the child (:func:`~worker_shim.program.process_names.describe`: ``RANK`` / ``LOCAL_RANK`` /
``WORLD_SIZE`` from ``/proc/<pid>/environ``, its command line without the debugger's, the program
it runs, the host, its parent and its order among the parent's children), publishes
``process_started``, and opens a session of its own for it
(:class:`worker_shim.session.child.ChildSession`), configured at once: no child waits for an IDE.

Deliveries from ``to_worker`` are routed by :attr:`DapEntry.process
<protocol_specs.wire.stream_entries.DapEntry>`: the main process's to the main core
(:class:`worker_shim.session.core.ShimCore`), a child's to its session; a request for a process
that is not (or no longer) debugged gets an error response, published back to the asker.
Configuration requests of every process are folded into one run-wide :class:`DebugSession` (the
latest per source wins): what a child that starts later is configured with. With
``RunSpec.ranks``, a child whose ``RANK`` is known and not listed is configured with no
breakpoints: it runs free. The focus (:mod:`protocol_specs.session.focus`: a ``tetherFocus``
request an adapter recorded in ``to_worker``, the last one wins) replaces ``RunSpec.ranks`` while it
is set: a live rank that leaves it has its breakpoints cleared, one that enters it is sent the run's
configuration. An expression evaluated in every paused rank (``tether eval``, the debug console's
``@all EXPR``, answered here rather than by a rank's debugpy) is
:mod:`worker_shim.session.rank_eval`'s.

Sans-I/O: reading ``/proc`` is a function passed in (:func:`read_proc` by default).
"""

from __future__ import annotations

import logging
import socket
from collections.abc import Callable
from typing import Any

import orjson

from protocol_specs.dap import models as dap
from protocol_specs.session.focus import (
    FOCUS_COMMAND,
    in_focus,
    outside_focus_answer,
    parse_focus,
)
from protocol_specs.session.processes import MAIN, ProcessInfo, node_of, process_key
from protocol_specs.session.rank_values import RankValue, console_answer, parse_prefix
from protocol_specs.session.session import BreakpointSet, DebugSession, StatusEvent
from protocol_specs.wire import wire
from protocol_specs.wire.wire import DapEntry, GroupEntry, PresenceEntry, StatusEntry

from ..program.process_names import ProcFacts, describe, read_proc
from .actions import (
    Action,
    CloseChild,
    EvalAnswered,
    MovedAlone,
    OpenChild,
    Publish,
    Say,
    Settle,
    Terminate,
    status_entry,
)
from .channel import DebugpyChannel
from .child import ChildSession, announces_child, message_of
from .core import ShimCore, parse_delivery, request_of
from .group import Announce, GroupAction, Note, RankGroup, Release, Send
from .node_group import NodeGroup
from .rank_eval import Ask, ConsoleAsk, Done, EvalMove, RankEval, console_eval
from .replay import (
    attach_arguments,
    cleared,
    configuration,
    initialize_arguments,
    pipe_output_attach,
)
from .suspend import SOURCE, SUSPEND_WAIT

__all__ = ["DebuggedProcesses", "cleared"]

log = logging.getLogger("tether.worker")

#: a session's requests that set breakpoints: not sent to a rank outside the focus
_BREAKPOINT_COMMANDS = frozenset(
    {"setBreakpoints", "setFunctionBreakpoints", "setExceptionBreakpoints"}
)


class DebuggedProcesses:
    """Every debugged process of the run, and which one a message is for: the main one's
    :class:`ShimCore` and one :class:`ChildSession` per child."""

    def __init__(
        self,
        main: ShimCore,
        *,
        read: Callable[[int], ProcFacts] = read_proc,
        host: str | None = None,
    ) -> None:
        self.main = main
        self.record = main.record
        self.children: dict[str, ChildSession] = {}
        self.infos: dict[str, ProcessInfo] = {}
        #: the run-wide configuration: configuration requests of every process, folded
        self.config = DebugSession()
        self._read = read
        self._host = socket.gethostname() if host is None else host
        self._born: dict[str, int] = {}  #: parent key -> how many children it had
        self._cmdlines: dict[str, list[str]] = {}  #: key -> real command line (forks share it)
        self._over = False  #: the program exited: a child announced now is not reported
        #: the ranks on this worker, stopped and moved together (``--stop all``; None: ``one``)
        self.group = RankGroup(main.clock) if self.record.spec.stop == "all" else None
        self.across = NodeGroup.of(self.group, self.record, main.node, main.wall)  #: a run's nodes'
        #: expressions evaluated in every paused rank (``tether eval``, ``@all``)
        self.evals = RankEval(main.clock)
        #: the session's focus (a ``tetherFocus`` request; None: ``RunSpec.ranks`` holds)
        self.focus: list[int] | None = None
        #: each configured child: whether it was configured free (with no breakpoints)
        self._free: dict[str, bool] = {}

    def __repr__(self) -> str:
        live = sum(1 for c in self.children.values() if not c.ended)
        return f"<DebuggedProcesses children={len(self.children)} live={live} {self.main!r}>"

    def start(
        self,
        pid: int,
        command: list[str] | None = None,
        *,
        late: bool = False,
        post_mortem: bool = False,
        started: dict[str, Any] | None = None,
    ) -> list[Action]:
        """The main process is ``pid``, running ``command`` (as submitted); ``late``,
        ``post_mortem`` and ``started``: see :meth:`ShimCore.start
        <worker_shim.session.core.ShimCore.start>`. On node K >= 1, its program is announced
        (``process_started``) like a child, for the IDE to be offered it."""
        facts = self._read(pid)
        key = self.main.key
        self._cmdlines[key] = facts.cmdline
        info = self.infos[key] = describe(
            pid, facts, parent=MAIN, nth=0, host=self._host, key=key, command=command,
            node=self.main.node,
        )  # fmt: skip
        announced: list[Action] = []
        if key != MAIN:  # node K's program: offered to the IDE as a child of the main process
            announced.append(Publish(self._started(info, info.title())))
        return announced + self.main.start(pid, late=late, post_mortem=post_mortem, started=started)

    # --- from the relay ---------------------------------------------------------------------------

    def on_delivery(self, delivery: wire.Deliver) -> list[Action]:
        cursor, entry = parse_delivery(delivery)
        if isinstance(entry, DapEntry) and (focus := _focus_of(entry)) is not None:
            return [*self._refocus(focus[0]), *self.main.on_entry(cursor, None)]
        if isinstance(entry, GroupEntry):  # another node's group (node_group.py)
            return [*self._group(self.across.on_entry(entry)), *self.main.on_entry(cursor, None)]
        console = console_eval(entry)
        if console is not None and node_of(console[0].process) != self.main.node:
            console = None  # asked in another node's session: that node's worker answers
        if console is not None:  # ``@all EXPR``: the worker answers it, from every rank
            # not live: the stream's past (an earlier attempt's asks), answered then
            answer = self._console(*console) if self.main.live else []
            return [*self.main.on_entry(cursor, None), *answer]
        if isinstance(entry, DapEntry):
            self._fold(entry)
            if node_of(entry.process) != self.main.node:
                # another node's process (node K: the main one's, folded by the core): that
                # node's worker answers it
                fold = entry if entry.process == MAIN else None
                return self.main.on_entry(cursor, fold)
            if entry.process != self.main.key:
                return [*self._for_child(entry), *self.main.on_entry(cursor, None)]
        actions = self.main.on_entry(cursor, entry)
        if isinstance(entry, PresenceEntry):
            for child in self.children.values():
                actions += child.presence(entry)
        return actions

    def _fold(self, entry: DapEntry) -> None:
        try:
            self.config.apply_to_worker(entry)
        except ValueError as exc:
            log.warning("skipping a malformed to_worker entry of %s: %s", entry.origin, exc)

    def _for_child(self, entry: DapEntry) -> list[Action]:
        child = self.children.get(entry.process)
        if child is not None and not child.ended:
            msg = request_of(entry)
            if msg is not None and self._held_off(child, msg):
                return self._outside_focus(child, entry, msg)
            actions = self._of(child.on_request(entry))
            if self.group is not None and msg is not None and not entry.local:
                moves = self.group.on_request(child.key, msg["command"], msg.get("arguments"))
                actions += self._group(moves)
            return actions
        if not self.main.live:
            return []  # the stream's past (an earlier attempt's processes): nothing to answer
        msg = request_of(entry)
        if msg is None or entry.local:
            return []
        text = f"process {entry.process} is not being debugged (it ended, or never started)"
        body = orjson.dumps(dap.error_response(msg, text, seq=1))  # the adapter renumbers
        return [Publish(DapEntry(origin=entry.origin, body=body, process=entry.process))]

    def end_run(self) -> list[Action]:
        return self.main.end_run()

    # --- from debugpy -----------------------------------------------------------------------------

    def on_debugpy_message(self, key: str, raw: bytes, answered: int) -> list[Action]:
        """One message on ``key``'s connection; ``answered``: the relay's highest answered
        publish number (the main core's output holding)."""
        child = self.children.get(key) if key != self.main.key else None
        if key != self.main.key and child is None:
            return []
        msg = message_of(raw)
        if msg is not None and announces_child(msg):
            return self._announced(key, msg)
        if msg is not None and msg.get("type") == "response":
            moves = self.evals.answered(key, msg)
            if moves is not None:  # a cross-rank evaluation's, not the session's
                channel = self._channel(key)
                if channel is not None:
                    channel.claim(msg["request_seq"])
                return self._evals(moves)
            self._seen_stack(key, msg)
        elif msg is not None and msg.get("type") == "event":
            self.evals.observe(key, msg)
        if child is None:
            return self.main.on_debugpy_message(raw, answered)
        if msg is None:
            return []
        if self.group is None:
            return self._of(child.on_message(msg, raw))
        was_live = child.live
        actions = self._group(self.group.on_event(key, msg, raw))
        return actions + self._membership(child, was_live)

    def _seen_stack(self, key: str, msg: dict[str, Any]) -> None:
        """A stop's prefetch read the stopped thread's frames: a cross-rank evaluation of this
        stop needs no ``stackTrace`` of its own (:meth:`RankEval.seen_stack`)."""
        channel = self._channel(key)
        asked = channel.prefetch_asked(msg.get("request_seq")) if channel is not None else None
        body = msg.get("body")
        if asked is None or asked[0] != "stackTrace" or not isinstance(body, dict):
            return
        if msg.get("success") and asked[1].get("startFrame") == 0:
            self.evals.seen_stack(key, asked[1].get("threadId"), body.get("stackFrames"))

    def _membership(self, child: ChildSession, was_live: bool) -> list[Action]:
        """A rank's session went live (it joins the group), or ended (it leaves)."""
        if self.group is None:
            return []
        if child.ended:
            return self._group(self.group.left(child.key))
        if child.live and not was_live and _is_rank(child.info, self.infos.get(child.info.parent)):
            assert child.info.rank is not None
            return self._group(self.group.joined(child.key, child.info.rank))
        return []

    def _group(self, moves: list[GroupAction]) -> list[Action]:
        """Perform the group's decisions: requests to ranks as the worker's own, events handed
        on to their sessions, notes."""
        actions: list[Action] = []
        for move in moves:
            child = self.children.get(move.key) if isinstance(move, Send | Release) else None
            if isinstance(move, Announce):
                actions.append(Publish(self.across.entry(move)))
            elif isinstance(move, Send) and child is not None:
                actions += child.channel.move(move.command, move.arguments)
            elif isinstance(move, Release) and child is not None:
                actions += self._of(child.on_message(move.msg, move.raw))
            elif isinstance(move, Note):
                log.info("run %s: %s", self.record.id, move.text)
                actions.append(Say(f"run {self.record.id}: {move.text}"))
                body = {"category": "important", "output": move.text + "\n"}
                event = orjson.dumps(dap.event("output", body, seq=1))
                actions += [Publish(DapEntry(body=event, process=key)) for key in move.keys]
        return actions

    def closed(self, key: str) -> list[Action]:
        """``key``'s connection ended, or could not be opened."""
        gone = self._evals(self.evals.gone(key))
        if key == self.main.key:
            return gone + self.main.debugpy_closed()
        child = self.children.get(key)
        if child is None:
            return []
        return gone + self._of(child.connection_closed()) + self._membership(child, child.live)

    def end(self, exit_code: int | None = None) -> list[Action]:
        """The program exited (with ``exit_code``): each child still thought alive is reported
        gone (the program's group is ended with it), and node K's program itself (announced like
        a child). A child debugpy announces after this (its message was on the way) is not
        reported started: its ``process_exited`` could not follow."""
        self._over = True
        actions: list[Action] = []
        for key, child in self.children.items():
            actions += self._evals(self.evals.gone(key))
            actions += self._of(child.connection_closed()) + self._membership(child, child.live)
        if self.main.key != MAIN and self.main.key in self.infos:
            exited = status_entry(
                StatusEvent.PROCESS_EXITED, self.main.wall, process=self.main.key,
                exit_code=exit_code,
            )  # fmt: skip
            actions.append(Publish(exited))
        return actions

    def _announced(self, key: str, msg: dict[str, Any]) -> list[Action]:
        """``startDebugging`` (answered at once) or ``debugpyAttach`` on ``key``'s connection."""
        actions: list[Action] = []
        if msg.get("type") == "request":
            args = msg.get("arguments")
            config = args.get("configuration") if isinstance(args, dict) else None
            child = self.children.get(key)
            actions += (child or self.main).channel.answer(msg)
        else:
            config = msg.get("body")
        pid = config.get("subProcessId") if isinstance(config, dict) else None
        if not isinstance(config, dict) or not isinstance(pid, int) or isinstance(pid, bool):
            log.warning("debugpy announced a child process without its pid: %r", msg)
            return actions
        return actions + self._new_child(key, pid, config)

    def _new_child(self, parent: str, pid: int, config: dict[str, Any]) -> list[Action]:
        key = process_key(pid, self.main.node)
        if key == self.main.key:
            return []
        if self._over:
            log.info("process %s was announced after the program exited: not debugged", key)
            return []
        # debugpy announces a pid it knows again only when that process replaced itself
        # (``exec`` after a ``fork``): a new incarnation, whose old session ends here
        replaced: list[Action] = []
        if key in self.children:
            replaced = self._replaced(self.children[key])
            if parent == key:  # announced on its own old connection: its parent is the old one's
                parent = self.infos[key].parent
        nth = self._born[parent] = self._born.get(parent, 0) + 1
        facts = self._read(pid)
        self._cmdlines[key] = facts.cmdline
        info = describe(pid, facts, parent=parent, nth=nth, host=self._host,
                        parent_cmdline=self._cmdlines.get(parent), node=self.main.node)  # fmt: skip
        self.infos[key] = info
        title = info.title(self.infos.get(parent))
        session = self.main.session
        mappings = attach_arguments(session, self.record.spec.workdir, self.main.run_dir)
        attach = pipe_output_attach(
            {**config, "request": "attach", "pathMappings": mappings["pathMappings"]}
        )
        child = ChildSession(
            info,
            title=title,
            record=self.record,
            run_dir=self.main.run_dir,
            initialize=initialize_arguments(session),
            attach=attach,
            configuration=lambda: self._configuration_of(info),
            clock=self.main.clock,
            wall=self.main.wall,
        )
        # the IDEs attached now are attached to it too (its stops are not unattended)
        child.watch.knows_presence_of(self.main.watch)
        self.children[key] = child
        started = self._started(info, title)
        return [*replaced, Publish(started), OpenChild(key), *child.start()]

    def _started(self, info: ProcessInfo, title: str) -> StatusEntry:
        """``process_started`` of ``info`` (prefetch: its stops are followed by a prefetch event,
        as the main's)."""
        return status_entry(
            StatusEvent.PROCESS_STARTED,
            self.main.wall,
            process=info.key,
            detail=title,
            data={**info.model_dump(), "prefetch": True},
        )

    def _replaced(self, old: ChildSession) -> list[Action]:
        """Process ``old`` exec'd a new program in its pid: its session (the old connection,
        which debugpy keeps open until then) ends now, reported exited, its rank out of the
        group, its cross-rank evaluations' state dropped (the new connection numbers its requests
        from 1 again: an old ask's number must not claim its answers); the close of its
        connection is not reported again."""
        log.info("process %s replaced itself (exec): a new session for it", old.key)
        actions = self._evals(self.evals.gone(old.key))
        actions += self._of(old.connection_closed()) + self._membership(old, old.live)
        return [*actions, CloseChild(old.key, retired=True)]

    def configuration(self) -> list[BreakpointSet]:
        """The run's latest configuration, folded from every process."""
        return configuration(self.config, post_mortem=self.record.spec.post_mortem)

    # --- focus ------------------------------------------------------------------------------------

    def _is_free(self, info: ProcessInfo) -> bool:
        """A rank outside the focus (or, with none, outside ``RunSpec.ranks``) gets no
        breakpoints: it does not stop on its own (its group still stops and moves it)."""
        if self.focus is not None:
            return not in_focus(info.rank, self.focus)
        return bool(self.record.spec.ranks) and not in_focus(info.rank, self.record.spec.ranks)

    def _configuration_of(self, info: ProcessInfo) -> list[BreakpointSet]:
        """What child ``info`` is configured with as it starts (asked at that moment)."""
        free = self._free[info.key] = self._is_free(info)
        return [] if free else self.configuration()

    def _held_off(self, child: ChildSession, msg: dict[str, Any]) -> bool:
        """A configuration request of a session of a rank outside the focus: not for its
        debugpy (the session was open before the focus moved, or ``--processes all``)."""
        return msg["command"] in _BREAKPOINT_COMMANDS and self._is_free(child.info)

    def _outside_focus(
        self, child: ChildSession, entry: DapEntry, msg: dict[str, Any]
    ) -> list[Action]:
        """Answered here, each breakpoint unverified with why (one the adapter answered itself,
        ``local``, needs none); it stays folded in the run's configuration."""
        if entry.local or child.info.rank is None:
            return []
        answer = outside_focus_answer(msg, child.info.rank, self.focus, self.record.spec.ranks)
        body = orjson.dumps({**answer, "seq": 1})  # the adapter renumbers
        return [Publish(DapEntry(origin=entry.origin, body=body, process=entry.process))]

    def _refocus(self, focus: list[int] | None) -> list[Action]:
        """A new focus: each configured child whose side of it changed is configured anew,
        with no breakpoints (left the focus) or the run's configuration (entered it)."""
        self.focus = focus
        log.info("run %s: focus on %s", self.record.id, "every rank" if focus is None else focus)
        actions: list[Action] = []
        for key, child in self.children.items():
            was = self._free.get(key)
            if child.ended or was is None or was == (free := self._is_free(child.info)):
                continue
            self._free[key] = free
            plan = self.configuration()
            actions += child.reconfigure([cleared(b) for b in plan] if free else plan)
        return actions

    def _of(self, actions: list[Action]) -> list[Action]:
        """A child's actions, its ``Terminate`` (the run's unattended-stop policy) made the
        run's: said once, by the main core; a rank the policy continued moves its group."""
        out: list[Action] = []
        for action in actions:
            if isinstance(action, Terminate):
                out += self.main.end_run()
            elif isinstance(action, MovedAlone):
                if self.group is not None:
                    move = self.group.on_request(action.process, action.command, action.arguments)
                    out += self._group(move)
            else:
                out.append(action)
        return out

    # --- time -------------------------------------------------------------------------------------

    @property
    def next_deadline(self) -> float | None:
        times = [self.main.next_deadline, *(c.next_deadline for c in self.children.values())]
        times.append(self.group.next_deadline if self.group is not None else None)
        times.append(self.evals.next_deadline)
        return min((t for t in times if t is not None), default=None)

    def on_tick(self) -> list[Action]:
        actions = self.main.on_tick()
        for child in self.children.values():
            actions += self._of(child.on_tick())
        actions += self._group(self.group.on_tick()) if self.group is not None else []
        return actions + self._evals(self.evals.on_tick())

    # --- cross-rank evaluation (rank_eval.py) -----------------------------------------------------

    def ranks(self) -> dict[str, int]:
        """The ranks debugged now: process key -> rank."""
        found: dict[str, int] = {}
        for key, child in self.children.items():
            parent = self.infos.get(child.info.parent)
            if child.live and not child.ended and _is_rank(child.info, parent):
                assert child.info.rank is not None
                found[key] = child.info.rank
        main = self.infos.get(self.main.key)
        if main is not None and main.rank is not None and self.main.live:
            found[self.main.key] = main.rank  # a job whose every process tether started (srun)
        return found

    def evaluate(self, ask: Any, source: str, ranks: list[int] | None) -> list[Action]:
        """Evaluate ``source`` in every paused rank (or of ``ranks``); ``EvalAnswered(ask)``
        follows, within :data:`~worker_shim.session.rank_eval.EVAL_WAIT`."""
        return self._evals(self.evals.start(ask, source, self.ranks(), ranks))

    def suspend(self, ask: Any) -> list[Action]:
        """``tether.on_suspend`` in every paused process (:mod:`.suspend`): ``EvalAnswered``."""
        keys = [self.main.key, *(k for k, c in self.children.items() if not c.ended)]
        ranks = {key: n for n, key in enumerate(keys)}
        return self._evals(self.evals.start(ask, SOURCE, ranks, None, wait=SUSPEND_WAIT))

    def suspend_outcome(self, ok: bool, text: str) -> list[Action]:
        """How the suspend went: every process's watch is told (the fallback acts if not)."""
        actions = self.main.channel.suspend_outcome(ok, text)
        for child in self.children.values():
            actions += self._of(child.channel.suspend_outcome(ok, text))
        return actions

    def _channel(self, key: str) -> DebugpyChannel | None:
        if key == self.main.key:
            return self.main.channel
        child = self.children.get(key)
        return child.channel if child is not None else None

    def _evals(self, moves: list[EvalMove]) -> list[Action]:
        """Perform the evaluations' decisions: requests to ranks as the worker's own, answers."""
        actions: list[Action] = []
        todo = list(moves)
        while todo:
            move = todo.pop(0)
            if isinstance(move, Ask):
                channel = self._channel(move.key)
                sent = channel.send(move.command, move.arguments) if channel else []
                if sent and channel is not None:
                    self.evals.sent(move, channel.seq)
                    actions += sent
                else:
                    todo += self.evals.not_sent(move)
            else:
                actions += self._evaluated_in(move.values)
                if isinstance(move.ask, ConsoleAsk):
                    actions += self._console_answer(move)
                else:
                    actions.append(EvalAnswered(move.ask, move.values))
        return actions

    def _evaluated_in(self, values: list[RankValue]) -> list[Action]:
        """The expression ran in these ranks and may have changed their state (``@all
        opt.step()``): each rank's session is told (``invalidated``), so its IDE reads its
        variables again and the adapter answers nothing more from the stop's prefetch."""
        keys = {rank: key for key, rank in self.ranks().items()}
        ran = [keys[v.rank] for v in values if v.state in ("value", "error") and v.rank in keys]
        event = orjson.dumps(dap.event("invalidated", {"areas": ["variables"]}, seq=1))
        return [Publish(DapEntry(body=event, transient=True, process=key)) for key in ran]

    def _console(self, entry: DapEntry, msg: dict[str, Any]) -> list[Action]:
        """An IDE's ``@all EXPR`` evaluate (any process's session): evaluated in every paused
        rank, answered with the values side by side."""
        prefix = parse_prefix(msg["arguments"]["expression"])
        assert prefix is not None
        ask = ConsoleAsk(entry.origin, entry.process, msg)
        if prefix.error:
            return self._console_reply(ask, error=prefix.error)
        return self.evaluate(ask, prefix.expression, prefix.ranks)

    def _console_answer(self, done: Done) -> list[Action]:
        assert isinstance(done.ask, ConsoleAsk)
        nodes = self.record.spec.resources.nodes
        result, error = console_answer(done.values, self.record.id, nodes, self.main.node)
        return self._console_reply(done.ask, result=result, error=error)

    def _console_reply(self, ask: ConsoleAsk, *, result: str = "", error: str = "") -> list[Action]:
        if error:
            reply = dap.error_response(ask.request, error, seq=1)  # the adapter renumbers
        else:
            reply = dap.response(ask.request, {"result": result, "variablesReference": 0}, seq=1)
        body = orjson.dumps(reply)
        return [Settle(), Publish(DapEntry(origin=ask.origin, body=body, process=ask.process))]


def _is_rank(info: ProcessInfo, parent: ProcessInfo | None) -> bool:
    """A rank of a distributed job: it has a ``RANK`` its parent does not (a DataLoader worker
    inherits its rank's: it is called ``worker N of rank R``)."""
    return info.rank is not None and (parent is None or parent.rank != info.rank)


def _focus_of(entry: DapEntry) -> tuple[list[int] | None] | None:
    """The focus a ``tetherFocus`` entry sets (in a 1-tuple: its None is "no focus"), None when
    the entry is no (well-formed) one."""
    if FOCUS_COMMAND.encode() not in entry.body:
        return None  # the common case, without parsing
    msg = request_of(entry)
    if msg is None or msg.get("command") != FOCUS_COMMAND:
        return None
    try:
        return (parse_focus(msg.get("arguments")),)
    except ValueError as exc:
        log.warning("skipping a malformed focus of %s: %s", entry.origin, exc)
        return None
