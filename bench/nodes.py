"""Benchmark 16: a run over two nodes (issue 43): time to the first stop on node 2 against a
single-node run's, and the memory of each node's worker.

The local pool (``tether worker --nodes 2``) runs node 0 in its slot and starts node 1's worker
(``tether worker --run R --attempt A --node 1``) on this host, in a directory of its own: no
``--node-via`` (network namespaces add a veth hop, not a different code path). The program
(``programs/nodes_bench.py``) stops at a breakpoint on its last node, set by the client while the
run is queued; the other node waits until it is continued. The client is Microsoft's DebugClient
(``tests/e2e/node/vscode_scenario.mjs``), as in VS Code.

- **time to the first stop**: from the pool saying it claimed the run to the client holding the
  ``stopped`` event of the last node's program (node 1's: its own session, offered when its
  program started; a single node: the main session). It holds the node worker's start, its join,
  its wait for node 0's rendezvous and its program's start under debugpy.
- **memory**: the resident set of each node's worker process (node 0: the pool, which runs it in
  its slot; node 1: its own ``tether worker --node 1``) and of the adapter (``tether debug``),
  read while the program is stopped; the single-node run's are the baseline.

Baseline and two-node runs alternate, a fresh pool for each (the pool's start is not timed).
"""

from __future__ import annotations

import os
import shutil
from pathlib import Path
from typing import Any

import trio

from tests.e2e.harness import debug_run, open_vscode_session, scenario, tether

from .common import PROGRAMS, Dist, break_line, children, ms, rss_kib

__all__ = ["PROGRAM", "run", "section"]

PROGRAM = "nodes_bench.py"
_TIMEOUT_S = 180


def _steps(nodes: int) -> list[dict[str, Any]]:
    stop: list[dict[str, Any]]
    if nodes == 1:
        stop = [{"op": "wait_stopped", "session": "main", "inspect": False, "reason": "breakpoint"}]
    else:
        last = nodes - 1
        stop = [
            {"op": "wait_session", "label": "last", "stopped": True, "name": rf"on node {last}\b",
             "timeoutMs": _TIMEOUT_S * 1000},
            {"op": "wait_stopped", "session": "last", "inspect": False, "reason": "breakpoint"},
        ]  # fmt: skip
    return [
        {"op": "mark", "name": "configured", "wait": True},
        *stop,
        {"op": "mark", "name": "stopped", "wait": True},
        {"op": "continue", "session": "main" if nodes == 1 else "last"},
        {"op": "wait_terminated", "timeoutMs": _TIMEOUT_S * 1000},
        {"op": "disconnect"},
    ]


def _node_worker(pool: int) -> int | None:
    """The pid of the pool's node worker (``tether worker ... --node 1``), a child of it."""
    for pid in children(pool):
        try:
            argv = Path(f"/proc/{pid}/cmdline").read_bytes().split(b"\0")
        except OSError:
            continue
        if b"worker" in argv and b"--node" in argv:
            return pid
    return None


async def _one_run(home: Path, relay: str, tmp: Path, name: str, nodes: int) -> dict[str, Any]:
    """One run of ``nodes`` nodes: its time to the first stop (ms) and the RSS (KiB) of each
    node's worker and of the adapter while stopped."""
    workdir = tmp / name
    workdir.mkdir(parents=True)
    shutil.copyfile(PROGRAMS / PROGRAM, workdir / PROGRAM)
    out = tmp / f"{name}-out"
    out.mkdir()
    out.chmod(0o777)  # a root pool's programs run as uids of their own
    extra = ("--nodes", str(nodes), "--env", f"OUT={out}")
    async with debug_run(home, relay, workdir, "python", PROGRAM, extra=extra) as (
        debug,
        run_id,
        port,
    ):
        spec = scenario(port, workdir, _steps(nodes), breakpoints={PROGRAM: [break_line(PROGRAM)]},
                        timeout_ms=_TIMEOUT_S * 1000)  # fmt: skip
        async with open_vscode_session(spec, timeout=_TIMEOUT_S) as session:
            await session.wait_mark("configured", timeout=_TIMEOUT_S)
            async with tether(
                "worker", "--relay", relay, "--slots", "1", "--work-dir", str(home / "worker"),
                "--nodes", str(nodes), home=home, name="pool",
            ) as pool:  # fmt: skip
                await pool.wait_line(r"tether worker: ready")
                await session.release("configured")
                await pool.wait_line(rf"claimed run {run_id}", timeout=_TIMEOUT_S)
                claimed = trio.current_time()
                await session.wait_mark("stopped", timeout=_TIMEOUT_S)
                first_stop = (trio.current_time() - claimed) * 1000
                memory = {
                    "node 0": rss_kib(pool.process.pid),
                    "adapter": rss_kib(debug.process.pid),
                }
                if nodes > 1:
                    node_worker = _node_worker(pool.process.pid)
                    memory["node 1"] = rss_kib(node_worker) if node_worker else 0
                await session.release("stopped")
                await session.result()
                await debug.wait_line(r"run \S+ ended", timeout=60)
    return {"first_stop": first_stop, "memory": memory}


