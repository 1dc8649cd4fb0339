"""Who gets in: every refusal of the relay's access control, against a live relay on a real
Redis-compatible server over real WebSockets (and TLS).

Two users, alice and bob, with ``runs`` tokens; a worker pool with a ``backend`` token. Each test
names the refusal it pins; each also checks that the refused peer got nothing and that the relay
still serves the others.
"""

from __future__ import annotations

import subprocess
import sys
import time
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from dataclasses import dataclass
from pathlib import Path

import msgpack
import pytest
import trio
import trustme
from websockets.exceptions import ConnectionClosed
from websockets.trio.client import ClientConnection, connect

from protocol_specs import wire
from protocol_specs.auth import Scope
from protocol_specs.run_spec import REDACTED, RunSpec
from protocol_specs.runs import RunState
from protocol_specs.session import StatusEvent
from protocol_specs.tunnels import TunnelSpec
from protocol_specs.wire import ErrorCode, Role
from relay.auth import TokenStore
from relay.client import Endpoint, RelayError, open_control, open_run_link
from relay.server import RelayConfig, serve_relay, server_port
from relay.store import Store, keys

pytestmark = [pytest.mark.redis, pytest.mark.timeout(60)]

SPEC = RunSpec(command=["python", "app.py"], workdir="/home/me/project")


@dataclass
class Relay:
    url: str
    store: Store
    alice: Endpoint
    bob: Endpoint
    pool: Endpoint

    def bare(self, token: str = "") -> Endpoint:
        return Endpoint(self.url, token=token)


@asynccontextmanager
async def live_relay(store: Store, config: RelayConfig | None = None) -> AsyncIterator[Relay]:
    tokens = TokenStore(store)
    async with trio.open_nursery() as nursery:
        server = await nursery.start(
            lambda task_status: serve_relay(store, port=0, config=config, task_status=task_status)
        )
        url = f"ws://127.0.0.1:{server_port(server)}"

        async def user(name: str, *scopes: Scope) -> Endpoint:
            token, _ = await tokens.create(name, scopes=list(scopes))
            return Endpoint(url, token=token)

        yield Relay(
            url,
            store,
            alice=await user("alice", Scope.RUNS),
            bob=await user("bob", Scope.RUNS),
            pool=await user("pool", Scope.BACKEND),
        )
        nursery.cancel_scope.cancel()


@pytest.fixture
async def relay(redis_store: Store) -> AsyncIterator[Relay]:
    async with live_relay(redis_store) as r:
        yield r


async def refusal(target: Endpoint, role: Role = Role.CONTROL, run: str = "") -> RelayError:
    """Open a connection in ``role``; the relay must refuse it."""
    caught: list[RelayError] = []
    with trio.fail_after(20):
        try:
            if role is Role.CONTROL:
                async with open_control(target):
                    pass
            else:
                async with open_run_link(target, role=role, run=run):
                    pass
        except* RelayError as group:
            caught += _leaves(group)
    assert caught, f"the relay let a {role.value} connection in"
    return caught[0]


def _leaves(group: BaseExceptionGroup[RelayError]) -> list[RelayError]:
    out: list[RelayError] = []
    for exc in group.exceptions:
        out += _leaves(exc) if isinstance(exc, BaseExceptionGroup) else [exc]
    return out


async def submitted(who: Endpoint, spec: RunSpec = SPEC) -> str:
    async with open_control(who) as control:
        return (await control.submit(spec)).id


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
        hello = wire.Hello(role=Role.IDE, run=run, token=token, cursor="0")
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


# --- users and their runs ------------------------------------------------------------------------


async def test_another_users_run_cannot_be_seen_attached_to_or_cancelled(relay: Relay) -> None:
    run = await submitted(relay.alice)
    for role in (Role.IDE, Role.LOGS):
        got = await refusal(relay.bob, role, run)
        assert got.code == ErrorCode.NO_SUCH_RUN, role
    async with open_control(relay.bob) as control:
        for call in (control.get_run(run), control.cancel(run), control.audit(run)):
            with pytest.raises(RelayError) as info:
                await call
            assert info.value.code == ErrorCode.NO_SUCH_RUN
        with pytest.raises(RelayError) as info:
            await control.rerun(run)
        assert info.value.code == ErrorCode.NO_SUCH_RUN
        assert await control.list_runs() == []
        mine = (await control.submit(SPEC)).id
        assert [r.id for r in await control.list_runs()] == [mine]
    async with open_control(relay.alice) as control:
        assert (await control.get_run(run)).state is RunState.QUEUED  # not cancelled
        assert [r.id for r in await control.list_runs()] == [run]
        events = [(e.event, e.user) for e in await control.audit(run)]
    assert ("submit", "alice") in events and ("refused", "bob") in events


