"""Benchmarks 1 and 2: requests, steps and whole stops on a paused program, with VS Code's client.

Every figure here comes from Microsoft's DebugClient under node (the scenario runner,
``tests/e2e/node/vscode_scenario.mjs``, its transcript timed with ``performance.now()`` to the
microsecond), because node, like VS Code, delays its TCP ACKs: a writer that sends an event right
after a response without ``TCP_NODELAY`` has the event held until the ACK, which a Python client
that acknowledges at once never shows (``shared/research/latency-wan.md``).

The same program (``programs/loop.py``, paused 20 frames deep) runs three ways
(:data:`common.WAYS`): through tether, under stock debugpy, and the floor (the same debuggee
tether's worker starts, pydevd's socket without the Nagle stall, the client attached directly).
The ways take turns, one block each, the order rotating, so machine noise hits all three.

- :func:`requests`: round trips of single requests. Two kinds: what VS Code asks at every stop
  (``threads``, the first 20 frames, the top frame's scopes and locals, a watch), which tether
  answers from the stop's prefetch; and requests it forwards to debugpy (another frame's scopes,
  the globals, a hover evaluation). The other two ways forward everything.
- :func:`steps`: ``next`` until its response and until ``stopped``, nothing else asked; then the
  program runs to its end: its last line until ``terminated``.
- :func:`stops`: a whole VS Code stop, ``next`` until the IDE holds everything its views show,
  asked as VS Code asks (:func:`bench.wan.inspect_steps`; the same as section 9, on loopback).
"""

from __future__ import annotations

import json
import os
import shutil
from collections.abc import Callable
from pathlib import Path
from typing import Any

from tests.e2e.harness import debug_run, open_vscode_session, scenario
from worker_shim.program.debuggee import start_debuggee

from .common import FLOOR, PROGRAMS, TETHER, WAYS, Dist, Stack, break_line
from .wan import inspect_steps, stop_times

__all__ = ["FORWARDED", "PREFETCHED", "request_times", "requests", "step_times", "steps", "stops"]

PROGRAM = "loop.py"
_TIMEOUT_S = 600

#: what VS Code asks at every stop: tether answers it from the stop's prefetch
PREFETCHED: dict[str, dict[str, Any]] = {
    "threads": {"op": "threads"},
    "stackTrace (20 frames)": {"op": "stack_trace", "startFrame": 0, "levels": 20},
    "scopes": {"op": "scopes"},
    "variables (Locals)": {"op": "variables", "scope": "Locals"},
    "evaluate (watch)": {"op": "evaluate", "expression": "total", "context": "watch"},
}
#: requests tether forwards to debugpy (nothing of the prefetch answers them)
FORWARDED: dict[str, dict[str, Any]] = {
    "scopes (3rd frame)": {"op": "scopes", "frame": 2},
    "variables (Globals)": {"op": "variables", "scope": "Globals"},
    "evaluate (hover)": {"op": "evaluate", "expression": "i * factor", "context": "hover"},
}


async def _run(
    way: str,
    stack: Stack,
    tmp: Path,
    name: str,
    argv: list[str],
    steps: list[dict[str, Any]],
) -> Path:
    """Run ``steps`` against ``programs/loop.py`` reached the given ``way``; the transcript."""
    workdir = tmp / name
    workdir.mkdir(parents=True)
    shutil.copyfile(PROGRAMS / PROGRAM, workdir / PROGRAM)
    transcript = tmp / f"{name}.transcript.jsonl"

    def spec(port: int) -> dict[str, Any]:
        s = scenario(port, workdir, steps,
                     breakpoints={PROGRAM: [break_line(PROGRAM)]},
                     timeout_ms=_TIMEOUT_S * 1000)  # fmt: skip
        s["transcript"] = str(transcript)
        return s

    if way == TETHER:
        async with debug_run(stack.home, stack.relay, workdir, *argv) as (adapter, _run, port):
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
                fast=way == FLOOR,
            ) as debuggee,
            open_vscode_session(spec(debuggee.port), timeout=_TIMEOUT_S) as session,
        ):
            await session.result()
    return transcript


