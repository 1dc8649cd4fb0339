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
collections walk only what is newer.

The price is memory: a frozen object that becomes cyclic garbage (part of a connection that closed)
is not reclaimed while it is frozen. When the number falls below half of what it was at the
freeze, the relay thaws everything (``gc.unfreeze``) and runs one full collection then, when the
load has dropped, and starts counting again from there.

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
#: how often the relay looks
INTERVAL = 5.0


class HeapAction(Enum):
    FREEZE = "freeze"
    THAW = "thaw"


@dataclass
class HeapPolicy:
    """When to freeze and when to thaw, from the number of subscriptions alone."""

    frozen_at: int = 0  #: the count at the last freeze (0: nothing frozen)
    base: int = 0  #: the count growth is measured from

    def decide(self, count: int) -> HeapAction | None:
        if count >= max(self.base + MIN_GROWTH, self.base * 5 // 4):
            self.frozen_at = self.base = count
            return HeapAction.FREEZE
        if self.frozen_at and count < self.frozen_at // 2:
            self.frozen_at, self.base = 0, count
            return HeapAction.THAW
        return None


async def keep_heap(
    count: Callable[[], int], *, interval: float = INTERVAL, policy: HeapPolicy | None = None
) -> None:
    """Freeze and thaw the heap as :class:`HeapPolicy` says, looking at ``count()`` every
    ``interval`` seconds, until cancelled (what is frozen then stays frozen)."""
    policy = policy or HeapPolicy()
    while True:
        await trio.sleep(interval)
        action = policy.decide(count())
        if action is None:
            continue
        started = time.perf_counter()
        if action is HeapAction.FREEZE:
            gc.collect(1)  # what is garbage already is not frozen
            gc.freeze()
        else:
            gc.unfreeze()
            gc.collect()
        log.info(
            "heap: %s at %d subscriptions (%.0f ms; %d objects frozen)",
            action.value,
            policy.base,
            (time.perf_counter() - started) * 1000,
            gc.get_freeze_count(),
        )
