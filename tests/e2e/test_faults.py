"""Fault injection with real processes: nothing lost, duplicated or reordered.

Redis (the bundled server), two relays, the worker pool and the adapter (`tether debug`) each run as
their own process. The adapter reaches relay A and the worker relay B, each through a
:class:`~faults.proxy.FaultProxy` that cuts, resets and stalls its link at random moments (seeded,
so a failure can be replayed). Midway relay A is SIGKILLed and replaced, and Redis is restarted from
its append-only file.

Every message carries a test sequence number the far side checks:

- IDE -> worker: ``evaluate record(i)`` requests, pipelined; the program appends ``i`` to a list in
  arrival order and answers ``i``. At the end the list must be exactly ``0..N-1``.
- worker -> IDE: ``evaluate flood(j, k)`` makes the program print ``tseq j`` ... ``tseq j+k-1``;
  the IDE's ``output`` events must carry exactly ``0..M-1`` in order. Every request gets exactly one
  response, with the right result.
"""

from __future__ import annotations

import itertools
import json
import os
import random
import re
import signal
from collections import Counter
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import pytest
import trio
from faults.proxy import FaultProxy
from stack import Proc, admin_token, tether

from adapter.dap_client import DapClient, open_dap_client
from adapter.demo import VSCODE_INITIALIZE
from relay.embedded import run_embedded_server

pytestmark = [pytest.mark.slow, pytest.mark.timeout(300)]

PROBE = Path(__file__).resolve().parent / "faults_project"
BREAKPOINT_LINE = 25
#: pings fast enough that a stalled link is noticed within about a second
FAST = {"TETHER_PING_INTERVAL": "0.5", "TETHER_PING_TIMEOUT": "0.5"}
RELAY_FLAGS = ("--ping-interval", "0.5", "--ping-timeout", "0.5", "--lease", "60")


@asynccontextmanager
async def relay_process(home: Path, redis: str, name: str) -> AsyncIterator[tuple[Proc, int]]:
    async with tether(
        "relay", "--redis", redis, "--port", "0", *RELAY_FLAGS, home=home, name=name
    ) as proc:
        m = await proc.wait_line(r"tether relay: ready relay=ws://127\.0\.0\.1:(\d+)")
        yield proc, int(m.group(1))


def kill9(proc: Proc) -> None:
    os.killpg(proc.process.pid, signal.SIGKILL)


class Redis:
    """The bundled server in the background; ``restart()`` stops it (SIGTERM) and starts it again
    on the same data directory, so it comes back from its append-only file."""

    def __init__(self, data_dir: Path) -> None:
        self.data_dir = data_dir
        self._ready = trio.Event()
        self._restart = trio.Event()

    async def run(self, *, task_status: trio.TaskStatus[str] = trio.TASK_STATUS_IGNORED) -> None:
        started = False
        while True:
            async with run_embedded_server(self.data_dir) as url:
                self._ready.set()
                if not started:
                    task_status.started(url)
                    started = True
                await self._restart.wait()
                self._restart = trio.Event()

    async def restart(self) -> None:
        ready = self._ready = trio.Event()
        self._restart.set()
        with trio.fail_after(30):
            await ready.wait()


class Chaos:
    """Cuts, resets and stalls the two proxied links at random moments until stopped."""

    def __init__(self, seed: int, proxies: dict[str, FaultProxy]) -> None:
        self.random = random.Random(seed)
        self.proxies = proxies
        self.injected: Counter[str] = Counter()
        self.enabled = True

    async def run(self) -> None:
        while True:
            await trio.sleep(self.random.uniform(0.3, 1.2))  # a random moment, not a wait for state
            if not self.enabled:
                continue
            name = self.random.choice(sorted(self.proxies))
            proxy = self.proxies[name]
            fault = self.random.choice(["cut", "reset", "stall"])
            if fault == "cut":
                if await proxy.cut():
                    self.injected[f"{name} cut"] += 1
            elif fault == "reset":
                if await proxy.reset():
                    self.injected[f"{name} reset"] += 1
            else:
                proxy.stall()
                self.injected[f"{name} stall"] += 1
                await trio.sleep(self.random.uniform(0.2, 2.0))  # how long the link hangs
                proxy.resume()


