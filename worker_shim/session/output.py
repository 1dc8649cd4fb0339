"""The program's output: to the run's logs stream and, when the IDE asked for it, to the IDE.

Theory of operation
-------------------
pydevd's output redirection sends one DAP event per ``write()`` through the same socket as every
response, in one queue its writer thread drains at a few thousand events a second: a program
printing fast makes every request wait behind its backlog (measured: a ``threads`` request
unanswered for over a minute during a 200,000-line flood), and what is still queued when the
program exits is dropped. So the shim never asks pydevd to redirect (:func:`pipe_output_attach`);
the IDE's output comes from the program's stdout and stderr pipes, which the worker reads anyway
(:class:`worker_shim.program.debuggee.OutputPump`), and which also carry what children and C code
write.

:class:`OutputHold` decides, without doing any I/O, what is published and when:

- Secret values are blanked first (:class:`protocol_specs.access.redact.Redactor`), so the logs stream
  and the IDE see the same text.
- Output goes out at once while the relay has answered the previous output entry; while it has
  not, output is held and merged, and goes out after that answer in pieces of at most
  :data:`PIECE` bytes (Nagle's idea, no timer): a trickle costs no delay, a flood few entries.
  Each piece is a ``LogEntry`` and, for a run whose IDE asked for output, a transient DAP
  ``output`` event (category ``stdout``/``stderr``), its text decoded incrementally per stream (a
  character may straddle two reads).
- At most :data:`HOLD_CAP` bytes are held: beyond that :attr:`OutputHold.full` is true and the pump
  stops reading, so a program outrunning the relay is slowed by its own pipe, never buffered
  without bound.

The ordering barrier (:meth:`ProgramOutput.settle`): output and the debugger's messages travel on
different paths (the pipes; debugpy's socket). Before the shim publishes ``stopped``, the end of the
program or any response, everything the program had written to its pipes is read and published
first (bounded: :data:`BARRIER_TIMEOUT`), so a line printed before a stop reaches the IDE before
``stopped`` and a REPL ``print`` before its ``evaluate`` response. The mark is taken when the
barrier starts (what was read, plus what the pipes hold: ``FIONREAD``), so a program still
printing (a child, during a ``threads`` request) costs at most a pipe's worth of reading.

What Python holds in its own buffer is not in the pipe yet: debug runs get ``PYTHONUNBUFFERED=1``
unless the run's environment sets it (:func:`unbuffered_env`).
"""

from __future__ import annotations

import codecs
import logging
from collections import deque
from collections.abc import AsyncIterator, Callable, Mapping
from contextlib import asynccontextmanager
from typing import Literal, Protocol

import orjson
import trio

from protocol_specs.access.redact import Redactor
from protocol_specs.dap import models as dap
from protocol_specs.runs.lines import LineJoiner
from protocol_specs.session.processes import MAIN, node_main
from protocol_specs.wire import wire
from relay.client import RelayError, RunLink

from ..program.metrics import ProgramMetrics
from .actions import BARRIER_EVENTS
from .replay import pipe_output_attach

__all__ = [
    "BARRIER_EVENTS",
    "BARRIER_TIMEOUT",
    "HOLD_CAP",
    "PIECE",
    "OutputHold",
    "Pipes",
    "ProgramOutput",
    "open_program_output",
    "pipe_output_attach",
    "unbuffered_env",
]

log = logging.getLogger("tether.worker")

#: the most bytes one published piece carries (a log chunk, an IDE ``output`` event)
PIECE = 16 * 1024
#: the most bytes held while the relay has not answered; beyond, the program's pipe fills up
HOLD_CAP = 1024 * 1024
#: how long the barrier waits for the pipes to be read up to its mark
BARRIER_TIMEOUT = 0.2

Stream = Literal["stdout", "stderr"]
Entry = wire.LogEntry | wire.DapEntry
_STREAMS: tuple[Stream, ...] = ("stdout", "stderr")


def unbuffered_env(env: Mapping[str, str], run_env: Mapping[str, str]) -> dict[str, str]:
    """``env`` with ``PYTHONUNBUFFERED=1`` unless the run's own environment sets it (to anything):
    what a debugged program prints must be in its pipe when it stops, not in Python's buffer."""
    if "PYTHONUNBUFFERED" in run_env:
        return dict(env)
    return {**env, "PYTHONUNBUFFERED": "1"}


