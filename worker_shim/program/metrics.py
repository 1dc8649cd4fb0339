"""The program's metrics, from ``tether.report`` and from its output lines, to the run's
``metrics`` stream (the decisions: ``protocol_specs/runs/metrics.py``).

The worker listens on a Unix socket in a directory of the attempt's own; the program finds it, and
the ``tether`` module (``tether.py``, linked into the same directory, which goes on its
``PYTHONPATH``), through the variables :func:`metrics_env` adds. Every process of the program
(ranks, DataLoader workers) inherits them and connects once; a report is one JSON line on its
connection. A stream rather than datagrams: Linux queues 10 datagrams per socket by default, so
each report would wait on the worker, where a stream's buffer (hundreds of KiB) lets a program
report without waiting while the worker keeps up. One reporting faster than the worker reads (or
while the hold is full) waits in ``send``, as one printing faster than the relay takes its
output waits on its pipe. What the program sent before it ended is read to the last line.

A line ``{"checkpoint": step}`` is ``tether.save_checkpoint(step)`` asking (on a connection of its
own): the ``save`` callback stores it and the answer line goes back on that connection
(``worker_shim/program/checkpoints.py``; without one, it is answered with an error).

The same directory holds the stop file of a sweep's early stopping: :meth:`ProgramMetrics.stop`
creates it, ``tether.should_stop()`` sees it; and the preempt file (``preempt.py``).
"""

from __future__ import annotations

import logging
import os
import signal
import socket as stdlib_socket
import time
from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import asynccontextmanager, suppress
from enum import StrEnum
from functools import partial
from pathlib import Path

import trio

from protocol_specs.checkpoints.asking import answer_error, decode_save
from protocol_specs.runs.metrics import (
    MAX_REPORT_BYTES,
    LineMetrics,
    MetricHold,
    Point,
    decode_pause,
    decode_report,
)
from protocol_specs.wire import wire
from relay.client import RelayError, RunLink

from .preempt import PREEMPT_NAME, Preemption, order_of

__all__ = [
    "ProgramControl",
    "ProgramMetrics",
    "control_action",
    "metrics_env",
    "open_program_metrics",
    "user_module",
]

log = logging.getLogger("tether.worker")

#: stores the checkpoint of a step the program asked for, and answers it with a line
Save = Callable[[int, Callable[[bytes], None]], Awaitable[None]]

#: the socket's and the stop file's names in the attempt's metrics directory
SOCKET_NAME = "metrics.sock"
STOP_NAME = "stop"
#: how long a send under way may still take once the run ends (then its points are dropped)
SEND_GRACE = 5.0


def user_module() -> Path:
    """The ``tether`` module programs import (``tether.py`` beside this package)."""
    return Path(__file__).resolve().parents[2] / "tether.py"


def metrics_env(where: Path, env: dict[str, str], module: Path | None = None) -> dict[str, str]:
    """``env`` with what the program needs to report: the socket, the stop file, and the
    ``tether`` module's directory (``module``: where it is, the installed one by default) last on
    ``PYTHONPATH`` (the program's own modules come first)."""
    api = where / "api"
    api.mkdir(mode=0o755, exist_ok=True)
    link = api / "tether.py"
    if not link.exists():
        link.symlink_to(module or user_module())
    path = os.pathsep.join(filter(None, [env.get("PYTHONPATH"), str(api)]))
    return {
        **env,
        "PYTHONPATH": path,
        "TETHER_METRICS_SOCKET": str(where / SOCKET_NAME),
        "TETHER_STOP_FILE": str(where / STOP_NAME),
        "TETHER_PREEMPT_FILE": str(where / PREEMPT_NAME),
    }


async def _always(_step: int, _values: dict[str, float]) -> bool:
    return True


class ProgramControl(StrEnum):
    """What a ``control`` entry of the relay asks of the program itself."""

    STOP = "stop"  #: a sweep pruned its trial: ``tether.should_stop()`` says so
    #: its sweep holds its other trials while one is paused for debugging: SIGSTOP to its group
    SUSPEND = "suspend"
    RESUME = "resume"  #: ... and SIGCONT when it goes on

    @classmethod
    def of(cls, entry: wire.AnyEntry | None, attempt: int) -> ProgramControl | None:
        """What ``entry`` asks of this attempt's program (None: nothing; ``terminate`` and
        ``tunnel`` are the shim's to perform)."""
        if not isinstance(entry, wire.ControlEntry) or entry.attempt not in (0, attempt):
            return None
        try:
            return cls(entry.action)
        except ValueError:
            return None


