"""The program's metrics, from ``tether.report`` and from its output lines, to the run's
``metrics`` stream (the decisions: ``protocol_specs/metrics.py``).

The worker listens on a Unix socket in a directory of the attempt's own; the program finds it, and
the ``tether`` module (``tether.py``, linked into the same directory, which goes on its
``PYTHONPATH``), through the variables :func:`metrics_env` adds. Every process of the program
(ranks, DataLoader workers) inherits them and connects once; a report is one JSON line on its
connection. A stream rather than datagrams: Linux queues 10 datagrams per socket by default, so
each report would wait on the worker, where a stream's buffer (hundreds of KiB) lets a program
report without waiting while the worker keeps up. One reporting faster than the worker reads (or
while the hold is full) waits in ``send``, as one printing faster than the relay takes its
output waits on its pipe. What the program sent before it ended is read to the last line.

The same directory holds the stop file of a sweep's early stopping: :meth:`ProgramMetrics.stop`
creates it, ``tether.should_stop()`` sees it.
"""

from __future__ import annotations

import logging
import os
import socket as stdlib_socket
import time
from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager, suppress
from pathlib import Path

import trio

from protocol_specs import wire
from protocol_specs.metrics import (
    MAX_REPORT_BYTES,
    LineMetrics,
    MetricHold,
    Point,
    decode_report,
)
from relay.client import RelayError, RunLink

__all__ = ["ProgramMetrics", "asks_stop", "metrics_env", "open_program_metrics", "user_module"]

log = logging.getLogger("tether.worker")

#: the socket's and the stop file's names in the attempt's metrics directory
SOCKET_NAME = "metrics.sock"
STOP_NAME = "stop"


def user_module() -> Path:
    """The ``tether`` module programs import (``tether.py`` beside this package)."""
    return Path(__file__).resolve().parent.parent / "tether.py"


def metrics_env(where: Path, env: dict[str, str]) -> dict[str, str]:
    """``env`` with what the program needs to report: the socket, the stop file, and the
    ``tether`` module's directory last on ``PYTHONPATH`` (the program's own modules come first)."""
    api = where / "api"
    api.mkdir(exist_ok=True)
    link = api / "tether.py"
    if not link.exists():
        link.symlink_to(user_module())
    path = os.pathsep.join(filter(None, [env.get("PYTHONPATH"), str(api)]))
    return {
        **env,
        "PYTHONPATH": path,
        "TETHER_METRICS_SOCKET": str(where / SOCKET_NAME),
        "TETHER_STOP_FILE": str(where / STOP_NAME),
    }


def asks_stop(delivery: wire.Deliver, attempt: int) -> bool:
    """Whether a delivery is the relay's ``stop`` for this attempt (a sweep pruned the trial).
    Looked at cheaply first: every DAP message of a session comes this way."""
    if b"\xa7control" not in delivery.entry[:16]:
        return False
    try:
        entry = wire.decode_entry(delivery.entry)
    except wire.WireError:
        return False
    return (
        isinstance(entry, wire.ControlEntry)
        and entry.action == "stop"
        and entry.attempt in (0, attempt)
    )


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
    ) -> None:
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
        self.dropped = 0  #: malformed reports
        #: each reporting process's connection, and what it sent of a line not yet ended
        self._conns: dict[stdlib_socket.socket, bytearray] = {}

    def __repr__(self) -> str:
        return f"<ProgramMetrics {self.hold!r}{' failed' if self._failed else ''}>"

    def output(self, stream: str, data: bytes) -> None:
        """A chunk of the program's output (the pump's): points from the lines it completes."""
        if self.lines:
            self._feed(self.lines.feed(stream, data, time.time()))

    def stop(self) -> None:
        """Ask the program to stop (``tether.should_stop()``): a sweep pruned its trial."""
        with suppress(OSError):
            (self.where / STOP_NAME).touch()

    def _feed(self, points: list[Point]) -> None:
        if points:
            self.hold.feed(points)
            self._wake.set()

    async def receive(self, nursery: trio.Nursery) -> None:
        """Take each process's connection and read its reports (a reader task each), until
        cancelled."""
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
        """Read what ``conn`` has now; False once it ended."""
        tail = self._conns.get(conn)
        if tail is None:
            return False
        while True:
            try:
                data = conn.recv(256 * 1024)
            except BlockingIOError:
                return True
            except OSError:
                data = b""
            if not data:
                self._lines(tail + b"\n")
                return False
            tail += data
            end = tail.rfind(b"\n")
            if end >= 0:
                self._lines(tail[:end])
                del tail[: end + 1]
            elif len(tail) > MAX_REPORT_BYTES:  # no line ends: not a report
                self.dropped += 1
                tail.clear()

    def _lines(self, data: bytes | bytearray) -> None:
        points = []
        for line in bytes(data).split(b"\n"):
            if line.strip():
                point = decode_report(line)
                if point is None:
                    self.dropped += 1
                else:
                    points.append(point)
        self._feed(points)

    def _close(self, conn: stdlib_socket.socket) -> None:
        if self._conns.pop(conn, None) is not None:
            conn.close()

    def drain(self) -> None:
        """Take every report still waiting in a connection (the program ended)."""
        self._accept()
        for conn in list(self._conns):
            if not self._read_now(conn):
                self._close(conn)

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
            try:
                for points in batches:
                    if points:
                        entry = wire.MetricEntry(points=points, attempt=self.attempt)
                        self.hold.published(await self.link.publish(entry), trio.current_time())
            except RelayError:
                self._fail()

    def _fail(self) -> None:
        if not self._failed:
            self._failed = True
            log.warning("cannot forward the program's metrics any more: the relay link failed")
        self.hold.take()
        self._room.set()


@asynccontextmanager
async def open_program_metrics(
    link: RunLink, where: Path, *, patterns: list[str], attempt: int
) -> AsyncIterator[ProgramMetrics]:
    """Listen in ``where`` (give the program :func:`metrics_env`) and publish until the block
    ends; then (shielded, bounded) what is left is published."""
    sock = stdlib_socket.socket(stdlib_socket.AF_UNIX, stdlib_socket.SOCK_STREAM)
    with sock:
        sock.setblocking(False)
        sock.bind(str(where / SOCKET_NAME))
        sock.listen(128)
        metrics = ProgramMetrics(link, sock, where, patterns=patterns, attempt=attempt)
        async with trio.open_nursery() as nursery:
            nursery.start_soon(metrics.receive, nursery)
            nursery.start_soon(metrics.publish)
            try:
                yield metrics
            finally:
                nursery.cancel_scope.cancel()
                with trio.CancelScope(shield=True), trio.move_on_after(5):
                    await metrics.end()
                for conn in list(metrics._conns):
                    metrics._close(conn)
