"""Who gets in, by token: users' credentials (missing, forged, revoked, expired, kept hashed) and
workers' tokens and tickets (good for one run's one attempt).

Against a live relay (``live_relay.py``) on a real Redis-compatible server over real
WebSockets. Each test names the refusal it pins; each also checks that the refused peer got
nothing and that the relay still serves the others.
"""

from __future__ import annotations

import time
from collections.abc import AsyncIterator

import pytest
import trio
from live_relay import SPEC, Relay, live_relay, refusal, submitted
from websockets.exceptions import ConnectionClosed
from websockets.trio.client import ClientConnection, connect

from protocol_specs.access.auth import Scope
from protocol_specs.runs.runs import RunState
from protocol_specs.session.session import StatusEvent
from protocol_specs.wire import wire
from protocol_specs.wire.wire import ErrorCode, Role, WorkerLink
from relay.auth import TokenStore
from relay.client import RelayError, open_control, open_run_link
from relay.server import RelayConfig
from relay.store import Store, keys

pytestmark = [pytest.mark.redis, pytest.mark.timeout(60)]


@pytest.fixture
async def relay(redis_store: Store) -> AsyncIterator[Relay]:
    async with live_relay(redis_store) as r:
        yield r


# --- credentials ---------------------------------------------------------------------------------


async def test_no_token_a_foreign_token_and_a_wrong_secret_are_refused_alike(relay: Relay) -> None:
    run = await submitted(relay.alice)
    none = await refusal(relay.bare())
    assert none.code == ErrorCode.UNAUTHORIZED and "needs a token" in none.message
    token_id = relay.alice.token.split("_")[1]
    forged = f"tthu_{token_id}_{'A' * 43}"  # alice's id, not her secret
    foreign = "tthu_0123456789abcdef_" + "B" * 43  # an id this relay never made
    for bad in (forged, foreign, "not-a-token"):
        got = await refusal(relay.bare(bad), Role.IDE, run)
        assert got.code == ErrorCode.UNAUTHORIZED
        assert got.message == "the token is not valid (unknown, malformed or mistyped)"
        assert bad not in got.message and relay.alice.token not in got.message
    async with open_control(relay.alice) as control:
        assert (await control.get_run(run)).state is RunState.QUEUED  # the owner still gets in
        trail = await control.audit(run)
    # tried on her run: she can see it (three refusals of one request by no valid token: the
    # first, and the other two as one entry with their count)
    refused = [e for e in trail if e.event == "refused"]
    assert [e.detail.split(":")[0] for e in refused] == ["open ide", "open ide"]
    assert refused[0].detail.startswith("open ide: unauthorized: the token is not valid")
    assert refused[1].detail.endswith("(the last of 2 more like it, in the 0 s after the first)")


async def test_revoked_and_expired_tokens_are_refused(relay: Relay) -> None:
    async with open_control(relay.alice) as control:
        spare, info = await control.create_token(label="laptop")
        assert spare.startswith("tthu_") and info.user == "alice"
        async with open_control(relay.bare(spare)):
            pass
        revoked = await control.revoke_token(info.id)
        assert revoked.revoked_at > 0
    got = await refusal(relay.bare(spare))
    assert got.code == ErrorCode.UNAUTHORIZED and got.message == f"token {info.id} was revoked"
    past = TokenStore(relay.store, clock=lambda: time.time() - 100)
    old, record = await past.create("alice", expires_in=10)
    got = await refusal(relay.bare(old))
    assert got.code == ErrorCode.UNAUTHORIZED and got.message == f"token {record.id} has expired"


async def test_tokens_are_kept_hashed(relay: Relay) -> None:
    token_id, secret = relay.alice.token.split("_", 2)[1:]
    stored = await relay.store.hgetall(keys.token(token_id))
    assert stored and secret.encode() not in stored["record"]


async def test_a_revoked_token_ends_a_connection_already_open(redis_store: Store) -> None:
    async with live_relay(redis_store, RelayConfig(recheck=0)) as relay:
        run = await submitted(relay.alice)
        token, info = await TokenStore(relay.store).create("alice", scopes=[Scope.RUNS])
        async with open_control(relay.bare(token)) as control:
            await control.get_run(run)
            await TokenStore(relay.store).revoke(info.id)
            with trio.fail_after(20), pytest.raises(RelayError) as refused:
                await control.get_run(run)  # the relay looked at the token again: closed
            assert refused.value.code == ErrorCode.UNAUTHORIZED


