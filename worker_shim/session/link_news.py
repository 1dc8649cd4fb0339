"""What a worker's run link reports, for the attempt's program: its drops and returns (a run
ended while the link was away ends the program once it is back), and the entries the relay
refused (said in a ``buffer_full`` status, never dropped silently)."""

from __future__ import annotations

from collections.abc import Callable

import trio

from protocol_specs.session.session import StatusEvent
from protocol_specs.wire import wire
from relay.client import RunLink

from .actions import status_entry

__all__ = ["LinkNews", "report_refusals"]


class LinkNews:
    """What the run link reports: drops and returns, and entries the relay refused."""

    def __init__(self, say: Callable[[str], None], run_id: str) -> None:
        self.say = say
        self.run_id = run_id
        #: set when the link comes back, then replaced (:func:`worker_shim.shim._end_when_ended` looks whether
        #: the run ended meanwhile)
        self.returned = trio.Event()
        self.ended = False  #: the run was ended while we were away (said once)
        self.dropped = 0
        self.last_refusal = ""
        self.refusal = trio.Event()
        #: deliveries node K's wait for the rendezvous took off the link, for the program's watch
        self.taken: list[wire.Deliver] = []

    def state(self, up: bool, detail: str) -> None:
        self.say(f"run {self.run_id}: relay link {'up' if up else 'down'}: {detail}")
        if up:
            self.returned.set()
            self.returned = trio.Event()

    def refused(self, n: int, error: wire.Error) -> None:
        del n
        self.dropped += 1
        self.last_refusal = error.message
        self.refusal.set()


async def report_refusals(link: RunLink, news: LinkNews) -> None:
    """Entries the relay refuses (the IDE side's buffer is full) are dropped, but never silently."""
    while True:
        await news.refusal.wait()
        news.refusal = trio.Event()
        detail = (
            f"{news.dropped} messages from the program were dropped so far: {news.last_refusal}. "
            "Attach an IDE (or run tether attach) to read the backlog."
        )
        await link.publish(
            status_entry(StatusEvent.BUFFER_FULL, detail=detail, data={"dropped": news.dropped})
        )
        await trio.sleep(30)  # at most one notice per 30 s
