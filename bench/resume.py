"""Benchmark 7: after a dropped link comes back, how soon the first buffered message arrives.

A worker link of a claimed run is down while the IDE side publishes an entry (stored by the relay);
then the worker reconnects naming its cursor, as :class:`relay.client.RunLink` does. Measured: the
reconnect itself (WebSocket and TLS-free handshake, ``hello`` to ``welcome``), and the time from the
``welcome`` to the ``deliver`` of the buffered entry: what tether adds beyond the reconnect.
"""

from __future__ import annotations

from typing import Any

import orjson
import trio

from protocol_specs.runs.spec import RunSpec
from protocol_specs.wire import wire
from protocol_specs.wire.wire import IdeLink, Role
from relay.client import open_connection, open_control, open_run_link

from .common import Dist, Endpoint


async def run(relay: Endpoint, rounds: int) -> dict[str, Dist]:
    async with open_control(relay, client="bench") as control:
        spec = RunSpec(command=["python", "x.py"], workdir="/tmp", name="resume", backend="bench")
        record = await control.submit(spec)
        assigned = await control.claim("bench-worker", backend="bench")
    assert assigned.run.id == record.id
    worker = Endpoint(relay.url, token=assigned.token)
    hello = wire.Hello(
        role=Role.WORKER, link=wire.WorkerLink(), run=record.id, attempt=assigned.run.attempt
    )
    result = {"reconnect": Dist([]), "first message after welcome": Dist([])}
    cursor = "0"
    async with open_run_link(relay, link=IdeLink(), run=record.id) as ide:
        for i in range(rounds):
            body = orjson.dumps({"seq": i + 1, "type": "request", "command": "threads"})
            await ide.publish(wire.DapEntry(origin="bench", body=body))
            await ide.flush()
            t0 = trio.current_time()
            async with open_connection(worker, hello.model_copy(update={"cursor": cursor})) as (
                ws,
                _,
            ):
                t1 = trio.current_time()
                while True:
                    frame: Any = wire.decode_frame(await ws.recv())
                    if isinstance(frame, wire.Deliver):
                        t2 = trio.current_time()
                        cursor = frame.cursor
                        break
            result["reconnect"].samples.append((t1 - t0) * 1000)
            result["first message after welcome"].samples.append((t2 - t1) * 1000)
    return result
