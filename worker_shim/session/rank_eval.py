"""One expression evaluated in every paused rank of the run on this worker (``tether eval``, ``@all``).

Theory of operation
-------------------
The worker holds every rank's debugpy connection, so it asks each paused rank itself, as its own
requests (no IDE asked them; their answers stay here), all ranks at once:

1. ``stackTrace`` of the thread the rank stopped on (the first thread to stop, as the rank's
   session shows it); the frame is the top one for a breakpoint, a step or an exception (where
   the user stopped it), and the top *user* frame for a pause (the group's pause lands anywhere:
   library frames, the standard library and tether's own are passed over). Not asked when the
   stop's prefetch read that thread's frames already and the frame is among them
   (:meth:`RankEval.seen_stack`): debugpy answers one request to a paused rank at a time, some
   40 ms each on a busy machine, so the evaluation is then one round trip, as one rank's;
2. ``evaluate`` (``repl``) in that frame of ``_tether_breakpoint.rank_value(SOURCE, globals(),
   locals())``: the rank's own process evaluates SOURCE and describes the value in a short JSON
   text (``worker_shim/inject/_tether_values.py``: a tensor's shape, dtype, norm, NaN/Inf counts,
   computed on its device; never its data); an expression that raises answers its exception's
   type and message;
3. if that helper cannot answer (a process without it), SOURCE itself is evaluated: the value's
   repr, or debugpy's refusal as it words it.

An evaluation does not move a rank: nothing here sends ``continue`` or a step, and
:class:`~worker_shim.session.group.RankGroup` is not told. Which ranks are paused is seen here
from debugpy's own events (``stopped``, ``continued``, the process's end), for ``--stop one``
as for ``all``. A rank that has not answered within :data:`EVAL_WAIT` is reported so; its late
answers are dropped. Ranks that run are reported ``running (not evaluated)``, and so is a rank
that continued between its ``stackTrace`` and its ``evaluate`` (its frames are gone: debugpy
would only refuse). Without the helper, the repr debugpy answers is cut to one line of 160
characters, as the helper's are.

Sans-I/O: :class:`RankEval` returns :data:`EvalMove` s; :class:`DebuggedProcesses
<worker_shim.session.processes.DebuggedProcesses>` sends the :class:`Ask` s on the ranks'
connections (telling :meth:`RankEval.sent` their seq) and delivers the :class:`Done` s.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Hashable
from dataclasses import dataclass, field
from typing import Any

from protocol_specs.session.rank_values import (
    RankValue,
    error_value,
    from_helper,
    parse_prefix,
    plain_value,
)
from protocol_specs.wire import wire
from protocol_specs.wire.wire import DapEntry

from .core import request_of

__all__ = [
    "EVAL_WAIT",
    "Ask",
    "ConsoleAsk",
    "Done",
    "EvalMove",
    "RankEval",
    "console_eval",
    "user_frame",
    "wrapped",
]

#: seconds every rank has to answer an evaluation
EVAL_WAIT = 20.0
#: frames asked of a paused rank, to find its top user frame
STACK_LEVELS = 30
#: stop reasons where the top frame is where the user stopped the rank
_USERS_STOPS = frozenset(
    {"breakpoint", "step", "exception", "entry", "goto", "function breakpoint"}
)
_LIBRARY = re.compile(r"[/\\](site|dist)-packages[/\\]|[/\\]lib[/\\]python\d\.\d+[/\\]|debugpy")


@dataclass(frozen=True)
class Ask:
    """Send process ``key``'s debugpy this request, as the worker's own; then call
    :meth:`RankEval.sent` with its seq (or :meth:`RankEval.not_sent`)."""

    key: str
    command: str
    arguments: dict[str, Any]
    job: int
    step: str  #: ``where``, ``helper``, ``plain``
    frame: int = 0  #: the frame evaluated in (``helper``, ``plain``)


@dataclass(frozen=True)
class Done:
    """The evaluation ``ask`` (whoever asked: a console request, a ``tether eval``) is complete:
    every rank's value, by rank."""

    ask: Hashable
    values: list[RankValue]


EvalMove = Ask | Done


def wrapped(source: str) -> str:
    """The expression evaluated in the rank: tether's helper describing ``source``'s value."""
    return (
        f"__import__('sys').modules['_tether_breakpoint'].rank_value({source!r}, globals(), "
        "locals())"
    )


def user_frame(frames: list[Any], reason: str, *, strict: bool = False) -> int | None:
    """The frame to evaluate in: the top one where the user stopped the rank (``reason``), else
    the top one that is the user's code (not a library's, the standard library's, tether's);
    with none of those, the top one (``strict``: None, the user's may be further down)."""
    ids = [f for f in frames if isinstance(f, dict) and isinstance(f.get("id"), int)]
    if not ids:
        return None
    if reason in _USERS_STOPS:
        return int(ids[0]["id"])
    for frame in ids:
        source = frame.get("source")
        path = str(source.get("path") or "") if isinstance(source, dict) else ""
        name = path.replace("\\", "/").rsplit("/", 1)[-1]
        if path and not _LIBRARY.search(path) and not name.startswith("_tether_"):
            return int(frame["id"])
    return None if strict else int(ids[0]["id"])


