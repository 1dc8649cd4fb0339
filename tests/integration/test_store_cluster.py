"""The store on a real Redis Cluster of three masters (``tests/redis_cluster.py``): what only a
cluster has. The conformance suite itself runs on the cluster too (``store`` fixture, ``cluster``)."""

from __future__ import annotations

import pytest
import trio
from conftest import RedisServer
from redis_cluster import RedisCluster, command

from relay.store import GlideStore, StoreError, keys, open_store

pytestmark = [pytest.mark.redis, pytest.mark.cluster]


def slot(cluster: RedisCluster, key: str) -> int:
    return int(command(cluster.nodes[0].port, "CLUSTER", "KEYSLOT", key)[1:])


def test_every_key_of_a_run_is_in_the_runs_slot(redis_cluster: RedisCluster) -> None:
    """One script may touch any of a run's keys; the global keys are single-key only."""
    run_keys = [
        *keys.run_keys("r1"),
        *keys.tunnel_keys("r1", "t1"),
        keys.tunnels("r1", 1),
        keys.held("r1"),
    ]
    assert {slot(redis_cluster, k) for k in run_keys} == {slot(redis_cluster, "{r1}")}
    queue = keys.queue("local")  # no hash tag: its companions are tagged with its whole name
    assert {
        slot(redis_cluster, k)
        for k in (queue, keys.meta_key(queue), keys.watchers_key(queue), keys.transient_key(queue))
    } == {slot(redis_cluster, queue)}
    # runs spread over the masters
    owners = {redis_cluster.owner(keys.record(f"run-{i}")) for i in range(30)}
    assert owners == {0, 1, 2}


async def test_any_node_or_a_seed_list_finds_the_whole_cluster(
    redis_cluster: RedisCluster,
) -> None:
    one_node = f"redis://127.0.0.1:{redis_cluster.nodes[1].port}"
    dead_first = f"redis://127.0.0.1:1,127.0.0.1:{redis_cluster.nodes[2].port}"
    for url in (one_node, dead_first, redis_cluster.url):
        async with open_store(url) as store:
            assert isinstance(store, GlideStore) and store.cluster
            for i in range(6):  # keys on every master, through the one client
                await store.set_bytes(f"tether-test:{{k{i}}}", b"%d" % i)
                assert await store.get_bytes(f"tether-test:{{k{i}}}") == b"%d" % i
            await store.delete(*(f"tether-test:{{k{i}}}" for i in range(6)))


async def test_a_cluster_has_database_zero_only(redis_cluster: RedisCluster) -> None:
    with pytest.raises(ValueError, match="database 0 only"):
        async with open_store(f"redis://127.0.0.1:{redis_cluster.nodes[0].port}/2"):
            pass


async def test_several_hosts_must_be_a_cluster(
    redis_cluster: RedisCluster, redis_instance: RedisServer
) -> None:
    url = f"redis://127.0.0.1:{redis_instance.tcp_port},127.0.0.1:1"
    with pytest.raises(StoreError, match="not the nodes of a Redis Cluster"):
        async with open_store(url):
            pass


async def test_a_run_outlives_a_restart_of_the_master_holding_it(
    redis_cluster: RedisCluster,
) -> None:
    """The master holding a run's slot stops (SIGTERM) and comes back from its append-only file:
    what was stored is there, and the same store (client) writes again once it is back."""
    stream = keys.stream("restarted-run", "to_ide")
    async with open_store(redis_cluster.url) as store:
        await store.flushall()
        before = await store.append_once(stream, "w", 1, b"before")
        await trio.to_thread.run_sync(redis_cluster.restart, redis_cluster.owner(stream))
        with trio.fail_after(30):
            while True:
                try:
                    after = await store.append_once(stream, "w", 2, b"after")
                    break
                except StoreError:
                    await trio.sleep(0.1)  # glide reconnects on its own schedule
        assert after.outcome == "stored" and after.prev == before.cursor
        assert [p for _, p in await store.read_after(stream, "0")] == [b"before", b"after"]
