"""Benchmark 12: scale out: 1, 2 and 4 relay processes on one Redis Cluster of three masters.

The cluster is started from Debian's ``redis-server`` where it is installed (else the bundled
server) by ``tests/redis_cluster.py``. For each number of relays, on the same cluster:

- **live round trips alone**: a run's two ends as the adapter and the worker hold them (run links,
  ``early`` delivery), the IDE's on the first relay and the worker's on the last, so with several
  relays every message crosses from one relay process to another through the cluster; the worker
  end echoes each DAP entry; one at a time.
- **idle sessions**: queued debug sessions as section 5 makes them (a link that published its
  configuration with 20 breakpoints, then idles; held by a process of their own), spread over the
  relays in turn; how long they
  took to set up, the relays' resident memory and the masters' ``used_memory`` per session, and
  the live round trips again beside them.
- **throughput**: many such pairs echoing at once (the IDE's end on relay ``i``, the worker's on
  relay ``i + 1``), round trips per second over all of them.

On a two-core machine the relays, the three masters and the benchmark's own clients share two
cores: more relays add capacity only where cores are free, and what this shows here is that
relays spread the load without costing latency or memory.
"""

from __future__ import annotations

import itertools
import shutil
from collections.abc import AsyncIterator
from contextlib import AsyncExitStack, asynccontextmanager
from pathlib import Path
from typing import Any

import orjson
import trio

from protocol_specs.runs.spec import RunSpec
from protocol_specs.wire import wire
from protocol_specs.wire.wire import IdeLink, WorkerLink
from relay.client import RunLink, open_control, open_run_link
from relay.embedded.server import bundled_server_binary
from tests.e2e.harness import admin_token, tether
from tests.redis_cluster import RedisCluster

from . import idle
from .common import Dist, Endpoint, ms, redis_used_memory, rss_kib, verdict
from .idle_holder import held_sessions

RELAYS = (1, 2, 4)


@asynccontextmanager
async def open_cluster() -> AsyncIterator[RedisCluster]:
    binary = shutil.which("redis-server") or bundled_server_binary()
    assert binary is not None, "no redis-server on the PATH and no bundled server"
    cluster = await trio.to_thread.run_sync(RedisCluster.start, binary)
    try:
        yield cluster
    finally:
        await trio.to_thread.run_sync(cluster.stop)


async def cluster_used_memory(cluster: RedisCluster) -> int:
    return sum([await redis_used_memory(f"redis://127.0.0.1:{n.port}") for n in cluster.nodes])


class Pair:
    """A run's two ends: the IDE's link publishes, the worker's echoes every DAP entry back."""

    def __init__(self, ide: RunLink) -> None:
        self.ide = ide
        self.seq = itertools.count(1)

    async def round_trip(self) -> float:
        body = orjson.dumps({"seq": next(self.seq), "type": "request", "command": "threads"})
        t0 = trio.current_time()
        await self.ide.publish(wire.DapEntry(origin="bench", body=body))
        async for delivery in self.ide.deliveries:
            entry = wire.decode_entry(delivery.entry)
            if isinstance(entry, wire.DapEntry) and entry.body == body:
                return (trio.current_time() - t0) * 1000
        raise RuntimeError("the IDE's link ended")


async def _echo(link: RunLink) -> None:
    async for delivery in link.deliveries:
        entry = wire.decode_entry(delivery.entry)
        if isinstance(entry, wire.DapEntry):
            await link.publish(wire.DapEntry(origin="bench-worker", body=entry.body))


@asynccontextmanager
async def open_pairs(
    ide_ends: list[Endpoint], worker_ends: list[Endpoint], count: int
) -> AsyncIterator[list[Pair]]:
    """``count`` runs, each claimed by an echoing worker end; pair ``i``'s IDE end on
    ``ide_ends[i % n]``, its worker end on ``worker_ends[i % n]``."""
    async with AsyncExitStack() as stack:
        nursery = await stack.enter_async_context(trio.open_nursery())
        pairs = []
        control = await stack.enter_async_context(open_control(ide_ends[0], client="bench"))
        for i in range(count):
            spec = RunSpec(
                command=["python", "x.py"], workdir="/tmp", name=f"echo-{i}", backend="echo"
            )
            record = await control.submit(spec)
            assigned = await control.claim(
                "bench-worker", backend="echo", run=record.id, attempt=record.attempt
            )
            where = worker_ends[i % len(worker_ends)]
            worker = await stack.enter_async_context(
                open_run_link(
                    Endpoint(where.url, token=assigned.token),
                    link=WorkerLink(early=True),
                    run=record.id,
                    attempt=assigned.run.attempt,
                )
            )
            nursery.start_soon(_echo, worker)
            ide = await stack.enter_async_context(
                open_run_link(ide_ends[i % len(ide_ends)], link=IdeLink(early=True), run=record.id)
            )
            pairs.append(Pair(ide))
        try:
            yield pairs
        finally:
            nursery.cancel_scope.cancel()


async def _live(pair: Pair, n: int) -> Dist:
    for _ in range(3):  # warm: the first messages of a link set things up
        await pair.round_trip()
    return Dist([await pair.round_trip() for _ in range(n)])


