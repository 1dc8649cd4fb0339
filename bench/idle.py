"""Benchmark 5: many queued debug sessions idling on one relay process, and a live one beside them.

Each idle session is what ``tether debug`` leaves while its run waits for a GPU: a queued run (for a
backend nobody serves here, so it stays queued), an adapter's relay link (the ``ide`` role) that
published the IDE's configuration (initialize, attach, 20 breakpoints, configurationDone) and its
presence; a process of their own holds them (``bench/idle_holder.py``), so that the benchmark's
own process measures the live session without carrying them. Measured: the relay process's
resident memory and Redis's ``used_memory`` per session, and a live session's request latency
before and after the idle ones joined.
"""

from __future__ import annotations

from typing import Any

import trio

from protocol_specs.runs.spec import RunSpec
from relay.client import open_control

from .common import Dist, Endpoint, Session, rss_kib, timed
from .idle_holder import held_sessions


async def live_latency(s: Session, n: int) -> dict[str, Dist]:
    out = {c: Dist([]) for c in ("threads", "stackTrace", "evaluate")}
    stack = await s.client.request("stackTrace", {"threadId": s.thread, "levels": 1})
    frame = stack["body"]["stackFrames"][0]["id"]
    args: dict[str, Any] = {
        "threads": None,
        "stackTrace": {"threadId": s.thread, "startFrame": 0, "levels": 20},
        "evaluate": {"expression": "total * factor", "frameId": frame, "context": "watch"},
    }
    for _ in range(n):
        for command, arguments in args.items():
            ms, _r = await timed(s.client.request(command, arguments))
            out[command].samples.append(ms)
    return out


async def submit_idle_runs(relay: Endpoint, sessions: int) -> list[str]:
    """``sessions`` queued runs for a backend nobody serves here (they stay queued)."""
    async with open_control(relay, client="bench") as control:
        runs = []
        for i in range(sessions):
            spec = RunSpec(
                command=["python", "train.py"], workdir="/tmp", name=f"idle-{i}", backend="idle"
            )
            runs.append((await control.submit(spec)).id)
    return runs


async def run(
    relay: Endpoint, relay_pid: int, redis_mem: Any, live: Session, sessions: int, n: int
) -> dict[str, Any]:
    before = await live_latency(live, n)
    rss0, mem0 = rss_kib(relay_pid), await redis_mem()
    t0 = trio.current_time()
    runs = await submit_idle_runs(relay, sessions)
    async with held_sessions([relay], runs) as held:
        setup_s = trio.current_time() - t0
        opened = max(held["sessions"], 1)
        rss1, mem1 = rss_kib(relay_pid), await redis_mem()
        after = await live_latency(live, n)
    return {
        "failure": held["failure"],
        "sessions": held["sessions"],
        "setup_s": setup_s,
        "relay_kib_per_session": (rss1 - rss0) / opened,
        "redis_bytes_per_session": (mem1 - mem0) / opened,
        "relay_rss_kib": [rss0, rss1],
        "redis_used_memory": [mem0, mem1],
        "live_before": before,
        "live_after": after,
    }