async def test_every_refusal_of_a_run_is_in_its_audit_trail_and_tells_the_refused_nothing(
    relay: Relay,
) -> None:
    """Bob's status, cancel, rerun, audit, exec, logs and IDE of alice's run, and a backend
    token's exec: each in her run's trail (his token's id, his address, his client, the code),
    each answered as a run that does not exist is."""
    run = await submitted(relay.alice)
    ghost = "r" + run[1:-1] + ("0" if run[-1] != "0" else "1")  # a run id nobody has
    exec_true = TunnelSpec(kind="exec", argv=["cat", "/etc/shadow"])
    answers: dict[str, list[tuple[str, str]]] = {run: [], ghost: []}
    for target in (run, ghost):
        async with open_control(relay.bob, client="bobs-cli/1") as control:
            for call in (
                control.get_run(target),
                control.cancel(target),
                control.rerun(target),
                control.audit(target),
                control.open_tunnel(target, exec_true),
            ):
                with pytest.raises(RelayError) as info:
                    await call
                said = info.value.message.replace(target, "RUN")
                answers[target].append((str(info.value.code), said))
        for role in (Role.LOGS, Role.IDE):
            got = await refusal(relay.bob, role, target)
            answers[target].append((str(got.code), got.message.replace(target, "RUN")))
    assert answers[run] == answers[ghost]  # nothing learnt: the same words for both
    assert {code for code, _ in answers[run]} == {"no_such_run"}
    async with open_control(relay.pool) as control:
        with pytest.raises(RelayError) as info:
            await control.open_tunnel(run, TunnelSpec(kind="shell"))
        assert info.value.code == ErrorCode.FORBIDDEN
    async with open_control(relay.alice) as control:
        trail = await control.audit(run)
    bob, pool = relay.bob.token.split("_")[1], relay.pool.token.split("_")[1]
    refused = [e for e in trail if e.event == "refused"]
    asked = {e.detail.partition(": no_such_run: ")[0] for e in refused if e.token == bob}
    assert asked == {
        "get_run",
        "cancel",
        "rerun",
        "get_audit",
        "open_tunnel exec (exec: cat /etc/shadow)",
        "open logs",
        "open ide",
    }
    for entry in refused:
        assert entry.source.startswith("127.0.0.1:") and entry.user in ("bob", "pool")
        assert ": no_such_run: no run " in entry.detail or entry.token == pool
    assert {e.client for e in refused if e.role == "control" and e.token == bob} == {"bobs-cli/1"}
    [by_backend] = [e for e in refused if e.token == pool]
    assert by_backend.detail.startswith("open_tunnel shell (shell): forbidden: a token with ")
    assert (by_backend.user, by_backend.role) == ("pool", "control")
    assert await relay.store.read_last(keys.audit(ghost), 10) == []  # no trail for no run


async def test_a_refused_partys_repeats_add_one_entry_and_a_count(relay: Relay) -> None:
    """A flood of refusals would push a run's history out of its trail (it keeps the newest
    10,000 entries): the repeats within a minute are one entry and a count."""
    run = await submitted(relay.alice)
    async with open_control(relay.bob) as control:
        for _ in range(50):
            with pytest.raises(RelayError):
                await control.cancel(run)
        with pytest.raises(RelayError):
            await control.get_run(run)  # another request: an entry of its own
    async with open_control(relay.alice) as control:
        trail = await control.audit(run)
        assert (await control.get_run(run)).state is RunState.QUEUED
    assert [(e.event, e.detail.split(":")[0]) for e in trail] == [
        ("submit", ""),
        ("refused", "cancel"),
        ("refused", "cancel"),
        ("refused", "get_run"),
    ]
    assert "(the last of 49 more like it, in the " in trail[2].detail
    assert len(await relay.store.read_last(keys.audit(run), 100)) == 3  # the count: not yet


async def test_refusals_of_a_finished_run_expire_with_it(redis_store: Store) -> None:
    async with live_relay(redis_store, RelayConfig(retention=3600)) as relay:
        run = await submitted(relay.alice)
        async with open_control(relay.alice) as control:
            await control.cancel(run)
        async with open_control(relay.bob) as control:
            with pytest.raises(RelayError):
                await control.get_run(run)
        ttl = await relay.store.ttl(keys.audit_refusals(run))
        assert ttl is not None and 0 < ttl <= 3600


