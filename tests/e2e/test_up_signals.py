"""`tether up` stopped by SIGTERM, SIGHUP or SIGKILL (systemd, a container runtime, a closed
terminal, `kill -9`) leaves no server behind, and the next `tether up` on the same data directory
starts with every earlier run there."""

from __future__ import annotations

import os
import signal
from pathlib import Path

import pytest
import trio
from stack import TETHER, home_env, tether

pytestmark = [pytest.mark.slow, pytest.mark.timeout(180)]


def servers_of(data_dir: Path) -> list[int]:
    """The processes (servers, guards) serving ``data_dir``'s socket."""
    marker = str(data_dir / "redis" / "redis.sock")
    found = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            cmdline = (entry / "cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
        except OSError:
            continue
        if marker in cmdline:
            found.append(int(entry.name))
    return found


async def gone(data_dir: Path) -> None:
    with trio.fail_after(30):
        while servers_of(data_dir):  # noqa: ASYNC110 (other processes: no event to wait on)
            await trio.sleep(0.05)


@pytest.mark.parametrize("signum", [signal.SIGTERM, signal.SIGHUP, signal.SIGKILL])
async def test_tether_up_leaves_no_server_behind_and_comes_back_with_its_runs(
    tmp_path: Path, signum: signal.Signals
) -> None:
    home, data = tmp_path / "home", tmp_path / "data"
    workdir = tmp_path / "project"
    workdir.mkdir()
    (workdir / "app.py").write_text("print('hi')\n")
    up_args = ("up", "--data-dir", str(data), "--workers", "0", "--relay-port", "0")
    async with tether(*up_args, home=home) as up:
        await up.wait_line(r"tether up: ready relay=(\S+)")
        assert servers_of(data), "no server found for the data directory"
        async with tether(
            "run", "--workdir", str(workdir), "--", "python", "app.py", home=home, name="run"
        ) as run:
            run_id = (await run.wait_line(r"run (\w+) queued")).group(1)
        os.kill(up.process.pid, signum)  # the process only, as a script that kept its PID would
        with trio.fail_after(60):
            code = await up.process.wait()
        assert code == (-signal.SIGKILL if signum is signal.SIGKILL else 128 + signum)
        if signum is not signal.SIGKILL:
            assert "Traceback" not in up.output
            said = "tether up: stopping: no run was running; 1 queued run starts at the next"
            assert said in up.output, up.output
        await gone(data)
    async with tether(*up_args, home=home, name="up again") as again:
        await again.wait_line(r"tether up: ready")
        proc = await trio.run_process(
            [TETHER, "ls"], capture_stdout=True, env=home_env(home), check=False
        )
        assert run_id in proc.stdout.decode(), proc.stdout.decode()
    await gone(data)


@pytest.mark.parametrize("signum", [signal.SIGINT, signal.SIGTERM])
async def test_stopping_tether_up_preempts_its_runs_and_says_so(
    tmp_path: Path, signum: signal.Signals
) -> None:
    """Ctrl-C (or SIGTERM) on `tether up` with a run in its pool: the run's attempt is preempted
    (its program, which traps nothing, is ended at its `--preempt-grace`), the run is queued again
    without using a retry, and the next `tether up` runs it again; never left "running" until its
    lease."""
    home, data = tmp_path / "home", tmp_path / "data"
    workdir = tmp_path / "project"
    workdir.mkdir()
    (workdir / "app.py").write_text(
        "import time\nprint('working', flush=True)\nwhile True:\n    time.sleep(0.1)\n"
    )
    up_args = ("up", "--data-dir", str(data), "--workers", "1", "--relay-port", "0")
    async with tether(*up_args, home=home) as up:
        await up.wait_line(r"tether up: ready relay=(\S+)")
        async with tether(
            "run", "--workdir", str(workdir), "--preempt-grace", "1s", "--", "python", "app.py",
            home=home, name="run",
        ) as run:  # fmt: skip
            run_id = (await run.wait_line(r"run (\w+) queued")).group(1)
        await up.wait_line(rf"run {run_id} attempt 1: \d+ files in")
        os.kill(up.process.pid, signum)
        with trio.fail_after(60):
            await up.process.wait()
        assert "Traceback" not in up.output
        assert "stopping: preempting 1 running attempt(s)" in up.output, up.output
        said = f"run {run_id}: preempted, back to the queue (no retry used)"
        assert said in up.output, up.output
    async with tether(*up_args, home=home, name="up again") as again:
        await again.wait_line(r"tether up: ready")
        await again.wait_line(rf"run {run_id} attempt 2: \d+ files in")
        done = await trio.run_process(
            [TETHER, "status", run_id], capture_stdout=True, env=home_env(home), check=False
        )
        await trio.run_process([TETHER, "cancel", run_id], env=home_env(home), check=False)
    text = done.stdout.decode()
    assert "preempted" in text, text
