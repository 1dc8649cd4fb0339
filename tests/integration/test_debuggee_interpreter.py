"""The user's own interpreter under real debugpy: the one the command names, another CPython
version, one too old for debugpy refused with the reason, found as the run finds it."""

from __future__ import annotations

import os
import sys
from pathlib import Path

import pytest
from debuggee_harness import RETURN_LINE, Run, client, configure, evaluate

from worker_shim.program.debuggee import start_debuggee
from worker_shim.program.python_command import check_python, resolve_python

pytestmark = [pytest.mark.slow, pytest.mark.timeout(90)]


def _venv(tmp_path: Path) -> Path:
    """A virtual environment of the user's: no debugpy in it, a module of its own."""
    import venv

    home = tmp_path / "venv"
    venv.EnvBuilder(with_pip=False).create(home)
    (site,) = home.glob("lib/python3*/site-packages")
    (site / "userlib.py").write_text("VALUE = 42\n")
    return home / "bin" / "python"


async def test_the_program_runs_on_the_interpreter_its_command_names(tmp_path: Path) -> None:
    """`tether debug -- /path/to/venv/bin/python app.py`: the program gets that environment's
    modules (as plain `python` would), with the worker's debugpy made available to it only."""
    python = _venv(tmp_path)
    run = Run(
        tmp_path,
        "import sys, userlib\nprint('PREFIX', sys.prefix, userlib.VALUE)\n"
        "try:\n    import trio\nexcept ImportError:\n    print('NO TRIO')\n",
    )
    async with start_debuggee(
        [str(python), "prog.py"], cwd=str(run.dir), env=run.env, log_path=str(run.log)
    ) as debuggee:
        async with client(debuggee) as ide:
            await configure(ide)
            await ide.wait_event("terminated")
        assert await debuggee.wait() == 0
    log = run.log.read_text()
    assert f"PREFIX {python.parent.parent} 42" in log, log
    assert "NO TRIO" in log  # nothing else of the worker's is visible to the program
    assert run.leftovers() == []


def _other_cpython() -> str | None:
    """A CPython of another minor version on this machine, if there is one (pyenv's, say)."""
    import shutil
    import subprocess

    here = f"{sys.version_info[0]}.{sys.version_info[1]}"
    candidates = [shutil.which(f"python{minor}") for minor in ("3.13", "3.12", "3.10")]
    candidates += sorted(str(p) for p in Path.home().glob(".pyenv/versions/3.1[023]*/bin/python3"))
    for found in filter(None, candidates):
        if here in found:
            continue
        try:  # a pyenv shim exists for versions that are not selected: it must really run
            probe = subprocess.run([found, "-c", "import sys; print(sys.version_info[1])"],
                                   capture_output=True, text=True, timeout=30, check=False)  # fmt: skip
        except OSError:
            continue
        if probe.returncode == 0 and probe.stdout.strip() != str(sys.version_info[1]):
            return found
    return None


@pytest.mark.skipif(_other_cpython() is None, reason="no other CPython >= 3.10 on this machine")
async def test_a_breakpoint_is_hit_on_another_cpython_version(tmp_path: Path) -> None:
    python = _other_cpython()
    assert python is not None
    run = Run(tmp_path)
    async with start_debuggee(
        [python, "prog.py"], cwd=str(run.dir), env=run.env, log_path=str(run.log)
    ) as debuggee:
        async with client(debuggee) as ide:
            (bp,) = await configure(ide, breakpoints=[RETURN_LINE])
            assert bp["verified"]
            stopped = await ide.wait_event("stopped")
            frames = await ide.request("stackTrace", {"threadId": stopped["body"]["threadId"]})
            top = frames["body"]["stackFrames"][0]
            assert await evaluate(ide, top["id"], "total") == "6"
            await ide.request("continue", {"threadId": stopped["body"]["threadId"]})
            await ide.wait_event("terminated")
    assert "result 6" in run.log.read_text()


async def test_an_interpreter_too_old_for_debugpy_is_refused_with_the_reason(
    tmp_path: Path,
) -> None:
    old = tmp_path / "python3.9"
    old.write_text("#!/bin/sh\necho cpython 3 9 18\n")
    old.chmod(0o755)
    with pytest.raises(
        ValueError, match=r"is cpython 3\.9\.18; the debugger .* needs CPython 3\.10"
    ):
        await check_python(str(old), env=dict(os.environ), cwd=str(tmp_path))
    run = Run(tmp_path)
    with pytest.raises(ValueError, match=r"needs CPython 3\.10 or newer"):
        async with start_debuggee(
            [str(old), "prog.py"], cwd=str(run.dir), env=run.env, log_path=str(run.log)
        ):
            pass


def test_the_interpreter_is_found_as_the_run_finds_it(tmp_path: Path) -> None:
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    mine = bin_dir / "python3.12"
    mine.write_text("#!/bin/sh\n")
    mine.chmod(0o755)
    env = {"PATH": str(bin_dir)}
    assert resolve_python("python3.12", env=env, cwd=str(tmp_path)) == str(mine)
    assert resolve_python("bin/python3.12", env=env, cwd=str(tmp_path)) == str(mine)
    assert resolve_python("python", env=env, cwd=str(tmp_path)) == sys.executable  # the worker's
    with pytest.raises(ValueError, match=r"no interpreter named 'python3\.7' on the worker's PATH"):
        resolve_python("python3.7", env=env, cwd=str(tmp_path))
    with pytest.raises(ValueError, match="no interpreter at 'venv/bin/python'"):
        resolve_python("venv/bin/python", env=env, cwd=str(tmp_path))
