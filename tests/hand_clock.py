"""The one hand clock of the sans-I/O cores' unit tests: a callable returning ``now``, which the
test moves (``clock.now += 5`` or :meth:`HandClock.advance`); nothing in it ticks by itself."""

from __future__ import annotations

__all__ = ["HandClock"]


class HandClock:
    def __init__(self, now: float = 100.0) -> None:
        self.now = now

    def __call__(self) -> float:
        return self.now

    def advance(self, seconds: float) -> float:
        self.now += seconds
        return self.now