async def run(home: Path, relay: str, tmp: Path, rounds: int) -> dict[str, Any]:
    """``rounds`` rounds, each a single-node run then a two-node run (each with a fresh pool)."""
    got: dict[int, list[dict[str, Any]]] = {1: [], 2: []}
    for i in range(rounds):
        for nodes in (1, 2):
            got[nodes].append(await _one_run(home, relay, tmp, f"nodes-{nodes}-{i}", nodes))
    figures: dict[str, Any] = {"rounds": rounds}
    for nodes, runs in got.items():
        figures[str(nodes)] = {
            "first_stop": Dist([r["first_stop"] for r in runs]),
            "memory_kib": {who: max(r["memory"][who] for r in runs) for who in runs[0]["memory"]},
        }
    figures["isolated"] = os.geteuid() == 0
    return figures


def section(f: dict[str, Any], _n: dict[str, int]) -> list[str]:
    """Section 16 of ``bench/report.md``."""
    one, two = f["1"], f["2"]
    s1, s2 = one["first_stop"], two["first_stop"]
    m1, m2 = one["memory_kib"], two["memory_kib"]
    mib = lambda kib: f"{kib / 1024:.0f} MiB"  # noqa: E731
    return [
        "## 16. A run over two nodes: first stop on node 2, memory per node",
        "",
        "The local pool (`tether worker --nodes 2`, a fresh one for each run) runs node 0 in its "
        "slot and starts node 1's worker (`tether worker --run R --attempt A --node 1`) on this "
        "host, in a directory of its own. The program (`bench/programs/nodes_bench.py`) stops at a "
        "breakpoint on its last node, set by the client (Microsoft's DebugClient, as VS Code) "
        "while the run is queued; the other node waits until it is continued. **Time to the first "
        "stop**: from the pool saying it claimed the run to the client holding the last node's "
        "`stopped` (on two nodes: node 1's program, in its own session; it holds the node "
        "worker's start, its join, its wait for node 0's rendezvous and its program's start). "
        "Baseline: the same program as a single-node run, stopping on node 0, in the main "
        f"session; the two alternate, {f['rounds']} runs each. **Memory**: the resident set of "
        "each node's worker process (node 0: the pool, which runs it in its slot) and of the "
        "adapter (`tether debug`) while the program is stopped, the largest of the runs"
        + (" (the pool as root: programs under uids of their own)." if f.get("isolated") else "."),
        "",
        "| run | first stop, median | worst | / single node |",
        "|---|---|---|---|",
        f"| single node (baseline) | {ms(s1.median)} | {ms(max(s1.samples))} | 1 |",
        f"| 2 nodes, stop on node 2 | {ms(s2.median)} | {ms(max(s2.samples))} "
        f"| {s2.median / s1.median:.2f} |",
        "",
        "| run | node 0's worker | node 1's worker | adapter |",
        "|---|---|---|---|",
        f"| single node | {mib(m1['node 0'])} | - | {mib(m1['adapter'])} |",
        f"| 2 nodes | {mib(m2['node 0'])} | {mib(m2['node 1'])} | {mib(m2['adapter'])} |",
        "",
    ]