def _entries(transcript: Path) -> list[dict[str, Any]]:
    return [json.loads(line) for line in transcript.read_text().splitlines() if line.strip()]


async def _blocks(
    stack: Stack,
    tmp: Path,
    label: str,
    blocks: int,
    make: Callable[[str, str], tuple[list[str], list[dict[str, Any]]]],
    read: Callable[[Path], dict[str, list[float]]],
) -> dict[str, dict[str, list[float]]]:
    """``blocks`` runs per way, the ways' order rotating; ``make(way, name)`` gives the argv and
    the steps of one run, ``read`` its samples by kind."""
    got: dict[str, dict[str, list[float]]] = {}
    for i in range(blocks):
        for way in WAYS[i % len(WAYS) :] + WAYS[: i % len(WAYS)]:
            name = f"{label}-{way}-{i}"
            argv, steps = make(way, name)
            for kind, samples in read(await _run(way, stack, tmp, name, argv, steps)).items():
                got.setdefault(kind, {w: [] for w in WAYS})[way] += samples
    return got


# --- 1. requests ------------------------------------------------------------------------------


def _request_steps(per_block: int) -> list[dict[str, Any]]:
    """Stop at the breakpoint, evaluate the watch, step (so the watch is in the next stop's
    prefetch), then a warm-up round and ``per_block`` rounds of every kind of request."""
    round_ = [*PREFETCHED.values(), *FORWARDED.values()]
    return [
        {"op": "wait_stopped", "inspect": False, "reason": "breakpoint"},
        {"op": "stack_trace", "startFrame": 0, "levels": 20},
        {"op": "evaluate", "expression": "total", "context": "watch"},
        {"op": "next"},
        {"op": "wait_stopped", "inspect": False},
        *(round_ * (per_block + 1)),
        {"op": "disconnect", "terminateDebuggee": True},
    ]


def request_times(transcript: Path) -> dict[str, list[float]]:
    """Round trips (ms) by kind (:data:`PREFETCHED`, :data:`FORWARDED`) of the requests after the
    last ``stopped``, less each kind's first (the warm-up round)."""
    entries = _entries(transcript)
    last_stop = max(i for i, e in enumerate(entries) if e["msg"].get("event") == "stopped")
    out: dict[str, list[float]] = {}
    sent: dict[int, tuple[dict[str, Any], float]] = {}
    top_frame: int | None = None
    scope_names: dict[int, str] = {}
    for e in entries[last_stop:]:
        msg = e["msg"]
        if e["dir"] == "client->adapter" and msg.get("type") == "request":
            sent[msg["seq"]] = (msg, e["t"])
            continue
        if msg.get("type") != "response" or msg.get("request_seq") not in sent:
            continue
        request, t0 = sent.pop(msg["request_seq"])
        if not msg.get("success"):
            raise ValueError(f"{request['command']} failed: {msg.get('message')}")
        body, args = msg.get("body") or {}, request.get("arguments") or {}
        kind = _kind(request["command"], args, top_frame, scope_names)
        if request["command"] == "stackTrace":
            top_frame = body["stackFrames"][0]["id"]
        elif request["command"] == "scopes":
            scope_names.update({sc["variablesReference"]: sc["name"] for sc in body["scopes"]})
        if kind is not None:
            out.setdefault(kind, []).append(e["t"] - t0)
    return {kind: samples[1:] for kind, samples in out.items()}


def _kind(
    command: str, args: dict[str, Any], top_frame: int | None, scope_names: dict[int, str]
) -> str | None:
    """Which of :data:`PREFETCHED` and :data:`FORWARDED` a request is."""
    if command == "threads":
        return "threads"
    if command == "stackTrace":
        return "stackTrace (20 frames)"
    if command == "scopes":
        return "scopes" if args.get("frameId") == top_frame else "scopes (3rd frame)"
    if command == "variables":
        name = scope_names.get(args.get("variablesReference", 0))
        return {"Locals": "variables (Locals)", "Globals": "variables (Globals)"}.get(name or "")
    if command == "evaluate":
        return "evaluate (watch)" if args.get("context") == "watch" else "evaluate (hover)"
    return None


