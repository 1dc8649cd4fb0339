"""A local pool's nodes, for runs that span nodes (``tether up/worker --nodes N --node-via PREFIX``).

Theory of operation
-------------------
A pool with ``--nodes N`` has its own host (node 0 of every run it claims: the slot runs it, as a
single-node run) and N-1 more nodes, each reached through its ``--node-via`` prefix (``ip netns
exec tn1``; none: this host, in a directory of its own). A run asking M nodes takes M-1 of those
at once, waiting until they are free (:class:`NodePool`, as :class:`~.pool.GpuPool` does for
GPUs), or fails at once if the pool has fewer. Once the slot holds the claim, each of the run's
nodes 1..M-1 is a process of its own, ``PREFIX... python -m adapter.cli worker --run ID --attempt
A --node K``, holding the attempt's worker token in ``TETHER_TOKEN`` (never on its command line):
it joins the attempt over its own link to the relay (:func:`node_workers`).

When node 0's program has ended, the relay has told the other nodes' workers to end theirs (its
``terminate`` entry): they get :data:`NODE_GRACE` seconds to do so, then SIGTERM, then SIGKILL.
A node's worker carries the pool's mark (``worker_shim/program/reaper.py``), so the pool's guard
ends it with the pool however the pool ends; its own guard then ends its program.
"""

from __future__ import annotations

import os
import subprocess
import sys
from collections.abc import AsyncIterator, Callable, Sequence
from contextlib import asynccontextmanager
from dataclasses import dataclass
from functools import partial
from pathlib import Path

import trio

from relay.client import Endpoint

from ..program.identity import Isolation
from ..program.reaper import MARK_ENV

__all__ = [
    "NODE_GRACE",
    "Node",
    "NodePool",
    "check_nodes",
    "isolation_argv",
    "node_argv",
    "node_workers",
]

#: how long the other nodes' workers have to end once node 0's program ended (the relay's
#: ``terminate`` reaches them) before they are stopped
NODE_GRACE = 15.0
#: how long a node's worker has after SIGTERM before SIGKILL
TERM_WAIT = 5.0


@dataclass(frozen=True)
class Node:
    """One of a pool's nodes beyond its own host: its number in the pool (1..N-1), the command
    its worker runs behind, and its worker's own directory."""

    index: int
    prefix: tuple[str, ...]
    work_dir: Path


def check_nodes(count: int, via: Sequence[Sequence[str]]) -> None:
    """A :class:`ValueError` saying what is wrong with a pool's ``--nodes`` and ``--node-via``."""
    if not 1 <= count <= 64:
        raise ValueError(f"--nodes {count}: a pool has 1 to 64 nodes")
    if len(via) > count - 1:
        raise ValueError(
            f"--node-via given {len(via)} times for --nodes {count}: one for each node after "
            f"this host's (at most {count - 1})"
        )
    if any(not prefix for prefix in via):
        raise ValueError("--node-via: give a command, e.g. 'ip netns exec tn1'")


class NodePool:
    """Which of the pool's nodes are free; a multi-node run waits for all of its own at once."""

    def __init__(self, count: int, via: Sequence[Sequence[str]], work_dir: Path) -> None:
        check_nodes(count, via)
        self.count = count
        self.nodes = [
            Node(k, tuple(via[k - 1]) if k <= len(via) else (), work_dir / "nodes" / f"node{k}")
            for k in range(1, count)
        ]
        self.free = list(self.nodes)
        self._changed = trio.Condition()

    def __repr__(self) -> str:
        return f"<NodePool {len(self.free)} of {len(self.nodes)} free, and this host>"

    async def take(self, nodes: int) -> list[Node]:
        """The nodes for a run of ``nodes`` nodes besides this host (none for a single-node run),
        once they are free; a :class:`ValueError` if the pool has fewer."""
        if nodes > self.count:
            raise ValueError(
                f"the run asks for {nodes} nodes; this worker pool has {self.count} "
                "(tether up / tether worker --nodes N)"
            )
        async with self._changed:
            while len(self.free) < nodes - 1:
                await self._changed.wait()
            taken, self.free = self.free[: nodes - 1], self.free[nodes - 1 :]
            return taken

    async def give_back(self, nodes: list[Node]) -> None:
        if not nodes:
            return
        async with self._changed:
            self.free += nodes
            self.free.sort(key=lambda node: node.index)
            self._changed.notify_all()


