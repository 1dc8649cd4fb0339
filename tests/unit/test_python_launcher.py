"""Launchers in debug mode: a console script (``torchrun``, ``accelerate``) is a Python script with a
``#!`` line, run as ``interpreter script``; any other program (a shell script, a binary) runs under
tether's launcher, which debugs the Python processes it starts; a missing one is named."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

from worker_shim.program.python_command import (
    BOOT,
    LAUNCH,
    SITECUSTOMIZE,
    boot_dir,
    build_launch_argv,
    is_launcher,
    python_launcher,
)


def _script(where: Path, name: str, text: str) -> Path:
    path = where / name
    path.write_text(text)
    path.chmod(0o755)
    return path


def test_what_counts_as_a_launcher() -> None:
    assert is_launcher("torchrun") and is_launcher("./launch-ranks") and is_launcher("deepspeed")
    assert not is_launcher("python3.11") and not is_launcher("train.py") and not is_launcher("")


def test_a_console_script_on_the_path_runs_on_its_interpreter(tmp_path: Path) -> None:
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    torchrun = _script(bin_dir, "torchrun", f"#!{sys.executable}\nimport sys\n")
    env = {"PATH": str(bin_dir)}
    assert python_launcher("torchrun", env=env, cwd=str(tmp_path)) == [
        sys.executable,
        str(torchrun),
    ]


def test_env_and_pips_long_path_shebangs(tmp_path: Path) -> None:
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    python = _script(bin_dir, "python3", "#!/bin/sh\n")
    env = {"PATH": str(bin_dir)}
    _script(tmp_path, "via-env", "#!/usr/bin/env -S python3\n")
    assert python_launcher("./via-env", env=env, cwd=str(tmp_path)) == [
        str(python),
        str(tmp_path / "./via-env"),
    ]
    long_python = "/opt/a path with spaces/bin/python3.11"
    _script(tmp_path, "accelerate", f"#!/bin/sh\n'''exec' \"{long_python}\" \"$0\" \"$@\"\n' '''\n")
    assert python_launcher("./accelerate", env=env, cwd=str(tmp_path)) == [
        long_python,
        str(tmp_path / "./accelerate"),
    ]


@pytest.mark.parametrize(
    ("name", "text"),
    [("run.sh", "#!/bin/bash\npython train.py\n"), ("tool", "\x7fELF binary"), ("plain", "")],
)
def test_any_other_program_is_not_a_python_launcher(tmp_path: Path, name: str, text: str) -> None:
    _script(tmp_path, name, text)
    assert python_launcher(f"./{name}", env={"PATH": ""}, cwd=str(tmp_path)) is None


def test_a_program_that_is_not_python_runs_under_the_launcher_with_children_debugged(
    tmp_path: Path,
) -> None:
    boot = boot_dir(tmp_path)
    assert [p.name for p in boot.iterdir()] == ["sitecustomize.py"]
    assert (boot / "sitecustomize.py").resolve() == SITECUSTOMIZE
    assert boot_dir(tmp_path) == boot  # a second call finds it made
    argv = build_launch_argv(["./train.sh", "--lr", "3"], boot_dir=str(boot), home="/h")
    assert argv[0] == sys.executable and str(BOOT) in argv
    assert argv[argv.index("--configure-subProcess") + 1] == "true"
    assert argv[-6:] == [str(LAUNCH), str(boot), "--", "./train.sh", "--lr", "3"]


def test_a_missing_launcher_is_named(tmp_path: Path) -> None:
    with pytest.raises(ValueError, match="no program 'torchrun' on the worker"):
        python_launcher("torchrun", env={"PATH": str(tmp_path)}, cwd=str(tmp_path))
