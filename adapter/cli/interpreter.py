"""Which Python environment a run's command runs in, decided at submit, where the environment the
user works in is known; and the files the command names, checked against the snapshot before the
run queues.

A project's virtual environment never travels in its snapshot (``.venv`` is left out, and its
``bin/python`` is a link out of the tree), and the worker cannot know which environment the user
had activated. So the command is made to name the user's environment by its path, as their shell
would run it (docs/runs.md, "Your environment on the worker"):

- a program named by a relative path inside a Python environment (``.venv/bin/python``,
  ``env/bin/torchrun``) is named by its absolute path;
- a bare name (``python``, ``torchrun``) that the active environment (``$VIRTUAL_ENV``,
  ``$CONDA_PREFIX``) provides is named by its absolute path there;
- anything else is found on the worker, as before, and a bare ``python`` with an environment in the
  project that is not active gets a word on how to use it.

The worker must see that path: on this machine's pool it does, on a cluster it does where home
directories are shared (as Slurm users expect). ``--no-local-env`` leaves the command as written.
Links are not followed: a venv's ``bin/python`` links to the base interpreter, and only the link's
own path makes Python use the venv (``pyvenv.cfg`` beside its ``bin``).
"""

from __future__ import annotations

import os
import shutil
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path, PurePath

from protocol_specs.snapshots.trees import Trees, decode_tree
from worker_shim.program.python_command import is_python, split_python_command

__all__ = ["Pinned", "check_targets", "env_root", "pin_environment", "tree_holds"]

#: the folders of a project where an environment usually lives, for the word about one not active
_PROJECT_ENVS = (".venv", "venv", "env", ".env")


@dataclass(frozen=True)
class Pinned:
    """The command as the run gets it, and what to tell the user at submit ("": nothing)."""

    command: list[str]
    note: str = ""


def env_root(program: Path) -> Path | None:
    """The Python environment ``program`` belongs to (``<env>/bin/<program>``, a venv's
    ``pyvenv.cfg`` or a conda env's ``conda-meta``), or ``None``."""
    root = Path(os.path.abspath(program)).parent.parent
    if (root / "pyvenv.cfg").is_file() or (root / "conda-meta").is_dir():
        return root
    return None


def pin_environment(command: list[str], workdir: Path, env: Mapping[str, str]) -> Pinned:
    """``command`` naming the user's environment by its path (the module's rules); ``env``: the
    submitting shell's environment. ``ValueError`` for an interpreter path that is not there."""
    program, rest = command[0], command[1:]
    if os.sep in program or (os.altsep and os.altsep in program):
        local = Path(os.path.abspath(workdir / program))
        if PurePath(program).is_absolute():
            return Pinned(command)
        if not local.exists():
            if is_python(program):
                raise ValueError(f"no interpreter at {program!r} in {workdir}")
            return Pinned(command)  # a script of the project: checked against the snapshot
        root = env_root(local)
        if root is None:
            return Pinned(command)
        return Pinned([str(local), *rest], _said(program, local, f"the environment {root}"))
    active = [env.get("VIRTUAL_ENV", ""), env.get("CONDA_PREFIX", "")]
    found = shutil.which(program, path=env.get("PATH", ""))
    for root_text in filter(None, active):
        root = Path(root_text)
        if found is not None and Path(os.path.abspath(found)).is_relative_to(root):
            pinned = os.path.abspath(found)
            kind = "venv" if env.get("VIRTUAL_ENV") == root_text else "conda environment"
            return Pinned([pinned, *rest], _said(program, Path(pinned), f"your active {kind}"))
    if is_python(program) and not any(active):
        for name in _PROJECT_ENVS:
            python = workdir / name / "bin" / "python"
            if python.exists() and env_root(python) is not None:
                return Pinned(
                    command,
                    f"note: {program} is the worker's {program}, not {name}/bin/python (the "
                    f"project's environment, which no snapshot carries): to run on it, name it "
                    f"(tether run -- {name}/bin/python ...) or activate it before you submit",
                )
    return Pinned(command)


def _said(program: str, path: Path, what: str) -> str:
    return (
        f"{program} is {path} ({what}): the run uses it by that path, which the worker must see "
        "(this machine, or a filesystem it shares); --no-local-env leaves the command as written"
    )


def check_targets(command: list[str], workdir: Path, holds: Callable[[str], bool]) -> None:
    """``ValueError`` for a file the command runs that the run will not have: a Python script
    (``python train.py``, ``train.py``) or a program of the project (``./launch.sh``) the snapshot
    of ``workdir`` does not hold (``holds(relative path)``). Known at submit, said at submit, not
    after the queue by the worker's ``python``."""
    program = command[0]
    named: str | None = None
    if is_python(program) or program.endswith(".py"):
        try:
            _options, target = split_python_command(command)
        except ValueError:
            return  # run as written (tether run): the interpreter says what it makes of it
        if not target[0].startswith("-"):
            named = target[0]
    elif os.sep in program or (os.altsep and os.altsep in program):
        named = program
    if named is None or "{" in named:  # a sweep's template: its trials are checked as runs
        return
    local = Path(os.path.abspath(workdir / named))
    if not local.is_relative_to(workdir):
        return  # outside the project: the worker's (a shared filesystem, say)
    rel = local.relative_to(workdir).as_posix()
    if holds(rel):
        return
    if local.exists():
        raise ValueError(
            f"{named} is left out of the snapshot of {workdir} (by .gitignore, .tetherignore, or "
            "as a cache), so the run would not have it"
        )
    raise ValueError(f"can't open file {named!r}: no such file in {workdir}")


def tree_holds(trees: Trees, rel: str) -> bool:
    """Whether a snapshot's trees have a file or symlink at ``rel`` (a relative POSIX path)."""
    digest = trees.root
    *parents, leaf = rel.split("/")
    for name in parents:
        row = next((r for r in decode_tree(trees.blobs[digest]) if r[0] == name), None)
        if row is None or row[1] != "d":
            return False
        digest = row[4]
    return any(r[0] == leaf and r[1] in "fl" for r in decode_tree(trees.blobs[digest]))