async def configure(ide: DapClient, probe: Path) -> None:
    """VS Code's attach sequence, with the one breakpoint."""
    assert (await ide.request("initialize", VSCODE_INITIALIZE))["success"]
    attach = ide.send_request_nowait("attach", {"justMyCode": True, "connect": {"port": 0}})
    await ide.wait_event("initialized", timeout=30)
    source = {"name": "probe.py", "path": str(probe / "probe.py")}
    bps = await ide.request(
        "setBreakpoints",
        {"source": source, "lines": [BREAKPOINT_LINE], "breakpoints": [{"line": BREAKPOINT_LINE}]},
    )
    assert bps["success"]
    assert (await ide.request("setExceptionBreakpoints", {"filters": []}))["success"]
    assert (await ide.request("configurationDone"))["success"]
    assert (await ide.response(attach))["success"]


class Session:
    """The scripted long session and its bookkeeping."""

    def __init__(self, ide: DapClient) -> None:
        self.ide = ide
        self.sent = 0  # record(i) numbers sent
        self.flooded = 0  # tseq lines asked for
        self.requests = 0
        self.thread = 0
        self.frame = 0

    async def stop(self) -> None:
        stopped = await self.ide.wait_event("stopped", timeout=90)
        self.thread = stopped["body"]["threadId"]
        stack = await self.ide.request(
            "stackTrace", {"threadId": self.thread, "levels": 1}, timeout=90
        )
        self.requests += 1
        frame = stack["body"]["stackFrames"][0]
        assert frame["line"] == BREAKPOINT_LINE, frame
        self.frame = frame["id"]

    async def evaluate(self, expression: str) -> str:
        seq = self.ide.send_request_nowait(
            "evaluate", {"expression": expression, "frameId": self.frame, "context": "repl"}
        )
        self.requests += 1
        response = await self.ide.response(seq, timeout=90)
        assert response["success"], response
        return str(response["body"]["result"])

    async def records(self, count: int) -> None:
        """``count`` pipelined ``record(i)`` requests; each must answer its own ``i``."""
        seqs = {}
        for _ in range(count):
            seqs[self.sent] = self.ide.send_request_nowait(
                "evaluate",
                {"expression": f"record({self.sent})", "frameId": self.frame, "context": "repl"},
            )
            self.sent += 1
        self.requests += count
        for i, seq in seqs.items():
            response = await self.ide.response(seq, timeout=90)
            assert response["success"], response
            assert response["body"]["result"] == str(i), (i, response)

    async def flood(self, count: int) -> None:
        assert await self.evaluate(f"flood({self.flooded}, {count})") == str(count)
        self.flooded += count

    async def resume(self) -> None:
        """One step (``next``), then ``continue`` back to the breakpoint."""
        self.ide.discard_events("stopped")
        response = await self.ide.request("next", {"threadId": self.thread}, timeout=90)
        assert response["success"], response
        await self.ide.wait_event("stopped", timeout=90)
        stack = await self.ide.request(
            "stackTrace", {"threadId": self.thread, "levels": 1}, timeout=90
        )
        assert stack["body"]["stackFrames"][0]["line"] == BREAKPOINT_LINE + 1, stack
        self.ide.discard_events("stopped")
        response = await self.ide.request("continue", {"threadId": self.thread}, timeout=90)
        self.requests += 3
        assert response["success"], response
        await self.stop()

    async def script(self, rounds: int, between: Any = None) -> None:
        for r in range(rounds):
            await self.records(5)
            if r % 4 == 0:
                await self.flood(50)
            if r % 10 == 9:
                await self.resume()
            if between is not None:
                await between(r)