async def test_a_revoked_token_ends_idle_ide_connections_that_send_nothing(
    redis_store: Store,
) -> None:
    """An IDE link sends no heartbeats; the relay's own look at open tokens still ends it."""
    async with live_relay(redis_store, RelayConfig(recheck=0)) as relay:
        run = await submitted(relay.alice)
        token, info = await TokenStore(relay.store).create("alice", scopes=[Scope.RUNS])
        hello = wire.Hello(role=Role.IDE, link=wire.IdeLink(), run=run, token=token, cursor="0")
        async with connect(relay.url, compression=None) as ws:
            await ws.send(wire.encode_frame(hello))
            welcome = wire.decode_frame(await ws.recv())
            assert isinstance(welcome, wire.Welcome) and welcome.heartbeat == 0
            await TokenStore(relay.store).revoke(info.id)
            frames: list[wire.AnyFrame] = []
            with trio.fail_after(20), pytest.raises(ConnectionClosed):
                await _read_until_closed(ws, frames)
            last = frames[-1]
            assert isinstance(last, wire.Error) and last.code == ErrorCode.UNAUTHORIZED


async def _read_until_closed(ws: ClientConnection, frames: list[wire.AnyFrame]) -> None:
    while True:
        frames.append(wire.decode_frame(await ws.recv()))


# --- worker tokens ---------------------------------------------------------------------------------


async def test_a_worker_token_is_good_for_its_run_only(relay: Relay) -> None:
    first = await submitted(relay.alice)
    second = await submitted(relay.alice)
    async with open_control(relay.pool) as control:
        assigned = await control.claim("w-0")
    assert assigned.run.id == first
    got = await refusal(relay.bare(assigned.token), Role.WORKER, second)
    assert got.code == ErrorCode.FORBIDDEN and "not another run" in got.message
    async with open_control(relay.bare(assigned.token)) as control:
        with pytest.raises(RelayError) as info:
            await control.claim("w-1", run=second, attempt=1)
        assert info.value.code == ErrorCode.FORBIDDEN
        with pytest.raises(RelayError) as info:
            await control.read_blob("ab" * 32)  # not in its run's snapshot
        assert info.value.code == ErrorCode.FORBIDDEN
    async with open_run_link(relay.bare(assigned.token), link=WorkerLink(), run=first) as link:
        assert link.run.id == first


async def test_a_worker_of_an_earlier_attempt_cannot_inject_into_the_next(relay: Relay) -> None:
    spec = SPEC.model_copy(update={"max_retries": 1, "retry_backoff": 0.0})
    run = await submitted(relay.alice, spec)
    async with open_control(relay.pool) as control:
        first = await control.claim("w-0")
        zombie = relay.bare(first.token)
        async with open_run_link(zombie, link=WorkerLink(), run=run) as link:
            await link.publish(wire.StatusEntry(event=StatusEvent.STARTED))
            await link.publish(wire.StatusEntry(event=StatusEvent.EXITED, exit_code=1))
            await link.flush()
        second = await control.claim("w-1")
    assert (second.run.id, second.run.attempt) == (run, 2)
    got = await refusal(zombie, Role.WORKER, run)
    assert got.code == ErrorCode.STALE_ATTEMPT
    async with open_control(zombie) as control:
        with pytest.raises(RelayError) as info:
            await control.claim("w-0", run=run, attempt=2)
        assert info.value.code == ErrorCode.STALE_ATTEMPT
    async with open_run_link(relay.bare(second.token), link=WorkerLink(), run=run) as link:
        assert link.run.attempt == 2  # the current attempt's worker is served


