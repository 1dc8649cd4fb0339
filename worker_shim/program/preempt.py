"""A preempted attempt on its worker: the program is warned, then ended after the grace.

Theory of operation
-------------------
The relay tells an attempt's workers it is preempted with a ``preempt`` control entry
(``protocol_specs/runs/preemption.py`` decides; ``data``: ``{"grace": float, "then": ...}``). Its
worker (plain and debug runs alike, every node's) hands it to the attempt's :class:`Preemption`,
which, once:

1. creates the preempt file (``TETHER_PREEMPT_FILE``, beside the stop file): the program's
   ``tether.should_preempt()`` turns true;
2. sends ``SIGUSR1`` to each of the program's processes (its process tree) that catches it
   (``SigCgt`` in ``/proc/PID/status``): a rank that does not trap it is not killed by it;
3. after ``grace`` seconds, ends the program as a ``terminate`` does, unless it exited first.

The program exits non-zero (or is ended), and the relay ends the attempt ``preempted``.

A worker preempts its *own* attempt when its scheduler warns it (``preempt_self``): it asks the
relay with its worker token, so the attempt is recorded preempted; if the relay cannot be reached
it acts locally all the same. :data:`ATTEMPTS` knows the attempts this worker process runs, so a
stopping pool preempts each (:meth:`Attempts.drain`) and stops claiming.
"""

from __future__ import annotations

import logging
import os
import signal
from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import asynccontextmanager, suppress
from dataclasses import dataclass
from pathlib import Path

import trio

from protocol_specs.runs.runs import RunRecord
from protocol_specs.wire import wire
from relay.client import RelayError, RunLink, open_control

__all__ = [
    "ATTEMPTS",
    "PREEMPT_NAME",
    "Attempts",
    "Order",
    "Preemption",
    "order_of",
    "preempt_self",
    "trapping",
]

log = logging.getLogger("tether.worker")

#: the preempt file's name in the attempt's private directory (beside the stop file)
PREEMPT_NAME = "preempt"
#: how long ``preempt_self`` tries the relay before it acts locally
ASK_RELAY_WITHIN = 10.0


@dataclass(frozen=True)
class Order:
    """A ``preempt`` entry's order: the grace, what follows (``retry``/``suspend``), why."""

    grace: float
    then: str = "retry"
    detail: str = ""


def order_of(entry: wire.AnyEntry | wire.Deliver | None, attempt: int) -> Order | None:
    """The preempt order ``entry`` (or a delivery of one) gives ``attempt``, if it is one."""
    if isinstance(entry, wire.Deliver):
        if b"preempt" not in entry.entry[:64]:  # cheap: every DAP message comes this way
            return None
        try:
            entry = wire.decode_entry(entry.entry)
        except wire.WireError:
            return None
    if not isinstance(entry, wire.ControlEntry) or entry.action != "preempt":
        return None
    if entry.attempt not in (0, attempt):
        return None
    grace = entry.data.get("grace")
    then = entry.data.get("then")
    return Order(
        grace=float(grace) if isinstance(grace, int | float) and grace >= 0 else 60.0,
        then=then if then in ("retry", "suspend") else "retry",
        detail=entry.detail,
    )


def trapping(root: int, sig: int = signal.SIGUSR1, proc: Path = Path("/proc")) -> list[int]:
    """The processes of ``root``'s tree (``root`` included) that catch ``sig``."""
    parents: dict[int, int] = {}
    with suppress(OSError):
        for name in os.listdir(proc):
            if not name.isdigit():
                continue
            try:
                stat = (proc / name / "stat").read_text()
            except OSError:
                continue
            fields = stat[stat.rfind(")") + 2 :].split()
            if len(fields) > 1 and fields[1].isdigit():
                parents[int(name)] = int(fields[1])
    tree = {root}
    grown = True
    while grown:
        grown = False
        for pid, parent in parents.items():
            if parent in tree and pid not in tree:
                tree.add(pid)
                grown = True
    return sorted(pid for pid in tree if _catches(proc / str(pid) / "status", sig))


def _catches(status: Path, sig: int) -> bool:
    try:
        text = status.read_text()
    except OSError:
        return False
    for line in text.splitlines():
        if line.startswith("SigCgt:"):
            return bool(int(line.split()[1], 16) >> (sig - 1) & 1)
    return False


class Preemption:
    """One attempt's program's preemption (see the module's docstring). The shim sets
    :attr:`program` and :attr:`terminate` once the program started; :meth:`run` (a task of the
    attempt) performs an order."""

    def __init__(self, where: Path) -> None:
        self.where = where
        #: the program's process (its group's id), once it started
        self.program = 0
        #: ends the program as a ``terminate`` does (the plain run's, the debug driver's)
        self.terminate: Callable[[], Awaitable[None]] | None = None
        self.order: Order | None = None
        self._ordered = trio.Event()

    def __repr__(self) -> str:
        return f"<Preemption {self.order or 'none'} program={self.program}>"

    @property
    def file(self) -> Path:
        return self.where / PREEMPT_NAME

    def give(self, order: Order | None) -> None:
        """Preempt the program (the first order only: a second one changes nothing here)."""
        if order is None or self.order is not None:
            return
        self.order = order
        self._ordered.set()

    async def run(self) -> None:
        """Wait for an order, then warn the program and end it after the grace (until
        cancelled: the attempt's end)."""
        await self._ordered.wait()
        order = self.order
        assert order is not None
        with suppress(OSError):
            self.file.touch()
        if self.program:
            for pid in await trio.to_thread.run_sync(trapping, self.program):
                with suppress(ProcessLookupError, PermissionError):
                    os.kill(pid, signal.SIGUSR1)
        await trio.sleep(order.grace)
        log.info("the preempted program did not exit within %g s: ending it", order.grace)
        if self.terminate is not None:
            await self.terminate()
        elif self.program:
            with suppress(ProcessLookupError, PermissionError):
                os.killpg(self.program, signal.SIGTERM)


