"""Benchmark 2b: stepping as VS Code's own client sees it (Microsoft's DebugClient, node).

A Python client acknowledges TCP at once; node, like VS Code, delays its ACKs, so a writer that
sends a response and then an event without ``TCP_NODELAY`` has the event held by Nagle's algorithm
until the ACK comes (``shared/research/latency-wan.md``). Only a node client shows that stall, so
these figures come from the scenario runner (``tests/e2e/node/vscode_scenario.mjs``).

Each way (tether, stock debugpy, the floor; :data:`common.WAYS`) runs ``programs/loop.py`` to its
breakpoint, then the runner sends ``next`` and waits for ``stopped`` (nothing else asked, so the
two are all that moves), ``per_block`` times; then it clears the breakpoint and continues, and the
program prints its last line and exits. From the runner's transcript (``performance.now()``,
microsecond resolution): ``next`` sent until its response, and until the ``stopped`` event; the
``output`` event of the program's last line until ``terminated`` (the end of a run as the IDE
sees it). The ways take turns, one block of steps each, the order rotating.
"""

from __future__ import annotations

import json
import os
import shutil
from pathlib import Path
from typing import Any

from tests.e2e.harness import debug_run, open_vscode_session, scenario
from worker_shim.debuggee import start_debuggee

from .common import FLOOR, PROGRAMS, TETHER, WAYS, Dist, Stack, break_line

PROGRAM = "loop.py"
_TIMEOUT_S = 300


def _steps(n: int, workdir: Path) -> list[dict[str, Any]]:
    step = [{"op": "next"}, {"op": "wait_stopped", "inspect": False}]
    return [
        {"op": "wait_stopped", "inspect": False, "reason": "breakpoint"},
        *(step * n),
        # then the program runs to its end: its last line (the total), then its exit
        {"op": "set_breakpoints", "path": str(workdir / PROGRAM), "lines": []},
        {"op": "continue"},
        {"op": "wait_terminated"},
        {"op": "disconnect"},
    ]


def step_times(transcript: Path) -> tuple[list[float], list[float], list[float]]:
    """(``next`` -> its response, ``next`` -> the next ``stopped``) in ms, per ``next`` sent;
    and the program's last line (its ``output`` event) -> ``terminated``, in ms."""
    entries = [json.loads(line) for line in transcript.read_text().splitlines() if line.strip()]
    answered: list[float] = []
    stopped: list[float] = []
    sent: dict[int, float] = {}
    pending: float | None = None
    last_line: float | None = None
    ended: list[float] = []
    for e in entries:
        msg = e["msg"]
        if e["dir"] == "client->adapter" and msg.get("command") == "next":
            sent[msg["seq"]] = pending = e["t"]
        elif msg.get("type") == "response" and msg.get("command") == "next":
            answered.append(e["t"] - sent[msg["request_seq"]])
        elif msg.get("event") == "stopped" and pending is not None:
            stopped.append(e["t"] - pending)
            pending = None
        elif msg.get("event") == "output" and msg["body"].get("category") == "stdout":
            last_line = e["t"]
        elif msg.get("event") == "terminated" and last_line is not None and not ended:
            ended.append(e["t"] - last_line)
    return answered, stopped, ended


async def _block(way: str, stack: Stack, tmp: Path, name: str, n: int) -> tuple[list[float], ...]:
    workdir = tmp / name
    workdir.mkdir(parents=True)
    shutil.copyfile(PROGRAMS / PROGRAM, workdir / PROGRAM)
    transcript = tmp / f"{name}.transcript.jsonl"
    argv = ["python", PROGRAM, str(2 * n + 100)]  # loop iterations: a short run once continued

    def spec(port: int) -> dict[str, Any]:
        s = scenario(port, workdir, _steps(n, workdir),
                     breakpoints={PROGRAM: [break_line(PROGRAM)]},
                     timeout_ms=_TIMEOUT_S * 1000)  # fmt: skip
        s["transcript"] = str(transcript)
        return s

    if way == TETHER:
        async with debug_run(stack.home, stack.relay, workdir, *argv) as (adapter, _run, port):
            async with open_vscode_session(spec(port), timeout=_TIMEOUT_S) as session:
                await session.result()
            await adapter.wait_line(r"run \S+ ended", timeout=60)  # the worker is free again
    else:
        async with start_debuggee(
            argv,
            cwd=str(workdir),
            env=dict(os.environ),
            log_path=str(tmp / f"{name}.log"),
            fast=way == FLOOR,
        ) as debuggee:
            async with open_vscode_session(spec(debuggee.port), timeout=_TIMEOUT_S) as session:
                await session.result()
    return step_times(transcript)


async def node_steps(stack: Stack, tmp: Path, blocks: int, per_block: int) -> dict[str, Any]:
    """``blocks`` blocks of ``per_block`` steps per way, the ways' order rotating."""
    got: dict[str, dict[str, list[float]]] = {
        kind: {w: [] for w in WAYS} for kind in ("answered", "stopped", "ended")
    }
    for i in range(blocks):
        order = WAYS[i % len(WAYS) :] + WAYS[: i % len(WAYS)]
        for way in order:
            times = await _block(way, stack, tmp, f"steps-{way}-{i}", per_block)
            for kind, samples in zip(("answered", "stopped", "ended"), times, strict=True):
                got[kind][way] += samples
    return {kind: {w: Dist(got[kind][w]) for w in WAYS} for kind in got}
