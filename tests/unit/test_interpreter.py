"""The environment a command runs in, decided at submit, and the files it names, checked against
the snapshot (``adapter/cli/interpreter.py``)."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from adapter.cli.interpreter import check_targets, pin_environment, tree_holds
from adapter.snapshots.snapshot import build_snapshot


def _env(root: Path, *, conda: bool = False) -> Path:
    """A Python environment at ``root`` (what makes one: pyvenv.cfg or conda-meta, and bin/)."""
    (root / "bin").mkdir(parents=True)
    if conda:
        (root / "conda-meta").mkdir()
    else:
        (root / "pyvenv.cfg").write_text("home = /usr/bin\n")
    for name in ("python", "torchrun"):
        exe = root / "bin" / name
        exe.write_text("#!/bin/sh\n")
        exe.chmod(0o755)
    return root


def test_a_relative_path_into_the_projects_venv_is_named_by_its_absolute_path(
    tmp_path: Path,
) -> None:
    _env(tmp_path / ".venv")
    pinned = pin_environment([".venv/bin/python", "train.py"], tmp_path, {})
    assert pinned.command == [str(tmp_path / ".venv/bin/python"), "train.py"]
    assert "the worker must see" in pinned.note and "--no-local-env" in pinned.note


def test_a_missing_interpreter_path_is_refused_at_submit(tmp_path: Path) -> None:
    with pytest.raises(ValueError, match=r"no interpreter at '\.venv/bin/python' in "):
        pin_environment([".venv/bin/python", "train.py"], tmp_path, {})


def test_a_bare_python_is_the_active_venvs(tmp_path: Path) -> None:
    venv = _env(tmp_path / "envs" / "proj")
    env = {"VIRTUAL_ENV": str(venv), "PATH": f"{venv}/bin{os.pathsep}/usr/bin"}
    pinned = pin_environment(["python", "-u", "train.py"], tmp_path, env)
    assert pinned.command == [str(venv / "bin/python"), "-u", "train.py"]
    assert "your active venv" in pinned.note
    # a launcher the environment provides, too (torchrun, accelerate)
    assert pin_environment(["torchrun", "x.py"], tmp_path, env).command[0] == str(
        venv / "bin/torchrun"
    )


def test_a_bare_python_is_the_active_conda_environments(tmp_path: Path) -> None:
    conda = _env(tmp_path / "conda", conda=True)
    env = {"CONDA_PREFIX": str(conda), "PATH": f"{conda}/bin"}
    pinned = pin_environment(["python", "train.py"], tmp_path, env)
    assert pinned.command[0] == str(conda / "bin/python")
    assert "conda environment" in pinned.note


def test_a_name_the_active_environment_does_not_provide_is_the_workers(tmp_path: Path) -> None:
    venv = _env(tmp_path / "venv-elsewhere")
    other = tmp_path / "other-bin"
    other.mkdir()
    (other / "srun").write_text("#!/bin/sh\n")
    (other / "srun").chmod(0o755)
    env = {"VIRTUAL_ENV": str(venv), "PATH": f"{other}{os.pathsep}{venv}/bin"}
    assert pin_environment(["srun", "x"], tmp_path, env).command == ["srun", "x"]


def test_with_no_active_environment_a_project_venv_gets_a_word(tmp_path: Path) -> None:
    _env(tmp_path / ".venv")
    pinned = pin_environment(["python", "train.py"], tmp_path, {"PATH": "/usr/bin"})
    assert pinned.command == ["python", "train.py"]  # the worker's, as written
    assert ".venv/bin/python" in pinned.note and "activate it" in pinned.note
    assert pin_environment(["python", "train.py"], tmp_path / ".venv", {}).note == ""


def test_absolute_paths_and_project_scripts_stay_as_written(tmp_path: Path) -> None:
    assert pin_environment(["/opt/py/bin/python", "x.py"], tmp_path, {}).command[0] == (
        "/opt/py/bin/python"
    )
    (tmp_path / "launch.sh").write_text("#!/bin/sh\n")
    assert pin_environment(["./launch.sh"], tmp_path, {}).command == ["./launch.sh"]


def test_a_script_the_snapshot_lacks_is_refused_at_submit(tmp_path: Path) -> None:
    (tmp_path / "train.py").write_text("print(1)\n")
    (tmp_path / "pkg").mkdir()
    (tmp_path / "pkg" / "run.py").write_text("print(2)\n")
    (tmp_path / "out").mkdir()
    (tmp_path / "out" / "gen.py").write_text("print(3)\n")
    (tmp_path / ".tetherignore").write_text("out/\n")
    snapshot = build_snapshot(tmp_path)

    def holds(rel: str) -> bool:
        return tree_holds(snapshot.trees, rel)

    assert holds("train.py") and holds("pkg/run.py") and not holds("pkg/none.py")
    check_targets(["python", "-u", "train.py", "--lr", "1"], tmp_path, holds)
    check_targets(["python", "pkg/run.py"], tmp_path, holds)
    check_targets(["train.py"], tmp_path, holds)
    check_targets(["python", "-m", "pkg.nothing"], tmp_path, holds)  # a module: the worker's
    check_targets(["python", "/elsewhere/x.py"], tmp_path, holds)  # outside: the worker's
    check_targets(["python", "train_{lr}.py"], tmp_path, holds)  # a sweep's template
    with pytest.raises(ValueError, match=r"can't open file 'nofile\.py': no such file in "):
        check_targets(["python", "nofile.py"], tmp_path, holds)
    with pytest.raises(ValueError, match=r"out/gen\.py is left out of the snapshot"):
        check_targets(["python", "out/gen.py"], tmp_path, holds)
    with pytest.raises(ValueError, match=r"can't open file './go\.sh'"):
        check_targets(["./go.sh"], tmp_path, holds)