def control_action(delivery: wire.Deliver, attempt: int) -> ProgramControl | None:
    """What the relay's ``control`` entry for this attempt that ``delivery`` carries asks of the
    program, if it is one. Looked at cheaply first: every DAP message of a session comes this
    way."""
    if b"\xa7control" not in delivery.entry[:16]:
        return None
    try:
        entry = wire.decode_entry(delivery.entry)
    except wire.WireError:
        return None
    return ProgramControl.of(entry, attempt)


class ProgramMetrics:
    """Reads reports from the socket and points from output lines into a :class:`MetricHold`,
    and publishes them on the run's link. Make one with :func:`open_program_metrics`."""

    def __init__(
        self,
        link: RunLink,
        sock: stdlib_socket.socket,
        where: Path,
        *,
        patterns: list[str],
        attempt: int,
        hold: MetricHold | None = None,
        may_pause: Callable[[int, dict[str, float]], Awaitable[bool]] = _always,
        save: Save | None = None,
    ) -> None:
        """``may_pause(step, values)``: whether the program may pause where a report met
        ``--debug-when`` (the relay decides for a sweep's trials: the first only); ``save(step,
        answer)``: store a checkpoint the program asked for, ``answer`` it with a line."""
        self.link = link
        self.sock = sock  #: listening, non-blocking: accepted when trio says it is readable
        self.where = where
        self.attempt = attempt
        self.lines = LineMetrics(patterns)
        self.hold = hold or MetricHold()
        self._wake = trio.Event()
        self._room = trio.Event()
        self._lock = trio.Lock()
        self._failed = False
        #: the shielded scope of a send under way (:meth:`ending` bounds it)
        self._sending: trio.CancelScope | None = None
        self.dropped = 0  #: malformed reports
        self.may_pause = may_pause
        self.save = save
        self._nursery: trio.Nursery | None = None
        #: a preempt of the attempt (``worker_shim/program/preempt.py``)
        self.preemption = Preemption(where)
        #: each reporting process's connection, and what it sent of a line not yet ended
        self._conns: dict[stdlib_socket.socket, bytearray] = {}
        #: the connections whose process asked whether to pause
        self._asked: set[stdlib_socket.socket] = set()

    def __repr__(self) -> str:
        return f"<ProgramMetrics {self.hold!r}{' failed' if self._failed else ''}>"

    @property
    def program(self) -> int:
        """The program's process (its group's id), once it started."""
        return self.preemption.program

    @program.setter
    def program(self, pid: int) -> None:
        self.preemption.program = pid

    def deliver(self, entry: wire.AnyEntry | wire.Deliver | None) -> None:
        """A ``to_worker`` entry (or its delivery) that may be a preempt of this attempt."""
        self.preemption.give(order_of(entry, self.attempt))

    def output(self, stream: str, data: bytes) -> None:
        """A chunk of the program's output (the pump's): points from the lines it completes
        (the patterns were checked at submit for the nesting that makes a match take
        forever: ``protocol_specs.runs.metrics.parse_pattern``)."""
        if self.lines:
            self._feed(self.lines.feed(stream, data, time.time()))

    def stop(self) -> None:
        """Ask the program to stop (``tether.should_stop()``): a sweep pruned its trial."""
        with suppress(OSError):
            (self.where / STOP_NAME).touch()

    def control(self, action: ProgramControl | None) -> None:
        """The relay's word about the program (None: none): ``stop`` (a sweep pruned it),
        ``suspend`` and ``resume`` (its sweep holds its other trials while one is paused for
        debugging: SIGSTOP and SIGCONT to the program's process group)."""
        if action is ProgramControl.STOP:
            self.stop()
        elif action is not None and self.program:
            sig = signal.SIGSTOP if action is ProgramControl.SUSPEND else signal.SIGCONT
            with suppress(ProcessLookupError, PermissionError):
                os.killpg(self.program, sig)

    def _feed(self, points: list[Point]) -> None:
        if points:
            self.hold.feed(points)
            self._wake.set()

    async def receive(self, nursery: trio.Nursery) -> None:
        """Take each process's connection and read its reports (a reader task each), until
        cancelled."""
        self._nursery = nursery
        while True:
            await trio.lowlevel.wait_readable(self.sock)
            for conn in self._accept():
                nursery.start_soon(self._read, conn)

    def _accept(self) -> list[stdlib_socket.socket]:
        taken: list[stdlib_socket.socket] = []
        while True:
            try:
                conn, _ = self.sock.accept()
            except OSError:  # BlockingIOError: nobody else waits
                return taken
            conn.setblocking(False)
            self._conns[conn] = bytearray()
            taken.append(conn)

    async def _read(self, conn: stdlib_socket.socket) -> None:
        """One process's reports, line by line; while the hold is full, nothing is read (the
        program's ``send`` waits once the socket's buffer is full)."""
        try:
            while conn in self._conns:
                while self.hold.full and not self._failed:
                    await self._room.wait()
                await trio.lowlevel.wait_readable(conn)
                if not self._read_now(conn):
                    return
        finally:
            self._close(conn)

    def _read_now(self, conn: stdlib_socket.socket) -> bool:
        """Read one chunk of what ``conn`` has now (the caller comes back for more: a program
        writing without a pause never holds the worker's loop); False once it ended."""
        tail = self._conns.get(conn)
        if tail is None:
            return False
        try:
            data = conn.recv(256 * 1024)
        except BlockingIOError:
            return True
        except OSError:
            data = b""
        if not data:
            self._lines(tail + b"\n", conn)
            return False
        tail += data
        end = tail.rfind(b"\n")
        if end >= 0:
            self._lines(tail[:end], conn)
            del tail[: end + 1]
        elif len(tail) > MAX_REPORT_BYTES:  # no line ends: not a report
            self.dropped += 1
            tail.clear()
        return True

    def _lines(self, data: bytes | bytearray, conn: stdlib_socket.socket) -> None:
        """Complete lines from one process: reports, or its question whether to pause. Whatever
        a line holds, it is at worst dropped and counted."""
        points = []
        for line in bytes(data).split(b"\n"):
            if line.startswith(b'{"pause"'):
                self._pause_asked(conn, line)
            elif line.startswith(b'{"checkpoint"'):
                self._save_asked(conn, line)
            elif line.strip():
                point = decode_report(line)
                if point is None:
                    self.dropped += 1
                else:
                    points.append(point)
        self._feed(points)

    def _pause_asked(self, conn: stdlib_socket.socket, line: bytes) -> None:
        """A report met ``--debug-when``: the program waits for ``pause`` or ``go on``. A
        process asks once (``tether.py``); any further question on its connection is answered
        ``go on`` at once, unasked of the relay."""
        asked = decode_pause(line)
        if asked is None or self._nursery is None or conn in self._asked:
            self._answer(conn, False)
            return
        self._asked.add(conn)
        self._nursery.start_soon(self._decide_pause, conn, *asked)

    def _save_asked(self, conn: stdlib_socket.socket, line: bytes) -> None:
        """``tether.save_checkpoint``: stored by :attr:`save`, answered on ``conn``."""
        step = decode_save(line)
        if step is None or self.save is None or self._nursery is None:
            why = "this worker does not store checkpoints" if self.save is None else "malformed"
            self._send(conn, answer_error(f"the checkpoint request was refused: {why}"))
            return
        self._nursery.start_soon(self.save, step, partial(self._send, conn))

    def _send(self, conn: stdlib_socket.socket, line: bytes) -> None:
        """An answer line (short: the socket's buffer takes it whole)."""
        with suppress(OSError):  # gone meanwhile
            conn.send(line)

    async def _decide_pause(
        self, conn: stdlib_socket.socket, step: int, values: dict[str, float]
    ) -> None:
        try:
            pause = await self.may_pause(step, values)
        except Exception as exc:  # the relay cannot say: the program goes on
            log.warning("cannot ask the relay whether to pause: %s", exc)
            pause = False
        self._answer(conn, pause)

    def _answer(self, conn: stdlib_socket.socket, pause: bool) -> None:
        try:
            conn.send(b"pause\n" if pause else b"go on\n")
        except OSError:  # gone meanwhile
            pass

    def _close(self, conn: stdlib_socket.socket) -> None:
        self._asked.discard(conn)
        if self._conns.pop(conn, None) is not None:
            conn.close()

    def drain(self, most: int = 64) -> None:
        """Take the reports still waiting in the connections (the program ended): up to
        ``most`` chunks from each (a child still writing cannot hold the end)."""
        self._accept()
        for conn in list(self._conns):
            for _ in range(most):
                if not self._read_now(conn):
                    self._close(conn)
                    break
                if not self._waiting(conn):
                    break

    @staticmethod
    def _waiting(conn: stdlib_socket.socket) -> bool:
        """Whether ``conn`` has bytes to read now."""
        try:
            return bool(conn.recv(1, stdlib_socket.MSG_PEEK))
        except BlockingIOError:
            return False
        except OSError:
            return True  # the next read says it ended

    async def publish(self) -> None:
        """Publish held points as the hold allows, until cancelled."""
        while True:
            await self._wake.wait()
            self._wake = trio.Event()
            await self.link.wait_answered(self.hold.in_flight)
            await trio.sleep_until(self.hold.due())
            await self._publish(lambda: self.hold.ready(self.link.answered, trio.current_time()))

    async def end(self) -> None:
        """Everything held and queued, published (before the program's exit status)."""
        self.drain()
        await self._publish(self.hold.take)

    async def _publish(self, take: Callable[[], list[list[Point]]]) -> None:
        async with self._lock:
            if self.link.failed is not None or self._failed:
                self._fail()
                return
            batches = take()
            self._room.set()
            self._room = trio.Event()
            # taken from the hold, the points are sent even if the run's end cancels us meanwhile
            # (they would be neither held nor published): the end gives a send SEND_GRACE more
            with trio.CancelScope(shield=True) as self._sending:
                try:
                    for points in batches:
                        if points:
                            entry = wire.MetricEntry(points=points, attempt=self.attempt)
                            sent = await self.link.publish(entry)
                            self.hold.published(sent, trio.current_time())
                except RelayError:
                    self._fail()
                finally:
                    self._sending = None

    def ending(self) -> None:
        """The run ends: a send under way has :data:`SEND_GRACE` seconds more, no longer."""
        if self._sending is not None:
            self._sending.deadline = trio.current_time() + SEND_GRACE

    def _fail(self) -> None:
        if not self._failed:
            self._failed = True
            log.warning("cannot forward the program's metrics any more: the relay link failed")
        self.hold.take()
        self._room.set()


