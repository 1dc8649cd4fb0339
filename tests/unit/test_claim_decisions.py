"""Claims count once their worker has them (``protocol_specs/runs/claims.py``), stepped on a hand clock:
a claim is provisional until confirmed; one left unconfirmed past its deadline (its answer was lost)
goes back to the queue at the same attempt, no retry spent; a confirm and a release of one claim
never both apply, so no two workers run one attempt."""

from __future__ import annotations

import pytest

from protocol_specs.runs.claims import (
    StaleClaim,
    claim,
    confirm,
    lease_expired,
    release,
    unconfirmed,
)
from protocol_specs.runs.runs import Attempt, IllegalTransition, RunEvent, RunRecord, RunState
from protocol_specs.runs.spec import RunSpec

SPEC = RunSpec(command=["python", "-c", "print(1)"], workdir="/w")  # no retries asked
WITHIN = 15.0
LOST = "the worker stopped renewing its lease"


def queued(spec: RunSpec = SPEC) -> RunRecord:
    return RunRecord(id="r1", spec=spec, attempts=[Attempt(n=1, queued_at=0.0)])


def claimed(record: RunRecord, worker: str, claim_id: str, at: float) -> RunRecord:
    return claim(record, worker, at=at, claim_id=claim_id, confirm_within=WITHIN, from_queue=True)


def test_a_claim_is_provisional_until_its_worker_confirms_it() -> None:
    record = claimed(queued(), "pool-0", "c1", at=100.0)
    entry = record.attempts[-1]
    assert record.state is RunState.STARTING and record.worker == "pool-0"
    assert (entry.n, entry.claim, entry.confirm_by, entry.confirmed_at) == (1, "c1", 115.0, None)
    assert entry.from_queue and unconfirmed(record, 1) == "c1"
    confirmed = confirm(record, "c1", at=101.0, about=1)
    assert confirmed.state is RunState.STARTING and confirmed.attempts[-1].confirmed_at == 101.0
    assert unconfirmed(confirmed, 1) == ""
    # said again (the answer to the first confirm was lost): the same record, nothing to write
    assert confirm(confirmed, "c1", at=102.0, about=1) is confirmed
    started = confirmed.advance(RunEvent.START, at=103.0, about=1)
    assert confirm(started, "c1", at=104.0, about=1) is started


def test_an_unconfirmed_claim_goes_back_to_the_queue_at_its_deadline_same_attempt() -> None:
    record = claimed(queued(), "pool-0", "c1", at=100.0)
    with pytest.raises(StaleClaim, match="not due yet"):
        release(record, "c1", at=114.9, about=1, lapsed=True)
    back = release(record, "c1", at=115.0, about=1, lapsed=True)
    assert (back.state, back.attempt, back.worker) == (RunState.QUEUED, 1, "")
    (entry,) = back.attempts  # no retry spent: still attempt 1, and only it
    assert (entry.claim, entry.claimed_at, entry.worker, entry.released) == ("", None, "", 1)
    assert not back.finished and back.exit_code is None
    # the next worker claims the same attempt, and that claim runs to the end
    again = claimed(back, "pool-1", "c2", at=130.0)
    assert (again.attempt, again.attempts[-1].claim, again.attempts[-1].released) == (1, "c2", 1)
    ran = confirm(again, "c2", at=130.1, about=1).advance(RunEvent.START, at=131.0, about=1)
    done = ran.advance(RunEvent.EXIT_OK, at=132.0, about=1, exit_code=0)
    assert done.state is RunState.SUCCEEDED and [a.n for a in done.attempts] == [1]
    assert done.attempts[-1].worker == "pool-1" and done.attempts[-1].outcome == "succeeded"


def test_a_confirm_that_comes_too_late_is_told_its_claim_is_gone() -> None:
    record = claimed(queued(), "pool-0", "c1", at=100.0)
    back = release(record, "c1", at=115.0, about=1, lapsed=True)
    with pytest.raises(StaleClaim, match="not held by this claim"):
        confirm(back, "c1", at=116.0, about=1)
    # claimed again by another worker at the same attempt: the late confirm still cannot take it
    again = claimed(back, "pool-1", "c2", at=117.0)
    with pytest.raises(StaleClaim):
        confirm(again, "c1", at=118.0, about=1)
    assert confirm(again, "c2", at=118.0, about=1).attempts[-1].confirmed_at == 118.0


@pytest.mark.parametrize("first", ["confirm", "release"])
def test_a_confirm_and_a_release_of_one_claim_never_both_apply(first: str) -> None:
    """The two race (a worker's confirm, a sweep past the deadline): decided on the same record
    one after the other, the second is refused whichever came first."""
    record = claimed(queued(), "pool-0", "c1", at=100.0)

    def do(what: str, on: RunRecord) -> RunRecord:
        if what == "confirm":
            return confirm(on, "c1", at=115.5, about=1)
        return release(on, "c1", at=115.5, about=1, lapsed=True)

    after = do(first, record)
    with pytest.raises(IllegalTransition):
        do("release" if first == "confirm" else "confirm", after)
    assert after.state is (RunState.STARTING if first == "confirm" else RunState.QUEUED)


def test_a_lease_that_expires_on_an_unconfirmed_claim_releases_it_and_on_a_confirmed_one_ends_it() -> (
    None
):
    record = claimed(queued(), "pool-0", "c1", at=100.0)
    back = lease_expired(record, at=190.0, about=1, detail=LOST)
    assert (back.state, back.attempt, back.attempts[-1].released) == (RunState.QUEUED, 1, 1)
    confirmed = confirm(record, "c1", at=101.0, about=1)
    lost = lease_expired(confirmed, at=191.0, about=1, detail=LOST)
    assert lost.state is RunState.LOST and lost.detail == LOST
    with_retries = queued(SPEC.model_copy(update={"max_retries": 1}))
    running = confirm(claimed(with_retries, "pool-0", "c1", at=0.0), "c1", at=1.0, about=1)
    retried = lease_expired(running, at=95.0, about=1, detail=LOST)
    assert (retried.state, retried.attempt) == (RunState.QUEUED, 2)  # a retry spent, as before


def test_only_the_current_unconfirmed_claim_is_released() -> None:
    record = claimed(queued(), "pool-0", "c1", at=100.0)
    with pytest.raises(StaleClaim, match="not the current claim"):
        release(record, "c0", at=120.0, about=1)
    confirmed = confirm(record, "c1", at=101.0, about=1)
    with pytest.raises(StaleClaim, match="confirmed: it counts"):
        release(confirmed, "c1", at=120.0, about=1, lapsed=True)
    started = confirmed.advance(RunEvent.START, at=102.0, about=1)
    with pytest.raises(IllegalTransition):
        release(started, "c1", at=120.0, about=1)
    cancelled = record.advance(RunEvent.CANCEL, at=103.0, detail="cancelled")
    for refused in (
        lambda: release(cancelled, "c1", at=120.0, about=1, lapsed=True),
        lambda: confirm(cancelled, "c1", at=120.0, about=1),
    ):
        with pytest.raises(IllegalTransition):
            refused()
    # the relay's own release, before the deadline (its answer could not be sent): at once
    assert release(record, "c1", at=100.5, about=1).state is RunState.QUEUED


def test_a_claim_recorded_before_claims_had_ids_counts_as_confirmed() -> None:
    old = queued().advance(RunEvent.CLAIM, at=1.0, worker="w")  # no claim id, no deadline
    assert unconfirmed(old, 1) == ""
    assert lease_expired(old, at=100.0, about=1, detail=LOST).state is RunState.LOST
