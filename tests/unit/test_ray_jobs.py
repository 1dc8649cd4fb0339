"""The Ray backend's pure parts: the job it submits for an attempt (resources, the ticket kept
off the command line), what Ray's job states mean to tether, and bad input refused at submit."""

from __future__ import annotations

import shlex

import pytest
from pydantic import ValidationError

from protocol_specs.runs.resources import Resources
from protocol_specs.runs.runs import RunRecord
from protocol_specs.runs.spec import RunSpec
from worker_shim.backends.job_watch import Phase
from worker_shim.backends.ray_jobs import address_of, job_request, seen_of
from worker_shim.backends.ray_nodes import bundle_of, node_argv, parse

TICKET = "ttht_0123456789abcdef_" + "x" * 43


def record(**resources: object) -> RunRecord:
    spec = RunSpec(
        command=["python", "train.py"],
        workdir="/w",
        backend="ray",
        name="lr sweep",
        resources=Resources(**resources),  # type: ignore[arg-type]
    )
    return RunRecord(id="r1", spec=spec, owner="alice", attempt=2)


def test_the_job_holds_the_runs_resources() -> None:
    body = job_request(
        record(gpus=2, cpus=8, memory_mb=1024, custom={"accelerator_type:A100": 1}),
        TICKET,
        submission_id="tether-r1-2-abc",
        python="/opt/py/bin/python",
        relay="wss://relay:8765",
    )
    assert body["entrypoint_num_gpus"] == 2 and body["entrypoint_num_cpus"] == 8
    assert body["entrypoint_memory"] == 1024 * 2**20
    assert body["entrypoint_resources"] == {"accelerator_type:A100": 1}
    assert body["submission_id"] == "tether-r1-2-abc"
    assert body["metadata"] == {
        "tether_run": "r1",
        "tether_attempt": "2",
        "tether_owner": "alice",
        "name": "lr sweep",
    }


def test_no_gpus_memory_or_custom_resources_are_asked_for_unless_the_run_does() -> None:
    body = job_request(record(), TICKET, submission_id="s", python="python", relay="ws://r")
    assert body["entrypoint_num_cpus"] == 1
    assert not {"entrypoint_num_gpus", "entrypoint_memory", "entrypoint_resources"} & set(body)


def test_the_ticket_is_in_the_environment_never_on_the_command_line() -> None:
    body = job_request(
        record(),
        TICKET,
        submission_id="s",
        python="/my env/python",
        relay="ws://r:1",
        ca_file="/etc/tether/ca.pem",
        work_dir="/scratch/tether",
        allow_tunnels=False,
    )
    argv = shlex.split(body["entrypoint"])
    assert argv == [
        "/my env/python", "-m", "adapter.cli", "worker", "--run", "r1", "--attempt", "2",
        "--work-dir", "/scratch/tether", "--no-shell", "--scheduler", "ray",
    ]  # fmt: skip
    assert TICKET not in body["entrypoint"]
    assert body["runtime_env"] == {
        "env_vars": {
            "TETHER_RELAY": "ws://r:1",
            "TETHER_TOKEN": TICKET,
            "TETHER_CA_FILE": "/etc/tether/ca.pem",
            "RAY_JOB_STOP_WAIT_TIME_S": "65",
        }
    }


@pytest.mark.parametrize(
    ("info", "phase"),
    [
        (None, Phase.GONE),
        ({"status": "PENDING"}, Phase.PENDING),
        ({"status": "RUNNING"}, Phase.RUNNING),
        ({"status": "SUCCEEDED"}, Phase.ENDED),
        ({"status": "STOPPED"}, Phase.ENDED),
        ({"status": "FAILED", "error_type": "JOB_ENTRYPOINT_COMMAND_ERROR"}, Phase.ENDED),
        ({"status": "FAILED", "error_type": "JOB_SUPERVISOR_ACTOR_START_TIMEOUT"}, Phase.GAVE_UP),
        ({"status": "SOMETHING_NEW"}, Phase.RUNNING),  # a later Ray's state: kept, not lost
    ],
)
def test_rays_job_states(info: dict[str, str] | None, phase: Phase) -> None:
    assert seen_of(info).phase is phase


def test_what_ray_said_is_kept_for_people() -> None:
    said = "Job supervisor actor failed to start within 3.0 seconds. This timeout can be set."
    seen = seen_of({"status": "FAILED", "message": said.replace(" to ", "\nto ")})
    assert seen.detail == "FAILED (Job supervisor actor failed to start within 3.0 seconds)"
    assert (
        seen_of({"status": "RUNNING", "message": "Job is currently running."}).detail == "RUNNING"
    )