async def _throughput(pairs: list[Pair], seconds: float) -> float:
    done = 0

    async def loop(pair: Pair) -> None:
        nonlocal done
        while True:
            await pair.round_trip()
            done += 1

    async with trio.open_nursery() as nursery:
        for pair in pairs:
            nursery.start_soon(loop, pair)
        await trio.sleep(seconds * 0.2)  # ramp up
        start, t0 = done, trio.current_time()
        await trio.sleep(seconds)
        rate = (done - start) / (trio.current_time() - t0)
        nursery.cancel_scope.cancel()
    return rate


async def run(home: Path, sessions: int, pairs: int, n: int, seconds: float) -> dict[str, Any]:
    results: list[dict[str, Any]] = []
    cap = str(sessions * len(RELAYS) + pairs * len(RELAYS) + 100)
    async with open_cluster() as cluster:
        await admin_token(home, cluster.url)
        for count in RELAYS:
            async with AsyncExitStack() as stack:
                args = ("relay", "--redis", cluster.url, "--port", "0", "--max-connections", cap,
                        "--max-control-connections", cap, "--max-runs", cap)  # fmt: skip
                procs = [
                    await stack.enter_async_context(
                        tether(*args, home=home, name=f"relay-{count}-{i}")
                    )
                    for i in range(count)
                ]
                ends = []
                for proc in procs:
                    url = (await proc.wait_line(r"ready relay=(\S+)")).group(1)
                    ends.append(Endpoint(url, token=_token(home)))
                echo = await stack.enter_async_context(open_pairs(ends[:1], ends[-1:], 1))
                alone = await _live(echo[0], n)
                rss0 = sum(rss_kib(p.process.pid) for p in procs)
                mem0 = await cluster_used_memory(cluster)
                t0 = trio.current_time()
                runs = await idle.submit_idle_runs(ends[0], sessions)
                async with held_sessions(ends, runs) as opened:
                    opened["setup_s"] = trio.current_time() - t0
                    rss1 = sum(rss_kib(p.process.pid) for p in procs)
                    mem1 = await cluster_used_memory(cluster)
                    beside = await _live(echo[0], n)
                opened_n = max(opened["sessions"], 1)
                rotated = ends[1:] + ends[:1]
                many = await stack.enter_async_context(open_pairs(ends, rotated, pairs))
                rate = await _throughput(many, seconds)
                results.append(
                    {
                        "relays": count,
                        "sessions": opened["sessions"],
                        "failure": opened["failure"],
                        "setup_s": opened["setup_s"],
                        "relay_kib_per_session": (rss1 - rss0) / opened_n,
                        "redis_bytes_per_session": (mem1 - mem0) / opened_n,
                        "alone": alone,
                        "beside": beside,
                        "pairs": pairs,
                        "round_trips_per_s": rate,
                    }
                )
    return {"configurations": results, "masters": 3}


def _token(home: Path) -> str:
    import tomllib

    return str(tomllib.loads((home / "config.toml").read_text())["default"]["token"])


def section(f: dict[str, Any], _n: dict[str, int]) -> list[str]:
    rows = [
        "## 12. Scale out: several relays on a Redis Cluster",
        "",
        f"One Redis Cluster of {f['masters']} masters (Debian's redis-server where installed), 1, 2 "
        "and 4 `tether relay` processes on it. **Live**: a run's two ends as the adapter and the "
        "worker hold them, the IDE's on the first relay and the worker's on the last (with "
        "several relays every message crosses between relay processes through the cluster), the "
        "worker echoing each DAP message; one round trip at a time, alone and beside the idle "
        "sessions. **Idle**: queued debug sessions as in section 5, spread over the relays. "
        "**Throughput**: echo pairs all at once, each from relay i to relay i+1. Two cores carry "
        "the relays, the masters and the benchmark's clients alike.",
        "",
        "| relays | idle sessions (set-up) | relay memory per session | Redis per session "
        "| live alone: median | p99 | beside the idle: median | p99 | p99 within 2x alone "
        "| round trips/s (pairs) |",
        "|---|---|---|---|---|---|---|---|---|---|",
    ]
    for c in f["configurations"]:
        alone, beside = c["alone"], c["beside"]
        within = beside.p99 <= 2 * alone.p99
        failure = " (stopped early)" if c["failure"] else ""
        rows.append(
            f"| {c['relays']} | {c['sessions']:,}{failure} ({c['setup_s']:.0f} s) "
            f"| {c['relay_kib_per_session']:.1f} KiB | {c['redis_bytes_per_session'] / 1024:.1f} KiB "
            f"| {ms(alone.median)} | {ms(alone.p99)} | {ms(beside.median)} | {ms(beside.p99)} "
            f"| {verdict(within)} ({beside.p99 / alone.p99:.2f} x) "
            f"| {c['round_trips_per_s']:,.0f} ({c['pairs']}) |"
        )
    failures = [c["failure"] for c in f["configurations"] if c["failure"]]
    return [*rows, "", *[f"Opening more failed: `{x}`" for x in failures], ""]
