"""Issue 43 on Slurm: a real Slurm cluster whose nodes are network namespaces (``tests/netns.py``,
one slurmd each, ``tests/slurm_cluster.py``), a two-node job whose ``srun`` starts tether's worker
on each node, and the run debugged as one.

The relay (``tether up``) lives in this namespace; the nodes reach it through the bridge (a
:class:`FaultProxy` listening there: the backend's ``--worker-relay``). ``tether backend slurm``
submits the run's job held, so the breakpoint is set while it is pending; released, node 0's
worker claims the attempt, node 1's joins it, and node 1's program stops in a function only it
runs, in a session of its own (a real DAP client: node's ``@vscode/debugadapter-testsupport``).
"""

from __future__ import annotations

import json
import os
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import trio
from faults.proxy import FaultProxy
from netns import Nodes, open_nodes, why_not
from node_harness import open_vscode_session, scenario
from slurm_cluster import SlurmCluster, slurm_available
from stack import debug_run, relay_stack, tether
from test_experiments_e2e import run_cli
from test_slurm_e2e import slurm_backend

from protocol_specs.runs.resources import Resources
from protocol_specs.runs.runs import RunRecord
from protocol_specs.runs.spec import RunSpec
from worker_shim.backends.slurm import job_script

pytestmark = [pytest.mark.slow, pytest.mark.slurm, pytest.mark.timeout(240)]


@pytest.fixture(scope="module")
def nodes() -> Iterator[Nodes]:
    why = slurm_available() or why_not()
    if why and (os.environ.get("TETHER_REQUIRE_SLURM") or os.environ.get("TETHER_REQUIRE_NETNS")):
        pytest.fail(f"Slurm over namespaces is required here but: {why}")
    if why:
        pytest.skip(why)
    with open_nodes(2) as made:
        yield made


@pytest.fixture(scope="module")
def slurm(tmp_path_factory: pytest.TempPathFactory, nodes: Nodes) -> Iterator[SlurmCluster]:
    with SlurmCluster(tmp_path_factory.mktemp("slurm"), nodes=nodes) as cluster:
        yield cluster


async def test_a_two_node_job_runs_a_task_in_each_namespace(
    tmp_path: Path, slurm: SlurmCluster, nodes: Nodes
) -> None:
    out = tmp_path / "out.txt"
    task = "echo $SLURM_NODEID $SLURMD_NODENAME $(hostname -I)"
    job = slurm.run(
        "sbatch", "--parsable", "--nodes=2", "--ntasks-per-node=1", f"--output={out}",
        "--wrap", f"srun sh -c '{task}'",
    ).strip()  # fmt: skip
    info = await trio.to_thread.run_sync(slurm.wait_job_state, job, {"COMPLETED", "FAILED"}, 60)
    assert info["JobState"] == "COMPLETED", (info, out.read_text(), slurm.log_tail())
    lines = sorted(line.split() for line in out.read_text().splitlines())
    assert lines == [["0", "node0", nodes.addresses[0]], ["1", "node1", nodes.addresses[1]]]


async def test_the_backends_job_script_starts_a_worker_on_each_node(
    tmp_path: Path, slurm: SlurmCluster, nodes: Nodes
) -> None:
    """The job script of a 2-node run, its ``python`` a stand-in that says where it ran and how:
    one worker each node, in its own namespace, its own work directory, ``--node`` its index."""
    said = tmp_path / "said"
    said.mkdir()
    python = tmp_path / "python"
    python.write_text(f'#!/bin/sh\necho "$(hostname -I) $*" > {said}/$SLURM_NODEID\n')
    python.chmod(0o755)
    spec = RunSpec(command=["python", "t.py"], workdir="/w", resources=Resources(nodes=2))
    script = tmp_path / "job.sh"
    script.write_text(
        job_script(
            RunRecord(id="r1", spec=spec, attempt=1), python=str(python),
            credentials=tmp_path / "c.json", work_dir=tmp_path / "work",
            output=tmp_path / "job.out",
        )
    )  # fmt: skip
    job = slurm.run("sbatch", "--parsable", str(script)).strip()
    info = await trio.to_thread.run_sync(slurm.wait_job_state, job, {"COMPLETED", "FAILED"}, 60)
    assert info["JobState"] == "COMPLETED", (info, slurm.log_tail())
    assert info["NumNodes"] == "2"
    for k in (0, 1):
        address, *argv = (said / str(k)).read_text().split()
        assert address == nodes.addresses[k]
        assert argv == [
            "-m", "adapter.cli", "worker", "--credentials", str(tmp_path / "c.json"),
            "--work-dir", f"{tmp_path / 'work'}-node{k}", "--node", str(k),
        ]  # fmt: skip