@asynccontextmanager
async def open_program_metrics(
    link: RunLink,
    where: Path,
    *,
    patterns: list[str],
    attempt: int,
    hand_over: Callable[[Path], None] = lambda _path: None,
    may_pause: Callable[[int, dict[str, float]], Awaitable[bool]] | None = None,
    save: Save | None = None,
) -> AsyncIterator[ProgramMetrics]:
    """Listen in ``where`` (give the program :func:`metrics_env`) and publish until the block
    ends; then (shielded, bounded) what is left is published. ``hand_over``: makes the socket
    the program's user's (on a worker that gives programs uids of their own). ``may_pause``,
    ``save``: see :class:`ProgramMetrics` (default: always; no checkpoints)."""
    sock = stdlib_socket.socket(stdlib_socket.AF_UNIX, stdlib_socket.SOCK_STREAM)
    with sock:
        sock.setblocking(False)
        sock.bind(str(where / SOCKET_NAME))
        hand_over(where / SOCKET_NAME)
        sock.listen(128)
        metrics = ProgramMetrics(
            link, sock, where, patterns=patterns, attempt=attempt, may_pause=may_pause or _always,
            save=save,
        )  # fmt: skip
        async with trio.open_nursery() as nursery:
            nursery.start_soon(metrics.receive, nursery)
            nursery.start_soon(metrics.publish)
            nursery.start_soon(metrics.preemption.run)
            try:
                yield metrics
            finally:
                metrics.ending()
                nursery.cancel_scope.cancel()
                with trio.CancelScope(shield=True), trio.move_on_after(5):
                    await metrics.end()
                for conn in list(metrics._conns):
                    metrics._close(conn)
