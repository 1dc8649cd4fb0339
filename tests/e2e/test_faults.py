"""Fault injection with real processes: nothing lost, duplicated or reordered.

Redis (the bundled server), two relays, the worker pool and the adapter (`tether debug`) each run as
their own process. The adapter reaches relay A and the worker relay B, each through a
:class:`~faults.proxy.FaultProxy` that cuts, resets and stalls its link at random moments (seeded,
so a failure can be replayed). Midway relay A is SIGKILLed and replaced, and Redis is restarted from
its append-only file.

The program has two debugged processes: the probe starts a child running the same probe loop, and
the test answers the adapter's ``startDebugging`` the way VS Code does (a second DAP connection to
the adapter, ``attach`` with the offered configuration), so the two processes' sessions run their
traffic concurrently through the same faults.

Every message carries a test sequence number the far side checks, per process:

- IDE -> worker: ``evaluate record(i)`` requests, pipelined; the program appends ``i`` to a list in
  arrival order and answers ``i``. At the end the list must be exactly ``0..N-1``.
- worker -> IDE: ``evaluate flood(j, k)`` makes the process print ``tseq ROLE j`` ...
  ``tseq ROLE j+k-1`` (ROLE: ``main`` or ``child``; a child writes to its parent's stdout, so all
  of the run's output reaches the main session); the ``output`` events must carry exactly
  ``0..M-1`` in order for each role. Every request of each session gets exactly one response, with
  the right result, and the child is offered exactly once.
"""

from __future__ import annotations

import itertools
import json
import os
import random
import re
import signal
from collections import Counter
from contextlib import AbstractAsyncContextManager, AsyncExitStack
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
import trio
from faults.proxy import FaultProxy
from stack import Proc, admin_token, tether
from stack import relay_process as shared_relay_process

from adapter.scripted_ide.dap_client import DapClient, open_dap_client
from adapter.scripted_ide.demo import VSCODE_INITIALIZE
from relay.embedded.server import run_embedded_server

pytestmark = [pytest.mark.slow, pytest.mark.timeout(300)]

PROBE = Path(__file__).resolve().parent / "faults_project"
BREAKPOINT_LINE = 34
#: pings fast enough that a stalled link is noticed within about a second
FAST = {"TETHER_PING_INTERVAL": "0.5", "TETHER_PING_TIMEOUT": "0.5"}
#: the chaos seed; TETHER_FAULTS_SEED=N replays another one (the run prints the seed it used)
SEED = int(os.environ.get("TETHER_FAULTS_SEED", "1"))
RELAY_FLAGS = ("--ping-interval", "0.5", "--ping-timeout", "0.5", "--lease", "60")


def relay_process(
    home: Path, redis: str, name: str
) -> AbstractAsyncContextManager[tuple[Proc, int]]:
    return shared_relay_process(home, redis, name, RELAY_FLAGS)


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


@dataclass
class TwoRelays:
    """One bundled server (``redis``, at ``redis_url``) and two relays on it, each behind a fault
    proxy: the adapter's link goes through ``to_a`` (relay ``relay_a``), the worker's through
    ``to_b``."""

    redis: Redis
    redis_url: str
    relay_a: Proc
    to_a: FaultProxy
    to_b: FaultProxy

    @property
    def links(self) -> dict[str, FaultProxy]:
        return {"adapter-relay": self.to_a, "worker-relay": self.to_b}


async def two_relays(
    tmp_path: Path, home: Path, nursery: trio.Nursery, stack: AsyncExitStack
) -> TwoRelays:
    """:class:`TwoRelays`, started in ``nursery`` and ``stack``, with an admin token in ``home``."""
    redis = Redis(tmp_path / "redis")
    redis_url = await nursery.start(redis.run)
    await admin_token(home, redis_url)
    relay_a, port_a = await stack.enter_async_context(relay_process(home, redis_url, "relay-a"))
    _relay_b, port_b = await stack.enter_async_context(relay_process(home, redis_url, "relay-b"))
    to_a, to_b = FaultProxy("127.0.0.1", port_a), FaultProxy("127.0.0.1", port_b)
    await nursery.start(to_a.run)
    await nursery.start(to_b.run)
    return TwoRelays(redis, redis_url, relay_a, to_a, to_b)


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


#: VS Code's initialize arguments, with the child sessions it opens for ``startDebugging``
INITIALIZE = {**VSCODE_INITIALIZE, "supportsStartDebuggingRequest": True}


async def configure(ide: DapClient, probe: Path, attach_args: dict[str, Any] | None = None) -> None:
    """VS Code's attach sequence, with the one breakpoint; ``attach_args`` for a child session
    (the configuration its ``startDebugging`` offered)."""
    assert (await ide.request("initialize", INITIALIZE))["success"]
    if attach_args is None:
        attach_args = {"justMyCode": True, "connect": {"port": 0}}
    attach = ide.send_request_nowait("attach", attach_args)
    await ide.wait_event("initialized", timeout=90)
    source = {"name": "probe.py", "path": str(probe / "probe.py")}
    bps = await ide.request(
        "setBreakpoints",
        {"source": source, "lines": [BREAKPOINT_LINE], "breakpoints": [{"line": BREAKPOINT_LINE}]},
    )
    assert bps["success"]
    assert (await ide.request("setExceptionBreakpoints", {"filters": []}))["success"]
    assert (await ide.request("configurationDone"))["success"]
    assert (await ide.response(attach, timeout=90))["success"]


class Session:
    """The scripted long session of one process and its bookkeeping."""

    def __init__(self, ide: DapClient, role: str) -> None:
        self.ide = ide
        self.role = role
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


