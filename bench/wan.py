"""Benchmark 9: a whole VS Code stop over a slow link (the link-delay proxy, ``delay_proxy.py``).

A whole stop is ``next`` sent until the IDE holds everything its views show, asked as VS Code asks
(``shared/research/latency-wan.md``, first section; VS Code's own UI timers left out): on
``stopped``, ``threads`` (awaited), ``stackTrace`` of the top frame (awaited), then at once and
concurrently: ``stackTrace`` of the next 19 frames; ``scopes`` of the top frame then ``variables``
of its first non-expensive scope (debugpy's ``Locals``); and each watch ``evaluate`` (context
``watch``). The client is Microsoft's DebugClient under node (``tests/e2e/node/vscode_scenario.mjs``,
its ``parallel`` step for the concurrent part); the figures come from its transcript
(``performance.now()``): ``next`` sent until the last of those responses received, and until the
``stopped`` event.

Where the delay sits (RTT/2 each way, optional jitter):
- **tether**: between the adapter (``tether debug``, on the laptop next to the IDE) and the relay:
  ``tether debug --relay ws://127.0.0.1:<proxy>``. The worker, its shim and Redis stay local to the
  relay, as when the relay runs near the GPUs.
- **stock debugpy**: between the DebugClient and debugpy's port: an SSH tunnel's stand-in.

The program is ``programs/loop.py`` paused 20 frames deep at its ``# BREAK`` line. Per RTT the ways
take turns, a block of stops each, the order rotating. The stop at the breakpoint is inspected the
same way first (a warm-up, not counted).
"""

from __future__ import annotations

import json
import os
import shutil
import zlib
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit, urlunsplit

from tests.e2e.harness import debug_run, open_vscode_session, scenario
from worker_shim.program.debuggee import start_debuggee

from .common import DEBUGPY, PROGRAMS, TETHER, Dist, Stack, break_line
from .delay_proxy import delay_proxy

PROGRAM = "loop.py"
WAN_WAYS = (TETHER, DEBUGPY)
#: the watch expressions (two, as the issue's whole stop has)
WATCHES = ("total", "i * factor")
#: the requests of one whole stop after ``next``, by command (the check that each was answered)
STOP_REQUESTS = {"threads": 1, "stackTrace": 2, "scopes": 1, "variables": 1, "evaluate": 2}
_TIMEOUT_S = 600

__all__ = [
    "PROGRAM",
    "STOP_REQUESTS",
    "WAN_WAYS",
    "WATCHES",
    "inspect_steps",
    "relay_via",
    "stop_times",
    "wan",
]


def inspect_steps() -> list[dict[str, Any]]:
    """What VS Code asks once it holds a ``stopped`` event, in its order and parallelism."""
    return [
        {"op": "threads"},
        {"op": "stack_trace", "startFrame": 0, "levels": 1},
        {
            "op": "parallel",
            "branches": [
                [{"op": "stack_trace", "startFrame": 1, "levels": 19, "focus": False}],
                [{"op": "scopes"}, {"op": "variables", "scope": "Locals"}],
                *([{"op": "evaluate", "expression": w, "context": "watch"}] for w in WATCHES),
            ],
        },
    ]


def _steps(n: int) -> list[dict[str, Any]]:
    stop = [{"op": "next"}, {"op": "wait_stopped", "inspect": False}, *inspect_steps()]
    return [
        {"op": "wait_stopped", "inspect": False, "reason": "breakpoint"},
        *inspect_steps(),  # warm-up: the first stop, not timed
        *(stop * n),
        {"op": "disconnect", "terminateDebuggee": True},
    ]


