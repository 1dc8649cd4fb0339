"""A run that spans nodes, against a live relay on a real Redis-compatible server: node 0's worker
claims the attempt, node 1's joins it (refused while it is queued), each node's link renews its
own lease, node 0's ``started`` hands its rendezvous to the other nodes, and the attempt ends as
torchelastic's does (a node's non-zero exit at once; 0 once every node exited 0; a node whose
lease expired loses the attempt, and a retry is queued), telling every node to stop."""

from __future__ import annotations

import time
from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager
from dataclasses import dataclass

import orjson
import pytest
import trio
from websockets.trio.server import serve

from protocol_specs.access.auth import Scope
from protocol_specs.runs.resources import Resources
from protocol_specs.runs.runs import RunState
from protocol_specs.runs.spec import RunSpec
from protocol_specs.session.session import StatusEvent
from protocol_specs.wire import wire
from protocol_specs.wire.wire import ErrorCode, IdeLink, StreamName, WorkerLink
from relay.auth import TokenStore
from relay.client import Endpoint, RelayError, open_control, open_run_link
from relay.client.link import RunLink
from relay.server import Relay, RelayConfig, server_port
from relay.store import Store, keys

pytestmark = [pytest.mark.redis, pytest.mark.timeout(60)]


def _spec(nodes: int = 2, retries: int = 0) -> RunSpec:
    return RunSpec(
        command=["python", "app.py"],
        workdir="/w",
        resources=Resources(nodes=nodes),
        max_retries=retries,
        retry_backoff=0,
    )


@dataclass
class Live:
    relay: Relay
    alice: Endpoint
    pool: Endpoint
    store: Store
    now: list[float]


@asynccontextmanager
async def live(store: Store) -> AsyncIterator[Live]:
    now = [time.time()]
    clock: Callable[[], float] = lambda: now[0]  # noqa: E731
    tokens = TokenStore(store)
    alice, _ = await tokens.create("alice", scopes=[Scope.RUNS])
    pool, _ = await tokens.create("pool", scopes=[Scope.BACKEND])
    async with trio.open_nursery() as nursery:
        relay = Relay(store, config=RelayConfig(lease=30.0), clock=clock, background=nursery)
        await nursery.start(relay.fanout.listen)
        await nursery.start(relay.claims.serve)
        server = await nursery.start(
            lambda task_status: serve(relay.handle, 0, host="127.0.0.1", task_status=task_status)
        )
        url = f"ws://127.0.0.1:{server_port(server)}"
        yield Live(relay, Endpoint(url, token=alice), Endpoint(url, token=pool), store, now)
        nursery.cancel_scope.cancel()


async def _controls(store: Store, run: str) -> list[wire.ControlEntry]:
    entries = await store.read_after(keys.stream(run, StreamName.TO_WORKER), "0", count=1000)
    decoded = [wire.decode_entry(entry[1]) for entry in entries]
    return [entry for entry in decoded if isinstance(entry, wire.ControlEntry)]


async def _claimed(lv: Live, spec: RunSpec) -> tuple[str, Endpoint]:
    """A 2-node run, claimed by node 0's worker, joined by node 1's: the run and its token."""
    async with open_control(lv.alice) as alice, open_control(lv.pool) as pool:
        run = (await alice.submit(spec)).id
        with trio.fail_after(10):
            assigned = await pool.claim("host-a")
        as_worker = lv.pool.with_token(assigned.token)
        async with open_control(as_worker) as worker:
            joined = await worker.claim("host-b", run=run, attempt=1, node=1)
        assert joined.token == "" and joined.run.id == run
    return run, as_worker


async def _run_exits(store: Store, run: str) -> list[tuple[int | None, str]]:
    """The run's own ``exited`` entries in the IDE's stream (a node's, with ``node``, aside)."""
    entries = await store.read_after(keys.stream(run, StreamName.TO_IDE), "0", count=1000)
    decoded = [wire.decode_entry(entry[1]) for entry in entries]
    return [
        (e.exit_code, e.detail)
        for e in decoded
        if isinstance(e, wire.StatusEntry)
        and e.event == StatusEvent.EXITED
        and "node" not in e.data
    ]


async def _status(link: RunLink, event: str, **fields: object) -> None:
    await link.publish(wire.StatusEntry(event=event, **fields))  # type: ignore[arg-type]
    await link.flush()  # answered: stored, and applied to the run