def audit(ide: DapClient, session: Session, seen: list[int]) -> dict[str, int]:
    """Lost, duplicated and reordered messages, both directions."""
    expected = list(range(session.sent))
    lost = len(set(expected) - set(seen))
    duplicated = len(seen) - len(set(seen))
    reordered = sum(1 for a, b in itertools.pairwise(seen) if b < a)
    lines = [
        int(m.group(1))
        for msg in ide.received
        if msg.get("type") == "event" and msg.get("event") == "output"
        for m in re.finditer(r"tseq (\d+)", msg["body"].get("output", ""))
    ]
    lost += len(set(range(session.flooded)) - set(lines))
    duplicated += len(lines) - len(set(lines))
    reordered += sum(1 for a, b in itertools.pairwise(lines) if b < a)
    answers = Counter(m["request_seq"] for m in ide.received if m.get("type") == "response")
    duplicated += sum(n - 1 for n in answers.values() if n > 1)
    return {"lost": lost, "duplicated": duplicated, "reordered": reordered}


@pytest.mark.parametrize("seed", [1])
async def test_nothing_is_lost_duplicated_or_reordered_under_faults(
    tmp_path: Path, seed: int
) -> None:
    home = tmp_path / "home"
    probe = tmp_path / "probe"
    probe.mkdir()
    (probe / "probe.py").write_text((PROBE / "probe.py").read_text())
    redis = Redis(tmp_path / "redis")
    async with trio.open_nursery() as nursery:
        redis_url = await nursery.start(redis.run)
        await admin_token(home, redis_url)
        async with (
            relay_process(home, redis_url, "relay-a") as (relay_a, port_a),
            relay_process(home, redis_url, "relay-b") as (_relay_b, port_b),
        ):
            to_a = FaultProxy("127.0.0.1", port_a)
            to_b = FaultProxy("127.0.0.1", port_b)
            await nursery.start(to_a.run)
            await nursery.start(to_b.run)
            chaos = Chaos(seed, {"adapter-relay": to_a, "worker-relay": to_b})
            async with tether(
                "debug",
                "--relay",
                to_a.url_for("ws"),
                "--port",
                "0",
                "--request-timeout",
                "120",
                "--workdir",
                str(probe),
                "--",
                "python",
                "probe.py",
                home=home,
                name="debug",
                extra_env=FAST,
            ) as debug:
                m = await debug.wait_line(r"adapter on 127\.0\.0\.1:(\d+)")
                async with open_dap_client("127.0.0.1", int(m.group(1))) as ide:
                    await configure(ide, probe)
                    async with tether(
                        "worker",
                        "--relay",
                        to_b.url_for("ws"),
                        "--work-dir",
                        str(home / "worker"),
                        home=home,
                        name="worker",
                        extra_env=FAST,
                    ):
                        session = Session(ide)
                        await session.stop()
                        nursery.start_soon(chaos.run)
                        await session.script(20)
                        # relay A dies without a goodbye; a new one takes its place
                        kill9(relay_a)
                        chaos.injected["relay SIGKILL"] += 1
                        async with relay_process(home, redis_url, "relay-a2") as (_a2, port_a2):
                            to_a.retarget("127.0.0.1", port_a2)
                            await session.script(20)
                            await redis.restart()
                            chaos.injected["redis restart"] += 1
                            await session.script(20)
                            chaos.enabled = False
                            to_a.resume()
                            to_b.resume()
                            seen = json.loads((await session.evaluate("check()")).strip("'\""))
                            counts = audit(ide, session, seen)
                            faults = dict(chaos.injected)
                            print(
                                f"\nfault injection (seed {seed}): {session.requests} requests, "
                                f"{session.sent} numbered evaluations, {session.flooded} numbered "
                                f"output lines; faults {faults}; {counts}"
                            )
                            assert sum(faults.values()) >= 10, faults
                            assert counts == {"lost": 0, "duplicated": 0, "reordered": 0}
                            await ide.request("disconnect", {"terminateDebuggee": True})
        nursery.cancel_scope.cancel()
