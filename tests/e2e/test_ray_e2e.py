"""The Ray backend against a real Ray head (``ray start --head``, started and stopped here by its
PID): submit and complete with logs, a breakpoint set while the job asks for a resource no node
has, hit once a node with it joins (VS Code's DebugClient under node), cancel while the job waits
for the GPU another job holds and while it runs, a job stopped from Ray's side preempted and
resumed as attempt 2, a job Ray gave up on before it started submitted again, and the run's
time limit kept.

Ray lives in ``.venv-ray`` (made on first use, ``tests/ray_cluster.py``); tether's worker runs in
the jobs with this repository's interpreter, as ``--python`` names it. Marked ``ray``: ``./dev test
-m ray`` runs them alone; CI runs them (``TETHER_REQUIRE_RAY=1``).
"""

from __future__ import annotations

import re
import sys
from collections.abc import AsyncIterator, Iterator
from contextlib import asynccontextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
import trio
from node_harness import open_vscode_session, scenario
from ray_cluster import RayHead, ray_bin
from stack import TETHER, Proc, debug_run, home_env, relay_stack, tether
from test_runs_e2e import FLAKY, FLAKY_BREAKPOINT
from test_slurm_preempt_e2e import LOOP

pytestmark = [pytest.mark.slow, pytest.mark.ray, pytest.mark.timeout(300)]

HELLO = """\
import os
print("hello from ray, gpus:", os.environ.get("CUDA_VISIBLE_DEVICES"), flush=True)
job_config = os.environ.get("RAY_JOB_CONFIG_JSON_ENV_VAR", "")
print("token in my environment:", "TETHER_TOKEN" in os.environ or "ttht_" in job_config, flush=True)
print("a Ray job's config:", bool(job_config), flush=True)
"""


@pytest.fixture(scope="module")
def head(tmp_path_factory: pytest.TempPathFactory) -> Iterator[RayHead]:
    """One GPU (declared: Ray only counts it) and a custom resource, on loopback."""
    ray = ray_bin()
    home = tmp_path_factory.mktemp("ray-home")
    with RayHead(
        ray, cpus=2, gpus=1, resources={"tether_test": 1}, env={"TETHER_HOME": str(home)}
    ) as head:
        yield head


@asynccontextmanager
async def ray_backend(
    home: Path,
    relay: str,
    head: RayHead,
    *,
    python: str = sys.executable,
    flags: tuple[str, ...] = (),
) -> AsyncIterator[Proc]:
    """The backend as the Ray guide (docs/ray.md) deploys it: with a token of the ``backend``
    scope alone (``python``: tether's on the cluster; ``flags``: more of the backend's)."""
    made = await trio.run_process(
        [TETHER, "token", "create", "--relay", relay, "--user", "ray", "--scope", "backend"],
        env=home_env(home),
        capture_stdout=True,
        capture_stderr=True,
    )
    token = made.stdout.decode().strip()
    assert token.startswith("tthu_"), made
    async with tether(
        "backend", "ray", "--relay", relay, "--address", head.address,
        "--python", python, "--poll", "0.3", *flags,
        home=home, name="ray", extra_env={"TETHER_TOKEN": token},
    ) as proc:  # fmt: skip
        await proc.wait_line(r"tether backend ray: ready .* ray=2\.")
        yield proc


@dataclass
class Stack:
    workdir: Path  #: the project: flaky.py and hello.py
    state: Path  #: flaky.py's memory across attempts (its ``state`` mount)
    home: Path
    relay: str
    backend: Proc


@asynccontextmanager
async def ray_stack(tmp_path: Path, head: RayHead) -> AsyncIterator[Stack]:
    """A project, `tether up` (no workers of its own) and the Ray backend for ``head``."""
    workdir = tmp_path / "project"
    workdir.mkdir()
    (workdir / "flaky.py").write_text(FLAKY)
    (workdir / "hello.py").write_text(HELLO)
    state = tmp_path / "state"
    state.mkdir()
    home = tmp_path / "home"
    async with (
        relay_stack(home, workers=0) as (_up, relay),
        ray_backend(home, relay, head) as backend,
    ):
        yield Stack(workdir, state, home, relay, backend)


