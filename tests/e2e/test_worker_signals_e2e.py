"""A run's processes end with its worker, however the worker ends: `tether worker` and `tether up`
stopped by SIGTERM, SIGHUP or SIGKILL with three runs in their pool (a plain run that prints
nothing, a debug run paused at a breakpoint, a run whose child left its process group) leave no
process of any run behind (checked by PID, and by the uids the programs ran as), and the runs are
reported as the worker's end says: stopped, it preempts them first (queued again at once, without
using a retry); killed, they are lost after the lease."""

from __future__ import annotations

import json
import os
import re
import signal
import sys
from pathlib import Path

import pytest
import trio
from stack import Proc, local_token, tether

from adapter.cli.submission import submit_run
from protocol_specs.runs.runs import RunRecord
from protocol_specs.runs.spec import RunSpec
from relay.client import Endpoint, open_control
from worker_shim.program.uid_leases import processes_of

pytestmark = [
    pytest.mark.slow,
    pytest.mark.timeout(240),
    pytest.mark.skipif(not sys.platform.startswith("linux"), reason="reads /proc"),
]

ROOT = os.geteuid() == 0
UIDS = (61100, 61199)

QUIET = """\
import json, os, time
json.dump({"pids": [os.getpid()]}, open("pids.part", "w")); os.rename("pids.part", "pids")
time.sleep(600)
"""
PAUSED = """\
import json, os
json.dump({"pids": [os.getpid()]}, open("pids.part", "w")); os.rename("pids.part", "pids")
breakpoint()
print("let go")
"""
CHILD = """\
import json, os, subprocess, time
away = subprocess.Popen(["sleep", "600"], start_new_session=True)  # out of the run's group
child = subprocess.Popen(["python3", "-c", "import time; time.sleep(600)"])
pids = [os.getpid(), away.pid, child.pid]
json.dump({"pids": pids}, open("pids.part", "w")); os.rename("pids.part", "pids")
time.sleep(600)
"""


def alive(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().split(") ", 1)[1][0] != "Z"
    except OSError:
        return False


async def pids_of(relay: Endpoint, run: RunRecord) -> list[int]:
    """The PIDs the run's program wrote in its directory once it ran."""
    async with open_control(relay, client="test") as control:
        with trio.fail_after(120):
            while True:
                record = await control.get_run(run.id)
                where = record.attempts[-1].run_dir if record.attempts else ""
                if where and (Path(where) / "pids").exists():
                    return list(json.loads((Path(where) / "pids").read_text())["pids"])
                await trio.sleep(0.05)


async def states(relay: Endpoint, runs: list[RunRecord], want: str, timeout: float) -> None:
    async with open_control(relay, client="test") as control:
        with trio.fail_after(timeout):
            while True:
                records = [await control.get_run(r.id) for r in runs]
                if all(r.state.value == want for r in records):
                    return
                await trio.sleep(0.1)


@pytest.mark.parametrize("signum", [signal.SIGTERM, signal.SIGHUP, signal.SIGKILL])
@pytest.mark.parametrize("command", ["worker", "up"])
async def test_no_process_of_a_run_outlives_its_worker(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, command: str, signum: signal.Signals
) -> None:
    home = tmp_path / "home"
    monkeypatch.setenv("TETHER_HOME", str(home))
    project = tmp_path / "project"
    project.mkdir()
    for name, text in (("quiet.py", QUIET), ("paused.py", PAUSED), ("child.py", CHILD)):
        (project / name).write_text(text)
    uids = ("--run-uids", f"{UIDS[0]}-{UIDS[1]}")
    lease = ("--lease", "3s")
    async with trio.open_nursery() as nursery:
        if command == "up":
            up_args = ("--workers", "3", "--relay-port", "0", *uids, *lease)
            ctx = tether("up", "--data-dir", str(home / "data"), *up_args, home=home)
            worker: Proc = await nursery.start(_hold, ctx)
            relay_url = (await worker.wait_line(r"tether up: ready relay=(\S+)")).group(1)
        else:
            _up, relay_url = await nursery.start(_hold_stack, home, lease)
            ctx = tether("worker", "--relay", relay_url, "--slots", "3", *uids,
                         "--work-dir", str(home / "worker"), home=home)  # fmt: skip
            worker = await nursery.start(_hold, ctx)
            await worker.wait_line(r"tether worker: ready")
        token = local_token(home)
        relay = Endpoint(relay_url, token=token)
        # a stopped worker preempts its runs first: their programs trap nothing, 1 s of grace
        base = RunSpec(
            command=["python", "quiet.py"], workdir=str(project), debug=False, preempt_grace=1.0
        )
        specs = [
            base,
            base.model_copy(update={"command": ["python", "paused.py"], "debug": True,
                                    "wait_for_ide": False}),
            base.model_copy(update={"command": ["python", "child.py"]}),
        ]  # fmt: skip
        runs = [await submit_run(relay, spec, lambda _text: None) for spec in specs]
        pids = [pid for run in runs for pid in await pids_of(relay, run)]
        await worker.wait_line(rf"Run {runs[1].id} is paused at paused.py", timeout=60)
        assert all(alive(pid) for pid in pids), pids

        os.kill(worker.process.pid, signum)
        with trio.fail_after(60):
            await worker.process.wait()
        with trio.fail_after(30):  # the guard sweeps after a SIGKILL
            while [pid for pid in pids if alive(pid)]:  # noqa: ASYNC110 (other processes)
                await trio.sleep(0.05)
        if ROOT:  # nor any process of the uids its runs ran as
            uids = {int(u) for u in re.findall(r"as uid (\d+)", worker.output)}
            assert len(uids) == 3 and processes_of(uids) == {}, uids
        if signum is not signal.SIGKILL:  # stopped: it preempted its runs first
            assert "Traceback" not in worker.output
            assert "stopping: preempting 3 running attempt(s)" in worker.output, worker.output
        if command == "up":  # its relay went with it: the next tether up on its data tells
            again = tether(
                "up", "--data-dir", str(home / "data"), "--workers", "0", "--relay-port", "0",
                *lease, home=home, name="up again",
            )  # fmt: skip
            back: Proc = await nursery.start(_hold, again)
            relay_url = (await back.wait_line(r"tether up: ready relay=(\S+)")).group(1)
            relay = Endpoint(relay_url, token=token)
        if signum is signal.SIGKILL:  # no warning: lost after the 3 s lease
            await states(relay, runs, "lost", 30)
        else:  # preempted: queued again without using a retry
            await states(relay, runs, "queued", 5)
        nursery.cancel_scope.cancel()


async def _hold(ctx: object, *, task_status: trio.TaskStatus[Proc]) -> None:
    async with ctx as proc:  # type: ignore[attr-defined]
        task_status.started(proc)
        await trio.sleep_forever()


async def _hold_stack(
    home: Path, lease: tuple[str, ...], *, task_status: trio.TaskStatus[tuple[Proc, str]]
) -> None:
    async with tether(
        "up", "--data-dir", str(home / "data"), "--workers", "0", "--relay-port", "0", *lease,
        home=home,
    ) as up:  # fmt: skip
        relay = (await up.wait_line(r"tether up: ready relay=(\S+)")).group(1)
        task_status.started((up, relay))
        await trio.sleep_forever()
