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
  read at all. A notice from another process carries the entry when it is small (a DAP message,
  an output chunk: ``NOTICE_PAYLOAD_BYTES``), so a run whose IDE and worker are on two relay
  processes is delivered without reads too. Otherwise (it is behind, the notice has no payload,
  or it holds too much already) it is *stale* and re-reads from Redis after its cursor, which is
  always right;
- "notices may be lost" (a dropped pub/sub connection, see ``Store.listen``) makes every
  subscription stale.

So a live session costs one Lua call per message and no reads, an idle one costs nothing but a few
hundred bytes here, and correctness rests on Redis alone: whatever a subscription misses here, it
re-reads.

Early entries: Redis off the way of live traffic
------------------------------------------------
A live DAP message need not wait for Redis: a connection whose peer asked for ``early`` entries
takes a published entry the moment its publisher's connection on this process received it
(:meth:`Fanout.forward`), before the append is done, and sends it without a cursor. When the append
returns, :meth:`Fanout.appended` turns it into a *commit* (the id alone: the peer has the entry).
A subscription that is stale or re-reading takes nothing early: what it re-reads names each
entry's publish (:meth:`Store.read_numbered`), so an entry it had sent early goes out as a commit,
and the peer itself drops one it took early (``protocol_specs/link/link.py``). The order a peer sees is
its publishers' order: the links forward a publish early only when nothing they received before it
still waits to be stored and delivered the ordinary way (``protocol_specs/link/relay.py``).
"""

from __future__ import annotations

import logging
import secrets
from collections import deque
from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import asynccontextmanager
from functools import partial
from typing import NamedTuple

import trio

from ..store import Notice, Store, StoreError, parse_id

__all__ = ["Fanout", "Item", "Subscription"]

log = logging.getLogger("tether.relay")

#: entries a subscription holds for a slow peer before it drops them and re-reads from Redis
MAX_HELD_ENTRIES = 256
#: payload bytes a subscription holds before it drops them and re-reads from Redis
MAX_HELD_BYTES = 1 << 20
#: how long the listener waits before subscribing again after the store failed
RESUBSCRIBE_SECONDS = 1.0


#: what an idle subscription holds for its early entries: nothing (no set each)
_NONE: set[tuple[str, int]] = set()


class Item(NamedTuple):
    """What a subscription hands its connection: an entry, an early entry or a commit."""

    cursor: str  #: the entry's id; ``""``: early (not stored yet)
    payload: bytes | None  #: ``None``: a commit (the entry went out early)
    producer: str = ""  #: the publish that wrote it, if known (``""``, 0: not a publish)
    n: int = 0

    @property
    def commit(self) -> bool:
        return self.payload is None


class Subscription:
    """One connection's view of one stream: what it delivered, and what it may take next."""

    __slots__ = (
        "_early",
        "_held",
        "_held_bytes",
        "_reading",
        "_settled",
        "_stale",
        "_tail",
        "_waiting",
        "_wake",
        "cursor",
        "early",
        "reads",
        "store",
        "stream",
    )

    def __init__(self, store: Store, stream: str, cursor: str, *, early: bool = False) -> None:
        self.store = store
        self.stream = stream
        self.cursor = cursor  #: the last id handed to the connection
        self.early = early  #: the connection takes entries before they are stored
        self._tail = parse_id(cursor)  #: the last id handed over or held
        self._held: deque[Item] = deque()
        self._held_bytes = 0
        #: early entries held or handed over whose stored copy has not come: (producer, n)
        self._early: set[tuple[str, int]] = _NONE  # a set of its own once there is one
        self._stale = True  # a new subscription catches up from Redis first
        self._reading = False
        self._wake = trio.Event()
        #: the connection waits for items, everything it was given sent
        self._waiting = False
        self._settled: trio.Event | None = None  #: set when it waits again (for :meth:`sent`)
        self.reads = 0  #: reads from Redis so far (tests and benchmarks look)

    def __repr__(self) -> str:
        state = "stale" if self._stale else f"{len(self._held)} held"
        return f"<Subscription {self.stream} after {self.cursor} {state}>"

    def _fits(self, size: int) -> bool:
        return len(self._held) < MAX_HELD_ENTRIES and self._held_bytes + size <= MAX_HELD_BYTES

    def _stored(self, producer: str, n: int, entry_id: str, payload: bytes | None) -> Item:
        """What to hand over for a stored entry: its commit if it went out early, else itself."""
        if n and self._early:
            went_early = (producer, n) in self._early
            # a producer's entries are stored in order: its earlier early ones never will be now
            self._early = {(p, k) for p, k in self._early if p != producer or k > n}
            if went_early:
                return Item(entry_id, None, producer, n)
        return Item(entry_id, payload, producer, n)

    def forwarded(self, producer: str, n: int, payload: bytes) -> bool:
        """A live publish, not stored yet: take it early if this connection may and can.
        True if taken while the connection was idle: it goes out next (:meth:`sent`)."""
        if not self.early or self._stale or self._reading or not self._fits(len(payload)):
            return False  # it comes once stored (held, or re-read)
        if (producer, n) in self._early:
            return False  # a re-sent publish this connection has already
        self._held.append(Item("", payload, producer, n))
        self._held_bytes += len(payload)
        if self._early is _NONE:
            self._early = set()
        self._early.add((producer, n))
        self._wake.set()
        if not self._waiting:
            return False  # busy: it goes out after what the connection is sending now
        self._waiting = False  # it wakes up for this one
        return True

    async def sent(self, limit: float) -> None:
        """Wait until the connection sent what it was given and waits again (at most ``limit``
        seconds): what appends a forwarded publish waits for this, so that the append's own
        work does not delay the early copy."""
        if self._waiting:
            return
        if self._settled is None:
            self._settled = trio.Event()
        with trio.move_on_after(limit):
            await self._settled.wait()

    def noticed(
        self, prev: str, entry_id: str, payload: bytes | None, producer: str = "", n: int = 0
    ) -> None:
        """An entry was appended after ``prev``; take it if it follows on, else re-read."""
        if self._stale or self._reading:
            self._stale = True
        else:
            new = parse_id(entry_id)
            if new <= self._tail:
                return  # already have it (our own append, noticed again through Redis)
            went_early = n > 0 and (producer, n) in self._early
            size = 0 if went_early else len(payload or b"")
            have = went_early or payload is not None  # its commit, or the entry itself
            if parse_id(prev) == self._tail and have and self._fits(size):
                item = self._stored(producer, n, entry_id, payload)
                self._held.append(item)
                self._held_bytes += size
                self._tail = new
            else:
                self._stale = True
        self._wake.set()

    def lost(self) -> None:
        """Notices may have been missed: re-read from Redis."""
        self._stale = True
        self._wake.set()

    async def next_batch(self, count: int = 200) -> list[Item]:
        """The next items after :attr:`cursor` (at most ``count`` entries read from Redis),
        waiting until there are any.

        Raises :class:`StoreError` if Redis fails while catching up.
        """
        while True:
            if self._stale:
                self._stale = False
                for item in self._held:
                    if not item.cursor:  # never went out: it comes stored instead
                        self._early.discard((item.producer, item.n))
                self._held.clear()
                self._held_bytes = 0
                self._reading = True
                try:
                    read = await self.store.read_numbered(self.stream, self.cursor, count=count)
                except BaseException:
                    self._stale = True
                    raise
                finally:
                    self._reading = False
                self.reads += 1
                if read:
                    self.cursor = read[-1].id
                    self._tail = parse_id(self.cursor)
                    if len(read) == count:
                        self._stale = True  # there may be more
                    return [self._stored(e.producer, e.n, e.id, e.payload) for e in read]
                self._tail = parse_id(self.cursor)
                continue
            if self._held:
                batch = list(self._held)
                self._held.clear()
                self._held_bytes = 0
                for item in reversed(batch):
                    if item.cursor:
                        self.cursor = item.cursor
                        break
                return batch
            self._wake = trio.Event()
            self._waiting = True
            if self._settled is not None:
                self._settled.set()
                self._settled = None
            try:
                await self._wake.wait()
            finally:
                self._waiting = False


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
    async def subscribe(
        self, stream: str, cursor: str, *, early: bool = False
    ) -> AsyncIterator[Subscription]:
        """A subscription to ``stream`` after ``cursor`` (``early``: it takes live entries before
        they are stored); the first one of this process makes Redis send notices of ``stream``
        here (before it reads anything), the last one stops it."""
        subscription = Subscription(self.store, stream, cursor, early=early)
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

    def forward(self, stream: str, producer: str, n: int, payload: bytes) -> list[Subscription]:
        """``producer``'s publish ``n`` for ``stream`` arrived and is being stored: hand it to the
        connections that take entries early. :meth:`appended` must follow (or :meth:`lost`).
        Returns the subscriptions that send it next (see :meth:`Subscription.sent`)."""
        return [
            subscription
            for subscription in self._subscriptions.get(stream, ())
            if subscription.forwarded(producer, n, payload)
        ]

    def appended(
        self,
        stream: str,
        prev: str,
        entry_id: str,
        payload: bytes | None,
        producer: str = "",
        n: int = 0,
    ) -> None:
        """``entry_id`` (after ``prev``) is stored in ``stream``; ``payload`` if this process has it,
        and the publish that wrote it.

        Redis does not notify the appending process of its own appends: it must call this."""
        for subscription in self._subscriptions.get(stream, ()):
            subscription.noticed(prev, entry_id, payload, producer, n)

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
            self.appended(
                notice.stream,
                notice.prev,
                notice.entry_id,
                notice.payload,
                notice.producer,
                notice.n,
            )

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