async def submitted(backend: Proc, run_id: str, attempt: int = 1) -> str:
    pattern = rf"run {run_id} attempt {attempt}: submitted as Ray job (\S+)"
    return (await backend.wait_line(pattern)).group(1)


@asynccontextmanager
async def ray_run(s: Stack, *args: str, name: str = "run") -> AsyncIterator[tuple[Proc, str, str]]:
    """``tether run --backend ray ARGS`` in the project: (its process, the run, its Ray job)."""
    async with tether(
        "run", "--backend", "ray", "--workdir", str(s.workdir), *args, home=s.home, name=name
    ) as run:
        run_id = (await run.wait_line(r"tether run: run (\S+) queued")).group(1)
        yield run, run_id, await submitted(s.backend, run_id)


async def said(s: Stack, *args: str) -> str:
    """What a tether command printed, to its end."""
    async with tether(*args, home=s.home, name=args[0]) as proc:
        await proc.process.wait()
    return proc.output


async def cancel(s: Stack, run_id: str) -> None:
    async with tether("cancel", run_id, home=s.home, name="cancel") as proc:
        await proc.wait_line(rf"run {run_id}: cancelled")


async def wait_status(head: RayHead, job: str, states: set[str]) -> str:
    return await trio.to_thread.run_sync(head.wait_job, job, states)


ENDED = {"STOPPED", "SUCCEEDED", "FAILED"}


def hold_the_gpu(head: RayHead, name: str) -> str:
    """Another team's job, holding the cluster's only GPU until stopped."""
    head.request(
        "POST",
        "/api/jobs/",
        {"entrypoint": "sleep 600", "submission_id": name, "entrypoint_num_gpus": 1},
    )
    return name


async def test_a_run_on_ray_with_logs_resources_and_a_ticket(tmp_path: Path, head: RayHead) -> None:
    async with ray_stack(tmp_path, head) as s:
        resources = ("--gpus", "1", "--mem", "100M", "--resource", "tether_test=1")
        async with ray_run(s, *resources, "--follow", "--", "python", "hello.py") as (
            run,
            run_id,
            job,
        ):
            await run.wait_line(r"hello from ray, gpus: 0")
            await run.wait_line(r"token in my environment: False")  # the program never sees it
            await run.wait_line(r"a Ray job's config: True")  # (where Ray would have put it)
            await run.wait_line(rf"-- tether: run {run_id} succeeded")
            assert await run.process.wait() == 0
        await s.backend.wait_line(rf"run {run_id} attempt 1: done with Ray job {job}")
        held = head.job_resources(job)
        assert held == {"CPU": 1, "GPU": 1, "memory": 100 * 2**20, "tether_test": 1}
        info = head.job(job)
        assert info["status"] == "SUCCEEDED"
        assert info["metadata"]["tether_run"] == run_id  # type: ignore[index]
        token = info["runtime_env"]["env_vars"]["TETHER_TOKEN"]  # type: ignore[index]
        assert token.startswith("ttht_")  # what anyone can read here is a spent ticket
        assert "ttht_" not in str(info["entrypoint"]) and "tthw_" not in str(info)
        status = await said(s, "status", run_id)
        assert re.search(rf"#1 on \S+ job {job} .*-> succeeded", status), status


