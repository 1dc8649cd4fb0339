"""Idle debug sessions held by a process of their own: ``python -m bench.idle_holder``.

The benchmark process that measures a live session's round trips must not also carry thousands of
idle links: its own garbage collections would be in its figures. This process opens the sessions
(section 5's, :func:`idle_session`, 100 connecting at a time, spread over the relays in turn) at
the lowest CPU priority, prints one line ``ready {"sessions": N, "setup_s": S, "failure": "..."}``
and holds them until its standard input closes.

Standard input: one JSON line ``{"relays": [URL, ...], "token": TOKEN, "runs": [RUN ID, ...]}``.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import orjson
import trio

from protocol_specs.wire import wire
from protocol_specs.wire.wire import IdeLink
from relay.client import Endpoint, open_run_link

REPO = Path(__file__).resolve().parents[1]

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
    async with open_run_link(relay, link=IdeLink(), run=run) as link:
        await link.publish(wire.PresenceEntry(origin="bench", epoch=1, attached=True))
        for seq, message in enumerate(_CONFIG, 1):
            body = orjson.dumps({"seq": seq, "type": "request", **message})
            await link.publish(wire.DapEntry(origin="bench", body=body))
        await link.flush()
        task_status.started()
        await done.wait()


async def hold(relays: list[Endpoint], runs: list[str]) -> None:
    t0 = trio.current_time()
    out: dict[str, Any] = {"sessions": 0, "failure": ""}
    done = trio.Event()
    async with trio.open_nursery() as nursery:
        for i in range(0, len(runs), 100):
            try:
                async with trio.open_nursery() as batch:
                    for k, run in enumerate(runs[i : i + 100], i):
                        relay = relays[k % len(relays)]
                        batch.start_soon(nursery.start, idle_session, relay, run, done)
            except Exception as exc:  # a limit reached: report how far it got, and why
                out["failure"] = f"{exc!r}"[:500]
                break
            out["sessions"] = min(i + 100, len(runs))
        out["setup_s"] = trio.current_time() - t0
        print("ready " + json.dumps(out), flush=True)
        await trio.to_thread.run_sync(sys.stdin.read)  # until the benchmark closes it
        done.set()


@asynccontextmanager
async def held_sessions(relays: list[Endpoint], runs: list[str]) -> AsyncIterator[dict[str, Any]]:
    """Idle sessions of ``runs`` in a process of their own, held while the context lasts; yields
    what it printed (how many opened, how long it took, why it stopped early)."""
    process = await trio.lowlevel.open_process(
        [sys.executable, "-m", "bench.idle_holder"],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        cwd=str(REPO),
    )
    assert process.stdin is not None and process.stdout is not None
    try:
        config = {"relays": [r.url for r in relays], "token": relays[0].token, "runs": runs}
        await process.stdin.send_all(json.dumps(config).encode() + b"\n")
        line = b""
        while not line.endswith(b"\n"):
            chunk = await process.stdout.receive_some(65536)
            if not chunk:
                raise RuntimeError("the idle sessions' process ended before it was ready")
            line += chunk
        text = line.decode()
        assert text.startswith("ready "), text
        yield json.loads(text[len("ready ") :])
    finally:
        await process.stdin.aclose()
        with trio.move_on_after(30):
            await process.wait()
        if process.returncode is None:
            process.kill()
            await process.wait()


def main() -> None:
    # The lowest CPU priority: these sessions stand for laptops elsewhere, and on a two-core
    # benchmark host their keepalives would take over half a core from the relay being measured.
    os.nice(19)
    config = json.loads(sys.stdin.readline())
    relays = [Endpoint(url, token=config["token"]) for url in config["relays"]]
    trio.run(hold, relays, config["runs"])


if __name__ == "__main__":
    main()
