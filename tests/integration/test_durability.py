"""Durability at the relay: reconnecting links, worker leases, the buffer cap, trimming, retention.

In-process relays on a real Redis-compatible server; links go through a FaultProxy where a test
cuts or refuses them.
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from contextlib import asynccontextmanager

import orjson
import pytest
import trio
from credentials import user_endpoint
from faults.proxy import FaultProxy

from protocol_specs.runs.runs import RunState
from protocol_specs.runs.spec import RunSpec
from protocol_specs.session.session import StatusEvent
from protocol_specs.wire import wire
from protocol_specs.wire.wire import ErrorCode, IdeLink, StreamName, WorkerLink
from relay.client import Endpoint, LinkPolicy, RunLink, open_control, open_run_link
from relay.server import RelayConfig, serve_relay, server_port
from relay.store import Cap, Store, keys

pytestmark = [pytest.mark.redis, pytest.mark.timeout(60)]

SPEC = RunSpec(command=["python", "app.py"], workdir="/home/me/project")
#: a link that notices a dead connection within about a second and retries at once
QUICK = LinkPolicy(
    ping_interval=0.3, ping_timeout=0.3, close_timeout=0.3, backoff_initial=0.01, backoff_max=0.05
)


@asynccontextmanager
async def relay(store: Store, config: RelayConfig) -> AsyncIterator[Endpoint]:
    async with trio.open_nursery() as nursery:
        server = await nursery.start(
            lambda task_status: serve_relay(store, port=0, config=config, task_status=task_status)
        )
        yield await user_endpoint(store, f"ws://127.0.0.1:{server_port(server)}")
        nursery.cancel_scope.cancel()


async def claimed_run(url: Endpoint) -> tuple[str, str]:
    """A claimed run's id, and the worker token its claim minted."""
    async with open_control(url) as control:
        run = (await control.submit(SPEC)).id
        token = (await control.claim("w-0")).token
    return run, token


def output(n: int) -> wire.DapEntry:
    body = {"seq": n, "type": "event", "event": "output", "body": {"output": f"line {n}\n"}}
    return wire.DapEntry(body=orjson.dumps(body), transient=True)


async def next_status(link: RunLink, event: str) -> wire.StatusEntry:
    with trio.fail_after(20):
        async for delivery in link.deliveries:
            entry = wire.decode_entry(delivery.entry)
            if isinstance(entry, wire.StatusEntry) and entry.event == event:
                return entry
    raise AssertionError(f"the link ended before a {event!r} status")


async def test_a_link_resumes_after_cuts_without_loss_or_duplicates(redis_store: Store) -> None:
    states: list[bool] = []
    async with relay(redis_store, RelayConfig()) as url, trio.open_nursery() as nursery:
        run, token = await claimed_run(url)
        proxy = FaultProxy("127.0.0.1", int(url.url.rsplit(":", 1)[1]))
        await nursery.start(proxy.run)
        async with (
            open_run_link(
                Endpoint(proxy.url_for(), token=token),
                link=WorkerLink(),
                run=run,
                policy=QUICK,
                on_state=lambda up, _detail: states.append(up),
            ) as worker,
            open_run_link(url, link=IdeLink(), run=run, policy=QUICK) as ide,
        ):
            for n in range(1, 301):
                await worker.publish(output(n))
                if n % 60 == 0:
                    await (proxy.reset() if n % 120 == 0 else proxy.cut())
            await worker.flush()
            got = []
            with trio.fail_after(20):
                async for delivery in ide.deliveries:
                    entry = wire.decode_entry(delivery.entry)
                    if isinstance(entry, wire.DapEntry):
                        got.append(orjson.loads(entry.body)["seq"])
                        if len(got) == 300:
                            break
            assert got == list(range(1, 301))
            assert worker.epoch >= 2 and False in states and states[-1] is True
        nursery.cancel_scope.cancel()
    stored = await redis_store.read_after(keys.stream(run, StreamName.TO_IDE), "0", count=1000)
    dap = [p for _, p in stored if isinstance(wire.decode_entry(p), wire.DapEntry)]
    assert len(dap) <= 300  # never twice (some may already be trimmed: the IDE received them)