async def test_a_breakpoint_set_while_no_node_has_what_the_job_asks_for_is_hit_when_one_joins(
    tmp_path: Path, head: RayHead
) -> None:
    """The job asks for a resource no node has (an A100, say); a node with it joins later, as
    an autoscaler would add one: the breakpoint set meanwhile stops the program there."""
    async with ray_stack(tmp_path, head) as s:
        (s.state / "attempted").touch()  # flaky.py goes straight to the breakpoint
        flaky = str(s.workdir / "flaky.py")
        steps: list[dict[str, Any]] = [
            {"op": "mark", "name": "configured", "wait": True},  # the node joins here
            {"op": "wait_stopped", "label": "hit", "reason": "breakpoint", "path": flaky,
             "line": FLAKY_BREAKPOINT},
            {"op": "variables", "label": "locals", "scope": "Locals"},
            {"op": "evaluate", "label": "sum", "expression": "sum(range(10))"},
            {"op": "continue"},
            {"op": "wait_terminated", "label": "end"},
            {"op": "disconnect"},
        ]  # fmt: skip
        extra = ("--backend", "ray", "--resource", "late_gpu=1", "--mount", f"state={s.state}")
        async with debug_run(s.home, s.relay, s.workdir, "python", "flaky.py", extra=extra) as (
            _debug,
            run_id,
            port,
        ):
            job = await submitted(s.backend, run_id)
            spec = scenario(
                port, s.workdir, steps, breakpoints={"flaky.py": [FLAKY_BREAKPOINT]},
                timeout_ms=120_000,
            )  # fmt: skip
            async with open_vscode_session(spec, timeout=240) as session:
                await session.wait_mark("configured")
                assert head.job(job)["status"] == "PENDING"  # no node has a late_gpu
                listed = await said(s, "ls")
                line = next(x for x in listed.splitlines() if x.startswith(run_id))
                assert "queued" in line and job in line, listed
                head.add_node(resources={"late_gpu": 1})
                await session.release("configured")
                result, _messages = await session.result()
    handshake = result["handshake"]["setBreakpoints"][0]["breakpoints"][0]
    assert handshake["verified"] is False  # nothing ran while the job waited
    labels = result["labels"]
    assert labels["hit"]["frames"][0]["name"] == "<module>"
    assert labels["locals"]["values"]["first"] == "False"
    assert labels["sum"]["result"] == "45"
    assert labels["end"]["exitCode"] == 0


async def test_cancel_while_pending_and_while_running_stops_the_ray_jobs(
    tmp_path: Path, head: RayHead
) -> None:
    blocker = hold_the_gpu(head, f"blocker-{tmp_path.name}")
    async with ray_stack(tmp_path, head) as s:
        await wait_status(head, blocker, {"RUNNING"})
        async with ray_run(s, "--gpus", "1", "--", "python", "hello.py") as (_run, pending, held):
            pass
        assert head.job(held)["status"] == "PENDING"
        await cancel(s, pending)
        await s.backend.wait_line(rf"run {pending}: cancelling Ray job {held}")
        # Ray cannot stop a job that waits for resources: it ends once it gets them
        head.request("POST", f"/api/jobs/{blocker}/stop")
        assert await wait_status(head, held, ENDED) == "STOPPED"
        logs = head.request("GET", f"/api/jobs/{held}/logs")
        assert "hello from ray" not in str(logs)  # the program never ran

        hang = ("--mount", f"state={s.state}", "--follow", "--", "python", "flaky.py", "hang")
        async with ray_run(s, *hang, name="running") as (run, running, job):
            await run.wait_line(r"^attempt first")
            assert head.job(job)["status"] == "RUNNING"
            await cancel(s, running)
            await run.wait_line(rf"-- tether: run {running} cancelled")
        # the worker stops the program and ends; the job ends with it, within the grace
        await wait_status(head, job, ENDED)
        await s.backend.wait_line(rf"run {running} attempt 1: done with Ray job {job}")
        assert "attempt 2" not in s.backend.output


