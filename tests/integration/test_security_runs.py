"""Who sees what: another user's runs, their audit trail of refusals, roles and scopes, tokens,
and secret values of a spec (the worker's only).

Against a live relay (``live_relay.py``) on a real Redis-compatible server over real
WebSockets. Each test names the refusal it pins; each also checks that the refused peer got
nothing and that the relay still serves the others.
"""

from __future__ import annotations

from collections.abc import AsyncIterator

import pytest
from live_relay import SPEC, Relay, live_relay, refusal, submitted

from protocol_specs.access.auth import Scope
from protocol_specs.runs.runs import RunState
from protocol_specs.runs.spec import REDACTED
from protocol_specs.wire.tunnels import TunnelSpec
from protocol_specs.wire.wire import ErrorCode, IdeLink, Role
from relay.client import RelayError, open_control, open_run_link
from relay.server import RelayConfig
from relay.store import Store, keys

pytestmark = [pytest.mark.redis, pytest.mark.timeout(60)]


@pytest.fixture
async def relay(redis_store: Store) -> AsyncIterator[Relay]:
    async with live_relay(redis_store) as r:
        yield r


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
    async with open_run_link(relay.alice, link=IdeLink(), run=run) as link:
        assert link.run.spec.env["WANDB_API_KEY"] == REDACTED
    async with open_control(relay.pool) as control:
        assigned = await control.claim("w-0")
    assert assigned.run.spec.env["WANDB_API_KEY"] == "s3cr3t-value"
