"""Benchmark 10: what a debuggable plain run costs while nobody is attached.

``tether run`` starts a Python program so that ``tether attach`` can debug it later
(``_tether_debugpy_boot.py --tether-attach``): a thread waits on the worker's unix socket, and
nothing of debugpy is loaded until an IDE attaches. This measures the program against plain
``python`` on the same interpreter, the runs alternating: a CPU-bound loop of arithmetic (a
training loop's Python side), a loop of short Python calls, and the start of a program that prints
one line (the whole process, start to exit). The loops time themselves (``time.perf_counter``
around the loop); the start is timed from outside.
"""

from __future__ import annotations

import statistics
import sys
import time
from pathlib import Path
from typing import Any

import trio

from worker_shim.program.python_command import build_attachable_argv, debugpy_home

__all__ = ["PROGRAMS", "run"]

#: name -> the program's source (``{n}``: its loop's iterations)
PROGRAMS: dict[str, str] = {
    "cpu loop": (
        "import time\n"
        "t = time.perf_counter()\n"
        "total = 0.0\n"
        "for i in range({n}):\n"
        "    total += (i % 7) * 0.5\n"
        "print(time.perf_counter() - t)\n"
    ),
    "short calls": (
        "import time\n"
        "def f(x):\n"
        "    return x + 1\n"
        "t = time.perf_counter()\n"
        "x = 0\n"
        "for i in range({n}):\n"
        "    x = f(x)\n"
        "print(time.perf_counter() - t)\n"
    ),
    "start and exit": "print('hi')\n",
}
#: loop iterations (full, quick)
ITERATIONS = {"cpu loop": (5_000_000, 200_000), "short calls": (2_000_000, 100_000)}


async def _once(argv: list[str], cwd: Path, timed_inside: bool) -> float:
    """Seconds: what the program printed (its loop), or the whole process's wall time."""
    t0 = time.perf_counter()
    done = await trio.run_process(argv, cwd=cwd, capture_stdout=True, capture_stderr=True)
    wall = time.perf_counter() - t0
    return float(done.stdout.split()[-1]) if timed_inside else wall


async def _worker_side(listener: trio.socket.SocketType) -> None:
    """What the worker does while nobody attaches: take each program's connection and hold it."""
    held = []
    while True:
        conn, _addr = await listener.accept()
        held.append(conn)


async def run(tmp: Path, runs: int, quick: bool) -> dict[str, Any]:
    """``runs`` pairs of runs per program, alternating; medians and minimums in seconds, and
    the median of each pair's ratio (this machine's speed drifts and jumps between runs: a pair
    run back to back sees the same machine most of the time)."""
    where = tmp / "debuggable"
    where.mkdir(parents=True, exist_ok=True)
    home = str(debugpy_home(where))
    listener = trio.socket.socket(trio.socket.AF_UNIX, trio.socket.SOCK_STREAM)
    await listener.bind(str(where / "attach.sock"))
    listener.listen(64)
    async with trio.open_nursery() as nursery:
        nursery.start_soon(_worker_side, listener)
        figures = await _measure(where, home, runs, quick)
        nursery.cancel_scope.cancel()
    listener.close()
    return figures


async def _measure(where: Path, home: str, runs: int, quick: bool) -> dict[str, Any]:
    out: dict[str, Any] = {"runs": runs, "python": sys.version.split()[0], "programs": {}}
    for name, source in PROGRAMS.items():
        n = ITERATIONS.get(name, (0, 0))[quick]
        script = where / f"{name.replace(' ', '_')}.py"
        script.write_text(source.format(n=n))
        ways = {
            "plain": [sys.executable, script.name],
            "debuggable": build_attachable_argv(
                ["python", script.name],
                python=sys.executable,
                home=home,
                socket=str(where / "attach.sock"),
            ),
        }
        got: dict[str, list[float]] = {way: [] for way in ways}
        for i in range(runs):  # a pair of runs back to back, the order alternating
            order = list(ways) if i % 2 == 0 else list(reversed(ways))
            for way in order:
                got[way].append(await _once(ways[way], where, name in ITERATIONS))
        pairs = [d / p for p, d in zip(got["plain"], got["debuggable"], strict=True)]
        out["programs"][name] = {
            "iterations": n,
            "paired_ratio": statistics.median(pairs),
            **{
                way: {"median": statistics.median(v), "min": min(v), "samples": v}
                for way, v in got.items()
            },
        }
    return out