def stop_times(transcript: Path) -> dict[str, list[float]]:
    """Per ``next`` sent (ms): until the ``stopped`` event (``stopped``), until the last response
    of the whole stop (``whole``), and the ``threads`` round trip (``threads``, the link's RTT as
    the client sees it plus the path behind it)."""
    entries = [json.loads(line) for line in transcript.read_text().splitlines() if line.strip()]
    out: dict[str, list[float]] = {"whole": [], "stopped": [], "threads": []}
    stop: dict[str, Any] | None = None

    def close() -> None:
        if stop is None:
            return
        commands = [c for c, _ in stop["sent"].values()]
        want = sorted(c for c, k in STOP_REQUESTS.items() for _ in range(k))
        if sorted(commands) != want or len(stop["answered"]) != len(commands):
            raise ValueError(f"a stop asked {sorted(commands)}, answered {len(stop['answered'])}")
        out["whole"].append(max(stop["answered"].values()) - stop["t0"])
        out["stopped"].append(stop["stopped"] - stop["t0"])
        threads = next(s for s, (c, _) in stop["sent"].items() if c == "threads")
        out["threads"].append(stop["answered"][threads] - stop["sent"][threads][1])

    for e in entries:
        msg = e["msg"]
        if e["dir"] == "client->adapter" and msg.get("type") == "request":
            if msg["command"] in ("next", "disconnect"):
                close()
                stop = {"t0": e["t"], "sent": {}, "answered": {}, "stopped": None}
                if msg["command"] == "disconnect":
                    stop = None
            elif stop is not None and stop["stopped"] is not None:
                stop["sent"][msg["seq"]] = (msg["command"], e["t"])
        elif stop is None:
            continue
        elif msg.get("type") == "event" and msg.get("event") == "stopped":
            stop["stopped"] = stop["stopped"] or e["t"]
        elif msg.get("type") == "response" and msg.get("request_seq") in stop["sent"]:
            stop["answered"][msg["request_seq"]] = e["t"]
    close()
    return out


def relay_via(relay: str, port: int) -> str:
    """The relay's URL with its host and port replaced by 127.0.0.1:``port``."""
    parts = urlsplit(relay)
    return urlunsplit(parts._replace(netloc=f"127.0.0.1:{port}"))


async def _block(
    way: str, stack: Stack, tmp: Path, name: str, n: int, rtt_ms: float, jitter_ms: float
) -> dict[str, list[float]]:
    workdir = tmp / name
    workdir.mkdir(parents=True)
    shutil.copyfile(PROGRAMS / PROGRAM, workdir / PROGRAM)
    transcript = tmp / f"{name}.transcript.jsonl"
    argv = ["python", PROGRAM]  # 10**7 iterations: it stays paused until disconnected

    def spec(port: int) -> dict[str, Any]:
        s = scenario(port, workdir, _steps(n),
                     breakpoints={PROGRAM: [break_line(PROGRAM)]},
                     timeout_ms=_TIMEOUT_S * 1000)  # fmt: skip
        s["transcript"] = str(transcript)
        return s

    seed = zlib.crc32(name.encode())  # jitter draws repeatable per block
    if way == TETHER:
        relay_port = urlsplit(stack.relay).port
        assert relay_port is not None, stack.relay
        async with (
            delay_proxy(relay_port, rtt_ms=rtt_ms, jitter_ms=jitter_ms, seed=seed) as proxy,
            # the proxy's address names no local stack: the stack's token is given as a user
            # of a relay behind a proxy gives theirs
            debug_run(
                stack.home,
                relay_via(stack.relay, proxy),
                workdir,
                *argv,
                extra_env={"TETHER_TOKEN": stack.endpoint().token},
            ) as (
                adapter,
                _run,
                port,
            ),
        ):
            async with open_vscode_session(spec(port), timeout=_TIMEOUT_S) as session:
                await session.result()
            await adapter.wait_line(r"run \S+ ended", timeout=120)  # the worker is free again
    else:
        async with (
            start_debuggee(
                argv,
                cwd=str(workdir),
                env=dict(os.environ),
                log_path=str(tmp / f"{name}.log"),
                fast=False,
            ) as debuggee,
            delay_proxy(debuggee.port, rtt_ms=rtt_ms, jitter_ms=jitter_ms, seed=seed) as proxy,
            open_vscode_session(spec(proxy), timeout=_TIMEOUT_S) as session,
        ):
            await session.result()
    return stop_times(transcript)


async def wan(
    stack: Stack,
    tmp: Path,
    rtts_ms: tuple[float, ...],
    blocks: int,
    per_block: int,
    jitter_ms: float = 0.0,
) -> dict[str, Any]:
    """Per RTT, ``blocks`` blocks of ``per_block`` whole stops per way, the ways' order rotating."""
    rows = []
    for rtt in rtts_ms:
        got = {k: {w: list[float]() for w in WAN_WAYS} for k in ("whole", "stopped", "threads")}
        for i in range(blocks):
            order = WAN_WAYS[i % 2 :] + WAN_WAYS[: i % 2]
            for way in order:
                name = f"wan-{way}-{rtt:g}-{i}"
                times = await _block(way, stack, tmp, name, per_block, rtt, jitter_ms)
                for kind, samples in times.items():
                    got[kind][way] += samples
        rows.append(
            {"rtt_ms": rtt, **{k: {w: Dist(v[w]) for w in WAN_WAYS} for k, v in got.items()}}
        )
    return {"jitter_ms": jitter_ms, "watches": list(WATCHES), "rows": rows}