@dataclass
class _Running:
    link: RunLink
    record: RunRecord
    #: None while the attempt starts (its files, its user): the order waits on its link
    preemption: Preemption | None
    node: int


class Attempts:
    """The attempts this worker process runs, for a pool that stops: :meth:`drain` preempts
    each (node 0's, through the relay) and :meth:`claim` stops handing out claims."""

    def __init__(self) -> None:
        self._running: dict[int, _Running] = {}
        #: the attempts this worker took, their programs started or not, by (run, attempt, node)
        self._taken: dict[tuple[str, int, int], _Running] = {}
        #: orders given here (the relay unreachable) to attempts whose program had not started
        self._pending: dict[tuple[str, int], Order] = {}
        self.stopping = False
        self._changed: trio.Event | None = None
        #: the claims waiting for a run now
        self._claims: set[trio.CancelScope] = set()

    def __len__(self) -> int:
        return len(self._taken)

    @asynccontextmanager
    async def taken(self, link: RunLink, record: RunRecord, node: int = 0) -> AsyncIterator[None]:
        """While the block runs, ``record``'s attempt is this worker's, from its link's start:
        a pool that stops preempts it even before its program started (its watch then reads the
        order on the link, and the attempt ends ``preempted``)."""
        key = (record.id, record.attempt, node)
        self._taken[key] = _Running(link, record, None, node)
        try:
            yield
        finally:
            del self._taken[key]
            if self._changed is not None:
                self._changed.set()

    @asynccontextmanager
    async def running(
        self, link: RunLink, record: RunRecord, preemption: Preemption, node: int = 0
    ) -> AsyncIterator[None]:
        """While the block runs, ``record``'s attempt runs here."""
        key = id(preemption)
        self._running[key] = _Running(link, record, preemption, node)
        order = self._pending.pop((record.id, record.attempt), None)
        if order is not None:
            preemption.give(order)
        try:
            yield
        finally:
            del self._running[key]
            if self._changed is not None:
                self._changed.set()

    def link_of(self, run: str, attempt: int) -> RunLink | None:
        """The link of ``run``'s attempt ``attempt`` if its node 0 runs here (``None``: not, or
        not yet: its program has not started)."""
        for each in self._running.values():
            if (each.record.id, each.record.attempt, each.node) == (run, attempt, 0):
                return each.link
        return None

    async def claim(self, claim: Callable[[], Awaitable[wire.Assigned]]) -> wire.Assigned:
        """``claim()``, unless the pool is stopping (then never: it waits to be cancelled). A
        claim waiting when the pool starts stopping is given up (were it answered meanwhile, its
        claim is never confirmed: the relay releases it)."""
        if not self.stopping:
            with trio.CancelScope() as scope:
                self._claims.add(scope)
                try:
                    return await claim()
                finally:
                    self._claims.discard(scope)
        await trio.sleep_forever()
        raise AssertionError("unreachable")

    def stop_claiming(self) -> None:
        """No claim from now on; those waiting are given up."""
        self.stopping = True
        for scope in self._claims:
            scope.cancel()

    async def drain(self, detail: str = "the worker pool is stopping") -> None:
        """Preempt every attempt running here (each with its run's ``preempt_grace``) and return
        once they all ended; no claim is made meanwhile."""
        self.stop_claiming()
        async with trio.open_nursery() as nursery:
            for each in list(self._taken.values()):
                if each.node == 0:
                    grace = each.record.spec.preempt_grace
                    nursery.start_soon(preempt_self, each.link, each.record, grace, detail)
        while self._taken or self._running:
            self._changed = trio.Event()
            await self._changed.wait()


#: the attempts this worker process runs
ATTEMPTS = Attempts()


async def preempt_self(link: RunLink, record: RunRecord, grace: float, detail: str) -> None:
    """Preempt this worker's own attempt (a scheduler warned it, or its pool stops): asked of the
    relay with the attempt's worker token, so the attempt is recorded ``preempted`` (the order
    comes back as every preempt's does); if the relay cannot be reached, acted on here."""
    try:
        with trio.fail_after(ASK_RELAY_WITHIN):
            async with open_control(link.endpoint, client="tether-worker") as control:
                await control.preempt(record.id, grace=grace, detail=detail)
        return
    except (RelayError, trio.TooSlowError, OSError) as exc:
        log.warning(
            "run %s: cannot ask the relay to preempt it (%s): preempting here", record.id, exc
        )
    order = Order(grace=grace, detail=detail)
    for each in ATTEMPTS._running.values():
        if each.record.id == record.id and each.record.attempt == record.attempt:
            assert each.preemption is not None
            each.preemption.give(order)
            return
    ATTEMPTS._pending[(record.id, record.attempt)] = order  # its program gets it as it starts
