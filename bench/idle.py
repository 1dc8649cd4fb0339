"""Benchmark 5: many queued debug sessions idling on one relay process, and a live one beside them.

Each idle session is what ``tether debug`` leaves while its run waits for a GPU: a queued run (for a
backend nobody serves here, so it stays queued), an adapter's relay link (the ``ide`` role) that
published the IDE's configuration (initialize, attach, 20 breakpoints, configurationDone) and its
presence. Measured: the relay process's resident memory and Redis's ``used_memory`` per session,
and a live session's request latency before and after the idle ones joined.
"""

from __future__ import annotations

from typing import Any

import orjson
import trio

from protocol_specs import wire
from protocol_specs.runs import RunSpec
from protocol_specs.wire import Role
from relay.client import open_control, open_run_link

from .common import Dist, Endpoint, Session, rss_kib, timed

_CONFIG = [
    {"command": "initialize", "arguments": {"adapterID": "python", "clientID": "vscode"}},
    {"command": "attach", "arguments": {"justMyCode": True}},
    {
        "command": "setBreakpoints",
        "arguments": {
            "source": {"path": "/home/me/project/train.py"},
            "breakpoints": [{"line": 10 + 3 * i} for i in range(20)],
        },
    },
    {"command": "configurationDone", "arguments": {}},
]


async def idle_session(
    relay: Endpoint, run: str, done: trio.Event, *, task_status: Any = trio.TASK_STATUS_IGNORED
) -> None:
    async with open_run_link(relay, role=Role.IDE, run=run) as link:
        await link.publish(wire.PresenceEntry(origin="bench", epoch=1, attached=True))
        for seq, message in enumerate(_CONFIG, 1):
            body = orjson.dumps({"seq": seq, "type": "request", **message})
            await link.publish(wire.DapEntry(origin="bench", body=body))
        await link.flush()
        task_status.started()
        await done.wait()


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


async def run(
    relay: Endpoint, relay_pid: int, redis_mem: Any, live: Session, sessions: int, n: int
) -> dict[str, Any]:
    before = await live_latency(live, n)
    rss0, mem0 = rss_kib(relay_pid), await redis_mem()
    t0 = trio.current_time()
    async with open_control(relay, client="bench") as control:
        runs = []
        for i in range(sessions):
            spec = RunSpec(
                command=["python", "train.py"], workdir="/tmp", name=f"idle-{i}", backend="idle"
            )
            runs.append((await control.submit(spec)).id)
    done = trio.Event()
    failure = ""
    opened = 0
    async with trio.open_nursery() as idle:
        for i in range(0, sessions, 100):  # 100 connecting at a time
            try:
                async with trio.open_nursery() as batch:
                    for run in runs[i : i + 100]:
                        batch.start_soon(idle.start, idle_session, relay, run, done)
            except Exception as exc:  # a limit reached: report how far it got, and why
                failure = f"{exc!r}"[:500]
                break
            opened = min(i + 100, sessions)
        sessions = max(opened, 1)
        setup_s = trio.current_time() - t0
        rss1, mem1 = rss_kib(relay_pid), await redis_mem()
        after = await live_latency(live, n)
        done.set()
    return {
        "failure": failure,
        "sessions": sessions,
        "setup_s": setup_s,
        "relay_kib_per_session": (rss1 - rss0) / sessions,
        "redis_bytes_per_session": (mem1 - mem0) / sessions,
        "relay_rss_kib": [rss0, rss1],
        "redis_used_memory": [mem0, mem1],
        "live_before": before,
        "live_after": after,
    }
