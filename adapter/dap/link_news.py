"""What the run's relay link tells the adapter from inside its own tasks: a publish refused, the
link down or back up.

The link (:func:`relay.client.open_run_link`) calls its ``on_refused`` and ``on_state``
callbacks where nothing may wait. :class:`LinkNews` is made before the link and the server: the
link is handed its two methods as those callbacks, the server the object itself, so neither needs
the other. It keeps what each publish carried until the relay stores or refuses it, and queues the
news for the server (:attr:`LinkNews.received`), which handles it in order with everything else,
under its lock.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass

import trio

from protocol_specs.wire import wire

__all__ = ["LinkNews", "Refused"]


@dataclass(frozen=True)
class Refused:
    """The relay refused a publish: all :meth:`AdapterCore.publish_refused` needs (no body)."""

    process: str
    origin_seq: int | None
    message: str


class LinkNews:
    """The link's news, queued for the server's loop."""

    def __init__(self, on_event: Callable[[str], None] | None = None) -> None:
        self._on_event = on_event or (lambda _text: None)
        #: publish number -> the process and ``origin_seq`` it carried (None: presence), until
        #: the relay answers it
        self._published: dict[int, tuple[str, int | None]] = {}
        # unbounded, but bounded in effect: one refusal per publish in the link's outbox (itself
        # bounded), one piece of news per reconnect; the callbacks that send cannot wait
        self._in, self.received = trio.open_memory_channel[Refused | tuple[bool, str]](math.inf)

    def published(self, n: int, process: str, origin_seq: int | None, answered: int) -> None:
        """Publish ``n`` carried ``origin_seq`` of ``process``; the link has counted every publish
        up to ``answered`` answered (stored: nothing to fail, forgotten)."""
        self._published[n] = (process, origin_seq)
        while self._published and next(iter(self._published)) <= answered:
            del self._published[next(iter(self._published))]

    def refused(self, n: int, error: wire.Error) -> None:
        """``RunLink.on_refused``. The link calls it in the same step as it counts ``n`` answered,
        so ``n`` is still kept here (:meth:`published` forgets what the link counts answered)."""
        if n in self._published:
            process, origin_seq = self._published.pop(n)
            self._in.send_nowait(Refused(process, origin_seq, error.message))

    def state(self, up: bool, detail: str) -> None:
        """``RunLink.on_state``."""
        self._on_event(f"relay link {'up' if up else 'down'}: {detail}")
        self._in.send_nowait((up, detail))
