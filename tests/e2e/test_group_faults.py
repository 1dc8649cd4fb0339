"""The ranks of a job stopped and moved as one, across link cuts and a relay SIGKILL.

The stack of ``test_faults.py`` (Redis, relay A for the adapter and relay B for the worker, each
link through a :class:`~faults.proxy.FaultProxy`) runs the torchrun-style launcher without
PyTorch: 4 ranks of ``programs/ranks4_worker.py``, ``--stop all``, a breakpoint in rank 2's line
set while the run is queued. The test is the IDE (VS Code's way: each rank offered by
``startDebugging`` when it stops, a session of its own for it).

Faults land at two exact points, found on the adapter's link (relay to adapter, not masked): the
first ``stopped`` event that reaches the adapter (the group is stopping: the other ranks' stops
are on their way) and the first ``continued`` after a continue in rank 2's session (the group
continue is under way). At each, the adapter's link holds what follows, both links are cut, the
adapter's relay is SIGKILLed and a new one takes its place; the adapter re-attaches to it.

Proved: every rank ends paused and its session sees its stop once (each rank offered once, one
``stopped`` each, nothing after it until the continue); after the continue every rank runs to the
end (exit codes 0, each rank's last line printed once), each session's events in order.
"""

from __future__ import annotations

import re
import shutil
from collections import Counter
from contextlib import AsyncExitStack
from pathlib import Path
from typing import Any

import pytest
import trio
from faults.proxy import Direction, FaultProxy
from stack import Proc, tether
from test_faults import FAST, INITIALIZE, kill9, relay_process, two_relays

from adapter.scripted_ide.dap_client import DapClient, open_dap_client

pytestmark = [pytest.mark.slow, pytest.mark.timeout(300)]

PROGRAMS = Path(__file__).resolve().parent / "programs"
RANK2_LINE = 51  # programs/ranks4_worker.py: only rank 2 runs it
RANKS = 4
#: an event as debugpy writes it (``"event": "stopped"``) or the adapter does
EVENT = r'"event":\s?"{}"'


async def configure(ide: DapClient, ws: Path, attach_args: dict[str, Any]) -> None:
    """VS Code's attach sequence, with the one breakpoint in rank 2's line."""
    assert (await ide.request("initialize", INITIALIZE))["success"]
    attach = ide.send_request_nowait("attach", attach_args)
    await ide.wait_event("initialized", timeout=90)
    source = {"name": "ranks4_worker.py", "path": str(ws / "ranks4_worker.py")}
    bps = await ide.request(
        "setBreakpoints",
        {"source": source, "lines": [RANK2_LINE], "breakpoints": [{"line": RANK2_LINE}]},
        timeout=90,
    )
    assert bps["success"], bps
    assert (await ide.request("setExceptionBreakpoints", {"filters": []}, timeout=90))["success"]
    assert (await ide.request("configurationDone", timeout=90))["success"]
    assert (await ide.response(attach, timeout=90))["success"]


class Storm:
    """At the first chunk towards the adapter that carries ``event``: hold what follows on that
    link, cut both links, SIGKILL the adapter's relay, start a new one, let the link go."""

    def __init__(
        self, stack: AsyncExitStack, home: Path, redis: str, links: dict[str, FaultProxy]
    ) -> None:
        self.stack, self.home, self.redis, self.links = stack, home, redis, links
        self.injected: Counter[str] = Counter()
        self.relays = 1

    def arm(self, event: str) -> trio.Event:
        hit = trio.Event()
        proxy = self.links["adapter-relay"]
        pattern = re.compile(EVENT.format(event).encode())

        def hook(direction: Direction, chunk: bytes) -> None:
            if direction == "down" and pattern.search(chunk):
                proxy.stall("down")  # what follows this chunk waits in the proxy
                proxy.on_pass = None
                hit.set()

        proxy.on_pass = hook
        return hit

    async def strike(self, relay: Proc) -> Proc:
        for name, proxy in self.links.items():
            if await proxy.cut():
                self.injected[f"{name} cut"] += 1
        kill9(relay)
        self.injected["relay SIGKILL"] += 1
        self.relays += 1
        new, port = await self.stack.enter_async_context(
            relay_process(self.home, self.redis, f"relay-a{self.relays}")
        )
        to_a = self.links["adapter-relay"]
        to_a.retarget("127.0.0.1", port)
        to_a.resume()
        return new


def events(ide: DapClient, *names: str) -> list[str]:
    return [
        m["event"]
        for m in ide.received
        if m.get("type") == "event" and (not names or m.get("event") in names)
    ]


def outputs(ide: DapClient) -> str:
    return "".join(
        m["body"].get("output", "")
        for m in ide.received
        if m.get("type") == "event" and m.get("event") == "output"
    )


def duplicated_responses(ide: DapClient) -> int:
    answers = Counter(m["request_seq"] for m in ide.received if m.get("type") == "response")
    return sum(n - 1 for n in answers.values() if n > 1)


