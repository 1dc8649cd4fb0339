"""Benchmark 3: a program printing many short lines under the debugger.

Lines per second reaching the DAP client as ``output`` events, through tether and straight from
stock debugpy; and the peak resident memory of every tether process.
"""

from __future__ import annotations

import shutil
from pathlib import Path
from typing import Any

import trio
from common import (
    PROGRAMS,
    DapClient,
    Stack,
    break_line,
    configure,
    direct_client,
    peak_rss_kib,
    tether_session,
)


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


def _workdir(tmp: Path, name: str) -> Path:
    workdir = tmp / name
    workdir.mkdir(parents=True, exist_ok=True)
    shutil.copyfile(PROGRAMS / "flood.py", workdir / "flood.py")
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