async def both(sessions: list[Session], rounds: int) -> None:
    """Both processes' scripts at once, through the same links."""
    async with trio.open_nursery() as nursery:
        for session in sessions:
            nursery.start_soon(session.script, rounds)


def audit(output: DapClient, session: Session, seen: list[int]) -> dict[str, int]:
    """Lost, duplicated and reordered messages of one process, both directions: its ``record``
    list, its ``tseq`` lines among ``output``'s events, its session's responses."""
    ide = session.ide
    expected = list(range(session.sent))
    lost = len(set(expected) - set(seen))
    duplicated = len(seen) - len(set(seen))
    reordered = sum(1 for a, b in itertools.pairwise(seen) if b < a)
    lines = [
        int(m.group(1))
        for msg in output.received
        if msg.get("type") == "event" and msg.get("event") == "output"
        for m in re.finditer(rf"tseq {session.role} (\d+)", msg["body"].get("output", ""))
    ]
    lost += len(set(range(session.flooded)) - set(lines))
    duplicated += len(lines) - len(set(lines))
    reordered += sum(1 for a, b in itertools.pairwise(lines) if b < a)
    answers = Counter(m["request_seq"] for m in ide.received if m.get("type") == "response")
    duplicated += sum(n - 1 for n in answers.values() if n > 1)
    return {"lost": lost, "duplicated": duplicated, "reordered": reordered}


def offers(ide: DapClient) -> list[dict[str, Any]]:
    return [
        m
        for m in ide.received
        if m.get("type") == "request" and m.get("command") == "startDebugging"
    ]


async def open_child_session(
    stack: AsyncExitStack, ide: DapClient, probe: Path
) -> tuple[DapClient, int]:
    """What VS Code does for ``startDebugging``: answer at once, then a new connection to the
    adapter that attaches with the offered configuration; returns it and the child's pid."""
    offer = await ide.wait_reverse_request("startDebugging", timeout=90)
    ide.answer(offer)
    configuration = offer["arguments"]["configuration"]
    assert offer["arguments"]["request"] == configuration["request"] == "attach", offer
    connect = configuration["connect"]
    kid = await stack.enter_async_context(open_dap_client(connect["host"], connect["port"]))
    await configure(kid, probe, configuration)
    return kid, configuration["subProcessId"]


@pytest.mark.parametrize("seed", [SEED])
async def test_nothing_is_lost_duplicated_or_reordered_under_faults(
    tmp_path: Path, seed: int
) -> None:
    home = tmp_path / "home"
    probe = tmp_path / "probe"
    probe.mkdir()
    (probe / "probe.py").write_text((PROBE / "probe.py").read_text())
    async with trio.open_nursery() as nursery, AsyncExitStack() as stack:
        relays = await two_relays(tmp_path, home, nursery, stack)
        redis, redis_url, relay_a = relays.redis, relays.redis_url, relays.relay_a
        to_a, to_b = relays.to_a, relays.to_b
        chaos = Chaos(seed, relays.links)
        debug = await stack.enter_async_context(
            tether(
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
            )
        )
        m = await debug.wait_line(r"adapter on 127\.0\.0\.1:(\d+)")
        ide = await stack.enter_async_context(
            open_dap_client("127.0.0.1", int(m.group(1)), serve={"startDebugging"})
        )
        await configure(ide, probe)
        await stack.enter_async_context(
            tether(
                "worker",
                "--relay",
                to_b.url_for("ws"),
                "--work-dir",
                str(home / "worker"),
                home=home,
                name="worker",
                extra_env=FAST,
            )
        )
        main = Session(ide, "main")
        await main.stop()
        # --processes stopped: the child is offered once it stops at the same breakpoint
        kid, kid_pid = await open_child_session(stack, ide, probe)
        child = Session(kid, "child")
        await child.stop()
        sessions = [main, child]
        nursery.start_soon(chaos.run)
        await both(sessions, 20)
        # relay A dies without a goodbye; a new one takes its place
        kill9(relay_a)
        chaos.injected["relay SIGKILL"] += 1
        _a2, port_a2 = await stack.enter_async_context(relay_process(home, redis_url, "relay-a2"))
        to_a.retarget("127.0.0.1", port_a2)
        await both(sessions, 20)
        await redis.restart()
        chaos.injected["redis restart"] += 1
        await both(sessions, 20)
        chaos.enabled = False
        to_a.resume()
        to_b.resume()
        counts = {}
        for session in sessions:
            seen = json.loads((await session.evaluate("check()")).strip("'\""))
            counts[session.role] = audit(ide, session, seen)
        faults = dict(chaos.injected)
        print(f"\nfault injection (seed {seed}), 2 processes; faults {faults}")
        for session in sessions:
            print(
                f"  {session.role}: {session.requests} requests, {session.sent} numbered "
                f"evaluations, {session.flooded} numbered output lines; {counts[session.role]}"
            )
        assert sum(faults.values()) >= 10, faults
        clean = {"lost": 0, "duplicated": 0, "reordered": 0}
        assert counts == {"main": clean, "child": clean}
        # one offer, for the child; its session's messages stayed in its own session
        assert [o["arguments"]["configuration"]["subProcessId"] for o in offers(ide)] == [kid_pid]
        assert offers(kid) == []
        assert not any(
            "tseq" in m.get("body", {}).get("output", "")
            for m in kid.received
            if m.get("event") == "output"
        )
        await kid.request("disconnect", {})  # a child session detaches only
        await ide.request("disconnect", {"terminateDebuggee": True})
        nursery.cancel_scope.cancel()
