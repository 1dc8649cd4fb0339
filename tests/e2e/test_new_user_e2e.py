"""What a new user meets first, with real processes: their own interpreter in debug mode, and the
program's output where they look (the `tether debug` terminal, and the IDE whatever its attach
says)."""

from __future__ import annotations

import re
import venv
from pathlib import Path

import pytest
import trio
from stack import debug_run, relay_stack

from adapter.scripted_ide.dap_client import open_dap_client
from protocol_specs.dap.capabilities import VSCODE_INITIALIZE

pytestmark = [pytest.mark.slow, pytest.mark.timeout(180)]

APP = """\
import sys
import userlib

print("hello from", userlib.NAME, "on", sys.prefix)
print("to stderr", file=sys.stderr)
"""


def users_venv(tmp_path: Path) -> Path:
    """A virtual environment of the user's: a module of its own, no debugpy, nothing of tether's."""
    home = tmp_path / "users-venv"
    venv.EnvBuilder(with_pip=False).create(home)
    (site,) = home.glob("lib/python3*/site-packages")
    (site / "userlib.py").write_text("NAME = 'userlib'\n")
    return home / "bin" / "python"


async def plain_attach(port: int) -> list[str]:
    """An IDE attaching the way debugpy's attach defaults (no redirectOutput, no debugOptions):
    the program's output events it got until the end."""
    lines: list[str] = []
    async with open_dap_client("127.0.0.1", port) as ide:
        await ide.request("initialize", VSCODE_INITIALIZE)
        attach = ide.send_request_nowait("attach", {"justMyCode": True})
        await ide.wait_event("initialized", timeout=30)
        await ide.request("setExceptionBreakpoints", {"filters": []})
        assert (await ide.request("configurationDone"))["success"]
        assert (await ide.response(attach))["success"]
        await ide.wait_event("terminated", timeout=120)
        for msg in ide.received:
            body = msg.get("body") or {}
            if msg.get("event") == "output" and body.get("category") in ("stdout", "stderr"):
                lines.append(body["output"])
    return lines


@pytest.mark.parametrize("quiet", [False, True], ids=["terminal", "quiet"])
async def test_debug_mode_runs_the_users_interpreter_and_shows_its_output(
    tmp_path: Path, quiet: bool
) -> None:
    python = users_venv(tmp_path)
    workdir = tmp_path / "project"
    workdir.mkdir()
    (workdir / "app.py").write_text(APP)
    home = tmp_path / "home"
    extra = ("--quiet",) if quiet else ()
    async with (
        # their own venv, on their own machine: programs run as them (a root worker's would not
        # reach a venv in pytest's tmp_path, which is root's only)
        relay_stack(home, workers=1, isolated=False) as (_up, relay),
        debug_run(home, relay, workdir, str(python), "app.py", extra=extra) as (debug, _run, port),
    ):
        events = "".join(await plain_attach(port))
        await debug.wait_line(r"ended \(exited, exit code 0\)")
        with trio.fail_after(30):
            assert await debug.process.wait() == 0
    said = f"hello from userlib on {python.parent.parent}"
    assert said in events and "to stderr" in events  # no redirectOutput asked: output anyway
    assert (said in debug.output) is not quiet


async def test_the_cli_is_scriptable_and_ctrl_c_leaves_the_run_going(tmp_path: Path) -> None:
    import os
    import signal

    from stack import TETHER, home_env

    workdir = tmp_path / "project"
    workdir.mkdir()
    (workdir / "app.py").write_text("print('done')\n")
    home = tmp_path / "home"

    async def cli(*args: str) -> tuple[int, str, str]:
        done = await trio.run_process(
            [TETHER, *args], env=home_env(home), cwd=workdir, capture_stdout=True,
            capture_stderr=True, check=False,
        )  # fmt: skip
        return done.returncode, done.stdout.decode(), done.stderr.decode()

    async with relay_stack(home, workers=1) as (_up, relay):
        code, out, err = await cli("run", "--", "python", "app.py")
        run = out.strip()
        assert code == 0 and len(run) == 14 and out == f"{run}\n", (out, err)  # the id alone
        assert "queued" in err  # progress goes to stderr
        code, out, _ = await cli("logs", "-f", run[:10])  # a prefix names it
        assert code == 0 and "done" in out
        code, _, err = await cli("cancel", run)
        assert code == 1 and "had already ended (succeeded)" in err
        code, out, _ = await cli("--version")
        assert code == 0 and out.startswith("tether ")
        async with debug_run(home, relay, workdir, "python", "app.py") as (debug, held, _port):
            os.killpg(debug.process.pid, signal.SIGINT)  # Ctrl-C in the terminal
            with trio.fail_after(30):
                assert await debug.process.wait() == 130
        assert f"stopped serving run {held}'s adapter; the run goes on" in debug.output
        assert f"tether attach {held}" in debug.output and "Traceback" not in debug.output
        code, out, _ = await cli("status", held)
        assert re.search(r"state +(queued|starting|running|waiting for an IDE)\b", out), out