async def test_a_job_stopped_from_rays_side_is_preempted_and_resumes_as_attempt_2(
    tmp_path: Path, head: RayHead
) -> None:
    """``ray job stop``: Ray's SIGTERM reaches the worker, which preempts the attempt; Ray waits
        the run's grace (``RAY_JOB_STOP_WAIT_TIME_S``, set by the backend; Ray's own is 3 s) before
        its SIGKILL, so a checkpoint that takes 6 s is saved; attempt 2 spends no retry and resumes from
    it."""
    async with ray_stack(tmp_path, head) as s:
        (s.workdir / "loop.py").write_text(LOOP)
        args = ("--max-retries", "0")  # the grace: 60 s
        loop = ("--follow", "--", "python", "loop.py", "6")
        async with ray_run(s, *args, *loop) as (run, run_id, first):
            await run.wait_line(r"^starting at step 0")
            assert head.job(first)["runtime_env"]["env_vars"]["RAY_JOB_STOP_WAIT_TIME_S"] == "65"
            head.request("POST", f"/api/jobs/{first}/stop")  # `ray job stop`
            await run.wait_line(r"-- tether: preempting attempt 1: ray: the job was stopped")
            step = int((await run.wait_line(r"^preempted at step (\d+)")).group(1))
            await run.wait_line(rf"attempt 1 was preempted; attempt 2 resumes from step {step}")
            second = await submitted(s.backend, run_id, attempt=2)
            assert second != first
            await run.wait_line(rf"^starting at step {step}$")
            await run.wait_line(rf"-- tether: run {run_id} succeeded")
            assert await run.process.wait() == 0
        status = await said(s, "status", run_id)
        assert re.search(rf"#1 .*job {first} .*-> preempted", status), status
        assert re.search(rf"#2 on \S+ job {second} .*-> succeeded", status), status


async def test_a_job_ray_gave_up_on_before_it_started_is_submitted_again(tmp_path: Path) -> None:
    """A cluster whose patience (RAY_JOB_START_TIMEOUT_SECONDS) is shorter than the wait for a
    GPU: Ray fails the job; nothing ran, so the same attempt gets a new job, no retry spent."""
    impatient = RayHead(ray_bin(), cpus=1, gpus=0, env={"RAY_JOB_START_TIMEOUT_SECONDS": "3"})
    with impatient:
        async with (
            ray_stack(tmp_path, impatient) as s,
            ray_run(s, "--gpus", "1", "--", "python", "hello.py") as (_run, run_id, first),
        ):
            again = (
                rf"run {run_id} attempt 1: submitted again \(Ray job {first} never started: "
                r"FAILED \(Job supervisor actor failed to start within 3.0 seconds\)\) "
                r"as Ray job (\S+)"
            )
            second = (await s.backend.wait_line(again, timeout=60)).group(1)
            assert second != first
            assert impatient.job(first)["error_type"] == "JOB_SUPERVISOR_ACTOR_START_TIMEOUT"
            logs = await said(s, "logs", run_id)
            assert f"Ray job {second} submitted again (Ray job {first} never" in logs, logs
            listed = await said(s, "ls")
            line = next(x for x in listed.splitlines() if x.startswith(run_id))
            assert "queued" in line, listed  # still its first attempt, still waiting
            await cancel(s, run_id)


async def test_a_run_past_its_time_limit_is_stopped_as_slurm_would(
    tmp_path: Path, head: RayHead
) -> None:
    """Ray has no time limits; the backend keeps the run's --time (from the job's first look
    running), stops the job and reports the attempt lost, as Slurm's TIMEOUT is."""
    async with ray_stack(tmp_path, head) as s:
        limited = ("--time", "15s", "--mount", f"state={s.state}", "--follow")
        async with ray_run(s, *limited, "--", "python", "flaky.py", "hang") as (run, run_id, job):
            await run.wait_line(r"^attempt first")
            why = rf"Ray job {job} ran past the run's time limit \(15 s\)"
            await s.backend.wait_line(rf"run {run_id}: cancelling Ray job {job}: {why}")
            await run.wait_line(rf"-- tether: run {run_id} lost.*{why}")
            assert await run.process.wait() != 0
        assert await wait_status(head, job, ENDED) == "STOPPED"
