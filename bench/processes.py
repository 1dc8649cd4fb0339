"""Benchmark 8: multi-process programs: a child's time to first stop, and memory per process session.

Part 1, time to a child's first stop: a parent starts one ``multiprocessing`` spawn child whose
function stops at a breakpoint on its first line (``programs/spawn_children.py``). tether: the IDE
configured the run while it was queued, then a worker starts it (``tether debug``, default
``--processes stopped``: the child is offered with ``startDebugging`` when it first stops). Stock
debugpy: started directly with ``--configure-subProcess true``, the client attached; it answers
debugpy's ``startDebugging`` by opening the child's session on debugpy's port, where it sets the
breakpoint and sends ``configurationDone``. The client is Microsoft's DebugClient through the
scenario runner (``tests/e2e/node/vscode_scenario.mjs``), as VS Code is node.

The clock starts at the child's birth (``/proc/PID/stat``, 10 ms ticks, read by the parent as it
starts the child; PID is the child session's ``subProcessId``) and stops when the runner received
``stopped`` in the child's session: its transcript's timestamp (ms since the runner's own epoch).
The two clocks are related once per run: the runner waits at a ``mark`` until the bench writes
``go`` on its stdin (wall clock noted just before), and at once sends a ``threads`` request, whose
transcript timestamp is then that wall-clock instant (error: the pipe and one event-loop turn, well
under a millisecond, plus the runner's 1 ms resolution). A second, coarser figure checks it: the
bench's wall clock on receiving the ``MARK stopped`` line the runner prints right after the stop.
Also from the transcript: the child's birth to the client receiving ``startDebugging`` for it.

Part 2, memory per process session: one run whose program starts K children that each stop at the
breakpoint, the client holding every child's session, against the same run with one child. Relay
resident memory and Redis ``used_memory`` are read when the IDE configured the queued run and again
when every child is stopped; per extra process: ``(delta(K) - delta(1)) / (K - 1)``. A run with one
child goes first and is not counted (first-use allocations).
"""

from __future__ import annotations

import json
import os
import shutil
import time
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

from tests.e2e.harness import debug_run, open_vscode_session, scenario, worker
from worker_shim.program.debuggee import start_debuggee

from .common import PROGRAMS, Dist, break_line, rss_kib

PROGRAM = "spawn_children.py"
_TICK = os.sysconf("SC_CLK_TCK")
_TIMEOUT_S = 240


def _boot_offset() -> float:
    """Wall clock minus CLOCK_BOOTTIME, in seconds (both read back to back)."""
    return time.time() - time.clock_gettime(time.CLOCK_BOOTTIME)


def _workdir(tmp: Path, name: str) -> Path:
    workdir = tmp / name
    workdir.mkdir(parents=True, exist_ok=True)
    shutil.copyfile(PROGRAMS / PROGRAM, workdir / PROGRAM)
    return workdir


def _spec(port: int, workdir: Path, steps: list[dict[str, Any]], transcript: Path) -> Any:
    spec = scenario(
        port,
        workdir,
        steps,
        breakpoints={PROGRAM: [break_line(PROGRAM)]},
        timeout_ms=_TIMEOUT_S * 1000,
    )
    spec["transcript"] = str(transcript)
    return spec


# -- part 1: a child's time to first stop ---------------------------------------------------------

_FIRST_STOP_STEPS: list[dict[str, Any]] = [
    # the clock sync: released by the bench, then at once a request the transcript timestamps
    {"op": "mark", "name": "sync", "wait": True},
    {"op": "threads", "allowError": True},
    # the resource tracker is a child too (debugpy offers it; it never stops)
    {"op": "wait_session", "label": "kid", "stopped": True},
    {"op": "wait_stopped", "session": "kid", "inspect": False, "reason": "breakpoint"},
    {"op": "mark", "name": "stopped"},
    {"op": "continue", "session": "kid"},
    {"op": "wait_output", "contains": "parent done, exit codes [0]"},
    {"op": "wait_terminated"},
    {"op": "disconnect"},
]


