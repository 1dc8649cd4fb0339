"""Benchmark 4: time to first stop, from the program's process starting to the IDE's ``stopped``.

tether: the IDE attached and set a breakpoint on an early line while the run was queued; then a
worker starts and runs it. Stock debugpy: started directly (``--listen --wait-for-client``), the
client attaching as soon as it listens. Both clocks start at the program process's birth (Linux
``/proc/PID/stat``, 10 ms resolution) and stop when the client holds the ``stopped`` event.
"""

from __future__ import annotations

import os
import shutil
import time
from pathlib import Path

from adapter.scripted_ide.dap_client import DapClient
from tests.e2e.harness import debug_run

from .common import (
    PROGRAMS,
    Stack,
    break_line,
    configure,
    direct_client,
    open_dap_client,
    worker,
)

_TICK = os.sysconf("SC_CLK_TCK")


def _born(pid: int) -> float:
    """When ``pid`` started, in CLOCK_BOOTTIME seconds."""
    stat = Path(f"/proc/{pid}/stat").read_text()
    return int(stat.rsplit(")", 1)[1].split()[19]) / _TICK


def _program_pid(script: str) -> int:
    """The newest process running ``script`` (under debugpy's boot)."""
    found = []
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                argv = (entry / "cmdline").read_bytes().split(b"\0")
            except OSError:
                continue
            if script.encode() in argv and any(b"debugpy" in a for a in argv):
                found.append((_born(int(entry.name)), int(entry.name)))
    return max(found)[1]


def _workdir(tmp: Path, name: str) -> Path:
    workdir = tmp / name
    workdir.mkdir(parents=True, exist_ok=True)
    shutil.copyfile(PROGRAMS / "early.py", workdir / "early.py")
    return workdir


async def _stopped_after_birth(client: DapClient) -> float:
    await client.wait_event("stopped", timeout=120)
    now = time.clock_gettime(time.CLOCK_BOOTTIME)
    return (now - _born(_program_pid("early.py"))) * 1000


async def through_tether(relay_home: Path, relay: str, tmp: Path, name: str) -> float:
    """Milliseconds; the worker starts after the IDE configured the queued run."""
    workdir = _workdir(tmp, name)
    line = break_line("early.py")
    async with (
        debug_run(relay_home, relay, workdir, "python", "early.py") as (_debug, _run, port),
        open_dap_client("127.0.0.1", port) as client,
    ):
        await configure(client, workdir, {"early.py": [line]}, mappings=False, wait_stop=False)
        async with worker(relay_home, relay):
            return await _stopped_after_birth(client)


async def straight(tmp: Path, name: str) -> float:
    workdir = _workdir(tmp, name)
    line = break_line("early.py")
    async with direct_client(workdir, ["python", "early.py"], tmp / f"{name}.log", fast=False) as (
        _,
        client,
    ):
        await configure(client, workdir, {"early.py": [line]}, mappings=True, wait_stop=False)
        return await _stopped_after_birth(client)


__all__ = ["Stack", "straight", "through_tether"]