async def test_a_ticket_claims_its_attempt_once_and_is_worth_nothing_after(relay: Relay) -> None:
    """What a Ray job carries where others can read it: it starts the attempt, once."""
    spec = SPEC.model_copy(update={"backend": "ray", "max_retries": 1, "retry_backoff": 0.0})
    run = await submitted(relay.alice, spec)
    async with open_control(relay.pool) as control:
        dispatched = await control.dispatch("ray", "ray-backend", ticket=True)
    ticket = relay.bare(dispatched.token)
    assert dispatched.run.id == run and dispatched.token.startswith("ttht_")
    got = await refusal(ticket, Role.WORKER, run)  # a ticket is no worker token
    assert got.code == ErrorCode.FORBIDDEN
    async with open_control(ticket) as control:
        with pytest.raises(RelayError) as info:
            await control.read_blob("ab" * 32)
        assert info.value.code == ErrorCode.FORBIDDEN
        with pytest.raises(RelayError) as info:  # read off a job list while the job waits
            await control.claim("w-thief", run=run, attempt=1)
        assert info.value.code == ErrorCode.JOB_NOT_RUNNING
    async with open_control(relay.pool) as control:
        await control.report(run, 1, "job", job="ray-1")
        await control.report(run, 1, "running", job="ray-0")  # another job: changes nothing
    async with open_control(ticket) as control:
        with pytest.raises(RelayError) as info:
            await control.claim("w-thief", run=run, attempt=1)
        assert info.value.code == ErrorCode.JOB_NOT_RUNNING
    async with open_control(relay.pool) as control:
        await control.report(run, 1, "running", job="ray-1")  # the backend saw the job run
    async with open_control(ticket) as control:
        assigned = await control.claim("w-0", run=run, attempt=1)
        assert assigned.token.startswith("tthw_")  # the worker token, in the claim's answer only
        with pytest.raises(RelayError) as info:
            await control.claim("w-thief", run=run, attempt=1)  # the attempt started: spent
        assert info.value.code == ErrorCode.STALE_ATTEMPT
    async with open_run_link(relay.bare(assigned.token), link=WorkerLink(), run=run) as link:
        await link.publish(wire.StatusEntry(event=StatusEvent.STARTED))
        await link.publish(wire.StatusEntry(event=StatusEvent.EXITED, exit_code=1))
        await link.flush()
    async with open_control(ticket) as control:  # attempt 2 is queued: not the ticket's
        with pytest.raises(RelayError) as info:
            await control.claim("w-thief", run=run, attempt=2)
        assert info.value.code == ErrorCode.STALE_ATTEMPT
    async with open_control(relay.alice) as control:
        trail = [(e.event, e.token) for e in await control.audit(run)]
    assert ("claim", dispatched.token.split("_")[1]) in trail  # whoever used it is on record


async def test_a_ray_jobs_node_trades_the_ticket_for_a_worker_token_when_it_joins(
    relay: Relay,
) -> None:
    """A Ray job over two nodes carries one ticket (its runtime environment reaches every task):
    node 1's join, once node 0 claimed, is answered with a worker token of its own, as node 0's
    claim is; before the backend saw the job run, it is refused like a claim."""
    nodes = SPEC.resources.model_copy(update={"nodes": 2})
    spec = SPEC.model_copy(update={"backend": "ray", "resources": nodes})
    run = await submitted(relay.alice, spec)
    async with open_control(relay.pool) as control:
        dispatched = await control.dispatch("ray", "ray-backend", ticket=True)
    ticket = relay.bare(dispatched.token)
    async with open_control(ticket) as control:
        with pytest.raises(RelayError) as info:  # read off a job list while the job waits
            await control.claim("w-1", run=run, attempt=1, node=1)
        assert info.value.code == ErrorCode.JOB_NOT_RUNNING
    async with open_control(relay.pool) as control:
        await control.report(run, 1, "job", job="ray-1")
        await control.report(run, 1, "running", job="ray-1")
    async with open_control(ticket) as control:
        with pytest.raises(RelayError) as info:  # node 0 has not claimed yet: asked again
            await control.claim("w-1", run=run, attempt=1, node=1)
        assert info.value.code == ErrorCode.JOB_NOT_RUNNING
        assert "node 0 has not claimed attempt 1 yet" in info.value.message
        node0 = await control.claim("w-0", run=run, attempt=1)
        node1 = await control.claim("w-1", run=run, attempt=1, node=1)
    assert node0.token.startswith("tthw_") and node1.token.startswith("tthw_")
    assert node1.token != node0.token and node1.run.id == run
    got = await refusal(ticket, Role.WORKER, run)  # the ticket itself is still no worker token
    assert got.code == ErrorCode.FORBIDDEN
    async with open_run_link(relay.bare(node1.token), link=WorkerLink(node=1), run=run) as link:
        assert link.run.attempt == 1  # node 1's worker is served with the token it was given