#: a plain program over two nodes, meeting as a distributed job does: node 1 checks in with node 0
#: at MASTER_ADDR:MASTER_PORT (what tether gave both), then node 0 ends while node 1 goes on into
#: node_one(), a function only it runs
NODES_PROGRAM = """\
import os
import socket


def node_one(rank, nnodes, where):
    print(f"node {rank} of {nnodes} met node 0 at {where}", flush=True)  # the breakpoint
    return where


rank, nnodes = int(os.environ["NODE_RANK"]), int(os.environ["NNODES"])
where = (os.environ["MASTER_ADDR"], int(os.environ["MASTER_PORT"]))
if rank == 0:
    with socket.create_server(("", where[1])) as server:
        server.settimeout(120)
        conn, _ = server.accept()
        with conn:
            print(conn.recv(100).decode(), "at node 0", flush=True)
else:
    with socket.create_connection(where, timeout=60) as conn:
        conn.sendall(f"node {rank} checked in".encode())
    node_one(rank, nnodes, where)
"""
NODE_LINE = next(
    n for n, line in enumerate(NODES_PROGRAM.splitlines(), 1) if "# the breakpoint" in line
)


async def node_exited(home: Path, run_id: str, node: int, *, timeout: float = 30) -> None:
    """Once the relay has node ``node`` of the run's attempt exited (its ``exited`` is in the
    IDE's stream then, before the answers to anything asked after)."""
    with trio.fail_after(timeout):
        while True:
            said = await run_cli(home, "status", run_id, "--json")
            rows = json.loads(said[said.index("{") :])["attempts"][-1]["nodes"]
            if rows[node]["state"] == "exited":
                return


async def test_a_two_node_run_on_slurm_stops_on_node_1_and_ends_0(
    tmp_path: Path, slurm: SlurmCluster, nodes: Nodes
) -> None:
    ws = tmp_path / "ws"
    ws.mkdir()
    (ws / "nodes.py").write_text(NODES_PROGRAM)
    home = tmp_path / "home"
    steps: list[dict[str, Any]] = [
        {"op": "mark", "name": "configured", "wait": True},
        {
            "op": "wait_session",
            "label": "node1",
            "stopped": True,
            "expect": {"name": {"$regex": r"node 1"}},
            "timeoutMs": 120_000,
        },
        {
            "op": "wait_stopped",
            "session": "node1",
            "label": "hit",
            "reason": "breakpoint",
            "path": "nodes.py",
            "line": NODE_LINE,
            "function": "node_one",
            "timeoutMs": 120_000,
        },
        # node 0 is done meanwhile: its end is not the run's, node 1's session goes on
        {"op": "mark", "name": "node 0 done", "wait": True},
        {"op": "variables", "session": "node1", "label": "locals", "scope": "Locals"},
        {
            "op": "evaluate",
            "session": "node1",
            "label": "env",
            "expression": "[os.environ[k] for k in ('NNODES', 'TETHER_NODE', 'MASTER_ADDR')]",
        },
        {"op": "continue", "session": "node1"},
        {"op": "wait_terminated", "label": "end", "timeoutMs": 120_000},
        {"op": "disconnect"},
    ]
    async with (
        relay_stack(home, isolated=False) as (_up, relay),
        trio.open_nursery() as nursery,
    ):
        port = int(relay.rsplit(":", 1)[1])
        proxy = FaultProxy("127.0.0.1", port, listen=nodes.bridge_address)
        await nursery.start(proxy.run)
        async with slurm_backend(
            home, relay, slurm, "--sbatch-arg=--hold", "--worker-relay", proxy.url_for()
        ) as backend:
            extra = ("--backend", "slurm", "--nodes", "2")
            async with debug_run(home, relay, ws, "python", "nodes.py", extra=extra) as (
                debug,
                run_id,
                adapter,
            ):
                spec = scenario(
                    adapter, ws, steps, breakpoints={"nodes.py": [NODE_LINE]}, timeout_ms=180_000
                )
                async with open_vscode_session(spec, timeout=200) as session:
                    await session.wait_mark("configured")
                    job = (
                        await backend.wait_line(
                            rf"run {run_id} attempt 1: submitted as Slurm job (\d+)"
                        )
                    ).group(1)
                    info = slurm.job_info(job)
                    assert info is not None and info["JobState"] == "PENDING", info
                    assert info["NumNodes"] in ("2", "2-2"), info  # pending: min-max
                    slurm.run("scontrol", "release", job)
                    await session.release("configured")
                    await session.wait_mark("node 0 done", timeout=120)
                    await node_exited(home, run_id, 0)
                    await session.release("node 0 done")
                    result, _messages = await session.result()
                await debug.wait_line(r"ended \(exited, exit code 0\)", timeout=60)
                assert "node 1 checked in at node 0" in debug.output, debug.output
            await trio.to_thread.run_sync(slurm.wait_job_state, job, {"COMPLETED"}, 30)
            async with tether("status", run_id, home=home, name="status") as status:
                await status.process.wait()
        nursery.cancel_scope.cancel()
    labels = result["labels"]
    values = labels["locals"]["values"]
    assert (values["rank"], values["nnodes"]) == ("1", "2"), values
    assert values["where"].startswith(f"('{nodes.addresses[0]}', "), values  # node 0's namespace
    assert labels["env"]["result"] == repr(["2", "1", nodes.addresses[0]])
    assert labels["end"]["exitCode"] == 0
    assert f"job {job}" in status.output, status.output