async def test_a_group_stop_and_continue_hold_across_link_cuts_and_a_relay_sigkill(
    tmp_path: Path,
) -> None:
    home = tmp_path / "home"
    ws = tmp_path / "ws"
    ws.mkdir()
    for name in ("ranks_launcher.py", "ranks4_worker.py"):
        shutil.copy(PROGRAMS / name, ws / name)
    async with trio.open_nursery() as nursery, AsyncExitStack() as stack:
        relays = await two_relays(tmp_path, home, nursery, stack)
        relay_a, to_a, to_b = relays.relay_a, relays.to_a, relays.to_b
        storm = Storm(stack, home, relays.redis_url, relays.links)
        debug = await stack.enter_async_context(
            tether(
                "debug", "--relay", to_a.url_for("ws"), "--port", "0", "--request-timeout", "120",
                "--stop", "all", "--workdir", str(ws), "--",
                "python", "ranks_launcher.py", str(RANKS), "ranks4_worker.py",
                home=home, name="debug", extra_env=FAST,
            )
        )  # fmt: skip
        m = await debug.wait_line(r"adapter on 127\.0\.0\.1:(\d+)")
        ide = await stack.enter_async_context(
            open_dap_client("127.0.0.1", int(m.group(1)), serve={"startDebugging"})
        )
        # the breakpoint is set while the run is queued
        await configure(ide, ws, {"justMyCode": True, "connect": {"port": 0}})
        stopping = storm.arm("stopped")
        await stack.enter_async_context(
            tether(
                "worker", "--relay", to_b.url_for("ws"), "--work-dir", str(home / "worker"),
                home=home, name="worker", extra_env=FAST,
            )
        )  # fmt: skip
        with trio.fail_after(120):
            await stopping.wait()  # the first stop reached the adapter: the group is stopping
        relay_a = await storm.strike(relay_a)

        # each rank is offered once, in its own session, and is seen stopped there once
        ranks: dict[int, DapClient] = {}
        threads: dict[int, int] = {}
        while len(ranks) < RANKS:
            offer = await ide.wait_reverse_request("startDebugging", timeout=120)
            ide.answer(offer)
            config = offer["arguments"]["configuration"]
            connect = config["connect"]
            rank_ide = await stack.enter_async_context(
                open_dap_client(connect["host"], connect["port"])
            )
            await configure(rank_ide, ws, config)
            stopped = await rank_ide.wait_event("stopped", timeout=120)
            rank = int(re.match(r"rank (\d+)", config["name"]).group(1))  # type: ignore[union-attr]
            assert rank not in ranks, f"rank {rank} offered twice"
            ranks[rank] = rank_ide
            threads[rank] = stopped["body"]["threadId"]
            expected = "breakpoint" if rank == 2 else "pause"
            assert stopped["body"]["reason"] == expected, (rank, stopped)
        assert sorted(ranks) == list(range(RANKS))
        for rank, rank_ide in ranks.items():
            assert events(rank_ide, "stopped", "continued") == ["stopped"], rank

        # a continue in rank 2's session, and the storm again while the group continues
        # (the other ranks' ``continued`` may reach the adapter before rank 2's answer: the storm
        # holds the link from there, so the answer is awaited only after the strike)
        continuing = storm.arm("continued")
        answered: list[dict[str, Any]] = []
        got_answer = trio.Event()

        async def go_on() -> None:
            answered.append(
                await ranks[2].request("continue", {"threadId": threads[2]}, timeout=180)
            )
            got_answer.set()

        nursery.start_soon(go_on)
        with trio.fail_after(120):
            await continuing.wait()
        relay_a = await storm.strike(relay_a)
        with trio.fail_after(120):
            await got_answer.wait()
        assert answered[0]["success"], answered
        exited = await ide.wait_event("exited", timeout=120)
        assert exited["body"]["exitCode"] == 0, exited
        with trio.fail_after(60):
            while "launcher done" not in outputs(ide):
                await ide.wait_event("output", timeout=60)
        text = outputs(ide)
        assert "launcher done, rank exit codes [0, 0, 0, 0]" in text, text
        for rank, rank_ide in ranks.items():
            # every rank ran to its end once; its session saw its stop, its continue, its end
            assert text.count(f"rank {rank} done") == 1, (rank, text)
            await rank_ide.wait_event("terminated", timeout=60)
            seen = events(rank_ide, "stopped", "continued", "terminated")
            assert seen == ["stopped", "continued", "terminated"], (rank, seen)
            assert duplicated_responses(rank_ide) == 0
        assert duplicated_responses(ide) == 0
        offered = [m for m in ide.received if m.get("command") == "startDebugging"]
        assert len(offered) == RANKS
        faults = dict(storm.injected)
        print(f"\ngroup under faults: {RANKS} ranks, faults {faults}")
        assert faults["relay SIGKILL"] == 2 and faults["adapter-relay cut"] == 2, faults
        await ide.request("disconnect", {"terminateDebuggee": True})
        nursery.cancel_scope.cancel()