def node_argv(
    node: Node,
    run_node: int,
    run_id: str,
    attempt: int,
    relay: Endpoint,
    *,
    python: str = sys.executable,
    allow_tunnels: bool = True,
    isolation: Isolation | None = None,
) -> list[str]:
    """The command line of the worker of the run's node ``run_node`` on ``node`` (its token goes
    in its environment, never here); ``isolation``: the pool's, which the node's worker houses
    its program by (:func:`isolation_argv`)."""
    argv = [*node.prefix, python, "-m", "adapter.cli", "worker"]
    argv += ["--run", run_id, "--attempt", str(attempt), "--node", str(run_node)]
    argv += ["--work-dir", str(node.work_dir), "--relay", relay.url]
    if relay.ca_file:
        argv += ["--ca-file", relay.ca_file]
    if not allow_tunnels:
        argv.append("--no-shell")
    return argv + isolation_argv(isolation or Isolation())


def isolation_argv(isolation: Isolation) -> list[str]:
    """The options that give a node's worker the pool's isolation: a root pool that runs each
    program as a uid of its own has its nodes' programs run so too (from its uids, their
    directories under its runs root); else the node's program runs as its worker's user."""
    if isolation.uids is None or isolation.runs_root is None:
        return ["--no-isolation"]
    uids = isolation.uids
    return ["--run-uids", f"{uids.start}-{uids.stop - 1}", "--runs-root", str(isolation.runs_root)]


@asynccontextmanager
async def node_workers(
    nodes: list[Node],
    run_id: str,
    attempt: int,
    relay: Endpoint,
    *,
    mark: str,
    say: Callable[[str], None],
    allow_tunnels: bool = True,
    isolation: Isolation | None = None,
) -> AsyncIterator[None]:
    """Start the workers of the run's nodes 1..M-1 (``nodes``, in order), their output said line
    by line (``node K: ...``), while the block runs node 0; on the way out (shielded) give them
    :data:`NODE_GRACE` seconds to end, then stop them. ``relay``'s token is the attempt's worker
    token; ``mark``: the pool's mark for them (under its own, not under the attempt's, which
    node 0's end kills at once); ``isolation``: the pool's, passed on to them."""
    env = {**os.environ, "TETHER_TOKEN": relay.token, MARK_ENV: mark}
    for name in ("TETHER_RELAY", "TETHER_STACK", "TETHER_CREDENTIALS"):
        env.pop(name, None)
    started: list[tuple[int, trio.Process]] = []
    try:
        async with trio.open_nursery() as nursery:
            try:
                for run_node, node in enumerate(nodes, 1):
                    await trio.to_thread.run_sync(
                        partial(node.work_dir.mkdir, parents=True, exist_ok=True)
                    )
                    argv = node_argv(
                        node, run_node, run_id, attempt, relay, allow_tunnels=allow_tunnels,
                        isolation=isolation,
                    )  # fmt: skip
                    try:
                        process = await trio.lowlevel.open_process(
                            argv, env=env, stdin=subprocess.DEVNULL, stdout=subprocess.PIPE,
                            stderr=subprocess.STDOUT,
                        )  # fmt: skip
                    except OSError as exc:
                        say(
                            f"node {run_node}: its worker could not start ({argv[0]}: {exc.strerror})"
                        )
                        continue
                    started.append((run_node, process))
                    nursery.start_soon(_pump, process, f"node {run_node}: ", say)
                yield
            finally:
                with trio.CancelScope(shield=True):
                    await _end(started, say)
                nursery.cancel_scope.cancel()  # a pipe a node's stray process still holds
    except BaseExceptionGroup as group:
        # what node 0's block raised (the relay lost, the attempt over), as itself: the pool's
        # slot tells a lost relay from a failure by the exception's type
        if len(group.exceptions) == 1:
            raise group.exceptions[0] from None
        raise


async def _pump(process: trio.Process, prefix: str, say: Callable[[str], None]) -> None:
    """A node worker's output, said line by line until it closes."""
    assert process.stdout is not None
    pending = b""
    async with process.stdout:
        async for chunk in process.stdout:
            pending += chunk
            *lines, pending = pending.split(b"\n")
            for line in lines:
                say(prefix + line.decode(errors="replace").rstrip())
    if pending:
        say(prefix + pending.decode(errors="replace").rstrip())


async def _end(started: list[tuple[int, trio.Process]], say: Callable[[str], None]) -> None:
    """Wait :data:`NODE_GRACE` seconds for the node workers to end, then SIGTERM, then SIGKILL."""
    with trio.move_on_after(NODE_GRACE):
        for _, process in started:
            await process.wait()
    left = [(k, p) for k, p in started if p.returncode is None]
    for run_node, process in left:
        say(
            f"node {run_node}: its worker was still running {NODE_GRACE:g} s after node 0 ended: stopped"
        )
        process.terminate()
    with trio.move_on_after(TERM_WAIT):
        for _, process in left:
            await process.wait()
    for _, process in left:
        if process.returncode is None:
            process.kill()
            await process.wait()
