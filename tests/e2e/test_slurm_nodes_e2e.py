"""Issue 43 on Slurm: a real Slurm cluster whose nodes are network namespaces (``tests/netns.py``,
one slurmd each, ``tests/slurm_cluster.py``), a two-node job whose ``srun`` starts tether's worker
on each node, and the run debugged as one."""

from __future__ import annotations

import os
from collections.abc import Iterator
from pathlib import Path

import pytest
import trio
from netns import Nodes, open_nodes, why_not
from slurm_cluster import SlurmCluster, slurm_available

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
