"""What every benchmark shares: real tether processes, debuggees, DAP sessions, memory, statistics.

tether runs as users run it, one process each: ``tether up --workers 0`` (the bundled Redis-compatible
server and the relay), ``tether worker`` (the pool and the worker shim) and ``tether debug`` (the
adapter). The process harness is the end-to-end tests' (``tests/e2e/stack.py``).
"""

from __future__ import annotations

import math
import os
import platform
import statistics
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import trio

from adapter.scripted_ide.dap_client import DapClient, open_dap_client
from adapter.scripted_ide.demo import VSCODE_INITIALIZE
from relay.client import Endpoint
from tests.e2e.harness import Proc, debug_run, relay_stack, tether, worker
from worker_shim.program.debuggee import Debuggee, start_debuggee

ROOT = Path(__file__).resolve().parent.parent
PROGRAMS = Path(__file__).resolve().parent / "programs"

#: the three ways a DAP client reaches a program, in every latency figure
TETHER, DEBUGPY, FLOOR = "tether", "debugpy", "floor"
WAYS = (TETHER, DEBUGPY, FLOOR)
WAY_NAMES = {
    TETHER: "through tether (adapter, relay, Redis, shim)",
    DEBUGPY: "stock debugpy (--listen), client attached directly",
    FLOOR: "debugpy without the Nagle stall, client attached directly",
}


def break_line(program: str, marker: str = "# BREAK") -> int:
    """The 1-based line of ``program`` (in :data:`PROGRAMS`) carrying ``marker``."""
    for n, line in enumerate((PROGRAMS / program).read_text().splitlines(), 1):
        if marker in line:
            return n
    raise ValueError(f"{program} has no {marker!r} line")


# -- statistics ---------------------------------------------------------------------------------


@dataclass
class Dist:
    """A latency distribution in milliseconds."""

    samples: list[float]

    @property
    def median(self) -> float:
        return statistics.median(self.samples)

    def quantile(self, q: float) -> float:
        ordered = sorted(self.samples)
        return ordered[min(len(ordered) - 1, math.ceil(q * len(ordered)) - 1)]

    @property
    def p99(self) -> float:
        return self.quantile(0.99)

    def summary(self) -> dict[str, float]:
        return {"n": len(self.samples), "median": self.median, "p99": self.p99}


# -- processes and memory -----------------------------------------------------------------------


def peak_rss_kib(pid: int) -> int:
    """The peak resident set of a live process (``VmHWM``), KiB; 0 where /proc is missing."""
    return _status_kib(pid, "VmHWM")


def rss_kib(pid: int) -> int:
    return _status_kib(pid, "VmRSS")


def _status_kib(pid: int, field: str) -> int:
    try:
        for line in Path(f"/proc/{pid}/status").read_text().splitlines():
            if line.startswith(field + ":"):
                return int(line.split()[1])
    except OSError:
        pass
    return 0


def children(pid: int) -> list[int]:
    """Direct children of ``pid`` (Linux)."""
    found = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            stat = (entry / "stat").read_text()
        except OSError:
            continue
        if int(stat.rsplit(")", 1)[1].split()[1]) == pid:
            found.append(int(entry.name))
    return found


def machine() -> dict[str, Any]:
    """What the figures were measured on."""
    cpu = "?"
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                cpu = line.split(":", 1)[1].strip()
                break
    except OSError:
        cpu = platform.processor() or "?"
    mem = 0
    try:
        for line in Path("/proc/meminfo").read_text().splitlines():
            if line.startswith("MemTotal:"):
                mem = int(line.split()[1]) // 1024
    except OSError:
        pass
    import debugpy

    return {
        "cpu": cpu,
        "cores": os.cpu_count(),
        "memory_mib": mem,
        "os": f"{platform.system()} {platform.release()}",
        "python": platform.python_version(),
        "debugpy": debugpy.__version__,
    }


# -- DAP sessions ------------------------------------------------------------------------------


async def configure(
    client: DapClient,
    workdir: Path,
    breakpoints: dict[str, list[int]],
    *,
    mappings: bool,
    wait_stop: bool = True,
    redirect_output: bool = False,
) -> dict[str, Any] | None:
    """What VS Code sends on attach; returns the first ``stopped`` event (if ``wait_stop``)."""
    await client.request("initialize", VSCODE_INITIALIZE)
    attach_args: dict[str, Any] = {"justMyCode": True}
    if redirect_output:
        attach_args["redirectOutput"] = True
    if mappings:
        attach_args["pathMappings"] = [{"localRoot": str(workdir), "remoteRoot": "."}]
    attach = client.send_request_nowait("attach", attach_args)
    await client.wait_event("initialized", timeout=120)
    for name, lines in breakpoints.items():
        await client.request(
            "setBreakpoints",
            {"source": {"path": str(workdir / name)}, "breakpoints": [{"line": n} for n in lines]},
        )
    await client.request("configurationDone")
    await client.response(attach, timeout=120)
    if wait_stop:
        return await client.wait_event("stopped", timeout=120)
    return None


@dataclass
class Session:
    """A DAP client on a program paused at its first breakpoint."""

    way: str
    client: DapClient
    thread: int
    pids: dict[str, int]  # tether's processes by role (tether way only)


@asynccontextmanager
async def direct_client(
    workdir: Path, argv: list[str], log_path: Path, *, fast: bool
) -> AsyncIterator[tuple[Debuggee, DapClient]]:
    """``argv`` under debugpy in ``workdir`` (``fast``: pydevd's socket without the Nagle stall),
    and a DAP client attached to it directly."""
    async with (
        start_debuggee(
            argv, cwd=str(workdir), env=dict(os.environ), log_path=str(log_path), fast=fast
        ) as debuggee,
        open_dap_client("127.0.0.1", debuggee.port) as client,
    ):
        yield debuggee, client


