"""Claims in the run records: made provisionally, confirmed by their worker, or released.

``protocol_specs/runs/claims.py`` decides; this module performs its decisions on the registry's store
(``relay/runs/registry.py``: each one a compare-and-set of the run's record, its side effects done
by the writer whose write won):

- :func:`claim` mints the claim's worker token and puts the claim's deadline in
  :data:`keys.UNCONFIRMED` *before* it writes the claim (the token's id is the claim's id): a
  claim whose relay died, or lost its store, right after writing it is found by the sweep, and has
  its token to revoke. Then the attempt's lease starts;
- :func:`confirm`: the claim counts; its deadline is dropped and its lease renewed. Said again
  (the first answer was lost), it answers the same and redoes those two;
- :func:`release`: the run is queued again at the same attempt. Its lease and deadline go, its
  worker token is revoked (a worker that got the answer late is refused everywhere, and told so
  when it confirms), a pool's claim goes back to its backend's queue (a scheduler job's worker
  claims again by itself) and the run's ``to_ide`` and logs streams get a ``queued`` status saying
  why;
- :func:`sweep`: every relay looks for claims past their deadline; the one whose ``ZREM`` takes
  one releases it, unless a confirm won the race (the claim then counts, its lease untouched).

A relay that dies between a decision and its side effects leaves at most a deadline in
:data:`keys.UNCONFIRMED` (the sweep finds the claim confirmed, or gone, and drops it) or a lease
(the lease sweep ignores an attempt that is not current). A pool's claim also puts its run in
:data:`keys.DELAYED` at its deadline until it is confirmed: a release whose relay died before it
appended the run to its queue again leaves the run there, and the next sweep queues it.
"""

from __future__ import annotations

import logging
import secrets
from typing import NamedTuple

from protocol_specs.access.auth import parse_token
from protocol_specs.runs import claims, nodes
from protocol_specs.runs.runs import IllegalTransition, RunEvent, RunRecord, RunState
from protocol_specs.session.session import StatusEvent
from protocol_specs.wire import wire
from protocol_specs.wire.wire import ErrorCode

from ..store import keys
from .books import Books

__all__ = ["Claimed", "claim", "claim_run", "confirm", "join", "release", "released", "sweep"]

log = logging.getLogger("tether.relay")


class Claimed(NamedTuple):
    """A claim made: the run's record, and the worker token minted for the claim (``""`` when the
    claimer holds the attempt's token already)."""

    record: RunRecord
    token: str


async def claim(
    registry: Books,
    run_id: str,
    worker: str,
    *,
    mint: bool,
    from_queue: bool,
    attempt: int | None = None,
) -> Claimed | None:
    """Claim ``run_id`` (at ``attempt``, if given) for ``worker``, provisionally; ``None`` if it is
    not queued (at that attempt). ``mint``: a worker token for the attempt is minted, its id the
    claim's; else (the claimer holds the attempt's token) the claim gets an id of its own."""
    record = await registry.load(run_id)
    if record is None or record.state is not RunState.QUEUED:
        return None
    at_attempt = record.attempt if attempt is None else attempt
    token = ""
    if mint:
        ttl = registry.config.retention + registry.config.lease
        token = await registry.tokens.mint_worker(record.owner, run_id, at_attempt, ttl)
        parsed = parse_token(token)
        assert parsed is not None
        claim_id = parsed[0]
    else:
        claim_id = secrets.token_hex(8)
    now = registry.clock()
    within = registry.config.claim_confirm
    # the deadline first: a claim written by a relay that then lost its store, or died, is found
    member = keys.unconfirmed(run_id, at_attempt, claim_id)
    await registry.store.zadd(keys.UNCONFIRMED, member, now + within)
    if from_queue:  # queued again by a sweep, should its release be cut short
        await registry.store.zadd(keys.DELAYED, run_id, now + within)

    def decide(current: RunRecord) -> RunRecord:
        current.check_attempt(RunEvent.CLAIM, at_attempt)
        return claims.claim(
            current, worker, at=now, claim_id=claim_id, confirm_within=within, from_queue=from_queue
        )

    change = await registry.update(run_id, decide)
    if change is None:
        await registry.store.zrem(keys.UNCONFIRMED, member)
        if token:
            await registry.tokens.delete(claim_id)  # never handed out
        return None
    claimed = change.after
    # every node's lease starts with node 0's claim: a node that never joins ends the attempt
    for member in keys.leases(run_id, claimed.attempt, claimed.spec.resources.nodes):
        await registry.store.zadd(keys.LEASES, member, now + registry.config.lease)
    await registry.append_status(run_id, StatusEvent.CLAIMED, claimed, detail=worker)
    return Claimed(claimed, token)


async def claim_run(
    registry: Books, worker: str, run_id: str, attempt: int, *, mint: bool
) -> Claimed | wire.Error:
    """Claim ``run_id``'s attempt ``attempt`` for the worker its scheduler job started, or say
    why not (``no_such_run``, ``run_finished``, ``stale_attempt``)."""
    record = await registry.load(run_id)
    if record is None:
        return wire.Error(code=ErrorCode.NO_SUCH_RUN, message=f"no run {run_id!r}")
    if record.finished:
        return wire.Error(
            code=ErrorCode.RUN_FINISHED, message=f"run {run_id} is {record.state.value}"
        )
    if record.attempt != attempt or record.state is not RunState.QUEUED:
        return wire.Error(
            code=ErrorCode.STALE_ATTEMPT,
            message=f"run {run_id} is at attempt {record.attempt} ({record.state.value}); "
            f"attempt {attempt} is not to be started",
        )
    claimed = await claim(registry, run_id, worker, mint=mint, from_queue=False, attempt=attempt)
    if claimed is None:
        return wire.Error(code=ErrorCode.STALE_ATTEMPT, message=f"run {run_id} was taken")
    return claimed


