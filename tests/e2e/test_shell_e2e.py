"""``tether shell RUN``: a shell on the run's worker, on a real terminal (a PTY driven by pexpect),
through the relay: typing, the window's size as ``stty size`` sees it (and after a resize),
Ctrl-C interrupting a ``sleep``, and the shell's exit status as tether's. Real processes:
``tether up``'s relay and Redis, a worker pool running a plain run, the CLI."""

from __future__ import annotations

from pathlib import Path

import pexpect
import pytest
import trio
from stack import TETHER, home_env, relay_stack, tether, worker

pytestmark = [pytest.mark.slow, pytest.mark.timeout(180)]

WAITS = "import time\nprint('up', flush=True)\ntime.sleep(120)\n"
PROMPT = "tether-test\\$ "


def _session(argv: list[str], env: dict[str, str], run_dir_name: str) -> tuple[int, str]:
    """Drive the shell as a person would; (tether's exit status, what the terminal showed)."""
    shell = pexpect.spawn(
        argv[0], argv[1:], env=env, dimensions=(30, 90), encoding="utf-8", timeout=30
    )
    shell.logfile_read = log = _Log()
    shell.expect(r"[#$] ")  # the login shell's own prompt: type once it is there
    shell.sendline("export PS1='tether-test$ '")
    shell.expect(PROMPT)
    shell.sendline("echo $((6 * 7)) in $(basename $(pwd)) as $WHO")
    shell.expect(f"42 in {run_dir_name} as tether")
    shell.expect(PROMPT)
    shell.sendline("stty size")
    shell.expect("30 90")
    shell.expect(PROMPT)
    shell.setwinsize(40, 120)  # the window grows: the remote terminal follows
    shell.sendline("stty size")
    shell.expect("40 120")
    shell.expect(PROMPT)
    shell.sendline("sleep 60")
    shell.sendintr()  # Ctrl-C: the remote terminal's line discipline signals the sleep
    shell.expect(PROMPT, timeout=10)
    shell.sendline("echo status $?")
    shell.expect("status 130")
    shell.expect(PROMPT)
    shell.sendline("exit 5")
    shell.expect(pexpect.EOF)
    shell.close()
    return shell.exitstatus, log.text


class _Log:
    def __init__(self) -> None:
        self.text = ""

    def write(self, data: str) -> None:
        self.text += data

    def flush(self) -> None:
        pass


async def test_a_shell_in_the_run_on_a_real_terminal(tmp_path: Path) -> None:
    home = tmp_path / "home"
    workdir = tmp_path / "project"
    workdir.mkdir()
    (workdir / "waits.py").write_text(WAITS)
    async with relay_stack(home) as (_up, relay), worker(home, relay):
        async with tether(
            "run", "--relay", relay, "--workdir", str(workdir), "--env", "WHO=tether",
            "--", "python", "waits.py", home=home, name="run",
        ) as run:  # fmt: skip
            run_id = (await run.wait_line(r"^(\S+)$")).group(1)
        async with tether("logs", run_id, "-f", "--relay", relay, home=home, name="logs") as logs:
            await logs.wait_line("up", timeout=120)
            env = {**home_env(home), "TERM": "xterm", "SHELL": "/bin/bash"}
            code, shown = await trio.to_thread.run_sync(
                _session, [TETHER, "shell", run_id, "--relay", relay], env, f"{run_id}-1"
            )
            assert code == 5, shown
            async with tether("cancel", run_id, "--relay", relay, home=home, name="cancel") as c:
                await c.process.wait()


async def test_a_shell_needs_a_terminal(tmp_path: Path) -> None:
    home = tmp_path / "home"
    async with relay_stack(home) as (_up, relay):
        done = await trio.run_process(
            [TETHER, "shell", "whatever", "--relay", relay],
            stdin=b"",
            capture_stdout=True,
            capture_stderr=True,
            env=home_env(home),
            check=False,
        )
    assert done.returncode != 0 and b"tether shell needs a terminal" in done.stderr
    assert b"Traceback" not in done.stderr
