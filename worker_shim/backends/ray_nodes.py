"""The entrypoint of a Ray job whose run spans nodes: one tether worker per node, all at once.

Theory of operation
-------------------
A run over N nodes is one Ray job (``worker_shim/backends/ray_jobs.py``) whose entrypoint is this
module::

    python -m worker_shim.backends.ray_nodes --nodes N --cpus C [--gpus G] [--memory B]
        [--resources JSON] [--patience S] -- PYTHON -m adapter.cli worker --run R --attempt A ...

It holds nothing itself. It asks Ray for a placement group of N bundles, each one node's share of
the run's resources (the run's ``--cpus-per-node``, ``--gpus-per-node``, memory, custom
resources), with strategy ``STRICT_SPREAD``: N distinct nodes, reserved together or not at all,
so no half-started job holds GPUs. Once Ray placed it, task K runs on bundle K the worker's
command plus ``--node K`` (node 0 claims the attempt, the others join it) and a work directory
of its own (``WORK_DIR-nodeK``: nodes may share a filesystem). A placement group that cannot be
placed within ``--patience`` seconds ends the job with one line saying so (the attempt is then
lost, and retried as the run says).

The job's exit code is the first non-zero exit of a node's worker (the relay ends the attempt
on every node then, and the other workers end their programs); 0 when every node's worker ended
0. A worker ends with its task: a task cancelled (the job stopped) terminates it, and a worker
whose task's process died gets SIGTERM from the kernel (``PR_SET_PDEATHSIG``).

Only the standard library and Ray are imported: the module runs with the cluster's Python, where
tether is installed beside Ray.
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import subprocess
import sys
import time
from typing import Any

__all__ = ["bundle_of", "main", "node_argv", "parse"]

#: how long the workers that still run get to end after one failed (the relay tells them to)
GRACE_S = 60.0


def parse(argv: list[str]) -> tuple[argparse.Namespace, list[str]]:
    """The driver's options and the worker's command (after ``--``)."""
    if "--" not in argv:
        raise SystemExit("tether ray driver: give the worker's command after --")
    cut = argv.index("--")
    parser = argparse.ArgumentParser(prog="python -m worker_shim.backends.ray_nodes")
    parser.add_argument("--nodes", type=int, required=True)
    parser.add_argument("--cpus", type=float, default=1)
    parser.add_argument("--gpus", type=float, default=0)
    parser.add_argument("--memory", type=int, default=0, help="bytes per node")
    parser.add_argument("--resources", default="{}", help="custom resources per node (JSON)")
    parser.add_argument("--patience", type=float, default=3600.0)
    args = parser.parse_args(argv[:cut])
    worker = argv[cut + 1 :]
    if args.nodes < 2 or not worker:
        raise SystemExit("tether ray driver: --nodes N (N >= 2) and the worker's command")
    return args, worker


def bundle_of(args: argparse.Namespace) -> dict[str, float]:
    """One node's share of the run's resources, as Ray names them."""
    bundle: dict[str, float] = {"CPU": args.cpus}
    if args.gpus:
        bundle["GPU"] = args.gpus
    if args.memory:
        bundle["memory"] = args.memory
    bundle.update({str(k): float(v) for k, v in json.loads(args.resources).items()})
    return bundle


def node_argv(worker: list[str], node: int, home: str = "") -> list[str]:
    """Node ``node``'s worker command: ``--node K`` and a work directory of its own."""
    argv = list(worker)
    if "--work-dir" in argv:
        at = argv.index("--work-dir") + 1
        argv[at] = f"{argv[at]}-node{node}"
    else:
        home = home or os.environ.get("TETHER_HOME") or os.path.expanduser("~/.tether")
        argv += ["--work-dir", os.path.join(home, f"worker-node{node}")]
    return [*argv, "--node", str(node)]


def _die_with_parent() -> None:
    """In the worker's child: SIGTERM once the task's process is gone (Linux only)."""
    try:
        import ctypes

        ctypes.CDLL(None).prctl(1, signal.SIGTERM)  # PR_SET_PDEATHSIG
    except (OSError, AttributeError):
        pass


def run_worker(argv: list[str]) -> int:
    """One node's worker, to its end (a Ray task's body); terminated if the task is cancelled."""
    process = subprocess.Popen(argv, preexec_fn=_die_with_parent)
    try:
        return process.wait()
    finally:
        if process.poll() is None:
            process.terminate()
            try:
                process.wait(timeout=30)
            except subprocess.TimeoutExpired:
                process.kill()


def _say(text: str) -> None:
    print(f"tether ray driver: {text}", flush=True)


def main(argv: list[str] | None = None) -> int:
    args, worker = parse(sys.argv[1:] if argv is None else argv)
    try:
        import ray
        from ray.util.placement_group import placement_group
        from ray.util.scheduling_strategies import PlacementGroupSchedulingStrategy
    except ImportError as exc:
        raise SystemExit(
            f"tether ray driver: {sys.executable} cannot import ray ({exc}): a run over nodes "
            "needs tether installed in the cluster's Ray environment (--python)"
        ) from None
    ray.init(log_to_driver=True)
    bundle = bundle_of(args)
    group = placement_group([bundle] * args.nodes, strategy="STRICT_SPREAD")
    ready, _ = ray.wait([group.ready()], timeout=args.patience)
    if not ready:
        _say(
            f"Ray found no {args.nodes} distinct nodes with {bundle} each within "
            f"{args.patience:g} s (placement group STRICT_SPREAD); giving up"
        )
        return 3
    _say(f"{args.nodes} nodes placed: {bundle} each")
    task = ray.remote(run_worker)
    opts: dict[str, Any] = {"num_cpus": args.cpus, "num_gpus": args.gpus, "max_retries": 0}
    if args.memory:
        opts["memory"] = args.memory
    custom = {k: v for k, v in bundle.items() if k not in ("CPU", "GPU", "memory")}
    if custom:
        opts["resources"] = custom
    running = {
        task.options(
            **opts,
            scheduling_strategy=PlacementGroupSchedulingStrategy(
                placement_group=group, placement_group_bundle_index=node
            ),
        ).remote(node_argv(worker, node)): node
        for node in range(args.nodes)
    }
    code = 0
    deadline = float("inf")
    while running:
        done, _ = ray.wait(list(running), timeout=max(0.0, min(deadline - time.monotonic(), 5)))
        for ref in done:
            node = running.pop(ref)
            try:
                ended = int(ray.get(ref))
            except Exception as exc:  # the task's process died: the node is lost
                _say(f"node {node}'s worker was lost: {type(exc).__name__}")
                ended = 1
            if ended and not code:
                code = ended
                deadline = time.monotonic() + GRACE_S
                _say(f"node {node}'s worker ended with {ended}; the others end with it")
        if running and time.monotonic() > deadline:
            for ref in running:
                ray.cancel(ref)
            deadline = float("inf")
    return code


if __name__ == "__main__":
    raise SystemExit(main())