def _child_times(
    result: dict[str, Any], transcript: Path, born: Path, go_wall: float, offset: float
) -> tuple[float, float]:
    """From the child's birth to the runner's receipt of (``startDebugging`` for it, ``stopped`` in
    its session), ms."""
    kid = result["labels"]["kid"]
    pid = kid["subProcessId"]
    main = next(s["index"] for s in result["sessions"] if s["kind"] == "main")
    entries = [json.loads(line) for line in transcript.read_text().splitlines() if line.strip()]
    sync = [
        e["t"]
        for e in entries
        if e["session"] == main
        and e["dir"] == "client->adapter"
        and e["msg"].get("command") == "threads"
    ][-1]  # the handshake sent one too; the step after the mark is the last
    offered = next(
        e["t"]
        for e in entries
        if e["dir"] == "adapter->client"
        and e["msg"].get("command") == "startDebugging"
        and e["msg"]["arguments"]["configuration"].get("subProcessId") == pid
    )
    stop = next(
        e["t"]
        for e in entries
        if e["session"] == kid["session"]
        and e["dir"] == "adapter->client"
        and e["msg"].get("event") == "stopped"
    )
    epoch = go_wall - sync / 1000 - _born_wall(born, pid, offset)  # the runner's T0, from birth
    return (epoch + offered / 1000) * 1000, (epoch + stop / 1000) * 1000


def _born_wall(born: Path, pid: int, offset: float) -> float:
    for line in born.read_text().splitlines():
        entry = json.loads(line)
        if entry["pid"] == pid:
            return float(entry["born_ticks"]) / _TICK + offset
    raise ValueError(f"the stopped session's subProcessId {pid} is no child the parent started")


def _figures(
    result: dict[str, Any], transcript: Path, born: Path, go: float, mark: float, offset: float
) -> dict[str, float]:
    offered, stopped = _child_times(result, transcript, born, go, offset)
    birth = _born_wall(born, result["labels"]["kid"]["subProcessId"], offset)
    return {"stopped": stopped, "offered": offered, "mark": (mark - birth) * 1000}


async def _drive(spec: Any) -> tuple[dict[str, Any], float, float]:
    """Run a first-stop scenario; returns (result, wall clock at `go sync`, at `MARK stopped`)."""
    async with open_vscode_session(spec, timeout=_TIMEOUT_S) as session:
        await session.wait_mark("sync", timeout=_TIMEOUT_S)
        go_wall = time.time()
        await session.release("sync")
        await session.wait_mark("stopped", timeout=_TIMEOUT_S)
        mark_wall = time.time()
        result, _messages = await session.result()
    return result, go_wall, mark_wall


async def child_stop_through_tether(
    home: Path, relay: str, tmp: Path, name: str
) -> dict[str, float]:
    """Milliseconds from the child's birth (see :func:`_figures`); the worker starts after the IDE configured the queued run."""
    workdir = _workdir(tmp, name)
    born = tmp / f"{name}.born"
    transcript = tmp / f"{name}.transcript.jsonl"
    offset = _boot_offset()
    argv = ["python", PROGRAM, "1", str(born)]
    async with debug_run(home, relay, workdir, *argv) as (debug, _run, port):
        spec = _spec(port, workdir, _FIRST_STOP_STEPS, transcript)
        async with open_vscode_session(spec, timeout=_TIMEOUT_S) as session:
            await session.wait_mark("sync", timeout=_TIMEOUT_S)
            go_wall = time.time()
            await session.release("sync")
            async with worker(home, relay):
                await session.wait_mark("stopped", timeout=_TIMEOUT_S)
                mark_wall = time.time()
                result, _messages = await session.result()
                await debug.wait_line(r"run \S+ ended", timeout=60)  # the worker is free again
    return _figures(result, transcript, born, go_wall, mark_wall, offset)


async def child_stop_straight(tmp: Path, name: str) -> dict[str, float]:
    """Milliseconds from the child's birth (see :func:`_figures`) with stock debugpy (``--configure-subProcess true``)."""
    workdir = _workdir(tmp, name)
    born = tmp / f"{name}.born"
    transcript = tmp / f"{name}.transcript.jsonl"
    offset = _boot_offset()
    argv = ["python", PROGRAM, "1", str(born)]
    async with start_debuggee(
        argv,
        cwd=str(workdir),
        env=dict(os.environ),
        log_path=str(tmp / f"{name}.log"),
        fast=False,
        subprocesses=True,
    ) as debuggee:
        spec = _spec(debuggee.port, workdir, _FIRST_STOP_STEPS, transcript)
        result, go_wall, mark_wall = await _drive(spec)
    return _figures(result, transcript, born, go_wall, mark_wall, offset)


