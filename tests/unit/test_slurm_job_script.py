"""The batch script the Slurm backend submits: the job's worker dials out with the attempt's
credentials (never on the command line), and refuses tunnels when the backend was told to."""

from __future__ import annotations

from pathlib import Path

from protocol_specs.runs.resources import Resources
from protocol_specs.runs.runs import RunRecord
from protocol_specs.runs.spec import RunSpec
from worker_shim.backends.slurm import job_script


def test_the_job_runs_a_worker_for_the_attempt_and_says_whether_it_serves_tunnels() -> None:
    spec = RunSpec(command=["python", "t.py"], workdir="/w", resources=Resources(gpus=2))
    record = RunRecord(id="r1", spec=spec, attempt=1)
    made = {
        allowed: job_script(
            record,
            python="/usr/bin/python3",
            credentials=Path("/s/c.json"),
            work_dir=Path("/s/work"),
            output=Path("/s/r1.out"),
            allow_tunnels=allowed,
        )
        for allowed in (True, False)
    }
    last = {allowed: script.strip().splitlines()[-1] for allowed, script in made.items()}
    assert last[True] == (
        "exec /usr/bin/python3 -m adapter.cli worker --credentials /s/c.json --work-dir /s/work"
        " --scheduler slurm --kill-wait 30"
    )
    assert last[False] == last[True] + " --no-shell"
    assert "#SBATCH --gres=gpu:2" in made[True]


async def test_a_job_slurm_cannot_be_asked_about_is_never_taken_for_gone(tmp_path: Path) -> None:
    """``scontrol`` (a stand-in on PATH) knows job 1, says job 2 is unknown, and times out on job
    3 (a busy controller): job 2 is left out (gone), and job 3 makes the whole look fail, so
    nothing is decided on it (a pending job taken for gone would be reported lost)."""
    import os

    import pytest

    from worker_shim.backends.scheduler import SchedulerError
    from worker_shim.backends.slurm import SlurmBackend

    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    fake = bin_dir / "scontrol"
    fake.write_text(
        "#!/bin/sh\n"
        'case "$4" in\n'
        "  1) echo 'JobId=1 JobState=PENDING Restarts=0' ;;\n"
        "  2) echo 'slurm_load_jobs error: Invalid job id specified' >&2; exit 1 ;;\n"
        "  *) echo 'slurm_load_jobs error: Socket timed out on send/recv operation' >&2; exit 1 ;;\n"
        "esac\n"
    )
    fake.chmod(0o755)
    backend = SlurmBackend(
        "ws://127.0.0.1:1", state_dir=tmp_path / "state", python="/usr/bin/python3",
        env={"PATH": f"{bin_dir}{os.pathsep}{os.environ.get('PATH', '')}"},
    )  # fmt: skip
    assert await backend.job_states(["1", "2"]) == {"1": ("PENDING", 0)}
    with pytest.raises(SchedulerError, match="Socket timed out"):
        await backend.job_states(["1", "2", "3"])


def test_a_run_over_nodes_is_one_job_whose_srun_starts_a_worker_on_each_node() -> None:
    """Node ``$SLURM_NODEID`` of a 3-node run: one task a node, CPUs and GPUs per node, its own
    work directory, ``--node`` its index; one node's failing worker ends the step everywhere."""
    import shlex

    from worker_shim.backends.slurm import sbatch_options

    spec = RunSpec(
        command=["python", "t.py"], workdir="/w", resources=Resources(gpus=2, cpus=4, nodes=3)
    )
    record = RunRecord(id="r1", spec=spec, attempt=2)
    opts = sbatch_options(record)
    assert {"--nodes=3", "--ntasks-per-node=1", "--cpus-per-task=4", "--gres=gpu:2"} <= set(opts)
    script = job_script(
        record, python="/opt/py thon", credentials=Path("/s/c.json"), work_dir=Path("/s/work"),
        output=Path("/s/r1.out"), allow_tunnels=False,
    )  # fmt: skip
    argv = shlex.split(script.strip().splitlines()[-1])
    assert argv[:2] == ["exec", "srun"]
    assert {"--kill-on-bad-exit=1", "--nodes=3", "--ntasks-per-node=1", "--cpus-per-task=4"} <= (
        set(argv)
    )
    assert argv[-3:-1] == ["/bin/bash", "-c"]
    on_node = shlex.split(argv[-1].replace("$SLURM_NODEID", "2"))
    assert on_node == [
        "exec", "/opt/py thon", "-m", "adapter.cli", "worker", "--credentials", "/s/c.json",
        "--work-dir", "/s/work-node2", "--node", "2", "--no-shell",
    ]  # fmt: skip
    # one node: the script as before
    single = RunRecord(id="r1", spec=spec.model_copy(update={"resources": Resources()}), attempt=1)
    assert not any("nodes" in opt for opt in sbatch_options(single))