@dataclass
class _Job:
    ask: Hashable
    source: str
    ranks: dict[str, int]  #: the ranks evaluated, by process key
    values: dict[int, RankValue] = field(default_factory=dict)  #: by rank, every one reported
    waiting: set[str] = field(default_factory=set)
    deadline: float = 0.0
    wait: float = EVAL_WAIT


@dataclass
class RankEval:
    """The cross-rank evaluations of the run on this worker (see the module docstring)."""

    clock: Callable[[], float]
    wait: float = EVAL_WAIT
    #: the processes paused now: key -> (the thread it stopped on, why)
    paused: dict[str, tuple[int, str]] = field(default_factory=dict)
    _jobs: dict[int, _Job] = field(default_factory=dict)
    #: the requests in flight, by (process key, seq): their :class:`Ask`
    _sent: dict[tuple[str, int], Ask] = field(default_factory=dict)
    _late: set[tuple[str, int]] = field(default_factory=set)
    _next: int = 0
    #: the frame to evaluate in, by process key, known from its stop's frames (until it moves)
    frames: dict[str, int] = field(default_factory=dict)

    def __repr__(self) -> str:
        return f"<RankEval paused={sorted(self.paused)} jobs={len(self._jobs)}>"

    # --- what debugpy says ------------------------------------------------------------------------

    def observe(self, key: str, msg: dict[str, Any]) -> None:
        """An event on ``key``'s connection: who is paused, on which thread."""
        name = msg.get("event")
        body = msg.get("body") if isinstance(msg.get("body"), dict) else {}
        assert isinstance(body, dict)
        if name in ("stopped", "continued", "exited", "terminated"):
            self.frames.pop(key, None)
        if name == "stopped" and isinstance(body.get("threadId"), int):
            if key not in self.paused:  # the first thread to stop: the one its session shows
                self.paused[key] = (body["threadId"], str(body.get("reason") or ""))
        elif name == "continued":
            thread = self.paused.get(key, (None, ""))[0]
            if body.get("allThreadsContinued", True) or body.get("threadId") == thread:
                self.paused.pop(key, None)
        elif name in ("exited", "terminated"):
            self.paused.pop(key, None)

    def seen_stack(self, key: str, thread: Any, frames: Any) -> None:
        """``key``'s frames of ``thread`` from the top (the stop's prefetch read them): if it is
        the paused thread and the frame to evaluate in is among them, no ``stackTrace`` is asked
        for this stop."""
        stop = self.paused.get(key)
        if stop is None or stop[0] != thread or not isinstance(frames, list):
            return
        frame = user_frame(frames, stop[1], strict=True)
        if frame is not None:
            self.frames[key] = frame

    def gone(self, key: str) -> list[EvalMove]:
        """``key``'s connection ended: it is not paused, and an evaluation waits no more for it."""
        self.paused.pop(key, None)
        self.frames.pop(key, None)
        self._sent = {k: ask for k, ask in self._sent.items() if k[0] != key}
        self._late = {k for k in self._late if k[0] != key}
        moves: list[EvalMove] = []
        for number, job in list(self._jobs.items()):
            if key in job.waiting:
                moves += self._final(number, key, error_value(job.ranks[key], "the process ended"))
        return moves

    # --- an evaluation ----------------------------------------------------------------------------

    def start(
        self,
        ask: Hashable,
        source: str,
        ranks: dict[str, int],
        wanted: list[int] | None,
        *,
        wait: float | None = None,
    ) -> list[EvalMove]:
        """Evaluate ``source`` in the paused ones of ``ranks`` (process key -> rank), or of those
        ``wanted``; a wanted rank that is not among them is reported ``absent``. ``wait``: the
        seconds each has (default :attr:`wait`)."""
        self._next += 1
        number = self._next
        want = None if wanted is None else set(wanted)
        chosen = {k: r for k, r in ranks.items() if want is None or r in want}
        wait = self.wait if wait is None else wait
        job = _Job(ask, source, chosen, deadline=self.clock() + wait, wait=wait)
        for rank in (want or set()) - set(chosen.values()):
            job.values[rank] = RankValue(rank=rank, state="absent")
        moves: list[EvalMove] = []
        for key, rank in sorted(chosen.items(), key=lambda kr: kr[1]):
            if key not in self.paused:
                job.values[rank] = RankValue(rank=rank, state="running")
                continue
            job.waiting.add(key)
            if key in self.frames:  # the stop's frames are known: the evaluation at once
                args = {"expression": wrapped(source), "frameId": self.frames[key],
                        "context": "repl"}  # fmt: skip
                moves.append(Ask(key, "evaluate", args, number, "helper", self.frames[key]))
                continue
            thread = self.paused[key][0]
            args = {"threadId": thread, "startFrame": 0, "levels": STACK_LEVELS}
            moves.append(Ask(key, "stackTrace", args, number, "where"))
        self._jobs[number] = job
        return moves + self._complete(number)

    def sent(self, ask: Ask, seq: int) -> None:
        """``ask`` went to debugpy as request ``seq``."""
        self._sent[(ask.key, seq)] = ask

    def not_sent(self, ask: Ask) -> list[EvalMove]:
        """``ask`` could not be sent (its connection is closed)."""
        job = self._jobs.get(ask.job)
        if job is None or ask.key not in job.waiting:
            return []
        return self._final(ask.job, ask.key, error_value(job.ranks[ask.key], "the process ended"))

    def answered(self, key: str, msg: dict[str, Any]) -> list[EvalMove] | None:
        """debugpy's response ``msg`` on ``key``'s connection; None: not an evaluation's."""
        seq = msg.get("request_seq")
        if not isinstance(seq, int):
            return None
        if (key, seq) in self._late:
            self._late.discard((key, seq))
            return []
        asked = self._sent.pop((key, seq), None)
        if asked is None:
            return None
        number, step = asked.job, asked.step
        job = self._jobs.get(number)
        if job is None or key not in job.waiting:
            return []
        rank = job.ranks[key]
        body = msg.get("body") if isinstance(msg.get("body"), dict) else {}
        assert isinstance(body, dict)
        ok = bool(msg.get("success"))
        why = str(msg.get("message") or "")
        # it continued (or ended) since it was asked: its frames are gone, nothing to evaluate in
        moved = key not in self.paused
        if moved and (step == "where" or not ok):
            return self._final(number, key, RankValue(rank=rank, state="running"))
        if step == "where":
            frame = user_frame(body.get("stackFrames") or [], self.paused.get(key, (0, ""))[1])
            if not ok or frame is None:
                return self._final(number, key, error_value(rank, why or "no frame to evaluate in"))
            args = {"expression": wrapped(job.source), "frameId": frame, "context": "repl"}
            return [Ask(key, "evaluate", args, number, "helper", frame)]
        result = str(body.get("result", ""))
        if step == "helper":
            value = from_helper(rank, result) if ok else None
            if value is None or (not value.type and value.state == "value"):
                if moved:
                    return self._final(number, key, RankValue(rank=rank, state="running"))
                return self._plain(number, key, asked.frame)  # no helper there: as debugpy says
            return self._final(number, key, value)
        if not ok:
            return self._final(number, key, error_value(rank, why))
        typed = str(body.get("type") or "")
        return self._final(number, key, plain_value(rank, result, typed))

    def _plain(self, number: int, key: str, frame: int) -> list[EvalMove]:
        job = self._jobs[number]
        args = {"expression": job.source, "frameId": frame, "context": "repl"}
        return [Ask(key, "evaluate", args, number, "plain", frame)]

    # --- time -------------------------------------------------------------------------------------

    @property
    def next_deadline(self) -> float | None:
        return min((j.deadline for j in self._jobs.values()), default=None)

    def on_tick(self) -> list[EvalMove]:
        """Ranks that did not answer in time are reported so (their answers dropped)."""
        now = self.clock()
        moves: list[EvalMove] = []
        for number, job in list(self._jobs.items()):
            if job.deadline > now:
                continue
            for (key, seq), asked in list(self._sent.items()):
                if asked.job == number:
                    del self._sent[(key, seq)]
                    self._late.add((key, seq))
            for key in sorted(job.waiting):
                why = f"no answer within {job.wait:g} s (busy, or blocked outside Python)"
                job.values[job.ranks[key]] = error_value(job.ranks[key], why)
            job.waiting.clear()
            moves += self._complete(number)
        return moves

    # --- plumbing ---------------------------------------------------------------------------------

    def _final(self, number: int, key: str, value: RankValue) -> list[EvalMove]:
        job = self._jobs[number]
        job.waiting.discard(key)
        job.values[value.rank] = value
        return self._complete(number)

    def _complete(self, number: int) -> list[EvalMove]:
        job = self._jobs[number]
        if job.waiting:
            return []
        del self._jobs[number]
        return [Done(job.ask, [job.values[r] for r in sorted(job.values)])]


@dataclass(frozen=True)
class ConsoleAsk:
    """Who asked an ``@all`` evaluate: the IDE (``origin``), in which process's session, with
    which request."""

    origin: str
    process: str
    request: dict[str, Any] = field(hash=False, compare=False)


def console_eval(entry: wire.AnyEntry | None) -> tuple[DapEntry, dict[str, Any]] | None:
    """``entry`` is an IDE's ``evaluate`` of the debug console (``repl``) with the ``@all`` /
    ``@ranks R`` / ``@rank N`` prefix: the entry and its request."""
    if not isinstance(entry, DapEntry) or entry.local:
        return None
    msg = request_of(entry)
    args = msg.get("arguments") if msg is not None else None
    if msg is None or msg["command"] != "evaluate" or not isinstance(args, dict):
        return None
    expression = args.get("expression")
    if args.get("context", "repl") != "repl" or not isinstance(expression, str):
        return None
    return (entry, msg) if parse_prefix(expression) is not None else None
