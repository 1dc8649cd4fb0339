"""The rank group across nodes through a live relay (``live_relay.py``, real Redis, real
WebSockets): one node's worker link publishes a ``group`` entry, the relay stores it in the run's
``to_worker`` (not the link's ``to_ide``), and the other node's worker link reads it there, in
order with an IDE's requests; an IDE's history holds it and the adapter's fold skips it quietly;
only a worker link may publish one."""

from __future__ import annotations

import logging
from collections.abc import AsyncIterator

import orjson
import pytest
import trio
from live_relay import SPEC, Relay, live_relay

from adapter.dap.core import AdapterCore
from adapter.dap.processes import Processes
from protocol_specs.link.link import Cursor
from protocol_specs.runs.resources import Resources
from protocol_specs.wire import wire
from protocol_specs.wire.wire import (
    DapEntry,
    ErrorCode,
    GroupEntry,
    IdeLink,
    StreamName,
    WorkerLink,
)
from relay.client import RunLink, open_control, open_run_link
from relay.store import Store, keys
from relay.web.debug_view import debug_view

pytestmark = [pytest.mark.redis, pytest.mark.timeout(60)]

TWO_NODES = SPEC.model_copy(update={"resources": Resources(nodes=2)})
CONTINUE = orjson.dumps({"seq": 4, "type": "request", "command": "continue",
                         "arguments": {"threadId": 1}})  # fmt: skip


@pytest.fixture
async def relay(redis_store: Store) -> AsyncIterator[Relay]:
    async with live_relay(redis_store) as r:
        yield r


async def next_entry(link: RunLink, kind: type) -> tuple[wire.Deliver, object]:
    """The link's next delivery of an entry of ``kind`` (others, such as history, skipped)."""
    with trio.fail_after(15):
        async for delivery in link.deliveries:
            entry = wire.decode_entry(delivery.entry)
            if isinstance(entry, kind):
                return delivery, entry
    raise AssertionError("the link ended")


async def test_a_nodes_group_entry_reaches_the_other_nodes_worker_through_to_worker(
    relay: Relay, caplog: pytest.LogCaptureFixture
) -> None:
    async with open_control(relay.alice) as alice:
        run = (await alice.submit(TWO_NODES)).id
    async with open_control(relay.pool) as pool:
        assigned = await pool.claim("w-0")
    worker = relay.pool.with_token(assigned.token)
    stop = GroupEntry(op="stop", node=0, attempt=1, rank=1, at=1.0)
    async with (
        open_run_link(worker, link=WorkerLink(), run=run, attempt=1) as node0,
        open_run_link(worker, link=WorkerLink(), run=run, attempt=1) as node1,
        open_run_link(relay.alice, link=IdeLink(), run=run) as ide,
    ):
        await ide.publish(DapEntry(origin="ide1", body=CONTINUE, process="201"))
        await ide.flush()
        await node0.publish(stop)
        await node0.flush()
        # node 1 reads it in to_worker, after the IDE's request before it
        first, request = await next_entry(node1, DapEntry)
        got, entry = await next_entry(node1, GroupEntry)
        assert entry == stop and got.stream == StreamName.TO_WORKER
        assert isinstance(request, DapEntry) and request.body == CONTINUE
        assert Cursor.parse(first.cursor) < Cursor.parse(got.cursor)
    store = relay.store
    stored = [
        wire.decode_entry(p)
        for _, p in await store.read_after(keys.stream(run, StreamName.TO_WORKER), "0", count=50)
    ]
    assert stop in stored
    to_ide = [
        wire.decode_entry(p)
        for _, p in await store.read_after(keys.stream(run, StreamName.TO_IDE), "0", count=50)
    ]
    assert not [e for e in to_ide if isinstance(e, GroupEntry)]  # not the link's own stream

    # an IDE that attaches now: its history holds the entry, and the adapter's fold skips it
    main = AdapterCore(run, clock=trio.current_time)
    processes = Processes(main)
    caplog.set_level(logging.DEBUG)
    async with open_run_link(relay.alice, link=IdeLink(history=True), run=run) as late:
        delivery, entry = await next_entry(late, GroupEntry)
        assert entry == stop
        assert processes.on_delivery(delivery.stream, entry, replaying=True) == []
        assert processes.on_delivery(delivery.stream, entry) == []
    assert not [r for r in caplog.records if r.levelno >= logging.WARNING]
    async with open_control(relay.alice) as alice:
        record = await alice.get_run(run)
    view = await debug_view(store, record)  # the web view's fold: no complaint either
    assert view.complete


async def test_only_a_worker_link_may_publish_a_group_entry(relay: Relay) -> None:
    async with open_control(relay.alice) as alice:
        run = (await alice.submit(TWO_NODES)).id
    refused: list[wire.Error] = []
    async with open_run_link(
        relay.alice, link=IdeLink(), run=run, on_refused=lambda _n, e: refused.append(e)
    ) as ide:
        await ide.publish(GroupEntry(op="pause", node=0, attempt=1, rank=0))
        await ide.flush()
    assert [e.code for e in refused] == [ErrorCode.FORBIDDEN]
    stored = await relay.store.read_after(keys.stream(run, StreamName.TO_WORKER), "0", count=50)
    assert not [p for _, p in stored if isinstance(wire.decode_entry(p), GroupEntry)]