def test_the_dashboard_address() -> None:
    assert address_of("head:8265") == "http://head:8265"
    assert address_of(" https://ray.example.com/ ") == "https://ray.example.com"
    with pytest.raises(SystemExit, match="dashboard's http"):
        address_of("ray://head:10001")


def test_custom_resources_are_refused_at_submit_unless_the_run_goes_to_ray() -> None:
    with pytest.raises(ValidationError, match="Ray setting: the slurm backend"):
        RunSpec(
            command=["python", "x.py"],
            workdir="/w",
            backend="slurm",
            resources=Resources(custom={"tether_test": 1}),
        )
    for bad in ({"GPU": 1}, {"bad name": 1}, {"ok": 0}):
        with pytest.raises(ValidationError):
            Resources(custom=bad)


def test_the_program_and_its_ray_tasks_never_get_the_workers_ticket(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Ray hands the job's runtime environment to the driver in RAY_JOB_CONFIG_JSON_ENV_VAR, and
    the driver to every task it starts: the worker's own variables are taken out of it."""
    import json

    from worker_shim.program.quarters import RAY_JOB_CONFIG, program_env

    config = {
        "runtime_env": {"env_vars": {"TETHER_TOKEN": TICKET, "WANDB_MODE": "offline"}},
        "metadata": {"tether_run": "r1"},
    }
    monkeypatch.setenv(RAY_JOB_CONFIG, json.dumps(config))
    monkeypatch.setenv("TETHER_TOKEN", TICKET)
    env = program_env(record(), None)
    assert "TETHER_TOKEN" not in env and TICKET not in str(env)
    assert json.loads(env[RAY_JOB_CONFIG]) == {
        "runtime_env": {"env_vars": {"WANDB_MODE": "offline"}},
        "metadata": {"tether_run": "r1"},
    }
    monkeypatch.setenv(RAY_JOB_CONFIG, f"not json {TICKET}")
    assert program_env(record(), None)[RAY_JOB_CONFIG] == "{}"


def test_a_run_over_nodes_is_one_job_whose_driver_spreads_a_worker_per_node() -> None:
    """The driver (``ray_nodes``) holds nothing itself: each node's share is its bundle."""
    body = job_request(
        record(nodes=3, gpus=2, cpus=8, memory_mb=1024, custom={"accelerator_type:A100": 1}),
        TICKET,
        submission_id="s",
        python="/opt/py/bin/python",
        relay="wss://relay:8765",
        work_dir="/scratch/tether",
    )
    assert not {k for k in body if k.startswith("entrypoint_")} - {"entrypoint"}
    argv = shlex.split(body["entrypoint"])
    cut = argv.index("--")
    assert argv[:cut] == [
        "/opt/py/bin/python", "-m", "worker_shim.backends.ray_nodes", "--nodes", "3",
        "--cpus", "8", "--gpus", "2", "--memory", str(1024 * 2**20),
        "--resources", '{"accelerator_type:A100": 1.0}',
    ]  # fmt: skip
    assert argv[cut + 1 :] == [
        "/opt/py/bin/python", "-m", "adapter.cli", "worker", "--run", "r1", "--attempt", "2",
        "--work-dir", "/scratch/tether",
    ]  # fmt: skip
    assert TICKET not in body["entrypoint"]
    driver, worker = parse(argv[3:])
    assert bundle_of(driver) == {"CPU": 8, "GPU": 2, "memory": 1024 * 2**20,
                                 "accelerator_type:A100": 1}  # fmt: skip
    assert worker == argv[cut + 1 :]


def test_each_nodes_worker_gets_its_node_and_a_work_directory_of_its_own() -> None:
    worker = ["py", "-m", "adapter.cli", "worker", "--run", "r1", "--attempt", "2"]
    assert node_argv([*worker, "--work-dir", "/s/w"], 1)[-4:] == [
        "--work-dir", "/s/w-node1", "--node", "1",
    ]  # fmt: skip
    assert node_argv(worker, 0, home="/h")[-4:] == ["--work-dir", "/h/worker-node0", "--node", "0"]
    with pytest.raises(SystemExit, match="give the worker's command after --"):
        parse(["--nodes", "2"])
    with pytest.raises(SystemExit, match=r"--nodes N \(N >= 2\)"):
        parse(["--nodes", "1", "--", "py"])
