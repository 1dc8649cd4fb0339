"""Claims: worker pools and scheduler backends waiting for a backend's queue, on one relay process.

Theory of operation
-------------------
A worker pool's slot sends ``claim`` and waits, perhaps for hours, for a run to be queued; a
scheduler backend sends ``dispatch`` and waits the same way. Each waiting request is a *waiter*
here, in the order they came. One task per backend (reading only while someone waits) takes the
next entry of the backend's queue from the consumer group, as this relay process's consumer, and
hands it to the first waiter still in line. The waiter's request then claims the run (the state
machine's ``claim``, provisional until the worker confirms it: ``protocol_specs/runs/claims.py``; a run
that was cancelled meanwhile is skipped) and answers.

A waiter leaves the line when its request is cancelled, which the relay does the moment the
request's connection closes: a worker killed while idle, or cut off from the relay, never takes a
run. An entry that was read but not handed over (its waiter left in between) goes to the next
waiter, or back to the end of the queue (appended anew, the old entry acknowledged). Entries are
acknowledged as soon as their run is claimed or dispatched, so a pending entry is one in hand; one
pending for longer than :data:`ORPHAN_AFTER` was left by a relay process that died holding it, and
:meth:`Claims.recover` (every relay runs it) puts it back the same way.
"""

from __future__ import annotations

import logging
from collections import deque
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from typing import TypeVar

import trio

from protocol_specs.runs.runs import RunRecord, RunState

from ..store import StoreError, keys
from .claiming import Claimed
from .registry import Registry

__all__ = ["ORPHAN_AFTER", "Claims"]

log = logging.getLogger("tether.relay")

#: a queue entry read but neither claimed nor put back for this long was left by a dead relay
ORPHAN_AFTER = 30.0
#: how long one blocking read of a queue waits before looking at its line again
READ_BLOCK_MS = 1000

#: a queue entry: its id and the run it queues
QueueEntry = tuple[str, str]

_T = TypeVar("_T")


@dataclass(eq=False)
class _Waiter:
    entry: QueueEntry | None = None
    handed: trio.Event = field(default_factory=trio.Event)


@dataclass
class _Line:
    """The waiters of one backend, and whether a reader serves them."""

    waiters: deque[_Waiter] = field(default_factory=deque)
    someone: trio.Event = field(default_factory=trio.Event)
    reading: bool = False


