"""A claim counts once its worker has it: claims are provisional until confirmed.

Theory of operation
-------------------
A worker takes a queued attempt with ``claim``; the relay records the claim (``queued`` ->
``starting``) and then answers. The answer can be lost: its relay dies between the write and the
send, or the link is cut with the answer in a buffer. The record then says that an attempt was
handed out which no worker holds, and counting it as an attempt would lose the run (nobody renews
its lease; with no retries asked it ends ``lost``) although nothing ran. So a claim is
*provisional* until its worker says it holds the answer, and one whose worker never says so goes
back to the queue at the same attempt:

- :func:`claim` records the claim with an id (the id of the worker token the answer carries, so
  that revoking that token revokes the claim) and a deadline, ``confirm_within`` seconds on;
- :func:`confirm` is the worker's first word once it has the answer (``confirm``; opening its
  worker link with the claim's token says the same): the claim counts from then on. Said again
  (the answer to the first one was lost), it changes nothing. Said about a claim that is no
  longer the run's current one (it was released, and perhaps claimed again by another worker at
  the same attempt), it raises :class:`StaleClaim`: the worker drops the run and takes the next;
- :func:`release` puts an unconfirmed claim back: the run is ``queued`` again at the *same*
  attempt, no retry spent. The claim's relay does it at once when it could not send the answer;
  any relay's sweep does it once the deadline passed (``lapsed``), and a lease that expires on an
  unconfirmed claim is released the same way (:func:`unconfirmed`), never counted as lost.

A confirm and a release of one claim are decided on the same record by compare-and-set
(``relay/runs/registry.py``), so exactly one of them applies: a worker starts an attempt only once
its claim counted, and a claim that counted is never released. Never two workers run one attempt,
and a claim whose answer was lost costs a delay (the deadline, then the next sweep), never the run.

The claim's deadline is wall-clock time, like leases; each decision takes the time as ``at``.
"""

from __future__ import annotations

from .nodes import node_rows
from .runs import Attempt, IllegalTransition, RunEvent, RunRecord, RunState, next_state

__all__ = ["StaleClaim", "claim", "confirm", "lease_expired", "release", "unconfirmed"]


class StaleClaim(IllegalTransition):
    """An event about a claim that is not the run's current one, or not in the state it needs."""

    def __init__(self, event: RunEvent, state: RunState, claim_id: str, why: str) -> None:
        super().__init__(event, state)
        self.args = (f"claim {claim_id or '?'}: {why}",)
        self.claim = claim_id
        self.why = why


def _current(record: RunRecord) -> Attempt | None:
    """The current attempt's entry, if it has one."""
    last = record.attempts[-1] if record.attempts else None
    return last if last is not None and last.n == record.attempt else None


def claim(
    record: RunRecord,
    worker: str,
    *,
    at: float,
    claim_id: str,
    confirm_within: float,
    from_queue: bool,
) -> RunRecord:
    """``record`` claimed by ``worker`` (``IllegalTransition`` unless it is queued), provisionally:
    the claim ``claim_id`` must be confirmed by ``at + confirm_within``. ``from_queue``: taken from
    its backend's queue (a released claim goes back there), rather than named by a scheduler job's
    worker (which asks again itself)."""
    claimed = record.advance(RunEvent.CLAIM, at=at, worker=worker)
    return claimed.with_attempt(
        claim=claim_id,
        confirm_by=at + confirm_within,
        confirmed_at=None,
        from_queue=from_queue,
        # a multi-node run: the claimer runs node 0, the others join (``nodes.py``)
        nodes=node_rows(record.spec.resources.nodes, worker),
    )


def confirm(record: RunRecord, claim_id: str, *, at: float, about: int) -> RunRecord:
    """The worker of claim ``claim_id`` (of attempt ``about``) holds the claim's answer: the claim
    counts. Confirmed already: ``record`` itself (nothing to write). Raises :class:`StaleClaim` if
    the claim is not the current attempt's (released, or another's), ``IllegalTransition`` if the
    run ended meanwhile (cancelled)."""
    current = _current(record)
    if about != record.attempt or current is None or not claim_id or current.claim != claim_id:
        raise StaleClaim(
            RunEvent.CONFIRM,
            record.state,
            claim_id,
            f"run {record.id} attempt {about} is not held by this claim any more (it was not "
            "confirmed in time and went back to the queue, or the run moved on)",
        )
    if current.confirmed_at is not None and not record.finished:
        return record
    return record.advance(RunEvent.CONFIRM, at=at).with_attempt(confirmed_at=at)


def release(
    record: RunRecord, claim_id: str, *, at: float, about: int, lapsed: bool = False
) -> RunRecord:
    """Claim ``claim_id`` never reached its worker: the run queued again at attempt ``about``, no
    retry spent. ``lapsed``: a sweep found it unconfirmed, which must be past its deadline.

    Raises :class:`StaleClaim` if the claim is not the current attempt's, was confirmed (it counts:
    only its lease can end it), or (``lapsed``) is not due; ``IllegalTransition`` if the run is not
    ``starting`` (started, or ended, meanwhile)."""
    record.check_attempt(RunEvent.RELEASE, about)
    next_state(record.state, RunEvent.RELEASE)
    current = _current(record)
    if current is None or not claim_id or current.claim != claim_id:
        raise StaleClaim(RunEvent.RELEASE, record.state, claim_id, "not the current claim")
    if current.confirmed_at is not None:
        raise StaleClaim(RunEvent.RELEASE, record.state, claim_id, "confirmed: it counts")
    if lapsed and (current.confirm_by is None or at < current.confirm_by):
        raise StaleClaim(RunEvent.RELEASE, record.state, claim_id, "not due yet")
    released = record.advance(RunEvent.RELEASE, at=at, about=about, worker="")
    return released.with_attempt(
        claim="",
        confirm_by=None,
        from_queue=False,
        released=current.released + 1,
        nodes=[],
    )


def unconfirmed(record: RunRecord, about: int | None) -> str:
    """The id of the claim that holds attempt ``about`` (the current one if ``None``) if it is
    unconfirmed, else ``""`` (confirmed, none, or a claim recorded before claims had ids)."""
    current = _current(record)
    if (
        record.state is not RunState.STARTING
        or current is None
        or (about is not None and about != record.attempt)
        or current.confirmed_at is not None
    ):
        return ""
    return current.claim


def lease_expired(record: RunRecord, *, at: float, about: int | None, detail: str) -> RunRecord:
    """Attempt ``about``'s lease expired: an unconfirmed claim is released (nothing ran); else the
    attempt is over (:meth:`RunRecord.attempt_over`: retried, or the run lost)."""
    claim_id = unconfirmed(record, about)
    if claim_id:
        return release(record, claim_id, at=at, about=record.attempt)
    return record.attempt_over(RunEvent.LEASE_EXPIRED, at=at, about=about, detail=detail)