async def test_node_1_joins_the_attempt_node_0_claimed_and_meets_it_at_its_rendezvous(
    redis_store: Store,
) -> None:
    async with live(redis_store) as lv:
        async with open_control(lv.alice) as alice, open_control(lv.pool) as pool:
            run = (await alice.submit(_spec())).id
            with pytest.raises(RelayError) as early:
                await pool.claim("host-b", run=run, attempt=1, node=1)
            assert early.value.code == ErrorCode.JOB_NOT_RUNNING
            assert "node 0 has not claimed attempt 1 yet" in early.value.message
            with trio.fail_after(10):
                assigned = await pool.claim("host-a")
            record = assigned.run
            assert [(r.node, r.host, r.state) for r in record.attempts[-1].nodes] == [
                (0, "host-a", "starting"),
                (1, "", "starting"),
            ]
            as_worker = lv.pool.with_token(assigned.token)
            async with open_control(as_worker) as worker:
                joined = await worker.claim("host-b", run=run, attempt=1, node=1)
                assert joined.token == "" and joined.run.state is RunState.STARTING
                assert joined.run.attempts[-1].nodes[1].host == "host-b"
                assert (await alice.get_run(run)).worker == "host-a"  # still node 0's claim
                with pytest.raises(RelayError) as beyond:
                    await worker.claim("host-c", run=run, attempt=1, node=2)
                assert beyond.value.code == ErrorCode.BAD_FRAME
                assert "there is no node 2" in beyond.value.message
            caught: list[RelayError] = []
            try:
                async with open_run_link(as_worker, link=WorkerLink(node=2), run=run, attempt=1):
                    pass
            except* RelayError as group:
                caught += [e for e in group.exceptions if isinstance(e, RelayError)]
            assert [e.code for e in caught] == [ErrorCode.BAD_FRAME]
            lv.now[0] += 10
            lease = lv.relay.config.lease
            async with (
                open_run_link(as_worker, link=WorkerLink(), run=run, attempt=1) as node0,
                open_run_link(as_worker, link=WorkerLink(node=1), run=run, attempt=1) as node1,
            ):
                # each link's opening renewed its own node's lease; node 1's did not confirm
                for node in (0, 1):
                    member = keys.lease(run, 1, node)
                    assert await lv.store.zscore(keys.LEASES, member) == lv.now[0] + lease
                assert (await alice.get_run(run)).attempts[-1].confirmed_at == lv.now[0]
                started = {"rendezvous": {"addr": "10.0.0.1", "port": 29500}}
                await _status(node0, StatusEvent.STARTED, data=started)
                assert await _controls(lv.store, run) == [
                    wire.ControlEntry(action="rendezvous", attempt=1, data=started["rendezvous"])
                ]
                await _status(node1, StatusEvent.STARTED)
                record = await alice.get_run(run)
                assert record.state is RunState.RUNNING
                assert [(r.host, r.state) for r in record.attempts[-1].nodes] == [
                    ("host-a", "running"),
                    ("host-b", "running"),
                ]


async def test_a_node_exiting_non_zero_ends_the_attempt_with_its_code_on_every_node(
    redis_store: Store,
) -> None:
    async with live(redis_store) as lv:
        run, as_worker = await _claimed(lv, _spec())
        async with (
            open_run_link(as_worker, link=WorkerLink(), run=run, attempt=1) as node0,
            open_run_link(as_worker, link=WorkerLink(node=1), run=run, attempt=1) as node1,
        ):
            rendezvous = {"rendezvous": {"addr": "10.0.0.1", "port": 29500}}
            await _status(node0, StatusEvent.STARTED, data=rendezvous)
            await _status(node1, StatusEvent.STARTED)
            node_exit = {"attempt": 1, "final": True, "node": 1}  # as the node's worker says it
            await _status(node1, StatusEvent.EXITED, exit_code=3, data=node_exit)
        async with open_control(lv.alice) as alice:
            record = await alice.get_run(run)
        assert (record.state, record.exit_code) == (RunState.FAILED, 3)
        assert record.detail == "node 1 exited with code 3"
        assert [(r.state, r.exit_code) for r in record.attempts[-1].nodes] == [
            ("running", None),
            ("exited", 3),
        ]
        terminate = [c for c in await _controls(lv.store, run) if c.action == "terminate"]
        assert [(c.attempt, c.detail) for c in terminate] == [(1, "node 1 exited with code 3")]
        assert await lv.store.zrange_by_score(keys.LEASES, float("inf"), 10) == []
        # the IDE is told the run's end by the relay: a node's exit is that node's news
        assert await _run_exits(lv.store, run) == [(3, "node 1 exited with code 3")]