class Claims:
    """Waiting claims and dispatches of this relay process (see the module's docstring)."""

    def __init__(self, registry: Registry, consumer: str) -> None:
        self.registry = registry
        self.consumer = consumer
        self._lines: dict[str, _Line] = {}
        self._nursery: trio.Nursery | None = None
        self._changed = trio.Event()

    def __repr__(self) -> str:
        waiting = {backend: len(line.waiters) for backend, line in self._lines.items()}
        return f"<Claims {self.consumer} waiting={waiting}>"

    def waiting(self, backend: str) -> int:
        """How many requests wait in ``backend``'s line on this process."""
        line = self._lines.get(backend)
        return len(line.waiters) if line else 0

    async def wait_until(self, backend: str, waiting: int) -> None:
        """Until exactly ``waiting`` requests wait for ``backend`` (for tests and benchmarks)."""
        while self.waiting(backend) != waiting:
            await self._changed.wait()

    def _notify(self) -> None:
        self._changed.set()
        self._changed = trio.Event()

    async def serve(self, *, task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED) -> None:
        """Run the queue readers (started as waiters come) and the orphan recovery until
        cancelled."""
        async with trio.open_nursery() as nursery:
            self._nursery = nursery
            task_status.started()
            while True:
                await trio.sleep(ORPHAN_AFTER / 2)
                try:
                    await self.recover()
                except StoreError as exc:
                    log.warning("cannot look for orphaned queue entries: %s", exc)

    # --- what a request waits for -----------------------------------------------------------------

    async def claim(self, backend: str, worker: str, alive: Callable[[], bool]) -> Claimed | None:
        """Wait for a queued run of ``backend`` and mark it claimed by ``worker``, with a worker
        token for the attempt; ``None`` if the requester is gone (``alive()`` false when the run
        came: it goes to the next in line)."""
        return await self._next(
            backend, alive, lambda run_id: self.registry.claimed(run_id, worker)
        )

    async def dispatch(self, backend: str, alive: Callable[[], bool]) -> RunRecord | None:
        """Wait for a queued run of ``backend`` for a scheduler backend (the run stays queued until
        the worker its job starts claims it); ``None`` if the requester is gone."""

        async def queued(run_id: str) -> RunRecord | None:
            record = await self.registry.load(run_id)
            return record if record is not None and record.state is RunState.QUEUED else None

        return await self._next(backend, alive, queued)

    async def _next(
        self,
        backend: str,
        alive: Callable[[], bool],
        take: Callable[[str], Awaitable[_T | None]],
    ) -> _T | None:
        """The next entry's run, if ``take`` takes it (a cancelled run is skipped)."""
        while True:
            entry = await self.take(backend)
            # shielded: a claim half made when the requester's connection closes is finished,
            # and the caller releases it when its answer cannot be delivered
            with trio.CancelScope(shield=True):
                if not alive():
                    await self.put_back(backend, entry)
                    return None
                entry_id, run_id = entry
                record = await take(run_id)
                await self.registry.ack(backend, entry_id)
                if record is not None:
                    return record

    async def take(self, backend: str) -> QueueEntry:
        """The next entry of ``backend``'s queue, in this process's line. Cancelled, the waiter
        leaves the line; an entry handed to it meanwhile is passed on (to the next waiter, or back
        to the queue)."""
        line = self._line(backend)
        waiter = _Waiter()
        line.waiters.append(waiter)
        line.someone.set()
        self._notify()
        try:
            await waiter.handed.wait()
        except BaseException:
            if waiter in line.waiters:
                line.waiters.remove(waiter)
                self._notify()
            if waiter.entry is not None:
                with trio.CancelScope(shield=True), trio.move_on_after(10):
                    await self.put_back(backend, waiter.entry)
            raise
        assert waiter.entry is not None
        return waiter.entry

    async def put_back(self, backend: str, entry: QueueEntry) -> None:
        """An entry taken but not used: to the next waiter in line, else back to the queue."""
        if self._hand(backend, entry):
            return
        entry_id, run_id = entry
        await self.registry.requeue(backend, entry_id, run_id)

    # --- readers ----------------------------------------------------------------------------------

    def _line(self, backend: str) -> _Line:
        line = self._lines.get(backend)
        if line is None:
            line = self._lines[backend] = _Line()
        if not line.reading and self._nursery is not None:
            line.reading = True
            self._nursery.start_soon(self._read, backend, line)
        return line

    def _hand(self, backend: str, entry: QueueEntry) -> bool:
        line = self._lines.get(backend)
        if line is None or not line.waiters:
            return False
        waiter = line.waiters.popleft()
        waiter.entry = entry
        waiter.handed.set()
        self._notify()
        return True

    async def _read(self, backend: str, line: _Line) -> None:
        """Read ``backend``'s queue while someone waits in its line; hand each entry over."""
        try:
            await self.registry.ensure_group(backend)
            async with self.registry.store.blocking_reader() as reader:
                while True:
                    if not line.waiters:
                        line.someone = trio.Event()
                        await line.someone.wait()
                    got = await reader.read_group(
                        keys.queue(backend),
                        keys.POOL_GROUP,
                        self.consumer,
                        block_ms=READ_BLOCK_MS,
                    )
                    if got is None:
                        continue
                    entry = (got[0], got[1].decode(errors="replace"))
                    if not self._hand(backend, entry):
                        with trio.CancelScope(shield=True):
                            await self.registry.requeue(backend, *entry)
        except StoreError as exc:
            log.warning("reading the %s queue: %s; retrying", backend, exc)
            await trio.sleep(1)
        finally:
            line.reading = False
        self._line(backend)  # a new reader, if the nursery still runs

    async def recover(self) -> int:
        """Put back the entries of every known queue that a dead relay process read and never
        claimed, dispatched or put back; acknowledge those whose run is no longer queued.
        Returns how many were queued again."""
        queued = 0
        for backend in sorted(self.registry.backends):
            orphans = await self.registry.store.reclaim(
                keys.queue(backend), keys.POOL_GROUP, self.consumer, min_idle=ORPHAN_AFTER
            )
            for entry_id, payload in orphans:
                run_id = payload.decode(errors="replace")
                record = await self.registry.load(run_id) if run_id else None
                if record is not None and record.state is RunState.QUEUED:
                    log.info("run %s: queued again (its queue entry was orphaned)", run_id)
                    await self.put_back(backend, (entry_id, run_id))
                    queued += 1
                else:
                    await self.registry.ack(backend, entry_id)
        return queued
