"""Garbage collection for a relay that holds many idle connections.

Theory of operation
-------------------
CPython's full collection walks every object the collector tracks. A relay serving ten thousand
idle debug sessions holds millions of them, nearly all as long-lived as their connections, and a
full collection then takes long enough to land on whatever live message is in flight: a latency
tail for the one session that is being debugged. So the relay watches how many subscriptions it
serves (one per delivering connection) and, once that number has grown by a quarter (and by
:data:`MIN_GROWTH` at least) since it last looked, collects the young generations and freezes what
exists (``gc.freeze``: moved to a permanent generation that no collection walks). Later
collections walk only what is newer. Once the number holds steady (within 2 % between two looks)
after any growth of :data:`STEADY_GROWTH` or more, it freezes too: ten thousand sessions that
connected in a burst end up frozen whole, not with their last fifth left for full collections to
walk.

An idle connection is not still: each keepalive ping its client sends wakes its receiving task,
which then waits again in new coroutine objects; they live until the next ping, old enough to be
promoted to the oldest generation. With 10,000 sessions that is some 250,000 objects always
awaiting, and each full collection walked them: 300-500 ms, four times in 40 s (measured). So while
the number holds steady the relay freezes again at every look (:attr:`HeapAction.REFREEZE`, after
a collection of the youngest generation: a few milliseconds), and full collections find little
to walk.

The price is memory: an object frozen that becomes cyclic garbage (part of a connection that
closed) is not reclaimed while it is frozen. So the relay counts the connections that ended: once
as many ended since the last full collection as half of those it froze at (a population that
turned over, though its number never fell), it thaws, collects everything and freezes again
(:attr:`HeapAction.RENEW`: one long pause, once per turnover). When the number falls below half
of what it was at the freeze, it thaws (``gc.unfreeze``) and runs one full collection then, when
the load has dropped, and starts counting again from there.

:class:`HeapPolicy` decides (no I/O, unit-tested); :func:`keep_heap` looks every few seconds and
acts.
"""

from __future__ import annotations

import gc
import logging
import time
from collections.abc import Callable
from dataclasses import dataclass
from enum import Enum

import trio

__all__ = ["HeapAction", "HeapPolicy", "keep_heap"]

log = logging.getLogger("tether.relay")

#: the least growth (in subscriptions) worth a freeze
MIN_GROWTH = 256
#: the least growth worth a freeze once the count holds steady
STEADY_GROWTH = 32
#: how often the relay looks
INTERVAL = 5.0


class HeapAction(Enum):
    FREEZE = "freeze"  #: grown: collect the young generations, freeze everything
    REFREEZE = "refreeze"  #: steady: collect the youngest generation, freeze what survived
    RENEW = "renew"  #: turned over: thaw, collect everything, freeze again
    THAW = "thaw"  #: fallen by half: thaw and collect everything


@dataclass
class HeapPolicy:
    """When to freeze and when to thaw, from the number of subscriptions and of the connections
    that ended."""

    frozen_at: int = 0  #: the count at the last freeze (0: nothing frozen)
    base: int = 0  #: the count growth is measured from
    last: int = -1  #: the count at the last look
    ended_at: int = 0  #: the connections ended at the last full collection

    def decide(self, count: int, ended: int = 0) -> HeapAction | None:
        steady = abs(count - self.last) <= self.last // 50
        self.last = count
        grown = count >= max(self.base + MIN_GROWTH, self.base * 5 // 4)
        if grown or (steady and count >= self.base + STEADY_GROWTH):
            self.frozen_at = self.base = count
            return HeapAction.FREEZE
        if not self.frozen_at:
            return None
        if count < self.frozen_at // 2:
            self.frozen_at, self.base, self.ended_at = 0, count, ended
            return HeapAction.THAW
        if ended - self.ended_at >= max(self.frozen_at // 2, MIN_GROWTH):
            self.frozen_at, self.base, self.ended_at = count, count, ended
            return HeapAction.RENEW
        return HeapAction.REFREEZE if steady else None


async def keep_heap(
    count: Callable[[], int],
    ended: Callable[[], int] = lambda: 0,
    *,
    interval: float = INTERVAL,
    policy: HeapPolicy | None = None,
) -> None:
    """Freeze and thaw the heap as :class:`HeapPolicy` says, looking at ``count()`` (subscriptions)
    and ``ended()`` (connections ended so far) every ``interval`` seconds, until cancelled (what is
    frozen then stays frozen)."""
    policy = policy or HeapPolicy()
    while True:
        await trio.sleep(interval)
        action = policy.decide(count(), ended())
        if action is None:
            continue
        started = time.perf_counter()
        if action is HeapAction.FREEZE:
            gc.collect(1)  # what is garbage already is not frozen
        elif action is HeapAction.REFREEZE:
            gc.collect(0)
        else:
            gc.unfreeze()
            gc.collect()
        if action is not HeapAction.THAW:
            gc.freeze()
        (log.debug if action is HeapAction.REFREEZE else log.info)(
            "heap: %s at %d subscriptions (%.0f ms; %d objects frozen)",
            action.value,
            policy.base,
            (time.perf_counter() - started) * 1000,
            gc.get_freeze_count(),
        )
