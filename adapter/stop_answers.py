"""The adapter's side of the stop-time prefetch, for one IDE session (:mod:`protocol_specs.prefetch`).

After a ``stopped`` from a worker that prefetches, the IDE's requests wait (in order) until the
worker's answers for that stop arrive, at most :data:`PREFETCH_WAIT`; then each is answered from
them when it can be (debugpy's own response), else forwarded as usual. Requests and events that
end the stop or change values invalidate the answers. Sans-I/O: the core asks and performs.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from protocol_specs.prefetch import StopCache

__all__ = ["PREFETCH_WAIT", "StopAnswers"]

#: how long the IDE's requests after a ``stopped`` wait for the worker's prefetch of that stop
#: (it follows the event by the worker's few requests to debugpy; this only bounds a lost one)
PREFETCH_WAIT = 2.0

Message = dict[str, Any]


class StopAnswers:
    def __init__(self, clock: Callable[[], float]) -> None:
        self.clock = clock
        self.cache = StopCache()
        #: the IDE's requests waiting for the prefetch, until :attr:`deadline`
        self.held: list[Message] = []
        self.deadline: float | None = None

    def __repr__(self) -> str:
        return f"<StopAnswers {len(self.cache.answers)} answers, {len(self.held)} held>"

    @property
    def holding(self) -> bool:
        return self.deadline is not None

    def stopped(self) -> None:
        """A ``stopped`` came; its prefetch follows: hold the IDE's requests until then."""
        self.deadline = self.clock() + PREFETCH_WAIT

    def event(self, name: str, body: Any) -> None:
        """An event from the worker (the prefetch itself: :meth:`filled`)."""
        self.cache.on_event(name)

    def filled(self, body: Any) -> list[Message]:
        """The prefetch arrived: keep its answers; the held requests, to handle now."""
        self.cache.fill(body)
        return self.release()

    def release(self) -> list[Message]:
        held, self.held, self.deadline = self.held, [], None
        return held

    def due(self) -> bool:
        return self.deadline is not None and self.deadline <= self.clock()

    def drop(self) -> None:
        """The IDE went away: its held requests go with it (the answers stay: same stop)."""
        self.held, self.deadline = [], None

    def ended(self) -> list[Message]:
        """The debugger is no longer live: nothing is answered from the stop any more."""
        self.cache.answers.clear()
        return self.release()

    def request(self, msg: Message) -> Message | None:
        """A request of the IDE: invalidate what it may change; debugpy's answer from the
        prefetch (``seq`` still the core's to set), or ``None``."""
        command = msg["command"]
        self.cache.on_request(command)
        if command == "evaluate":
            self.cache.on_evaluate(msg.get("arguments"))
        return self.cache.answer(msg)
