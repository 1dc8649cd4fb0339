"""Delivery through the fanout: across relay processes on one Redis, and past a lost subscription."""

from __future__ import annotations

import pytest
import trio
from credentials import user_endpoint

from protocol_specs.runs.spec import RunSpec
from protocol_specs.snapshots.snapshots import Manifest, ManifestEntry, digest_of
from protocol_specs.wire import wire
from protocol_specs.wire.wire import IdeLink, WorkerLink
from relay.client import Endpoint, open_control, open_run_link
from relay.links.fanout import Fanout, Item, Subscription
from relay.server import serve_relay, server_port
from relay.store import GlideStore, Store
from relay.store.base import NOTICE_PAYLOAD_BYTES

BODY = b'{"seq":1,"type":"request","command":"threads"}'
SOURCE = b"print(1)\n"
MANIFEST = Manifest(entries=[ManifestEntry(path="main.py", digest=digest_of(SOURCE), size=9)])


async def _relay(store: Store, nursery: trio.Nursery) -> str:
    server = await nursery.start(lambda task_status: serve_relay(store, task_status=task_status))
    return f"ws://127.0.0.1:{server_port(server)}"


@pytest.fixture
async def two_relays(redis_store: Store, nursery: trio.Nursery) -> list[Endpoint]:
    """Two relay processes' worth of relays (each its own fanout) on one Redis."""
    a = await user_endpoint(redis_store, await _relay(redis_store, nursery))
    b = Endpoint(await _relay(redis_store, nursery), token=a.token)
    return [a, b]


async def _claimed_run(relay: Endpoint, other: Endpoint) -> tuple[str, Endpoint]:
    """A run claimed through ``relay``; its worker's token, for ``other``."""
    async with open_control(relay) as control:
        await control.put_blob(MANIFEST.digests[0], SOURCE)
        record = await control.submit(
            RunSpec(command=["python", "main.py"], workdir="/home/me/project"), MANIFEST
        )
        assigned = await control.claim("w-0")
    return record.id, other.with_token(assigned.token)


async def _next_dap(link: object) -> bytes:
    while True:
        entry = wire.decode_entry((await link.deliveries.receive()).entry)  # type: ignore[attr-defined]
        if isinstance(entry, wire.DapEntry):
            return entry.body


async def test_peers_on_different_relays_reach_each_other(two_relays: list[Endpoint]) -> None:
    a, b = two_relays
    run, worker_at_b = await _claimed_run(a, b)
    async with (
        open_run_link(a, link=IdeLink(), run=run) as ide,
        open_run_link(worker_at_b, link=WorkerLink(), run=run) as worker,
    ):
        for n in range(1, 4):
            body = BODY.replace(b"1", str(n).encode(), 1)
            await ide.publish(wire.DapEntry(origin="a", body=body))
            with trio.fail_after(5):
                assert await _next_dap(worker) == body
            await worker.publish(wire.DapEntry(body=body))
            with trio.fail_after(5):
                assert await _next_dap(ide) == body


async def test_a_lost_subscription_loses_no_delivery(
    two_relays: list[Endpoint], redis_store: Store
) -> None:
    """Redis drops the relays' notice subscriptions; what was appended meanwhile still arrives."""
    if not isinstance(redis_store, GlideStore):
        pytest.skip("pub/sub is Redis's")
    a, b = two_relays
    run, worker_at_b = await _claimed_run(a, b)
    async with (
        open_run_link(a, link=IdeLink(), run=run) as ide,
        open_run_link(worker_at_b, link=WorkerLink(), run=run) as worker,
    ):
        await worker.publish(wire.DapEntry(body=b'{"seq":1,"type":"event","event":"a"}'))
        with trio.fail_after(5):
            await _next_dap(ide)
        killed = await redis_store._client.custom_command(["CLIENT", "KILL", "TYPE", "pubsub"])
        assert killed >= 2  # both relays' subscribers
        await worker.publish(wire.DapEntry(body=b'{"seq":2,"type":"event","event":"b"}'))
        with trio.fail_after(10):
            assert b'"b"' in await _next_dap(ide)


async def test_another_processes_small_appends_arrive_without_a_read(
    store: Store, nursery: trio.Nursery
) -> None:
    """A notice carries a small entry: the relay process that delivers it reads nothing back
    (the IDE on one relay, the worker on another); a big one it reads."""
    here = Fanout(store)
    await nursery.start(here.listen)
    got, seen = trio.open_memory_channel[list[Item]](10)

    async def deliver(subscription: Subscription) -> None:
        while True:
            await got.send(await subscription.next_batch())

    async with here.subscribe("{r}:s", "0") as subscription:
        nursery.start_soon(deliver, subscription)
        await subscription.sent(5)  # caught up (one read: nothing there yet), waiting
        small = await store.append_once("{r}:s", "elsewhere", 1, b"small", notify_except="other")
        with trio.fail_after(5):
            assert await seen.receive() == [Item(small.cursor, b"small", "elsewhere", 1)]
        assert subscription.reads == 1  # its first catch-up only
        big = b"b" * (NOTICE_PAYLOAD_BYTES + 1)
        large = await store.append_once("{r}:s", "elsewhere", 2, big, notify_except="other")
        with trio.fail_after(5):
            assert await seen.receive() == [Item(large.cursor, big, "elsewhere", 2)]
        assert subscription.reads >= 2  # read back (and once more if a notice may be lost)
        nursery.cancel_scope.cancel()