async def test_the_attempt_succeeds_once_every_node_exited_0(redis_store: Store) -> None:
    async with live(redis_store) as lv:
        run, as_worker = await _claimed(lv, _spec())
        async with (
            open_run_link(as_worker, link=WorkerLink(), run=run, attempt=1) as node0,
            open_run_link(as_worker, link=WorkerLink(node=1), run=run, attempt=1) as node1,
            open_control(lv.alice) as alice,
        ):
            rendezvous = {"rendezvous": {"addr": "10.0.0.1", "port": 29500}}
            await _status(node0, StatusEvent.STARTED, data=rendezvous)
            await _status(node1, StatusEvent.STARTED)
            node_exit = {"attempt": 1, "final": True, "node": 0}
            await _status(node0, StatusEvent.EXITED, exit_code=0, data=node_exit)
            assert (await alice.get_run(run)).state is RunState.RUNNING  # node 1 still runs
            assert await _run_exits(lv.store, run) == []  # so the IDE's sessions go on
            await _status(node1, StatusEvent.EXITED, exit_code=0, data={**node_exit, "node": 1})
            record = await alice.get_run(run)
        assert (record.state, record.exit_code) == (RunState.SUCCEEDED, 0)
        assert [r.state for r in record.attempts[-1].nodes] == ["exited", "exited"]
        assert [c.action for c in await _controls(lv.store, run)] == ["rendezvous", "terminate"]
        assert await _run_exits(lv.store, run) == [(0, "all 2 nodes exited with code 0")]


async def test_a_node_whose_lease_expires_loses_the_attempt_and_a_retry_is_queued(
    redis_store: Store,
) -> None:
    async with live(redis_store) as lv:
        run, as_worker = await _claimed(lv, _spec(retries=1))
        registry = lv.relay.registry
        async with open_run_link(as_worker, link=WorkerLink(), run=run, attempt=1) as node0:
            rendezvous = {"rendezvous": {"addr": "10.0.0.1", "port": 29500}}
            await _status(node0, StatusEvent.STARTED, data=rendezvous)
            lv.now[0] += lv.relay.config.lease + 1
            assert await registry.renew_lease(run, 1, 0)  # node 0's heartbeat; node 1 is silent
            assert await registry.sweep() == [run]
        async with open_control(lv.alice) as alice:
            record = await alice.get_run(run)
        assert (record.state, record.attempt) == (RunState.QUEUED, 2)
        first = record.attempts[0]
        assert first.outcome == "lost" and first.detail.startswith(
            "node 1's worker stopped renewing its lease"
        )
        assert [r.state for r in first.nodes] == ["running", "lost"]
        terminate = [c for c in await _controls(lv.store, run) if c.action == "terminate"]
        assert [c.attempt for c in terminate] == [1]
        assert "attempt 1 was lost: node 1's worker" in terminate[0].detail
        assert await lv.store.zrange_by_score(keys.LEASES, float("inf"), 10) == []


async def _received_all(link: RunLink, upto: wire.DapEntry) -> None:
    """``link`` took ``upto`` from its stream and told the relay so (a publish after the report,
    answered, says the relay handled the report: a link's frames are handled in order)."""
    with trio.fail_after(15):
        async for delivery in link.deliveries:
            if wire.decode_entry(delivery.entry) == upto:
                break
    link.report_now()
    output = {"seq": 1, "type": "event", "event": "output", "body": {"output": "x"}}
    await link.publish(wire.DapEntry(origin="", body=orjson.dumps(output), transient=True))
    await link.flush()


async def test_to_worker_keeps_a_request_until_every_node_received_it(redis_store: Store) -> None:
    """An IDE's live request (transient: deleted once received) is for one node's process, but
    every node reads ``to_worker``: node 0 having received it must not delete it before node 1
    did, or node 1, reconnecting from its cursor, never gets it (it hung a node's processes)."""
    request = {"seq": 5, "type": "request", "command": "evaluate", "arguments": {"expression": "1"}}
    asked = wire.DapEntry(origin="ide1", body=orjson.dumps(request), transient=True, process="n1")
    async with live(redis_store) as lv:
        run, as_worker = await _claimed(lv, _spec())
        stream = keys.stream(run, StreamName.TO_WORKER)

        async def kept() -> bool:
            return any(
                wire.decode_entry(payload) == asked
                for _id, payload in await lv.store.read_after(stream, "0", count=1000)
            )

        async with (
            open_run_link(lv.alice, link=IdeLink(), run=run) as ide,
            open_run_link(as_worker, link=WorkerLink(), run=run, attempt=1) as node0,
        ):
            await ide.publish(asked)
            await ide.flush()
            await _received_all(node0, asked)
            assert await kept()  # node 1 has not received it yet
            async with open_run_link(
                as_worker, link=WorkerLink(node=1), run=run, attempt=1
            ) as node1:
                await _received_all(node1, asked)
            assert not await kept()  # every node received it: it goes