async def first_stops(home: Path, relay: str, tmp: Path, n: int) -> dict[str, Any]:
    """``n`` runs each way, alternating."""
    figures = ("stopped", "offered", "mark")
    got = {f: {"tether": list[float](), "debugpy": list[float]()} for f in figures}
    for i in range(n):
        for way, measure in (
            ("tether", lambda i=i: child_stop_through_tether(home, relay, tmp, f"pc-t{i}")),
            ("debugpy", lambda i=i: child_stop_straight(tmp, f"pc-d{i}")),
        ):
            measured = await measure()
            for f in figures:
                got[f][way].append(measured[f])
    return {
        "child_first_stop": {k: Dist(v) for k, v in got["stopped"].items()},
        "child_offered": {k: Dist(v) for k, v in got["offered"].items()},
        "child_first_stop_mark": {k: Dist(v) for k, v in got["mark"].items()},
    }


# -- part 2: memory per process session -----------------------------------------------------------


def _many_steps(k: int) -> list[dict[str, Any]]:
    steps: list[dict[str, Any]] = [{"op": "mark", "name": "configured", "wait": True}]
    for i in range(k):
        steps += [
            {"op": "wait_session", "label": f"k{i}", "stopped": True},
            {"op": "wait_stopped", "session": f"k{i}", "inspect": False, "reason": "breakpoint"},
        ]
    steps.append({"op": "mark", "name": "held", "wait": True})
    steps += [{"op": "continue", "session": f"k{i}"} for i in range(k)]
    zeros = ", ".join(["0"] * k)
    return [
        *steps,
        {"op": "wait_output", "contains": f"parent done, exit codes [{zeros}]"},
        {"op": "wait_terminated"},
        {"op": "disconnect"},
    ]


async def _memory_run(
    home: Path,
    relay: str,
    relay_pid: int,
    redis_mem: Callable[[], Awaitable[int]],
    tmp: Path,
    name: str,
    k: int,
) -> dict[str, Any]:
    """One run of ``k`` children: memory when configured (queued) and with every child stopped."""
    workdir = _workdir(tmp, name)
    argv = ["python", PROGRAM, str(k), str(tmp / f"{name}.born")]
    async with debug_run(home, relay, workdir, *argv) as (debug, _run, port):
        spec = _spec(port, workdir, _many_steps(k), tmp / f"{name}.transcript.jsonl")
        async with open_vscode_session(spec, timeout=_TIMEOUT_S) as session:
            await session.wait_mark("configured", timeout=_TIMEOUT_S)
            adapter = debug.process.pid
            before = [rss_kib(relay_pid), await redis_mem(), rss_kib(adapter)]
            await session.release("configured")
            async with worker(home, relay):
                await session.wait_mark("held", timeout=_TIMEOUT_S)
                held = [rss_kib(relay_pid), await redis_mem(), rss_kib(adapter)]
                await session.release("held")
                result, _messages = await session.result()
                await debug.wait_line(r"run \S+ ended", timeout=60)
    children = [s for s in result["sessions"] if s["kind"] == "child"]
    return {
        "children": k,
        "sessions_opened": len(children),
        "relay_rss_kib": [before[0], held[0]],
        "redis_used_memory": [before[1], held[1]],
        "adapter_rss_kib": [before[2], held[2]],
    }


async def memory(
    home: Path,
    relay: str,
    relay_pid: int,
    redis_mem: Callable[[], Awaitable[int]],
    tmp: Path,
    k: int,
) -> dict[str, Any]:
    runs = [
        await _memory_run(home, relay, relay_pid, redis_mem, tmp, f"pm-{i}-{n}", n)
        for i, n in enumerate((1, 1, k))
    ]
    one, many = runs[1], runs[2]

    def per_process(key: str) -> float:
        grew = [(r[key][1] - r[key][0]) for r in (one, many)]
        return (grew[1] - grew[0]) / (k - 1)

    return {
        "children": k,
        "runs": runs,
        "relay_kib_per_process": per_process("relay_rss_kib"),
        "redis_bytes_per_process": per_process("redis_used_memory"),
        "adapter_kib_per_process": per_process("adapter_rss_kib"),
    }


__all__ = ["PROGRAM", "child_stop_straight", "child_stop_through_tether", "first_stops", "memory"]