class OutputHold:
    """What of the program's output to publish, and when. No I/O: feed it, take entries.

    ``feed`` chunks in the order they were read; ``ready(answered)`` gives what may go now (the
    relay's highest answered publish number decides); ``flush`` gives everything held (the
    barrier); ``end`` also what the redactors and decoders hold back (the streams ended). After
    publishing what one of them returned, report the last entry's number with ``published``.
    """

    def __init__(
        self,
        secrets: list[str],
        *,
        attempt: int = 1,
        to_ide: bool = False,
        piece: int = PIECE,
        cap: int = HOLD_CAP,
        node: int = 0,
    ) -> None:
        """``node``: the node of a run that spans nodes whose program this is (its log entries
        say so; its output events are for its main process's session)."""
        self.attempt = attempt
        self.node = node
        #: also publish the output as DAP ``output`` events for the IDE
        self.to_ide = to_ide
        self.piece = piece
        self.cap = cap
        self.redactors = {name: Redactor(secrets) for name in _STREAMS}
        #: whole lines: a line of stderr never lands inside a line of stdout (or the reverse)
        self.lines = LineJoiner()
        self._decoders = {
            name: codecs.getincrementaldecoder("utf-8")("replace") for name in _STREAMS
        }
        self._segments: list[tuple[Stream, bytearray]] = []  # consecutive same-stream data merged
        self._held = 0
        #: the publish number of the last output entry sent (0: none)
        self.in_flight = 0

    def __repr__(self) -> str:
        return (
            f"<OutputHold held={self._held} segments={len(self._segments)} "
            f"in_flight={self.in_flight} to_ide={self.to_ide}>"
        )

    @property
    def held(self) -> int:
        """Bytes held, not yet taken."""
        return self._held

    @property
    def full(self) -> bool:
        """Whether to stop reading the program's output until something is taken."""
        return self._held >= self.cap

    def feed(self, stream: str, data: bytes) -> None:
        """Hold a chunk of ``stream`` (``stdout`` or ``stderr``), its secrets blanked, in line
        order with the other stream's (:class:`~protocol_specs.runs.lines.LineJoiner`)."""
        name = _stream(stream)
        for which, piece in self.lines.feed(name, self.redactors[name].feed(data)):
            self._hold(_stream(which), piece)

    def sendable(self, answered: int) -> bool:
        """Whether something is held and the relay answered the previous output entry."""
        return bool(self._segments) and answered >= self.in_flight

    def ready(self, answered: int) -> list[Entry]:
        """What may be published now: everything held once ``answered`` reached the previous output
        entry, else nothing (it waits, merging what follows)."""
        return self._take() if self.sendable(answered) else []

    def flush(self) -> list[Entry]:
        """Everything held, answered or not (a line half written included: the barrier), in
        pieces of at most :attr:`piece` bytes."""
        for which, piece in self.lines.flush():
            self._hold(_stream(which), piece)
        return self._take()

    def _take(self) -> list[Entry]:
        entries: list[Entry] = []
        for stream, data in self._segments:
            view = memoryview(data)
            for start in range(0, len(data), self.piece):
                entries += self._entries(stream, bytes(view[start : start + self.piece]))
            view.release()
        self._segments = []
        self._held = 0
        return entries

    def end(self) -> list[Entry]:
        """Everything, including what the redactors held back (a possible start of a secret) and
        an incomplete character at a stream's end: the streams ended."""
        for name in _STREAMS:
            for which, piece in self.lines.feed(name, self.redactors[name].flush()):
                self._hold(_stream(which), piece)
        entries = self.flush()
        for name in _STREAMS:
            text = self._decoders[name].decode(b"", final=True)
            if text and self.to_ide:
                entries.append(_output_event(name, text))
        return entries

    def published(self, n: int) -> None:
        """The entries taken last were published; ``n`` is the last one's number."""
        self.in_flight = max(self.in_flight, n)

    def _hold(self, stream: Stream, data: bytes) -> None:
        if not data:
            return
        if self._segments and self._segments[-1][0] == stream:
            self._segments[-1][1].extend(data)
        else:
            self._segments.append((stream, bytearray(data)))
        self._held += len(data)

    def _entries(self, stream: Stream, data: bytes) -> list[Entry]:
        entries: list[Entry] = [
            wire.LogEntry(stream=stream, data=data, attempt=self.attempt, node=self.node)
        ]
        if self.to_ide:
            text = self._decoders[stream].decode(data)
            if text:
                entries.append(_output_event(stream, text, node_main(self.node)))
        return entries


def _stream(name: str) -> Stream:
    if name == "stdout":
        return "stdout"
    if name == "stderr":
        return "stderr"
    raise ValueError(f"not an output stream: {name!r}")


def _output_event(stream: Stream, text: str, process: str = MAIN) -> wire.DapEntry:
    body = {"category": stream, "output": text}
    raw = orjson.dumps(dap.event("output", body))
    return wire.DapEntry(body=raw, transient=True, process=process)


class Pipes(Protocol):
    """How far the program's pipes were read (:class:`worker_shim.program.debuggee.OutputPump`)."""

    def mark(self) -> dict[str, int]:
        """Per pipe, the position its output reaches now (read so far plus still in the pipe)."""
        ...

    def reached(self, mark: dict[str, int]) -> bool:
        """Whether everything before ``mark`` was handed over (or its pipe ended)."""
        ...

    async def moved(self) -> None:
        """Return once more output was handed over, or a pipe ended."""
        ...


