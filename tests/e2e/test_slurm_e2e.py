"""The Slurm backend against a real single-node Slurm (munged, slurmctld, slurmd started here):
submit, queue, run, logs, debug with a breakpoint set while the job is pending, cancel while
pending (a requeued job: ``test_slurm_preempt_e2e.py``), a crash stopped post-mortem, and a sweep whose
trials are jobs."""

from __future__ import annotations

import json
import os
import re
from collections.abc import AsyncIterator, Iterator
from contextlib import asynccontextmanager
from pathlib import Path

import pytest
import trio
from slurm_cluster import SlurmCluster, slurm_available
from stack import Proc, debug_run, relay_stack, tether
from test_experiments_e2e import SWEEP_TRAIN, finished_sweep, points_of_run, run_cli, start_sweep
from test_post_mortem_e2e import CRASH, WHERE
from test_runs_e2e import FLAKY, FLAKY_BREAKPOINT
from test_session_e2e import assert_schema_valid, bp_args, ide_session, resume, stopped_frame

from adapter.scripted_ide.dap_client import open_dap_client

pytestmark = [pytest.mark.slow, pytest.mark.slurm, pytest.mark.timeout(240)]


@pytest.fixture(scope="module")
def slurm(tmp_path_factory: pytest.TempPathFactory) -> Iterator[SlurmCluster]:
    reason = slurm_available()
    if reason and os.environ.get("TETHER_REQUIRE_SLURM"):
        pytest.fail(f"Slurm is required here (TETHER_REQUIRE_SLURM) but: {reason}")
    if reason:
        pytest.skip(f"no Slurm here: {reason}")
    with SlurmCluster(tmp_path_factory.mktemp("slurm")) as cluster:
        yield cluster


@asynccontextmanager
async def slurm_backend(
    home: Path, relay: str, cluster: SlurmCluster, *extra: str
) -> AsyncIterator[Proc]:
    async with tether(
        "backend",
        "slurm",
        "--relay",
        relay,
        "--state-dir",
        str(home / "slurm"),
        "--poll",
        "0.3",
        *extra,
        home=home,
        name="slurm",
        extra_env=cluster.env,
    ) as proc:
        await proc.wait_line(r"tether backend slurm: ready")
        yield proc


def project(tmp_path: Path) -> Path:
    workdir = tmp_path / "project"
    workdir.mkdir()
    (workdir / "flaky.py").write_text(FLAKY)
    (workdir / "hello.py").write_text(
        "import os\nprint('hello from job', os.environ['SLURM_JOB_ID'])\n"
    )
    return workdir


async def test_run_on_slurm_with_logs_status_and_the_job_id(
    tmp_path: Path, slurm: SlurmCluster
) -> None:
    workdir = project(tmp_path)
    home = tmp_path / "home"
    async with relay_stack(home, workers=0) as (_up, relay):
        async with slurm_backend(home, relay, slurm) as backend:
            async with tether(
                "run",
                "--backend",
                "slurm",
                "--cpus",
                "1",
                "--mem",
                "200M",
                "--time",
                "10m",
                "--follow",
                "--workdir",
                str(workdir),
                "--",
                "python",
                "hello.py",
                home=home,
                name="run",
            ) as run:
                run_id = (await run.wait_line(r"tether run: run (\S+) queued")).group(1)
                job = (
                    await backend.wait_line(
                        rf"run {run_id} attempt 1: submitted as Slurm job (\d+)"
                    )
                ).group(1)
                await run.wait_line(rf"hello from job {job}")
                await run.wait_line(rf"-- tether: run {run_id} succeeded")
                assert await run.process.wait() == 0
            info = await trio.to_thread.run_sync(slurm.wait_job_state, job, {"COMPLETED"}, 30)
            # the backend saw it end too: its credentials are gone
            await backend.wait_line(rf"run {run_id} attempt 1: done with Slurm job {job}")
            assert info["TimeLimit"] == "00:10:00" and info["NumCPUs"] == "1"
            async with tether("status", run_id, home=home, name="status") as status:
                await status.process.wait()
            assert re.search(rf"#1 on \S+ job {job} .*-> succeeded", status.output), status.output
            script = (home / "slurm" / "jobs" / f"{run_id}-1.sh").read_text()
            assert "--credentials" in script and relay not in script  # never on the command line
            assert not list((home / "slurm" / "credentials").iterdir())  # removed once done