async def test_wrong_roles_and_scopes_are_refused(relay: Relay) -> None:
    run = await submitted(relay.alice)
    got = await refusal(relay.alice, Role.WORKER, run)  # a user token is no worker token
    assert got.code == ErrorCode.FORBIDDEN
    async with open_control(relay.alice) as control:
        for call in (control.claim("w"), control.dispatch("slurm", "x")):
            with pytest.raises(RelayError) as info:
                await call
            assert info.value.code == ErrorCode.FORBIDDEN
            assert "'backend' scope" in info.value.message
        with pytest.raises(RelayError) as info:
            await control.create_token(scopes=[Scope.ADMIN])  # no escalation
        assert info.value.code == ErrorCode.FORBIDDEN
        with pytest.raises(RelayError) as info:
            await control.create_token(user="bob")
        assert info.value.code == ErrorCode.FORBIDDEN
    async with open_control(relay.pool) as control:
        with pytest.raises(RelayError) as info:
            await control.submit(SPEC)  # a backend token runs work, it does not submit it
        assert info.value.code == ErrorCode.FORBIDDEN
        assigned = await control.claim("w-0")
    assert assigned.run.id == run and assigned.token.startswith("tthw_")
    as_worker = relay.bare(assigned.token)
    got = await refusal(as_worker, Role.IDE, run)  # a worker token cannot attach an IDE
    assert got.code == ErrorCode.FORBIDDEN
    async with open_control(as_worker) as control:
        with pytest.raises(RelayError) as info:
            await control.submit(SPEC)
        assert info.value.code == ErrorCode.FORBIDDEN


async def test_users_see_only_their_own_tokens(relay: Relay) -> None:
    async with open_control(relay.alice) as control:
        alices = await control.list_tokens()
        assert {t.user for t in alices} == {"alice"}
    async with open_control(relay.bob) as control:
        assert {t.user for t in await control.list_tokens()} == {"bob"}
        with pytest.raises(RelayError) as info:
            await control.revoke_token(alices[0].id)
        assert info.value.code == ErrorCode.NO_SUCH_TOKEN
    async with open_control(relay.alice):
        pass  # still good


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
    async with open_run_link(relay.bare(assigned.token), role=Role.WORKER, run=first) as link:
        assert link.run.id == first


async def test_a_worker_of_an_earlier_attempt_cannot_inject_into_the_next(relay: Relay) -> None:
    spec = SPEC.model_copy(update={"max_retries": 1, "retry_backoff": 0.0})
    run = await submitted(relay.alice, spec)
    async with open_control(relay.pool) as control:
        first = await control.claim("w-0")
        zombie = relay.bare(first.token)
        async with open_run_link(zombie, role=Role.WORKER, run=run) as link:
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
    async with open_run_link(relay.bare(second.token), role=Role.WORKER, run=run) as link:
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
    async with open_run_link(relay.bare(assigned.token), role=Role.WORKER, run=run) as link:
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


# --- secrets in specs ------------------------------------------------------------------------------


async def test_secret_env_values_reach_the_worker_only(relay: Relay) -> None:
    spec = SPEC.model_copy(
        update={
            "env": {"WANDB_API_KEY": "s3cr3t-value", "MODE": "fast"},
            "secret_env": ["WANDB_API_KEY"],
        }
    )
    run = await submitted(relay.alice, spec)
    async with open_control(relay.alice) as control:
        shown = await control.get_run(run)
        listed = await control.list_runs()
    assert shown.spec.env == {"WANDB_API_KEY": REDACTED, "MODE": "fast"}
    assert listed[0].spec.env["WANDB_API_KEY"] == REDACTED
    async with open_run_link(relay.alice, role=Role.IDE, run=run) as link:
        assert link.run.spec.env["WANDB_API_KEY"] == REDACTED
    async with open_control(relay.pool) as control:
        assigned = await control.claim("w-0")
    assert assigned.run.spec.env["WANDB_API_KEY"] == "s3cr3t-value"


# --- limits ----------------------------------------------------------------------------------------


async def test_failed_authentications_are_slowed_down_and_good_ones_are_not(
    redis_store: Store,
) -> None:
    config = RelayConfig(auth_free=2, auth_delay=0.05)
    async with live_relay(redis_store, config) as relay:
        codes = [
            (await refusal(relay.bare("tthu_0123456789abcdef_" + "C" * 43))).code for _ in range(4)
        ]
        assert codes == [ErrorCode.UNAUTHORIZED] * 2 + [ErrorCode.TOO_MANY_FAILURES] * 2
        last = await refusal(relay.bare("nope"))
        assert last.code == ErrorCode.TOO_MANY_FAILURES and "waits 0.4 s" in last.message
        async with open_control(relay.alice) as control:  # the same address, a good token
            await control.list_runs()