def project_with_venv(tmp_path: Path) -> Path:
    """A project with its own ``.venv`` (a module only it has), as ``python -m venv .venv``
    makes it, and a script that imports that module."""
    workdir = tmp_path / "project"
    workdir.mkdir()
    (workdir / "app.py").write_text(APP)
    home = workdir / ".venv"
    venv.EnvBuilder(with_pip=False).create(home)
    (site,) = home.glob("lib/python3*/site-packages")
    (site / "userlib.py").write_text("NAME = 'userlib'\n")
    return workdir


async def test_the_projects_own_venv_runs_the_program_by_its_relative_path(
    tmp_path: Path,
) -> None:
    """``tether debug -- .venv/bin/python app.py``: the README's example. No snapshot carries a
    venv: the run names it by its path here, and says so at submit."""
    workdir = project_with_venv(tmp_path)
    home = tmp_path / "home"
    async with (
        relay_stack(home, workers=1, isolated=False) as (_up, relay),
        debug_run(home, relay, workdir, ".venv/bin/python", "app.py") as (debug, _run, port),
    ):
        events = "".join(await plain_attach(port))
        await debug.wait_line(r"ended \(exited, exit code 0\)")
    assert f"hello from userlib on {workdir / '.venv'}" in events
    assert f".venv/bin/python is {workdir / '.venv/bin/python'}" in debug.output
    assert "the worker must see" in debug.output


async def test_an_activated_venvs_python_is_the_runs_and_a_missing_script_is_refused(
    tmp_path: Path,
) -> None:
    """With the project's venv activated, a bare ``python`` is the venv's (as the shell runs it);
    without, the submit says how to use it; a script the snapshot lacks is refused at submit."""
    import os

    from stack import TETHER, home_env

    workdir = project_with_venv(tmp_path)
    home = tmp_path / "home"
    active = workdir / ".venv"
    activated = {
        **home_env(home),
        "VIRTUAL_ENV": str(active),
        "PATH": f"{active / 'bin'}{os.pathsep}{os.environ['PATH']}",
    }

    async def cli(*args: str, env: dict[str, str]) -> tuple[int, str, str]:
        done = await trio.run_process(
            [TETHER, *args], env=env, cwd=workdir, capture_stdout=True, capture_stderr=True,
            check=False,
        )  # fmt: skip
        return done.returncode, done.stdout.decode(), done.stderr.decode()

    async with relay_stack(home, workers=1, isolated=False):
        code, out, err = await cli(
            "run", "-f", "--no-post-mortem", "--", "python", "app.py", env=activated
        )
        assert code == 0, (out, err)
        assert f"hello from userlib on {active}" in out
        assert "your active venv" in err
        code, out, err = await cli("run", "--", "python", "app.py", env=home_env(home))
        assert code == 0 and "the worker's python, not .venv/bin/python" in err, err
        code, out, err = await cli("run", "--", "python", "nofile.py", env=activated)
        assert code == 1 and out == "", out
        assert err.strip().endswith(f"can't open file 'nofile.py': no such file in {workdir}")
        code, _, err = await cli("debug", "--", "python", "nofile.py", env=activated)
        assert code == 1 and "can't open file 'nofile.py'" in err and "Traceback" not in err


async def test_ctrl_c_in_run_follow_says_the_run_goes_on_and_how_to_follow_it(
    tmp_path: Path,
) -> None:
    """As `docker logs -f` / `kubectl logs -f`: Ctrl-C stops following, not the run, and says so
    with how to follow it again or cancel it."""
    import os
    import signal

    from stack import status_saying, tether

    workdir = tmp_path / "project"
    workdir.mkdir()
    (workdir / "app.py").write_text(
        "import time\nprint('working', flush=True)\nwhile True:\n    time.sleep(0.1)\n"
    )
    home = tmp_path / "home"
    async with relay_stack(home, workers=1):
        async with tether(
            "run", "-f", "--workdir", str(workdir), "--", "python", "app.py", home=home,
            name="run -f",
        ) as follow:  # fmt: skip
            run = (await follow.wait_line(r"tether run: run (\w+) queued")).group(1)
            await follow.wait_line(r"^working$")
            os.killpg(follow.process.pid, signal.SIGINT)  # Ctrl-C in the terminal
            with trio.fail_after(30):
                assert await follow.process.wait() == 130
        said = (
            f"tether: stopped following run {run}; the run goes on. `tether logs -f {run}` "
            f"follows it again, `tether cancel {run}` stops it."
        )
        assert said in follow.output and "Traceback" not in follow.output, follow.output
        await status_saying(home, run, "running")
        async with tether("cancel", run, home=home, name="cancel") as cancel:
            with trio.fail_after(30):
                assert await cancel.process.wait() == 0, cancel.output