async def join(
    registry: Books, worker: str, run_id: str, attempt: int, node: int
) -> RunRecord | wire.Error:
    """Node ``node`` (>= 1) of a multi-node run joins attempt ``attempt`` that node 0 claimed
    (``protocol_specs/runs/nodes.py``): its worker is noted as the node's host, nothing is
    claimed. Said again (the answer was lost), it answers the same."""
    refused: list[nodes.Refused] = []

    def decide(record: RunRecord) -> RunRecord:
        why = nodes.join_refusal(record, run_id, attempt, node)
        if why is not None:
            refused.append(why)
            raise IllegalTransition(RunEvent.CLAIM, record.state)
        return nodes.joined(record, node, worker)

    change = await registry.update(run_id, decide)
    if change is None:
        why = refused[-1] if refused else nodes.join_refusal(None, run_id, attempt, node)
        assert why is not None
        return wire.Error(code=ErrorCode(why.code), message=why.message)
    if change.after is not change.before:
        log.info("run %s: %s joins attempt %s as node %s", run_id, worker, attempt, node)
    return change.after


async def confirm(
    registry: Books, run_id: str, attempt: int, claim_id: str
) -> RunRecord | wire.Error:
    """The claim's worker holds its answer: the claim counts (see the module's docstring)."""
    now = registry.clock()
    refused: list[IllegalTransition] = []

    def decide(record: RunRecord) -> RunRecord:
        try:
            return claims.confirm(record, claim_id, at=now, about=attempt)
        except IllegalTransition as exc:
            refused.append(exc)
            raise

    change = await registry.update(run_id, decide)
    if change is None:
        if not refused:
            return wire.Error(code=ErrorCode.NO_SUCH_RUN, message=f"no run {run_id!r}")
        why = refused[-1]
        if isinstance(why, claims.StaleClaim):
            return wire.Error(code=ErrorCode.STALE_ATTEMPT, message=str(why))
        return wire.Error(
            code=ErrorCode.RUN_FINISHED,
            message=f"run {run_id} is {why.state.value}: its claim no longer counts",
        )
    await registry.store.zrem(keys.UNCONFIRMED, keys.unconfirmed(run_id, attempt, claim_id))
    await registry.store.zrem(keys.DELAYED, run_id)
    await registry.store.zadd(keys.LEASES, keys.lease(run_id, attempt), now + registry.config.lease)
    return change.after


async def release(
    registry: Books, record: RunRecord, why: str, *, lapsed: bool = False
) -> RunRecord | None:
    """Release the claim ``record`` (as claimed) holds, if it still does and is unconfirmed
    (``lapsed``: and past its deadline): queued again at the same attempt. ``why``: what became
    of the claim's answer, for the log and the run's streams."""
    last = record.attempts[-1] if record.attempts else None
    claim_id = last.claim if last is not None and last.n == record.attempt else ""
    now = registry.clock()
    change = await registry.update(
        record.id,
        lambda current: claims.release(
            current, claim_id, at=now, about=record.attempt, lapsed=lapsed
        ),
    )
    if change is None:
        return None
    await released(registry, change.before, change.after, why)
    return change.after


async def released(registry: Books, before: RunRecord, after: RunRecord, why: str) -> None:
    """The side effects of a release this process won (``before``: the record as claimed)."""
    claimed = before.attempts[-1]
    if claimed.from_queue:
        await registry.enqueue(after)
        await registry.store.zrem(keys.DELAYED, before.id)
    await registry.settle(before, after)
    await registry.store.zrem(
        keys.UNCONFIRMED, keys.unconfirmed(before.id, before.attempt, claimed.claim)
    )
    await registry.tokens.revoke(claimed.claim)  # the answer's worker token, if one was minted
    text = (
        f"queued again for attempt {after.attempt} (no retry spent): the claim by "
        f"{before.worker or 'a worker'} {why}"
    )
    log.info("run %s: %s", before.id, text)
    await registry.append_status(before.id, StatusEvent.QUEUED, after, logs=True, detail=text)


async def sweep(registry: Books) -> list[str]:
    """Release the claims left unconfirmed past their deadline; the ids of their runs."""
    now = registry.clock()
    back = []
    for member in await registry.store.zrange_by_score(keys.UNCONFIRMED, now, 100):
        if not await registry.store.zrem(keys.UNCONFIRMED, member):
            continue  # another relay took it
        parsed = keys.parse_unconfirmed(member)
        if parsed is None:
            continue
        run_id, attempt, claim_id = parsed

        def decide(
            record: RunRecord, attempt: int = attempt, claim_id: str = claim_id
        ) -> RunRecord:
            return claims.release(record, claim_id, at=now, about=attempt, lapsed=True)

        change = await registry.update(run_id, decide)
        if change is None:
            continue  # confirmed (it counts), cancelled, or released already
        within = registry.config.claim_confirm
        why = f"was not confirmed within {within:g} s: its answer never reached the worker"
        await released(registry, change.before, change.after, why)
        back.append(run_id)
    return back
