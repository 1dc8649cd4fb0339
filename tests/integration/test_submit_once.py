"""A submit whose relay dies half-way: the run is queued once, or said lost, never left queued
with nothing in its queue (``protocol_specs/runs/submits.py``, ``relay/runs/submitting.py``).

Two relays serve one real Redis-compatible server, in-process, over real WebSockets, reached
through a :class:`~faults.proxy.FaultProxy`; relay A dies (its tasks cancelled: nothing of it runs
after, as after a SIGKILL) at a chosen step of a submit. A real worker pool runs what is queued;
each program's side effect is counted.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import trio
from faults.proxy import FaultProxy
from test_lost_claims import relay

from adapter.cli.submission import submit_run
from protocol_specs.access.auth import Scope
from protocol_specs.runs.runs import RunRecord, RunState
from protocol_specs.runs.spec import RunSpec
from protocol_specs.runs.submits import run_id_for
from relay.auth import TokenStore
from relay.client import Endpoint, RelayError, follow_logs, open_control
from relay.runs import submitting
from relay.store import Store, keys
from worker_shim.backends.pool import run_pool

pytestmark = [pytest.mark.redis, pytest.mark.slow, pytest.mark.timeout(120)]


def counting(ran: Path, *, workdir: str = "/w") -> RunSpec:
    code = f"open({str(ran)!r}, 'a').write('ran\\n')"
    return RunSpec(command=["python", "-c", code], workdir=workdir, debug=False, debuggable=False)


async def ended(relay_url: Endpoint, run_id: str) -> RunRecord:
    """The run's record once it ended (its logs followed to their end)."""
    with trio.fail_after(60):
        await follow_logs(relay_url, run_id, lambda _entry: None)
    async with open_control(relay_url) as control:
        return await control.get_run(run_id)


async def test_a_submit_asked_again_after_its_relay_died_queues_the_run_once(
    redis_store: Store, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Relay A writes the run's record and dies before the run is in its queue: the CLI's submit
    asks again through the proxy with the same key; relay B finds the run, finishes its submit,
    and the run runs once."""
    monkeypatch.setenv("TETHER_HOME", str(tmp_path / "home"))
    tokens = TokenStore(redis_store)
    alice, _ = await tokens.create("alice", scopes=[Scope.RUNS])
    pool_token, _ = await tokens.create("pool", scopes=[Scope.BACKEND])
    workdir = tmp_path / "project"
    workdir.mkdir()
    (workdir / "train.py").write_text("print('hi')\n")
    ran = tmp_path / "ran"
    spec = counting(ran, workdir=str(workdir))
    proxy = FaultProxy("127.0.0.1", 1)
    died: list[str] = []
    async with trio.open_nursery() as nursery:
        relay_a, port_a, kill_a = await nursery.start(relay, redis_store)
        _, port_b, _ = await nursery.start(relay, redis_store)
        await nursery.start(proxy.run)
        proxy.retarget("127.0.0.1", port_a)
        enqueue = relay_a.registry.enqueue

        async def dies_instead(record: RunRecord) -> None:
            died.append(record.id)
            proxy.retarget("127.0.0.1", port_b)
            kill_a.cancel()  # the record is written; the queue entry never is
            await trio.sleep_forever()

        relay_a.registry.enqueue = dies_instead  # type: ignore[method-assign]
        del enqueue
        pool = Endpoint(f"ws://127.0.0.1:{port_b}", token=pool_token)
        await nursery.start(
            lambda task_status: run_pool(
                pool, slots=1, work_dir=tmp_path / "pool", gpus=[], name="p",
                task_status=task_status,
            )
        )  # fmt: skip
        said: list[str] = []
        record = await submit_run(Endpoint(proxy.url_for(), token=alice), spec, said.append)
        done = await ended(Endpoint(f"ws://127.0.0.1:{port_b}", token=alice), record.id)
        nursery.cancel_scope.cancel()
    assert died == [record.id]  # the run relay A half-submitted is the one answered
    assert any("asking again (the same run" in line for line in said), said
    assert done.state is RunState.SUCCEEDED and [a.n for a in done.attempts] == [1]
    assert ran.read_text() == "ran\n", "the program ran exactly once"
    assert await redis_store.zrange_by_score(keys.SUBMITTING, float("inf"), 10) == []


@pytest.mark.parametrize("cut", ["before the queue", "before the manifest"])
async def test_a_submit_nobody_asks_again_is_finished_by_a_sweep(
    redis_store: Store, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, cut: str
) -> None:
    """Relay A dies half-way through a submit and nobody asks again: relay B's sweep finishes it
    (the run is queued and runs once), or, if the snapshot's manifest was never kept, ends the
    run ``lost`` saying so: never queued with nothing in its queue."""
    monkeypatch.setattr(submitting, "FINISH_AFTER", 0.5)
    tokens = TokenStore(redis_store)
    alice, _ = await tokens.create("alice", scopes=[Scope.RUNS])
    pool_token, _ = await tokens.create("pool", scopes=[Scope.BACKEND])
    ran = tmp_path / "ran"
    key = "00" * 16
    async with trio.open_nursery() as nursery:
        relay_a, port_a, kill_a = await nursery.start(relay, redis_store)
        _, port_b, _ = await nursery.start(relay, redis_store)
        registry = relay_a.registry

        async def dies(*_args: Any, **_kwargs: Any) -> None:
            kill_a.cancel()
            await trio.sleep_forever()

        if cut == "before the queue":
            registry.enqueue = dies  # type: ignore[method-assign]
        else:
            monkeypatch.setattr(submitting, "_keep_manifest", dies)
        with pytest.raises((RelayError, BaseExceptionGroup)):  # its relay died: no answer
            async with open_control(Endpoint(f"ws://127.0.0.1:{port_a}", token=alice)) as c:
                await c.submit(counting(ran), key=key)
        run_id = run_id_for("alice", key)
        await nursery.start(
            lambda task_status: run_pool(
                Endpoint(f"ws://127.0.0.1:{port_b}", token=pool_token), slots=1,
                work_dir=tmp_path / "pool", gpus=[], name="p", task_status=task_status,
            )
        )  # fmt: skip
        done = await ended(Endpoint(f"ws://127.0.0.1:{port_b}", token=alice), run_id)
        nursery.cancel_scope.cancel()
    if cut == "before the queue":
        assert done.state is RunState.SUCCEEDED and ran.read_text() == "ran\n"
    else:
        assert done.state is RunState.LOST and "submit it again" in done.detail
        assert not ran.exists()
    assert await redis_store.zrange_by_score(keys.SUBMITTING, float("inf"), 10) == []
