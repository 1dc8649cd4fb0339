"""The batch script the Slurm backend submits: the job's worker dials out with the attempt's
credentials (never on the command line), and refuses tunnels when the backend was told to."""

from __future__ import annotations

from pathlib import Path

from protocol_specs.runs import Resources, RunRecord, RunSpec
from worker_shim.slurm import job_script


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
    )
    assert last[False] == last[True] + " --no-shell"
    assert "#SBATCH --gres=gpu:2" in made[True]
