"""The adapter's side of the stop-time prefetch, for one IDE session (:mod:`protocol_specs.session.prefetch`).

After a ``stopped`` from a worker that prefetches, the IDE's requests wait (in order) until the
worker's answers for that stop arrive, at most :data:`PREFETCH_WAIT`; then each is answered from
them when it can be (debugpy's own response), else forwarded as usual. Requests and events that
end the stop or change values invalidate the answers. Sans-I/O: the core asks and performs.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from protocol_specs.session.prefetch import RUNS_PROGRAM, StopCache

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
        #: a prefetch is on its way for the stop now (one for a stop already over is not kept)
        self.expecting = False

    def __repr__(self) -> str:
        return f"<StopAnswers {len(self.cache.answers)} answers, {len(self.held)} held>"

    def holds(self, msg: Message) -> bool:
        """Whether ``msg`` waits for the stop's prefetch. A request that runs the program does
        not: it ends the stop (what was held goes first, :meth:`release`)."""
        return self.deadline is not None and msg["command"] not in RUNS_PROGRAM

    def stopped(self) -> None:
        """A ``stopped`` came; its prefetch follows: hold the IDE's requests until then."""
        self.deadline = self.clock() + PREFETCH_WAIT
        self.expecting = True

    def event(self, name: str) -> None:
        """An event from the worker (the prefetch itself: :meth:`filled`)."""
        self.cache.on_event(name)

    def filled(self, body: Any) -> list[Message]:
        """The prefetch arrived: keep its answers (unless its stop is over); the held
        requests, to handle now."""
        if self.expecting:
            self.cache.fill(body)
        self.expecting = False
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
        if command in RUNS_PROGRAM:
            self.expecting = False  # the prefetch on its way is of a stop that is over
        self.cache.on_request(command)
        if command == "evaluate":
            self.cache.on_evaluate(msg.get("arguments"))
        return self.cache.answer(msg)
