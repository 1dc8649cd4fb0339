"""A worker confirms each claim before it does anything with the run.

The relay counts a claim only once its worker says it holds the answer (``confirm``;
``protocol_specs/runs/claims.py``); a claim nobody confirms goes back to the queue at the same attempt.
So the answer to a claim is not yet a run to start: :func:`confirm_claim` says so to the relay
first, and only a confirmed claim is run. Should the relay be lost meanwhile (the confirm's answer
lost with it), the confirm is said again on a new connection, with the claim's worker token, until
the relay answers: a confirm said twice counts once, and a claim whose confirm went through must
not be dropped (nobody else would run it). A claim that went back to the queue meanwhile (its
confirm came too late, or its token was revoked with it) is refused: the worker drops the run and
takes the next one, and the worker that claims it again runs it.
"""

from __future__ import annotations

import trio

from protocol_specs.wire import wire
from protocol_specs.wire.wire import ErrorCode
from relay.client import ControlClient, Endpoint, RelayError, open_control

__all__ = ["CONFIRM_PATIENCE", "confirm_claim"]

#: how long a worker says its confirm again while the relay cannot be reached or has lost its store
CONFIRM_PATIENCE = 120.0
#: errors that say nothing about the claim: the relay went away, or lost its store for a moment
_TRANSIENT = frozenset({ErrorCode.UNREACHABLE, ErrorCode.INTERNAL})


async def confirm_claim(
    control: ControlClient | None, as_worker: Endpoint, assigned: wire.Assigned, *, client: str
) -> None:
    """Confirm ``assigned``'s claim, on ``control`` (the connection the claim came on, if it may
    confirm it), else on a new connection as ``as_worker`` (the claim's worker token). Returns once
    the claim counts; raises :class:`RelayError` saying why not (it went back to the queue, the run
    was cancelled, or the relay stayed out of reach for :data:`CONFIRM_PATIENCE` s)."""
    record = assigned.run
    last = record.attempts[-1] if record.attempts else None
    claim = last.claim if last is not None and last.n == record.attempt else ""
    if not claim:
        return  # a relay from before claims were confirmed: the answer's arrival is enough
    deadline = trio.current_time() + CONFIRM_PATIENCE
    pause = 0.2
    while True:
        try:
            if control is not None:
                await control.confirm(record.id, record.attempt, claim)
            else:
                async with open_control(as_worker, client=client) as fresh:
                    await fresh.confirm(record.id, record.attempt, claim)
            return
        except RelayError as exc:
            if exc.code not in _TRANSIENT or trio.current_time() + pause > deadline:
                raise
        control = None  # that connection is gone: a new one as the claim's worker
        await trio.sleep(pause)  # the relay's restart, or its store's: nothing to wait on here
        pause = min(pause * 2, 5.0)
