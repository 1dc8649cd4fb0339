"""``tether exec RUN -- COMMAND``: a command on the run's worker, through the relay, as a script
uses it: its output on our stdout and stderr, our stdin on its, its exit status as ours. Real
processes: ``tether up``'s relay and Redis, a worker pool running a plain run, the CLI."""

from __future__ import annotations

import hashlib
import os
import signal
import subprocess
from pathlib import Path

import pytest
import trio
from stack import TETHER, home_env, relay_stack, tether, worker

pytestmark = [pytest.mark.slow, pytest.mark.timeout(180)]

WAITS = "import time\nprint('up', flush=True)\ntime.sleep(120)\n"


async def _exec(
    home: Path, relay: str, run_id: str, *command: str, stdin: bytes = b""
) -> subprocess.CompletedProcess[bytes]:
    argv = [TETHER, "exec", run_id, "--relay", relay, "--", *command]
    with trio.fail_after(60):
        return await _run(argv, stdin, home)


async def _run(argv: list[str], stdin: bytes, home: Path) -> subprocess.CompletedProcess[bytes]:
    return await trio.run_process(
        argv, stdin=stdin, capture_stdout=True, capture_stderr=True, env=home_env(home),
        check=False,
    )  # fmt: skip


async def test_exec_runs_a_command_in_the_run_and_returns_its_status(tmp_path: Path) -> None:
    home = tmp_path / "home"
    workdir = tmp_path / "project"
    workdir.mkdir()
    (workdir / "waits.py").write_text(WAITS)
    async with relay_stack(home) as (_up, relay), worker(home, relay) as pool:
        async with tether(
            "exec", "no-such-run", "--relay", relay, "--", "true", home=home, name="refused"
        ) as refused:
            assert await refused.process.wait() != 0
        assert "no run 'no-such-run'" in refused.output and "Traceback" not in refused.output
        async with tether(
            "run", "--relay", relay, "--workdir", str(workdir), "--env", "WHO=tether",
            "--", "python", "waits.py", home=home, name="run",
        ) as run:  # fmt: skip
            run_id = (await run.wait_line(r"^(\S+)$")).group(1)
        async with tether("logs", run_id, "-f", "--relay", relay, home=home, name="logs") as logs:
            await logs.wait_line("up", timeout=120)
            try:
                await _commands(home, relay, run_id)
            except trio.TooSlowError:
                raise AssertionError(f"tether exec hung; the worker said:\n{pool.output}") from None
            async with tether("cancel", run_id, "--relay", relay, home=home, name="cancel") as c:
                await c.process.wait()
            await logs.wait_line(r"-- tether: run \S+ cancelled", timeout=60)
        # the run ended; its pool keeps its directory, and serves its tunnels there
        await pool.wait_line(rf"run {run_id}: its directory stays here", timeout=60)
        done = await _exec(home, relay, run_id, "sh", "-c", "ls; echo $WHO")
        assert (done.returncode, done.stdout) == (0, b"waits.py\ntether\n")


async def _commands(home: Path, relay: str, run_id: str) -> None:
    done = await _exec(home, relay, run_id, "sh", "-c", 'ls; echo "$WHO" >&2; exit 3')
    assert done.returncode == 3
    assert done.stdout == b"waits.py\n" and done.stderr == b"tether\n"
    data = bytes(range(256)) * 8192  # 2 MiB through stdin and back out
    done = await _exec(home, relay, run_id, "cat", stdin=data)
    assert done.returncode == 0
    assert hashlib.sha256(done.stdout).digest() == hashlib.sha256(data).digest()
    done = await _exec(home, relay, run_id, "no-such-command")
    assert done.returncode == 127
    assert b"cannot run no-such-command" in done.stderr
    # Ctrl-C: tether says nothing more (no traceback), and the remote command hangs up too
    async with tether(
        "exec", run_id, "--relay", relay, "--", "sh", "-c", "echo started; exec sleep 120",
        home=home, name="interrupted",
    ) as interrupted:  # fmt: skip
        await interrupted.wait_line("started")
        os.kill(interrupted.process.pid, signal.SIGINT)
        with trio.fail_after(30):
            assert await interrupted.process.wait() == 130
    assert "Traceback" not in interrupted.output
    # the hang-up may still be on its way when tether gave up waiting for it (3 s, a loaded box)
    with trio.fail_after(60):
        while True:
            left = await _exec(
                home, relay, run_id, "sh", "-c", "pgrep -f 'slee[p] 120' || echo none"
            )
            if left.stdout == b"none\n":
                break
            await trio.sleep(0.5)
    async with tether("audit", run_id, "--relay", relay, home=home, name="audit") as audit:
        await audit.process.wait()
    assert "exec: cat" in audit.output and "exec: no-such-command" in audit.output