async def requests(stack: Stack, tmp: Path, blocks: int, per_block: int) -> dict[str, Any]:
    """Benchmark 1: ``per_block`` round trips of each kind per way in each of ``blocks`` blocks."""

    def make(_way: str, _name: str) -> tuple[list[str], list[dict[str, Any]]]:
        return ["python", PROGRAM], _request_steps(per_block)

    got = await _blocks(stack, tmp, "requests", blocks, make, request_times)
    return {
        group: {kind: {w: Dist(got[kind][w]) for w in WAYS} for kind in kinds}
        for group, kinds in (("prefetched", PREFETCHED), ("forwarded", FORWARDED))
    }


# --- 2. steps and whole stops -----------------------------------------------------------------


def _step_steps(n: int, workdir: Path) -> list[dict[str, Any]]:
    step: list[dict[str, Any]] = [{"op": "next"}, {"op": "wait_stopped", "inspect": False}]
    return [
        {"op": "wait_stopped", "inspect": False, "reason": "breakpoint"},
        *(step * n),
        # then the program runs to its end: its last line (the total), then its exit
        {"op": "set_breakpoints", "path": str(workdir / PROGRAM), "lines": []},
        {"op": "continue"},
        {"op": "wait_terminated"},
        {"op": "disconnect"},
    ]


def step_times(transcript: Path) -> dict[str, list[float]]:
    """``next`` -> its response (``answered``) and -> the next ``stopped`` (``stopped``), ms per
    ``next`` sent; and the program's last line (its ``output`` event) -> ``terminated``
    (``ended``)."""
    out: dict[str, list[float]] = {"answered": [], "stopped": [], "ended": []}
    sent: dict[int, float] = {}
    pending: float | None = None
    last_line: float | None = None
    for e in _entries(transcript):
        msg = e["msg"]
        if e["dir"] == "client->adapter" and msg.get("command") == "next":
            sent[msg["seq"]] = pending = e["t"]
        elif msg.get("type") == "response" and msg.get("command") == "next":
            out["answered"].append(e["t"] - sent[msg["request_seq"]])
        elif msg.get("event") == "stopped" and pending is not None:
            out["stopped"].append(e["t"] - pending)
            pending = None
        elif msg.get("event") == "output" and msg["body"].get("category") == "stdout":
            last_line = e["t"]
        elif msg.get("event") == "terminated" and last_line is not None and not out["ended"]:
            out["ended"].append(e["t"] - last_line)
    return out


async def steps(stack: Stack, tmp: Path, blocks: int, per_block: int) -> dict[str, Any]:
    """Benchmark 2: ``per_block`` steps per way and block, then the run's end, once per block."""

    def make(_way: str, name: str) -> tuple[list[str], list[dict[str, Any]]]:
        # loop iterations: a short run once continued
        argv = ["python", PROGRAM, str(2 * per_block + 100)]
        return argv, _step_steps(per_block, tmp / name)

    got = await _blocks(stack, tmp, "steps", blocks, make, step_times)
    return {kind: {w: Dist(got[kind][w]) for w in WAYS} for kind in got}


async def stops(stack: Stack, tmp: Path, blocks: int, per_block: int) -> dict[str, Any]:
    """Benchmark 2: ``per_block`` whole VS Code stops per way and block, on loopback."""
    stop: list[dict[str, Any]] = [
        {"op": "next"},
        {"op": "wait_stopped", "inspect": False},
        *inspect_steps(),
    ]

    def make(_way: str, _name: str) -> tuple[list[str], list[dict[str, Any]]]:
        return ["python", PROGRAM], [
            {"op": "wait_stopped", "inspect": False, "reason": "breakpoint"},
            *inspect_steps(),  # warm-up: the first stop, not timed
            *(stop * per_block),
            {"op": "disconnect", "terminateDebuggee": True},
        ]

    got = await _blocks(stack, tmp, "stops", blocks, make, stop_times)
    return {kind: {w: Dist(got[kind][w]) for w in WAYS} for kind in ("whole", "stopped")}