async def test_connections_per_user_are_capped(redis_store: Store) -> None:
    config = RelayConfig(max_connections=2, max_control_connections=2)
    async with live_relay(redis_store, config) as relay:
        async with open_control(relay.alice), open_control(relay.alice):
            got = await refusal(relay.alice)
            assert got.code == ErrorCode.TOO_MANY_CONNECTIONS
            async with open_control(relay.bob):
                pass  # another user is not affected
        async with open_control(relay.alice):
            pass  # closed ones are counted out


async def test_idle_ide_links_never_lock_the_same_users_control_calls_out(
    redis_store: Store,
) -> None:
    """IDE and logs links are counted apart from control connections: a user whose adapters
    hold every link they may have still gets `tether ls` and `tether cancel`."""
    async with live_relay(redis_store, RelayConfig(max_connections=2)) as relay:
        run = await submitted(relay.alice)
        async with (
            open_run_link(relay.alice, role=Role.IDE, run=run),
            open_run_link(relay.alice, role=Role.IDE, run=run),
        ):
            async with connect(relay.url, compression=None) as ws:
                await ws.send(
                    wire.encode_frame(wire.Hello(role=Role.IDE, run=run, token=relay.alice.token))
                )
                refused = wire.decode_frame(await ws.recv())
            assert isinstance(refused, wire.Error)
            assert refused.code == ErrorCode.TOO_MANY_CONNECTIONS
            async with open_control(relay.alice) as control:
                assert [r.id for r in await control.list_runs()] == [run]


async def test_active_runs_per_user_are_capped(redis_store: Store) -> None:
    async with live_relay(redis_store, RelayConfig(max_active_runs=2)) as relay:
        async with open_control(relay.alice) as control:
            first = (await control.submit(SPEC)).id
            await control.submit(SPEC)
            with pytest.raises(RelayError) as info:
                await control.submit(SPEC)
            assert info.value.code == ErrorCode.TOO_MANY_RUNS
            await control.cancel(first)
            await control.submit(SPEC)  # room again
        await submitted(relay.bob)  # bob has his own allowance


async def test_a_big_message_before_the_handshake_is_refused(relay: Relay) -> None:
    async with connect(relay.url, compression=None, max_size=None) as ws:
        await ws.send(b"\x00" * (wire.MAX_HELLO_BYTES + 1))
        with trio.fail_after(10), pytest.raises(ConnectionClosed):  # noqa: PT012
            while True:
                await ws.recv()
        assert ws.close_code == 1009
    async with open_control(relay.alice):
        pass


async def test_a_hello_naming_no_token_is_audited_on_the_run_it_tried(relay: Relay) -> None:
    run = await submitted(relay.alice)
    async with connect(relay.url, compression=None) as ws:
        await ws.send(msgpack.packb({"t": "hello", "v": 1, "role": "ide", "run": run}))
        reply = msgpack.unpackb(await ws.recv())
    assert reply["code"] == "unauthorized"
    async with open_control(relay.alice) as control:
        trail = await control.audit(run)
    assert trail[-1].event == "refused" and trail[-1].source.startswith("127.0.0.1:")


# --- transport -------------------------------------------------------------------------------------


async def test_tls_relay_is_verified_by_clients(redis_store: Store, tmp_path: Path) -> None:
    ca = trustme.CA()
    cert = ca.issue_cert("localhost", "127.0.0.1")
    ca_file = tmp_path / "ca.pem"
    ca.cert_pem.write_to_path(str(ca_file))
    import ssl

    context = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
    cert.configure_cert(context)
    token, _ = await TokenStore(redis_store).create("alice")
    async with trio.open_nursery() as nursery:
        server = await nursery.start(
            lambda task_status: serve_relay(
                redis_store, port=0, ssl=context, task_status=task_status
            )
        )
        url = f"wss://localhost:{server_port(server)}"
        async with open_control(Endpoint(url, token=token, ca_file=str(ca_file))) as control:
            assert control.user == "alice"
        with pytest.raises(RelayError) as info:
            async with open_control(Endpoint(url, token=token)):  # the system CAs do not know it
                pass
        assert info.value.code == "tls" and "certificate" in info.value.message
        nursery.cancel_scope.cancel()


def test_a_plain_text_relay_refuses_to_listen_beyond_loopback() -> None:
    tether = str(Path(sys.executable).with_name("tether"))
    out = subprocess.run(
        [tether, "relay", "--host", "0.0.0.0", "--port", "0", "--redis", "redis://127.0.0.1:1"],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert out.returncode != 0
    assert "refusing to serve plain ws:// on 0.0.0.0" in out.stderr and "--insecure" in out.stderr
    half = subprocess.run(
        [tether, "relay", "--tls-cert", "cert.pem", "--redis", "redis://127.0.0.1:1"],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert half.returncode != 0 and "--tls-cert and --tls-key go together" in half.stderr
