"""Issue 43's Ray "Done when": a 2-node local Ray cluster (``ray start`` twice, the second in a
network namespace of its own) runs a 2-node run, debugged from a real DAP client (node's
``@vscode/debugadapter-testsupport``).

The Ray head listens on a bridge's address in this (the relay's) namespace; the second node runs
in a namespace (``tests/netns.py``) whose loopback is its own, and joins only once the IDE set
its breakpoints: until then the job's placement group (two bundles, ``STRICT_SPREAD``) cannot be
placed, so the run stays queued while the breakpoint is set. The program is plain Python: node
1's part calls a function node 0's never does; the breakpoint there is hit in node 1's own
session, inspected (it runs on one Ray node, and meets node 0 at the other's address),
continued; the run ends with exit code 0.

Ray and tether share ``.venv-ray-nodes`` (``tests/ray_cluster.py``: the job's driver imports Ray
and runs tether's module).
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import pytest
import trio
from faults.proxy import FaultProxy
from netns import open_nodes
from node_harness import open_vscode_session, scenario
from ray_cluster import RayHead, ray_with_tether
from stack import debug_run, relay_stack, tether
from test_ray_e2e import ray_backend

pytestmark = [pytest.mark.slow, pytest.mark.ray, pytest.mark.timeout(600)]

PROGRAM = """\
import os
import socket


def node_one_check(step):
    text = f"node {os.environ['TETHER_NODE']} of {os.environ['NNODES']} checks step {step}"
    print(text, flush=True)  # the breakpoint
    return text


node = int(os.environ["NODE_RANK"])
if node == 1:
    node_one_check(7)
print(f"node {node} done, its master {os.environ['MASTER_ADDR']}", flush=True)
"""
LINE = next(n for n, line in enumerate(PROGRAM.splitlines(), 1) if "# the breakpoint" in line)


async def test_issue_43_a_two_node_ray_cluster_runs_a_two_node_run_debugged_on_node_1(
    tmp_path: Path, netns_ok: None
) -> None:
    python = ray_with_tether()
    ws = tmp_path / "project"
    ws.mkdir()
    (ws / "nodes.py").write_text(PROGRAM)
    home = tmp_path / "home"
    ray_home = tmp_path / "ray-home"
    steps: list[dict[str, Any]] = [
        {"op": "mark", "name": "configured", "wait": True},  # node 1 joins Ray here
        {"op": "wait_session", "label": "node1", "stopped": True,
         "name": r"^main process \(pid \d+\) on node 1 ", "timeoutMs": 240_000},
        {"op": "wait_stopped", "session": "node1", "label": "hit", "reason": "breakpoint",
         "path": "nodes.py", "line": LINE, "function": "node_one_check", "timeoutMs": 60_000},
        {"op": "evaluate", "session": "node1", "label": "node",
         "expression": "__import__('os').environ['TETHER_NODE']"},
        {"op": "evaluate", "session": "node1", "label": "netns",
         "expression": "__import__('os').readlink('/proc/self/ns/net')"},
        {"op": "evaluate", "session": "node1", "label": "master",
         "expression": "__import__('os').environ['MASTER_ADDR']"},
        {"op": "variables", "session": "node1", "label": "locals", "scope": "Locals"},
        {"op": "continue", "session": "node1"},
        {"op": "wait_terminated", "label": "end", "timeoutMs": 120_000},
        {"op": "disconnect"},
    ]  # fmt: skip
    with open_nodes(1) as nodes:
        ray = python.parent / "ray"
        env = {"TETHER_HOME": str(ray_home)}
        with RayHead(ray, cpus=1, host=nodes.bridge_address, env=env) as head:
            async with (
                relay_stack(home, workers=0) as (_up, relay),
                trio.open_nursery() as nursery,
            ):
                port = int(relay.rsplit(":", 1)[1])
                proxy = FaultProxy("127.0.0.1", port, listen=nodes.bridge_address)
                await nursery.start(proxy.run)
                flags = ("--worker-relay", proxy.url_for())
                async with ray_backend(home, relay, head, python=str(python), flags=flags) as rb:
                    extra = ("--backend", "ray", "--nodes", "2")
                    async with debug_run(home, relay, ws, "python", "nodes.py", extra=extra) as (
                        debug,
                        run_id,
                        adapter,
                    ):
                        job = (
                            await rb.wait_line(
                                rf"run {run_id} attempt 1: submitted as Ray job (\S+)"
                            )
                        ).group(1)
                        spec = scenario(
                            adapter, ws, steps, breakpoints={"nodes.py": [LINE]},
                            timeout_ms=300_000,
                        )  # fmt: skip
                        async with open_vscode_session(spec, timeout=500) as session:
                            await session.wait_mark("configured")
                            async with tether("ls", home=home, name="ls") as listed:
                                await listed.process.wait()
                            line = next(
                                x for x in listed.output.splitlines() if x.startswith(run_id)
                            )
                            assert "queued" in line, listed.output  # one Ray node: no placement
                            head.add_node(cpus=1, prefix=nodes.prefix(0), ip=nodes.addresses[0])
                            await trio.to_thread.run_sync(head.wait_nodes, 2)
                            await session.release("configured")
                            try:
                                result, _messages = await session.result()
                                await debug.wait_line(r"ended \(exited, exit code 0\)", timeout=120)
                            except BaseException:
                                with trio.CancelScope(shield=True):
                                    logs = await trio.to_thread.run_sync(
                                        head.request, "GET", f"/api/jobs/{job}/logs"
                                    )
                                print("the backend said:", rb.output, "the job:", logs, sep="\n")
                                raise
                        await rb.wait_line(rf"run {run_id} attempt 1: done with Ray job {job}")
                nursery.cancel_scope.cancel()
            assert head.job(job)["status"] == "SUCCEEDED"
        inode = os.stat(f"/run/netns/{nodes.names[0]}").st_ino
    labels = result["labels"]
    assert labels["node"]["result"] == "'1'"
    # Ray places the bundles where it likes: node 1 is either Ray node, node 0 the other one
    here = os.readlink("/proc/self/ns/net")
    ray_nodes = {f"'net:[{inode}]'": nodes.addresses[0], f"'{here}'": nodes.bridge_address}
    node_1_at = ray_nodes[labels["netns"]["result"]]
    (node_0_at,) = set(ray_nodes.values()) - {node_1_at}
    assert labels["master"]["result"] == f"'{node_0_at}'", labels
    assert labels["locals"]["values"]["step"] == "7"
    assert labels["end"]["exitCode"] == 0
