"""The adapter's side of the focus and of a large group's stop: what the IDE is offered, and the
summary line; decided synchronously (:mod:`protocol_specs.session.focus` says what they are).

Theory of operation
-------------------
:class:`RankFocus` is held by :class:`adapter.dap.processes.Processes`. It keeps:

- the focus (``tether attach --ranks``, or the latest ``tetherFocus`` in the run's ``to_worker``
  stream: any adapter's, the last one wins). An attach's own focus is recorded (published) when its
  main IDE configures; until then the stream's older foci do not replace it.
- how many ranks of the run are live (counted again only when a process starts or exits: a stop
  costs O(1), a group stop of n ranks O(n)).
- the ranks a large group stop paused along with rank K, not offered: once every live rank is
  paused, or once none more paused for :data:`SUMMARY_WAIT` seconds, rank K's session gets one line
  (:func:`~protocol_specs.session.focus.summary_text`).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import orjson

from protocol_specs.session.focus import (
    FOCUS_COMMAND,
    GROUP_TAG,
    OFFER_ALL_UP_TO,
    focus_request,
    group_with,
    parse_focus,
)
from protocol_specs.session.processes import MAIN, ProcessState, ProcessTable
from protocol_specs.wire.wire import DapEntry

from .actions import Origin, Publish
from .forwarding import request_entry

__all__ = ["SUMMARY_WAIT", "RankFocus", "is_group_stop", "rank_of"]

#: seconds without a new summarized stop after which a large group's summary is said anyway
SUMMARY_WAIT = 5.0


def rank_of(table: ProcessTable, key: str) -> int | None:
    """The rank process ``key`` is (None: not a rank; a DataLoader worker of rank R inherits
    ``RANK`` but is not one)."""
    info = table.info(key)
    if info is None or info.rank is None:
        return None
    parent = table.info(info.parent) if info.parent != MAIN else None
    return None if parent is not None and parent.rank == info.rank else info.rank


@dataclass
class RankFocus:
    """The focus of one adapter, and the summaries of large group stops (module docstring)."""

    table: ProcessTable
    clock: Callable[[], float]
    ranks: list[int] | None = None
    #: this adapter's own focus (an attach's) waits to be recorded
    pending: bool = False
    _live: int | None = None
    #: the rank a group stop started with -> the ranks it paused, not offered, not told yet
    held: dict[int, set[int]] = field(default_factory=dict)
    deadline: float | None = None

    def __repr__(self) -> str:
        return f"<RankFocus ranks={self.ranks} pending={self.pending} held={self.held}>"

    # --- the focus --------------------------------------------------------------------------------

    def request(self, arguments: Any) -> list[int] | None:
        """A ``tetherFocus`` request: its ranks (``ranks``), which become this adapter's focus,
        or with ``"add": true`` join it (no focus stays no focus); raises ``ValueError``."""
        asked = parse_focus(arguments)
        if isinstance(arguments, dict) and arguments.get("add") is True:
            if asked is None:
                raise ValueError('tetherFocus with "add" needs the ranks to add')
            if self.ranks is not None:
                self.ranks = sorted({*self.ranks, *asked})
        else:
            self.ranks = asked
        self.pending = False
        return asked

    def record(self, shared: Origin) -> Publish:
        """The entry that records the focus in ``to_worker`` (the worker and every adapter read
        it), the next request of this adapter's ``seq`` space."""
        self.pending = False
        seq = shared.seq + 1
        entry = request_entry(
            focus_request(self.ranks), seq, origin=shared.name, process=MAIN, local=True
        )
        shared.seq = seq
        return Publish(entry, seq)

    def fold(self, entry: DapEntry) -> bool:
        """A ``to_worker`` entry: a focus recorded by any adapter is this one's too (unless its
        own waits to be recorded). True when it was a focus."""
        if FOCUS_COMMAND.encode() not in entry.body:
            return False
        try:
            msg = orjson.loads(entry.body)
            if not isinstance(msg, dict) or msg.get("command") != FOCUS_COMMAND:
                return False
            ranks = parse_focus(msg.get("arguments"))
        except (orjson.JSONDecodeError, ValueError):
            return False
        if not self.pending:
            self.ranks = ranks
        return True

    def shows(self, rank: int | None) -> bool:
        """Whether the IDE may be offered a process of ``rank`` (None: not a rank)."""
        return self.ranks is None or rank is None or rank in self.ranks

    # --- a large group's stop ---------------------------------------------------------------------

    def processes_changed(self) -> None:
        self._live = None

    def live_ranks(self) -> int:
        if self._live is None:
            self._live = sum(
                1
                for key, known in self.table.known.items()
                if known.state is not ProcessState.EXITED and rank_of(self.table, key) is not None
            )
        return self._live

    def summarized(self, rank: int | None, stop: dict[str, Any] | None) -> int | None:
        """The rank this stop of ``rank`` came with, when the IDE is not offered it for it: a rank
        the group paused or moved along with another, in a group of more than
        :data:`~protocol_specs.session.focus.OFFER_ALL_UP_TO` ranks, and not named by the
        focus."""
        with_rank = group_with(stop)
        if rank is None or with_rank is None or with_rank == rank:
            return None
        if self.ranks is not None and rank in self.ranks:
            return None
        return with_rank if self.live_ranks() > OFFER_ALL_UP_TO else None

    def hold(self, rank: int, with_rank: int) -> list[int]:
        """``rank`` paused with ``with_rank``, not offered. The ranks to tell of now (every live
        rank is paused) or [] (later, :meth:`due`)."""
        held = self.held.setdefault(with_rank, set())
        held.add(rank)
        if len(held) + 1 >= self.live_ranks():
            return sorted(self.held.pop(with_rank))
        # a quiet period: on a loaded machine 64 ranks' stops trickle in for seconds, and one
        # line for all of them beats a line per straggler
        self.deadline = self.clock() + SUMMARY_WAIT
        return []

    def due(self) -> dict[int, list[int]]:
        """The summaries whose wait is over: with rank -> the ranks paused with it."""
        if self.deadline is None or self.clock() < self.deadline:
            return {}
        self.deadline = None
        due = {with_rank: sorted(ranks) for with_rank, ranks in self.held.items() if ranks}
        self.held.clear()
        return due


def is_group_stop(entry: DapEntry) -> dict[str, Any] | None:
    """The body of a ``stopped`` event the rank group tagged (None: any other entry)."""
    if GROUP_TAG.encode() not in entry.body:
        return None
    try:
        msg = orjson.loads(entry.body)
    except orjson.JSONDecodeError:
        return None
    if not isinstance(msg, dict) or msg.get("event") != "stopped":
        return None
    body = msg.get("body")
    return body if isinstance(body, dict) else None
