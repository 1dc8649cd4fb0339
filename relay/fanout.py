"""Waking the connections that deliver a stream, with one Redis subscription per relay process.

A run connection delivers one stream (an IDE link the run's ``to_ide``, a worker ``to_worker``, a
logs follower ``logs``) from the cursor its peer named. Blocking ``XREAD`` would need one Redis
connection per delivering connection; ten thousand idle debug sessions would be ten thousand Redis
clients. Instead each relay process holds one :class:`Fanout`:

- the first subscription to a stream in this process registers the process as a watcher of it in
  Redis; every append publishes a notice (stream, new id, previous id) to each watcher's channel
  from the script that stores it (``relay/store/scripts.py``), and the fanout's listener hands each notice
  to the stream's subscriptions here;
- an append made by *this* process is handed over at once, with its payload (:meth:`Fanout.appended`);
  Redis does not echo it back;
- a subscription whose last delivered id is the notice's previous id takes the payload as is: no
  read at all. Otherwise (it is behind, the notice has no payload, or it holds too much already)
  it is *stale* and re-reads from Redis after its cursor, which is always right;
- "notices may be lost" (a dropped pub/sub connection, see ``Store.listen``) makes every
  subscription stale.

So a live session costs one Lua call per message and no reads, an idle one costs nothing but a few
hundred bytes here, and correctness rests on Redis alone: whatever a subscription misses here, it
re-reads.
"""

from __future__ import annotations

import logging
import secrets
from collections import deque
from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import asynccontextmanager
from functools import partial

import trio

from .store import Entry, Notice, Store, StoreError, parse_id

__all__ = ["Fanout", "Subscription"]

log = logging.getLogger("tether.relay")

#: entries a subscription holds for a slow peer before it drops them and re-reads from Redis
MAX_HELD_ENTRIES = 256
#: payload bytes a subscription holds before it drops them and re-reads from Redis
MAX_HELD_BYTES = 1 << 20
#: how long the listener waits before subscribing again after the store failed
RESUBSCRIBE_SECONDS = 1.0


class Subscription:
    """One connection's view of one stream: what it delivered, and what it may take next."""

    def __init__(self, store: Store, stream: str, cursor: str) -> None:
        self.store = store
        self.stream = stream
        self.cursor = cursor  #: the last id handed to the connection
        self._tail = parse_id(cursor)  #: the last id handed over or held
        self._held: deque[Entry] = deque()
        self._held_bytes = 0
        self._stale = True  # a new subscription catches up from Redis first
        self._reading = False
        self._wake = trio.Event()
        self.reads = 0  #: reads from Redis so far (tests and benchmarks look)

    def __repr__(self) -> str:
        state = "stale" if self._stale else f"{len(self._held)} held"
        return f"<Subscription {self.stream} after {self.cursor} {state}>"

    def noticed(self, prev: str, entry_id: str, payload: bytes | None) -> None:
        """An entry was appended after ``prev``; take it if it follows on, else re-read."""
        if self._stale or self._reading:
            self._stale = True
        else:
            new = parse_id(entry_id)
            if new <= self._tail:
                return  # already have it (our own append, noticed again through Redis)
            fits = (
                len(self._held) < MAX_HELD_ENTRIES
                and self._held_bytes + len(payload or b"") <= MAX_HELD_BYTES
            )
            if payload is not None and fits and parse_id(prev) == self._tail:
                self._held.append((entry_id, payload))
                self._held_bytes += len(payload)
                self._tail = new
            else:
                self._stale = True
        self._wake.set()

    def lost(self) -> None:
        """Notices may have been missed: re-read from Redis."""
        self._stale = True
        self._wake.set()

    async def next_batch(self, count: int = 200) -> list[Entry]:
        """The next entries after :attr:`cursor` (at most ``count``), waiting until there are any.

        Raises :class:`StoreError` if Redis fails while catching up.
        """
        while True:
            if self._stale:
                self._stale = False
                self._held.clear()
                self._held_bytes = 0
                self._reading = True
                try:
                    batch = await self.store.read_after(self.stream, self.cursor, count=count)
                except BaseException:
                    self._stale = True
                    raise
                finally:
                    self._reading = False
                self.reads += 1
                if batch:
                    self.cursor = batch[-1][0]
                    self._tail = parse_id(self.cursor)
                    if len(batch) == count:
                        self._stale = True  # there may be more
                    return batch
                self._tail = parse_id(self.cursor)
                continue
            if self._held:
                batch = list(self._held)
                self._held.clear()
                self._held_bytes = 0
                self.cursor = batch[-1][0]
                return batch
            self._wake = trio.Event()
            await self._wake.wait()