async def test_a_worker_cut_off_past_its_lease_loses_the_run_and_learns_it(
    redis_store: Store,
) -> None:
    config = RelayConfig(lease=0.6)
    async with relay(redis_store, config) as url, trio.open_nursery() as nursery:
        run, token = await claimed_run(url)
        proxy = FaultProxy("127.0.0.1", int(url.url.rsplit(":", 1)[1]))
        await nursery.start(proxy.run)
        as_worker = Endpoint(proxy.url_for(), token=token)
        async with (
            open_run_link(url, link=IdeLink(), run=run, policy=QUICK) as ide,
            open_run_link(as_worker, link=WorkerLink(), run=run, policy=QUICK) as worker,
        ):
            await worker.publish(wire.StatusEntry(event=StatusEvent.STARTED))
            await worker.flush()
            assert worker.welcome is not None and worker.welcome.heartbeat == pytest.approx(0.2)
            proxy.refuse(True)
            await proxy.cut()  # the worker's host drops off the network
            lost = await next_status(ide, StatusEvent.WORKER_LOST)
            assert lost.state == RunState.LOST.value
            assert "stopped renewing its lease" in lost.detail
            proxy.refuse(False)  # it comes back: the run is no longer its to run
            with trio.fail_after(20):
                while not (worker.latest and worker.latest.run and worker.latest.run.finished):
                    await worker.deliveries.receive()  # the relay's terminate arrives too
            assert worker.run.state is RunState.LOST
        nursery.cancel_scope.cancel()


async def test_heartbeats_keep_a_quiet_worker_alive(redis_store: Store) -> None:
    config = RelayConfig(lease=0.6)
    async with relay(redis_store, config) as url:
        run, token = await claimed_run(url)
        as_worker = url.with_token(token)
        async with open_run_link(as_worker, link=WorkerLink(), run=run, policy=QUICK) as worker:
            await worker.publish(wire.StatusEntry(event=StatusEvent.STARTED))
            await trio.sleep(2.0)  # three leases of silence but for heartbeats
            async with open_control(url) as control:
                assert (await control.get_run(run)).state is RunState.RUNNING


async def test_the_buffer_cap_refuses_with_a_clear_error_until_the_reader_catches_up(
    redis_store: Store,
) -> None:
    config = RelayConfig(buffer_cap=Cap(entries=10))
    refused: list[wire.Error] = []
    async with relay(redis_store, config) as url:
        run, token = await claimed_run(url)  # "queued" and "claimed" are two entries of to_ide
        async with open_run_link(
            url.with_token(token),
            link=WorkerLink(),
            run=run,
            policy=QUICK,
            on_refused=lambda _n, e: refused.append(e),
        ) as worker:
            for n in range(1, 13):
                await worker.publish(output(n))
            await worker.flush()
            assert [e.code for e in refused] == [ErrorCode.BUFFER_FULL] * 4
            assert "holds 10 entries" in refused[0].message
            # status entries still get through: the IDE side always learns what happened
            await worker.publish(wire.StatusEntry(event=StatusEvent.BUFFER_FULL, detail="dropped"))
            await worker.flush()
            assert len(refused) == 4
            key = keys.stream(run, StreamName.TO_IDE)
            full = await redis_store.buffered_bytes(key)
            async with open_run_link(url, link=IdeLink(), run=run, policy=QUICK) as ide:
                await next_status(ide, StatusEvent.BUFFER_FULL)
                # the reader says what it received, then publishes: once that publish is
                # acknowledged, the relay has trimmed the transient entries it had received
                ide.report_now()
                await ide.publish(wire.PresenceEntry(origin="ide", epoch=1, attached=True))
                await ide.flush()
            assert 0 < await redis_store.buffered_bytes(key) < full / 4  # only statuses are kept
            await worker.publish(output(13))
            await worker.flush()
            assert len(refused) == 4  # room again


async def test_finished_runs_expire_after_the_retention(redis_store: Store) -> None:
    async with relay(redis_store, RelayConfig(retention=3600)) as url:
        async with open_control(url) as control:
            run = (await control.submit(SPEC)).id
            await control.cancel(run)
        for key in (keys.record(run), keys.manifest(run), keys.stream(run, StreamName.TO_IDE)):
            ttl = await redis_store.ttl(key)
            assert ttl is not None and 3590 < ttl <= 3600, key
