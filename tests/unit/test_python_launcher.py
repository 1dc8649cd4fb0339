"""Launchers in debug mode: a console script (``torchrun``, ``accelerate``) is a Python script with a
``#!`` line, run as ``interpreter script``; anything else is refused with a sentence."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

from worker_shim.python_command import is_launcher, python_launcher


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
    assert python_launcher("./accelerate", env=env, cwd=str(tmp_path))[0] == long_python


@pytest.mark.parametrize(
    ("name", "text", "said"),
    [
        ("run.sh", "#!/bin/bash\npython train.py\n", r"not a Python program \(it runs /bin/bash\)"),
        ("tool", "\x7fELF binary", r"not a Python program \(it is not a script\)"),
    ],
)
def test_what_is_not_python_is_refused_with_a_sentence(
    tmp_path: Path, name: str, text: str, said: str
) -> None:
    _script(tmp_path, name, text)
    with pytest.raises(ValueError, match=said):
        python_launcher(f"./{name}", env={"PATH": ""}, cwd=str(tmp_path))


def test_a_missing_launcher_is_named(tmp_path: Path) -> None:
    with pytest.raises(ValueError, match="no program 'torchrun' on the worker"):
        python_launcher("torchrun", env={"PATH": str(tmp_path)}, cwd=str(tmp_path))