class Fanout:
    """Every delivering connection of one relay process, by stream; see the module docstring."""

    def __init__(self, store: Store) -> None:
        self.store = store
        #: this process's listener id: Redis sends it notices of the streams it watches
        self.id = secrets.token_hex(8)
        self._subscriptions: dict[str, set[Subscription]] = {}
        #: streams whose watch is being registered or removed in Redis (set when done)
        self._changing: dict[str, trio.Event] = {}

    def __len__(self) -> int:
        return sum(len(subs) for subs in self._subscriptions.values())

    @asynccontextmanager
    async def subscribe(self, stream: str, cursor: str) -> AsyncIterator[Subscription]:
        """A subscription to ``stream`` after ``cursor``; the first one of this process makes
        Redis send notices of ``stream`` here (before it reads anything), the last one stops it."""
        subscription = Subscription(self.store, stream, cursor)
        while stream in self._changing:
            await self._changing[stream].wait()
        subs = self._subscriptions.setdefault(stream, set())
        subs.add(subscription)
        try:
            if len(subs) == 1:
                await self._change(stream, self.store.watch)
            yield subscription
        finally:
            subs.discard(subscription)
            if not subs and self._subscriptions.get(stream) is subs:
                del self._subscriptions[stream]
                with trio.CancelScope(shield=True), trio.move_on_after(5):
                    try:
                        await self._change(stream, self.store.unwatch)
                    except StoreError as exc:  # a stale watcher costs Redis one PUBLISH per append
                        log.warning("cannot stop watching %s: %s", stream, exc)

    async def _change(self, stream: str, change: Callable[[str, str], Awaitable[None]]) -> None:
        done = self._changing[stream] = trio.Event()
        try:
            await change(stream, self.id)
        finally:
            del self._changing[stream]
            done.set()

    def appended(self, stream: str, prev: str, entry_id: str, payload: bytes | None) -> None:
        """``entry_id`` (after ``prev``) is stored in ``stream``; ``payload`` if this process has it.

        Redis does not notify the appending process of its own appends: it must call this."""
        for subscription in self._subscriptions.get(stream, ()):
            subscription.noticed(prev, entry_id, payload)

    def lost(self, stream: str | None = None) -> None:
        """What was appended to ``stream`` (every stream: ``None``) may not have been noticed."""
        for name, subs in self._subscriptions.items():
            if stream is None or name == stream:
                for subscription in subs:
                    subscription.lost()

    def notice(self, notice: Notice | None) -> None:
        """What :meth:`Store.listen` hands over."""
        if notice is None:
            self.lost()
        else:
            self.appended(notice.stream, notice.prev, notice.entry_id, None)

    async def listen(
        self, *, task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED
    ) -> None:
        """Follow the store's notices until cancelled; subscribe again whenever that fails.

        Started once the first subscription holds (a failure before that raises)."""
        started = False
        while True:
            try:
                async with trio.open_nursery() as nursery:
                    await nursery.start(partial(self.store.listen, self.id, self.notice))
                    if started:
                        self.notice(None)  # what came while unsubscribed is unknown
                    else:
                        started = True
                        task_status.started()
            except StoreError as exc:
                if not started:
                    raise
                log.warning("append notices: %s; subscribing again", exc)
            await trio.sleep(RESUBSCRIBE_SECONDS)
