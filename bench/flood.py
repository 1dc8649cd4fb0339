"""Benchmark 3: a program printing many short lines under the debugger.

Lines per second reaching the DAP client as ``output`` events, through tether and straight from
stock debugpy; and the peak resident memory of every tether process.

Responsiveness during the flood, with VS Code's own client (Microsoft's DebugClient, the pinned
copy the end-to-end tests use, driven by ``flood_probe.mjs``) and VS Code's attach arguments
(``debugOptions: ["RedirectOutput"]``): a ``threads`` request every 0.1 s and one ``pause`` 1 s
after the program's first output; the latency of the ``threads`` requests sent during the flood
(between the first output and ``stopped``), and ``pause`` -> ``stopped``.
"""

from __future__ import annotations

import json
import os
import shutil
import statistics
import sys
import tempfile
from pathlib import Path
from typing import Any

import trio

from tests.e2e.harness import debug_run, ensure_node_modules, vscode_attach, vscode_initialize
from worker_shim.program.debuggee import start_debuggee

from .common import (
    PROGRAMS,
    DapClient,
    Stack,
    break_line,
    configure,
    direct_client,
    peak_rss_kib,
    tether_session,
)

PROBE = Path(__file__).resolve().with_name("flood_probe.mjs")


class _Discard(list[Any]):
    def append(self, _item: Any) -> None:
        pass


async def _flood(client: DapClient, workdir: Path, n: int, *, mappings: bool) -> float:
    """Lines per second from ``configurationDone`` to the stop after the last line."""
    lines = 0
    file = client._file

    def count(msg: dict[str, Any]) -> None:  # keeps none of the output events
        nonlocal lines
        if msg.get("event") != "output":
            file(msg)
        elif msg["body"].get("category") == "stdout":
            lines += msg["body"].get("output", "").count("\n")

    client._file = count  # type: ignore[method-assign]
    client.received = _Discard()
    breakpoints = {"flood.py": [break_line("flood.py")]}
    await configure(
        client, workdir, breakpoints, mappings=mappings, wait_stop=False, redirect_output=True
    )
    start = trio.current_time()
    await client.wait_event("stopped", timeout=900)
    end = trio.current_time()
    assert lines == n, f"{lines} of {n} lines arrived before the stop"
    return n / (end - start)


def _workdir(tmp: Path, name: str, program: str = "flood.py") -> Path:
    workdir = tmp / name
    workdir.mkdir(parents=True, exist_ok=True)
    shutil.copyfile(PROGRAMS / program, workdir / program)
    return workdir


async def through_tether(
    stack: Stack, tmp: Path, n: int, name: str
) -> tuple[float, dict[str, int]]:
    """(lines per second, peak RSS KiB of each tether process so far)."""
    workdir = _workdir(tmp, name)
    async with tether_session(stack, workdir, ["python", "flood.py", str(n)], None) as (s, _):
        rate = await _flood(s.client, workdir, n, mappings=False)
        peaks = {role: peak_rss_kib(pid) for role, pid in s.pids.items()}
    return rate, peaks


async def straight(tmp: Path, n: int, name: str, *, fast: bool = False) -> float:
    """Lines per second from stock debugpy, the client attached directly."""
    workdir = _workdir(tmp, name)
    async with direct_client(
        workdir, ["python", "flood.py", str(n)], tmp / f"{name}.log", fast=fast
    ) as (_, client):
        return await _flood(client, workdir, n, mappings=True)


# -- responsiveness during the flood --------------------------------------------------------------


async def responsive_through_tether(
    stack: Stack, tmp: Path, n: int, name: str, *, quick: bool
) -> dict[str, Any]:
    """The probe on `tether debug`'s adapter; the run is cancelled by the probe's disconnect."""
    workdir = _workdir(tmp, name, "flood_wait.py")
    argv = ["python", "flood_wait.py", str(n)]
    async with debug_run(stack.home, stack.relay, workdir, *argv) as (adapter, _run, port):
        result = await _probe(port, vscode_attach(port, workdir, remote_root=None), quick=quick)
        await adapter.wait_line(r"run \S+ ended", timeout=60)  # the worker is free again
    return result


async def responsive_straight(tmp: Path, n: int, name: str, *, quick: bool) -> dict[str, Any]:
    """The probe attached straight to stock debugpy (``python -m debugpy --listen``)."""
    workdir = _workdir(tmp, name, "flood_wait.py")
    async with start_debuggee(
        ["python", "flood_wait.py", str(n)],
        cwd=str(workdir),
        env=dict(os.environ),
        log_path=str(tmp / f"{name}.log"),
        fast=False,
    ) as debuggee:
        attach = vscode_attach(debuggee.port, workdir, remote_root=".")
        return await _probe(debuggee.port, attach, quick=quick)


async def _probe(port: int, attach: dict[str, Any], *, quick: bool) -> dict[str, Any]:
    """Run flood_probe.mjs against ``port``; its figures, summarised."""
    await trio.to_thread.run_sync(ensure_node_modules)
    window, pause_after = (20, 0.2) if quick else (60, 1.0)
    cfg = {
        "port": port,
        "initialize": vscode_initialize(),
        "attach": attach,
        "intervalMs": 100,
        "pauseAfterOutputMs": pause_after * 1000,
        "windowMs": window * 1000,
        "afterStopMs": 1000,
    }
    with tempfile.TemporaryDirectory(prefix="flood-probe-") as tmp:
        path = Path(tmp) / "cfg.json"
        path.write_text(json.dumps(cfg))
        with trio.fail_after(window + 180):
            done = await trio.run_process(
                ["node", str(PROBE), str(path)],
                capture_stdout=True,
                capture_stderr=True,
                check=False,
            )
    lines = [line for line in done.stdout.decode().splitlines() if line.startswith("{")]
    raw = json.loads(lines[-1]) if lines else {"error": done.stdout.decode()[-2000:]}
    if raw.get("error"):
        sys.stderr.write(done.stderr.decode()[-3000:])
        raise RuntimeError(f"flood_probe.mjs failed: {raw['error']}")
    return {**summarise_probe(raw), "pause_after_output_s": pause_after, "window_s": window}


def summarise_probe(raw: dict[str, Any]) -> dict[str, Any]:
    """``threads`` latency during the flood (sent between the first output and ``stopped``: of the
    answered ones; the longest wait of the others), pause -> stopped, and how far the program and
    its output were at the stop."""
    during = [p for p in raw["probes"] if p["during"]]
    answered = [p["ms"] for p in during if p["ms"] is not None]
    waiting = [p["waitedMs"] for p in during if p["ms"] is None]
    return {
        "threads_sent": len(during),
        "threads_answered": len(answered),
        "threads_median_ms": statistics.median(answered) if answered else None,
        "threads_max_ms": max(answered) if answered else None,
        "unanswered_longest_s": max(waiting) / 1000 if waiting else None,
        "pause_to_stopped_ms": raw["pauseToStoppedMs"],
        "lines_before_stopped": raw["linesBeforeStopped"],
        "printed_at_stop": raw["printedAtStop"],
        "lines_received": raw["lines"],
    }