async def test_a_breakpoint_set_while_the_job_is_pending_is_hit(
    tmp_path: Path, slurm: SlurmCluster
) -> None:
    workdir = project(tmp_path)
    state = tmp_path / "state"
    state.mkdir()
    (state / "attempted").touch()  # flaky.py goes straight to the breakpoint
    home = tmp_path / "home"
    async with (
        relay_stack(home, workers=0) as (_up, relay),
        slurm_backend(home, relay, slurm, "--sbatch-arg=--hold") as backend,
    ):
        extra = ("--backend", "slurm", "--mount", f"state={state}")
        async with (
            debug_run(home, relay, workdir, "python", "flaky.py", extra=extra) as (
                _d,
                run_id,
                port,
            ),
            open_dap_client("127.0.0.1", port) as ide,
        ):
            job = (
                await backend.wait_line(rf"run {run_id} attempt 1: submitted as Slurm job (\d+)")
            ).group(1)
            async with ide_session(ide, [bp_args(workdir, "flaky.py", FLAKY_BREAKPOINT)]) as got:
                assert got[0]["body"]["breakpoints"][0]["verified"] is False  # nothing runs yet
            assert slurm.job_state(job) == "PENDING"
            slurm.run("scontrol", "release", job)
            stopped, frame = await stopped_frame(ide)
            assert (frame["line"], frame["source"]["path"]) == (
                FLAKY_BREAKPOINT,
                str(workdir / "flaky.py"),
            )
            assert slurm.job_state(job) == "RUNNING"
            await resume(ide, "continue", stopped["body"]["threadId"])
            assert (await ide.wait_event("exited", timeout=60))["body"]["exitCode"] == 0
            assert_schema_valid(ide)
        # cancelling a run whose job is still pending cancels the job
        async with tether(
            "run",
            "--backend",
            "slurm",
            "--workdir",
            str(workdir),
            "--",
            "python",
            "hello.py",
            home=home,
            name="run",
        ) as run:
            queued = (await run.wait_line(r"tether run: run (\S+) queued")).group(1)
        held = (
            await backend.wait_line(rf"run {queued} attempt 1: submitted as Slurm job (\d+)")
        ).group(1)
        async with tether("cancel", queued, home=home, name="cancel") as cancel:
            await cancel.wait_line(rf"run {queued}: cancelled")
        await backend.wait_line(rf"run {queued}: cancelling Slurm job {held}")
        await trio.to_thread.run_sync(slurm.wait_job_state, held, {"CANCELLED"}, 30)


async def test_a_crash_in_a_slurm_job_stops_post_mortem_then_ends_by_the_policy(
    tmp_path: Path, slurm: SlurmCluster
) -> None:
    """The worker in the job is the pool's: a plain run's uncaught exception stops the program
    and is announced; nobody attaches, so after the timeout it ends with its own exit code."""
    workdir = project(tmp_path)
    (workdir / "crash.py").write_text(CRASH)
    home = tmp_path / "home"
    async with (
        relay_stack(home, workers=0) as (_up, relay),
        slurm_backend(home, relay, slurm),
        tether(
            "run", "--backend", "slurm", "--follow", "--unattended-timeout", "1s",
            "--workdir", str(workdir), "--", "python", "crash.py", "fast",
            home=home, name="run",
        ) as run,
    ):  # fmt: skip
        run_id = (await run.wait_line(r"tether run: run (\S+) queued")).group(1)
        notice = await run.wait_line(r"-- tether: Run .* no IDE is attached", timeout=120)
        assert f"Run {run_id} stopped on an uncaught ValueError (bad batch 7) at {WHERE}" in (
            notice.string
        )
        await run.wait_line(r"ValueError: bad batch 7", timeout=60)
        await run.wait_line(rf"-- tether: run {run_id} failed, exit code 1", timeout=60)
        assert await run.process.wait() == 1


async def test_a_sweep_on_slurm_runs_each_trial_as_a_job(
    tmp_path: Path, slurm: SlurmCluster
) -> None:
    workdir = tmp_path / "project"
    workdir.mkdir()
    (workdir / "train.py").write_text(SWEEP_TRAIN)
    home = tmp_path / "home"
    async with relay_stack(home, workers=0) as (_up, relay):
        async with slurm_backend(home, relay, slurm):
            sweep = await start_sweep(
                home, workdir, "--backend", "slurm", "--cpus", "1", "--mem", "200M",
                "--param", "lr=log:1e-3:1e-1", "--trials", "4", "--parallel", "2",
                "--objective", "loss:min", "--", "python", "train.py", "{lr}", "16", "5", "0.1",
            )  # fmt: skip
            info = await finished_sweep(home, sweep, timeout=200)
            assert [t["state"] for t in info["trials"]] == ["complete"] * 4, info["trials"]
            jobs = set()
            for trial in info["trials"]:
                points = await points_of_run(home, trial["run"])
                assert [p["step"] for p in points] == [0, 1, 2, 3, 4]
                status = await run_cli(home, "status", trial["run"], "--json")
                record = json.loads(status[status.index("{") :])
                assert record["spec"]["backend"] == "slurm"
                jobs.add(record["attempts"][0]["job"])
            assert len(jobs) == 4 and all(job.isdigit() for job in jobs)  # a Slurm job each
            best = min(info["trials"], key=lambda t: t["value"])
            assert info["sweep"]["best"] == best["n"]
