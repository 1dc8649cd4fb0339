"""A claim whose answer was lost with its relay: the run goes back to the queue at the same attempt,
then runs once and succeeds (``protocol_specs/runs/claims.py``).

Two relays serve one real Redis-compatible server, in-process, over real WebSockets; a real worker
pool (``run_pool``: one slot, real programs) reaches them through a
:class:`~faults.proxy.FaultProxy`. Relay A dies (its tasks cancelled, no goodbye: nothing of it runs
after its claim was written, as after a SIGKILL) right after it recorded the pool's claim and
before it answered. The pool loses its connection, finds relay B through the proxy and waits there;
relay B's sweep finds the claim unconfirmed past its deadline and puts the run back in the queue at
attempt 1, revoking the token the lost answer carried; the pool claims it again, confirms, and runs
it. The program's side effect is counted: once.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import trio
from faults.proxy import FaultProxy

from protocol_specs.access.auth import Scope
from protocol_specs.runs.runs import RunState
from protocol_specs.runs.spec import RunSpec
from protocol_specs.session.session import StatusEvent
from protocol_specs.wire import wire
from relay.auth import TokenStore
from relay.client import Endpoint, follow_logs, open_control
from relay.runs.claiming import Claimed
from relay.server import Relay, RelayConfig, server_port
from relay.store import Store, keys
from worker_shim.backends.pool import run_pool

pytestmark = [pytest.mark.redis, pytest.mark.slow, pytest.mark.timeout(120)]

#: a lost claim goes back after a second (and the next sweep), not the default 15 s
CONFIG = RelayConfig(claim_confirm=1.0)


async def relay(
    store: Store, *, task_status: trio.TaskStatus[tuple[Relay, int, trio.CancelScope]]
) -> None:
    """An in-process relay with its background tasks; cancelling its scope is its death."""
    from websockets.trio.server import serve

    async with trio.open_nursery() as nursery:
        node = Relay(store, config=CONFIG, background=nursery)
        await nursery.start(node.fanout.listen)
        await nursery.start(node.claims.serve)
        nursery.start_soon(node.sweep_forever)
        server = await nursery.start(
            lambda task_status: serve(node.handle, 0, host="127.0.0.1", task_status=task_status)
        )
        task_status.started((node, server_port(server), nursery.cancel_scope))


async def test_a_claim_whose_answer_died_with_its_relay_runs_once_at_the_same_attempt(
    redis_store: Store, tmp_path: Path
) -> None:
    tokens = TokenStore(redis_store)
    alice, _ = await tokens.create("alice", scopes=[Scope.RUNS])
    pool_token, _ = await tokens.create("pool", scopes=[Scope.BACKEND])
    ran = tmp_path / "ran"
    code = f"open({str(ran)!r}, 'a').write('ran\\n'); print('the answer is 42')"
    spec = RunSpec(
        command=["python", "-c", code], workdir="/w", debug=False, debuggable=False, name="lost"
    )
    lost: list[Claimed] = []
    proxy = FaultProxy("127.0.0.1", 1)
    async with trio.open_nursery() as nursery:
        relay_a, port_a, kill_a = await nursery.start(relay, redis_store)
        _, port_b, _ = await nursery.start(relay, redis_store)
        await nursery.start(proxy.run)
        proxy.retarget("127.0.0.1", port_a)
        claimed = relay_a.registry.claimed

        async def claimed_then_dies(run_id: str, worker: str, **how: Any) -> Claimed | None:
            got = await claimed(run_id, worker, **how)  # the claim is written...
            if got is not None:
                lost.append(got)
                proxy.retarget("127.0.0.1", port_b)  # (where the pool finds a relay next)
                kill_a.cancel()  # ...and relay A dies before its answer is sent
            return got

        relay_a.registry.claimed = claimed_then_dies  # type: ignore[method-assign]
        pool = Endpoint(proxy.url_for(), token=pool_token)
        await nursery.start(
            lambda task_status: run_pool(
                pool,
                slots=1,
                work_dir=tmp_path / "pool",
                gpus=[],
                name="p",
                task_status=task_status,
            )
        )
        with trio.fail_after(30):
            await relay_a.claims.wait_until("local", 1)
        as_alice = Endpoint(f"ws://127.0.0.1:{port_b}", token=alice)
        async with open_control(as_alice) as control:
            run = (await control.submit(spec)).id
        entries: list[Any] = []
        with trio.fail_after(60):
            await follow_logs(as_alice, run, entries.append)
        async with open_control(as_alice) as control:
            record = await control.get_run(run)
        nursery.cancel_scope.cancel()

    assert len(lost) == 1 and lost[0].record.id == run and lost[0].record.attempt == 1
    assert record.state is RunState.SUCCEEDED, record
    (attempt,) = record.attempts  # attempt 1 only: no retry spent, nothing lost
    assert (attempt.n, attempt.outcome, attempt.released) == (1, "succeeded", 1)
    assert attempt.worker == "p-0" and attempt.claim != lost[0].record.attempts[-1].claim
    assert ran.read_text() == "ran\n", "the program ran exactly once"
    output = b"".join(e.data for e in entries if isinstance(e, wire.LogEntry))
    assert b"the answer is 42" in output
    markers = [e for e in entries if isinstance(e, wire.StatusEntry)]
    again = [m for m in markers if m.event == StatusEvent.QUEUED and "queued again" in m.detail]
    assert len(again) == 1 and "was not confirmed within 1 s" in again[0].detail, markers
    # the lost answer's worker token was revoked with its claim; nothing is left to sweep
    revoked = await TokenStore(redis_store).get(lost[0].token.split("_")[1])
    assert revoked is not None and revoked.revoked_at > 0
    assert await redis_store.zrange_by_score(keys.UNCONFIRMED, float("inf"), 10) == []


async def test_a_jobs_worker_whose_claims_answer_died_asks_again_and_runs_once(
    redis_store: Store, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A scheduler job's worker (``run_one``: it claims its named attempt) loses its claim's answer
    with relay A: it asks again through the proxy (relay B answers that the attempt is claimed,
    until its sweep puts the unconfirmed claim back), then claims, confirms and runs it, once."""
    from relay.runs import claiming
    from worker_shim.backends.pool import run_one

    tokens = TokenStore(redis_store)
    alice, _ = await tokens.create("alice", scopes=[Scope.RUNS])
    backend_token, _ = await tokens.create("slurm", scopes=[Scope.BACKEND])
    ran = tmp_path / "ran"
    code = f"open({str(ran)!r}, 'a').write('ran\\n')"
    spec = RunSpec(command=["python", "-c", code], workdir="/w", debug=False, debuggable=False)
    proxy = FaultProxy("127.0.0.1", 1)
    lost: list[Claimed] = []
    async with trio.open_nursery() as nursery:
        _, port_a, kill_a = await nursery.start(relay, redis_store)
        _, port_b, _ = await nursery.start(relay, redis_store)
        await nursery.start(proxy.run)
        proxy.retarget("127.0.0.1", port_a)
        original = claiming.claim

        async def claimed_then_dies(*args: Any, **how: Any) -> Claimed | None:
            got = await original(*args, **how)  # the claim is written...
            if got is not None and not lost:
                lost.append(got)
                proxy.retarget("127.0.0.1", port_b)
                kill_a.cancel()  # ...and relay A dies before its answer is sent
            return got

        monkeypatch.setattr(claiming, "claim", claimed_then_dies)
        as_alice = Endpoint(f"ws://127.0.0.1:{port_b}", token=alice)
        async with open_control(as_alice) as control:
            run = (await control.submit(spec)).id
        said: list[str] = []
        with trio.fail_after(60):
            exit_code = await run_one(
                Endpoint(proxy.url_for(), token=backend_token), run, 1,
                work_dir=tmp_path / "job", worker="job-1", on_event=said.append,
            )  # fmt: skip
        async with open_control(as_alice) as control:
            record = await control.get_run(run)
        nursery.cancel_scope.cancel()
    assert exit_code == 0 and len(lost) == 1
    assert any("its claim's answer was lost with the relay" in line for line in said), said
    assert record.state is RunState.SUCCEEDED and [a.n for a in record.attempts] == [1]
    assert ran.read_text() == "ran\n", "the program ran exactly once"