@asynccontextmanager
async def direct_session(
    way: str, workdir: Path, argv: list[str], breakpoints: dict[str, list[int]]
) -> AsyncIterator[Session]:
    """Stock debugpy (``fast=False``: ``python -m debugpy --listen``) or the floor (``fast=True``:
    the same debuggee tether's worker starts, pydevd's socket without the Nagle stall)."""
    async with direct_client(workdir, argv, workdir.parent / f"{way}.log", fast=way == FLOOR) as (
        debuggee,
        client,
    ):
        stopped = await configure(client, workdir, breakpoints, mappings=True)
        assert stopped is not None
        yield Session(way, client, stopped["body"]["threadId"], {"debuggee": debuggee.process.pid})


@dataclass
class Stack:
    """A running tether: ``tether up --workers 0`` and ``tether worker``."""

    home: Path
    relay: str
    up: Proc
    worker: Proc

    def endpoint(self) -> Endpoint:
        """The relay with the local user's token (`tether up` keeps it in its data directory)."""
        return Endpoint(self.relay, token=(self.home / "data" / "token").read_text().strip())

    async def redis_url(self) -> str:
        return (await self.up.wait_line(r"redis: (\S+)")).group(1)

    def pids(self) -> dict[str, int]:
        redis = [p for p in children(self.up.process.pid) if b"server" in _cmdline(p)]
        found = {"relay": self.up.process.pid, "worker": self.worker.process.pid}
        if redis:
            found["redis"] = redis[0]
        return found


def _cmdline(pid: int) -> bytes:
    try:
        return Path(f"/proc/{pid}/cmdline").read_bytes()
    except OSError:
        return b""


@asynccontextmanager
async def tether_stack(
    home: Path, *, slots: int = 1, relay_args: tuple[str, ...] = ()
) -> AsyncIterator[Stack]:
    """``tether up --workers 0 [relay_args]`` and ``tether worker``."""
    async with (
        tether(
            "up", "--data-dir", str(home / "data"), "--workers", "0", "--relay-port", "0",
            *relay_args, home=home,
        ) as up,
    ):  # fmt: skip
        relay = (await up.wait_line(r"tether up: ready relay=(\S+)")).group(1)
        async with worker(home, relay, slots=slots) as w:
            yield Stack(home, relay, up, w)


@asynccontextmanager
async def tether_session(
    stack: Stack,
    workdir: Path,
    argv: list[str],
    breakpoints: dict[str, list[int]] | None,
) -> AsyncIterator[tuple[Session, Proc]]:
    """`tether debug` of ``argv`` and a DAP client on its adapter, configured and stopped at the
    first breakpoint (``breakpoints=None``: not configured yet)."""
    async with (
        debug_run(stack.home, stack.relay, workdir, *argv) as (adapter, _run, port),
        open_dap_client("127.0.0.1", port) as client,
    ):
        thread = 0
        if breakpoints is not None:
            stopped = await configure(client, workdir, breakpoints, mappings=False)
            assert stopped is not None
            thread = stopped["body"]["threadId"]
        pids = stack.pids() | {"adapter": adapter.process.pid}
        yield Session(TETHER, client, thread, pids), adapter
        await end_run(client)
        await adapter.wait_line(r"run \S+ ended", timeout=60)  # the worker is free again


async def end_run(client: DapClient) -> None:
    """Stop the program, as the IDE's Stop button does (else it stays paused on its worker)."""
    with trio.move_on_after(30):
        try:
            await client.request("disconnect", {"terminateDebuggee": True})
        except (ConnectionError, TimeoutError):
            pass


async def redis_used_memory(url: str) -> int:
    """``used_memory`` of INFO, over a plain RESP connection (``redis://`` or ``unix://``)."""
    if url.startswith("unix://"):
        stream: trio.abc.Stream = await trio.open_unix_socket(url[len("unix://") :].split("?")[0])
    else:
        host, _, port = url.split("://", 1)[1].split("/")[0].rpartition(":")
        stream = await trio.open_tcp_stream(host or "127.0.0.1", int(port or 6379))
    async with stream:
        await stream.send_all(b"*2\r\n$4\r\nINFO\r\n$6\r\nmemory\r\n")
        data = b""
        while b"used_memory:" not in data or not data.endswith(b"\r\n"):
            data += await stream.receive_some(65536)
    for line in data.decode().splitlines():
        if line.startswith("used_memory:"):
            return int(line.split(":")[1])
    raise ValueError("no used_memory in INFO")


def ms(x: float) -> str:
    """Milliseconds as the report writes them."""
    return f"{x:.2f} ms" if x < 100 else f"{x:.0f} ms"


def verdict(ok: bool) -> str:
    """A target, met or not, as the report writes it."""
    return "met" if ok else "**not met**"


async def timed(coro: Any) -> tuple[float, Any]:
    """(milliseconds, result) of awaiting ``coro``."""
    t0 = trio.current_time()
    result = await coro
    return (trio.current_time() - t0) * 1000, result


__all__ = [
    "DEBUGPY",
    "FLOOR",
    "PROGRAMS",
    "ROOT",
    "TETHER",
    "WAYS",
    "WAY_NAMES",
    "Debuggee",
    "Dist",
    "Endpoint",
    "Proc",
    "Session",
    "Stack",
    "break_line",
    "children",
    "configure",
    "direct_client",
    "direct_session",
    "machine",
    "ms",
    "peak_rss_kib",
    "redis_used_memory",
    "relay_stack",
    "rss_kib",
    "tether",
    "tether_session",
    "tether_stack",
    "timed",
    "verdict",
    "worker",
]
