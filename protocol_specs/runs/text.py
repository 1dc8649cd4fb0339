"""How a run reads wherever it is shown (``tether ls``/``status``, ``sweep status``, the web view):
one function per fact, so every view says the same thing. Sans-I/O: records in, text out.

- :func:`shown_state`: the state a run is shown in (``waiting for an IDE`` is a running run held
  before its first line);
- :func:`slots_text`: why a queued run of a worker pool still waits: what holds the pool's slots
  (``2 of 2 slots held: run 6b07 paused on uncaught ValueError at crash.py:8 in step, run 6b08
  waiting for an IDE``).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from .runs import RunRecord

__all__ = ["holding_text", "shown_state", "slots_text"]


def shown_state(record: RunRecord) -> str:
    """The state a run is shown in: its state, or ``waiting for an IDE`` while its program is
    held before its first line for an IDE's configuration; a paused run of several ranks says
    how many of them are paused (``paused (3 of 4 ranks)``)."""
    if record.waiting_for_ide and record.state.value == "running":
        return "waiting for an IDE"
    if record.state.value == "paused":
        # the processes described as ranks (a DataLoader worker of a rank is ``worker N of rank R``)
        ranks = [row for row in record.processes.values() if row.title.startswith("rank ")]
        live = [row for row in ranks if row.state != "exited"]
        if len(live) > 1:
            paused = sum(row.state == "paused" for row in live)
            return f"paused ({paused} of {len(live)} ranks)"
    return record.state.value


def holding_text(record: RunRecord, *, named: bool = True) -> str:
    """What one run does with the slot it holds: ``run X paused at train.py:18 in step``,
    ``run X waiting for an IDE``, ``run X running``; ``named`` false: another user's run, not
    named (``a run of another user, paused``)."""
    state = shown_state(record)
    if record.state.value == "paused" and record.paused_at:
        where = record.paused_at
        state = f"paused {'on' if ' at ' in where else 'at'} {where}"
    if record.silent_for:
        state += " (its worker is silent)"
    return f"run {record.id} {state}" if named else f"a run of another user ({state})"


def slots_text(holders: Sequence[RunRecord], free: int, viewer: str | None) -> str:
    """Why a queued run of a worker pool waits, or ``""`` when a slot is free (``free``: the
    pool's slots waiting for a run) or no slot is known: the slots, and what holds each
    (``viewer``: whose runs are named; None: everyone's, an admin's view). Runs paused or held
    for an IDE come first: those are the ones a person can let go."""
    if free or not holders:
        return ""

    def order(r: RunRecord) -> int:
        return 0 if r.state.value == "paused" else 1 if r.waiting_for_ide else 2

    said = [
        holding_text(r, named=viewer is None or r.owner == viewer)
        for r in sorted(holders, key=order)
    ]
    n = len(holders)
    return f"{n} of {n} slot{'s' * (n != 1)} held: {', '.join(said)}"