class ProgramOutput:
    """The :class:`OutputHold` driven over a run link: the pump's ``on_output``, the publisher of
    held output once the relay answered, and the barrier. Make one with
    :func:`open_program_output`."""

    def __init__(
        self, link: RunLink, hold: OutputHold, metrics: ProgramMetrics | None = None
    ) -> None:
        """``metrics``: the program's metrics; its output lines go there too, and they are
        published first when the output ends (before the exit status)."""
        self.link = link
        self.hold = hold
        self._lock = trio.Lock()  # one publisher at a time: pieces keep their order
        #: taken from the hold, not published yet (a publish cancelled while the outbox was full
        #: leaves the rest here for the next one)
        self._taken: deque[Entry] = deque()
        self._wake = trio.Event()  # output was held
        self._room = trio.Event()  # the hold was emptied
        self._failed = False
        self.metrics = metrics

    @property
    def preempted(self) -> bool:
        """The attempt was preempted (``worker_shim/program/preempt.py``)."""
        return self.metrics is not None and self.metrics.preempted

    def __repr__(self) -> str:
        return f"<ProgramOutput {self.hold!r}{' failed' if self._failed else ''}>"

    @property
    def to_ide(self) -> bool:
        return self.hold.to_ide

    @to_ide.setter
    def to_ide(self, value: bool) -> None:
        self.hold.to_ide = value

    def blank(self, text: str) -> str:
        """``text`` with the run's secret values blanked."""
        return self.hold.redactors["stdout"].text(text)

    async def __call__(self, stream: str, data: bytes) -> None:
        """A chunk the pump read: held, published now if the relay answered the previous output
        entry; returns once the hold is below its cap again."""
        if self.metrics is not None:
            self.metrics.output(stream, data)
        if self._failed:
            return
        self.hold.feed(stream, data)
        if not self._lock.locked() and self.hold.sendable(self.link.answered):
            await self._publish(self.hold.ready)
        else:
            self._wake.set()
        while self.hold.full and not self._failed:
            await self._room.wait()

    async def flush(self) -> None:
        """Publish everything held now, answered or not."""
        await self._publish(lambda _answered: self.hold.flush())

    async def settle(self, pipes: Pipes, timeout: float = BARRIER_TIMEOUT) -> None:
        """The barrier: return once everything the program wrote to its pipes before this call is
        published (or after ``timeout`` of waiting for the pipes, then with what was read)."""
        mark = pipes.mark()
        deadline = trio.current_time() + timeout
        while not pipes.reached(mark) and trio.current_time() < deadline:
            await self.flush()  # also lets a pump waiting for room read on
            with trio.move_on_at(deadline):
                await pipes.moved()
        await self.flush()

    async def end(self) -> None:
        """Publish everything, the redactors' and decoders' tails too (the streams ended), and
        the metrics."""
        if self.metrics is not None:
            await self.metrics.end()
        await self._publish(lambda _answered: self.hold.end())

    async def run(self) -> None:
        """Publish held output as soon as the relay answered the output entry before it."""
        while True:
            await self._wake.wait()
            self._wake = trio.Event()
            await self.link.wait_answered(self.hold.in_flight)
            await self._publish(self.hold.ready)

    async def _publish(self, take: Callable[[int], list[Entry]]) -> None:
        """Publish what ``take(answered)`` returns (decided under the lock, so in order)."""
        async with self._lock:
            if self.link.failed is not None:
                self._fail(self.link.failed)
            if self._failed:
                return
            self._taken += take(self.link.answered)
            self._made_room()
            try:
                while self._taken:
                    n = await self.link.publish(self._taken[0])
                    self._taken.popleft()  # no checkpoint since publish returned: never twice
                    self.hold.published(n)
            except RelayError as exc:
                self._fail(exc)

    def _made_room(self) -> None:
        self._room.set()
        self._room = trio.Event()

    def _fail(self, exc: RelayError) -> None:
        """The link gave up for good: output is dropped from now on (the worker's log file, which
        the pump writes first, still has all of it)."""
        if not self._failed:
            self._failed = True
            log.warning("cannot forward the program's output any more: %s", exc)
        self.hold.flush()
        self._taken.clear()
        self._made_room()


@asynccontextmanager
async def open_program_output(
    link: RunLink,
    attempt: int,
    secrets: list[str],
    metrics: ProgramMetrics | None = None,
    *,
    node: int = 0,
) -> AsyncIterator[ProgramOutput]:
    """A :class:`ProgramOutput` with its publisher running (``metrics``: the program's, fed its
    output). On exit (normal, error or cancel), shielded and bounded (5 s): everything still held
    is published, redactors' tails included (and the metrics' first)."""
    output = ProgramOutput(link, OutputHold(secrets, attempt=attempt, node=node), metrics)
    async with trio.open_nursery() as nursery:
        nursery.start_soon(output.run)
        try:
            yield output
        finally:
            with trio.CancelScope(shield=True), trio.move_on_after(5):
                await output.end()
            nursery.cancel_scope.cancel()
