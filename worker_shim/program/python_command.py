"""The user's Python command in debug mode: which interpreter runs it, whether that interpreter can
run debugpy, the command split into Python's options and the target, and the argv that starts it
held under debugpy (``build_debug_argv``).

The run's command is the user's (``python -u -m pkg.train --lr 3e-4``, ``.venv/bin/python x.py``,
``x.py``); debug mode keeps their interpreter and their options and puts debugpy between the
options and the target. A console script (``torchrun``) is run as ``interpreter script``
(:func:`python_launcher`); any other program (a shell script, ``srun``) runs under tether's
launcher, whose Python descendants are debugged as its children (:func:`build_launch_argv`). What
cannot be debugged is refused here, at submit time where the CLI checks the command and again on
the worker, with a sentence that says why.
"""

from __future__ import annotations

import os
import re
import shutil
import sys
from pathlib import Path, PurePath

import trio

from protocol_specs.session.processes import COLLECTIVE_TIMEOUT_ENV, COLLECTIVE_TIMEOUT_FLOOR

from ..inject import SCRIPTS
from .identity import UNREACHABLE_HINT, ProgramUser, Runtime, search_path, spawn_options

__all__ = [
    "ADAPTER",
    "BOOT",
    "LAUNCH",
    "MIN_PYTHON",
    "NOT_WITH_MAIN_ONLY",
    "SITECUSTOMIZE",
    "boot_dir",
    "build_attachable_argv",
    "build_debug_argv",
    "build_launch_argv",
    "check_python",
    "debugged_children_env",
    "debugpy_home",
    "is_launcher",
    "is_python",
    "python_launcher",
    "resolve_python",
    "split_python_command",
]

#: debugpy's command line with pydevd's socket made TCP_NODELAY
BOOT = SCRIPTS / "_tether_debugpy_boot.py"
#: the main process of a command that is not Python (:func:`build_launch_argv`)
LAUNCH = BOOT.with_name("_tether_launch.py")
#: what every Python process a non-Python command starts imports first (as ``sitecustomize``)
SITECUSTOMIZE = BOOT.with_name("_tether_sitecustomize.py")

_USAGE = (
    "debug mode needs a Python command: python [options] script.py|-m module|-c code [args], "
    "or script.py [args]"
)
_PYTHON_NAME = re.compile(r"python(3(\.\d+)?)?")
_FLAGS = frozenset("bBdEiIOPqsuv")  # CPython's short options without a value that can be kept
_REFUSED = {
    "S": "python -S cannot be debugged: it hides site-packages, where debugpy is installed",
    "x": "python -x cannot be debugged: debugpy, not the interpreter, reads the script",
    "h": "python -h runs no program",
    "?": "python -? runs no program",
    "V": "python -V runs no program",
}


def is_python(program: str) -> bool:
    return _PYTHON_NAME.fullmatch(PurePath(program).name) is not None or program == sys.executable


def is_launcher(program: str) -> bool:
    """A program named neither ``python*`` nor ``*.py``: maybe a launcher such as ``torchrun``,
    ``accelerate`` or ``deepspeed``, a Python script installed as a command. Only the worker can
    tell (:func:`python_launcher`): the command is found on the run's ``PATH`` there."""
    return bool(program) and not is_python(program) and not program.endswith(".py")


#: pip's first lines for an interpreter path that is too long or has spaces:
#: ``#!/bin/sh`` then ``'''exec' "/long path/python" "$0" "$@"``
_PIP_SH_EXEC = re.compile(r"^'''exec' \"([^\"]+)\"")


def python_launcher(
    program: str, *, env: dict[str, str], cwd: str, user: ProgramUser | None = None
) -> list[str] | None:
    """``[interpreter, script]`` for a command that is a Python script with a ``#!`` line (how pip
    installs ``torchrun`` and every other console script); ``None`` for any other program (a shell
    script, a binary: run under :data:`LAUNCH`); ``ValueError`` says why it cannot be run at all.

    Run as ``interpreter script``, a console script is a Python command like any other: debugpy
    starts the launcher, and the launcher's children (the ranks) are debugged as its subprocesses.
    """
    path = search_path(env, user)
    if os.sep in program or (os.altsep and os.altsep in program):
        found: str | None = str(Path(cwd, program))
    else:
        found = shutil.which(program, path=path)
    if found is None or not os.path.isfile(found):
        raise ValueError(f"no program {program!r} on the worker (its PATH, or the run directory)")
    if user is not None and not user.can_read(found):
        raise ValueError(
            f"the run's user (uid {user.uid}) may not read {found}: {UNREACHABLE_HINT}"
        )
    try:
        with open(found, "rb") as f:
            head = f.read(1024)
    except OSError as exc:
        raise ValueError(f"cannot read {found}: {exc.strerror}") from None
    lines = head.decode(errors="replace").split("\n")
    words = lines[0][2:].split() if lines[0].startswith("#!") else []
    if words and PurePath(words[0]).name == "env":
        names = [w for w in words[1:] if not w.startswith("-")]
        words = [shutil.which(names[0], path=path) or names[0]] if names else []
    if words and PurePath(words[0]).name == "sh" and len(lines) > 1:
        pip_exec = _PIP_SH_EXEC.match(lines[1])
        if pip_exec:
            words = [pip_exec.group(1)]
    if words and is_python(words[0]):
        return [words[0], found]
    return None


#: the oldest CPython the debugpy tether installs runs on (its ``Requires-Python``)
MIN_PYTHON = (3, 10)


def resolve_python(
    program: str, *, env: dict[str, str], cwd: str, user: ProgramUser | None = None
) -> str:
    """The interpreter a command names, as the run's environment finds it: a path (relative to the
    run directory), or a name looked up on the run's ``PATH``. A bare ``python``/``python3`` that
    is not on that ``PATH`` is the worker's own interpreter; any other name must be found.
    ``user``: the program runs as that uid, so what it cannot run is not found, and a bare
    ``python`` is the ``PATH``'s ``python3`` before the worker's own interpreter (which may be in
    a directory of the worker's only)."""
    runnable = os.X_OK
    if os.sep in program or (os.altsep and os.altsep in program):
        path = Path(cwd, program)
        if not (path.is_file() and os.access(path, runnable)):
            if PurePath(program).is_absolute():  # the submitter's environment, named by its path
                raise ValueError(
                    f"no interpreter at {program} on the worker: the run names it by its path on "
                    "the machine it was submitted from, which the worker must see too (the same "
                    "machine, or a shared filesystem); submit with --no-local-env to use the "
                    "worker's, or name an interpreter the worker has"
                )
            raise ValueError(f"no interpreter at {program!r} on the worker (relative to the run)")
        if user is not None and not user.can_run(path):
            raise ValueError(
                f"the run's user (uid {user.uid}) may not run {program!r}: {UNREACHABLE_HINT}"
            )
        return str(path)
    search = search_path(env, user)
    # a uid of its own may not run the worker's interpreter: a bare python is then its python3
    names = [program, "python3"] if program == "python" and user is not None else [program]
    for name in names:
        found = shutil.which(name, path=search)
        if found is not None and (user is None or user.can_run(found)):
            return found
    if program in ("python", "python3"):
        if user is None or user.can_run(sys.executable):
            return sys.executable
        raise ValueError(
            f"no {program} on the run's PATH that its user (uid {user.uid}) may run, nor the "
            f"worker's own ({sys.executable}): {UNREACHABLE_HINT}"
        )
    raise ValueError(f"no interpreter named {program!r} on the worker's PATH")


#: interpreters already found fit for debugpy: (path, size, mtime) of their executable
_FIT: set[tuple[str, int, int, int]] = set()


async def check_python(
    python: str, *, env: dict[str, str], cwd: str, user: ProgramUser | None = None
) -> None:
    """Raise ``ValueError`` saying why ``python`` cannot run debugpy (not CPython, or too old);
    asked as ``user`` (the program's uid). An interpreter found fit is not asked again (while its
    executable is unchanged)."""
    key = _identity(python, user)
    if key in _FIT:
        return
    probe = "import sys; print(sys.implementation.name, *sys.version_info[:3])"
    try:
        with trio.fail_after(30):
            done = await trio.run_process(
                [python, "-c", probe], env=env, cwd=cwd, capture_stdout=True, capture_stderr=True,
                check=False, **spawn_options(user),
            )  # fmt: skip
    except (OSError, trio.TooSlowError) as exc:
        raise ValueError(f"cannot run the interpreter {python}: {exc}") from None
    words = done.stdout.decode(errors="replace").split()
    if done.returncode != 0 or len(words) != 4 or not all(w.isdigit() for w in words[1:]):
        said = done.stderr.decode(errors="replace").strip().splitlines()[:1]
        raise ValueError(
            f"{python} did not run as a Python interpreter (exit {done.returncode}"
            f"{': ' + said[0][:200] if said else ''})"
        )
    name, version = words[0], tuple(int(w) for w in words[1:])
    wanted = ".".join(map(str, MIN_PYTHON))
    if name != "cpython" or version[:2] < MIN_PYTHON:
        raise ValueError(
            f"{python} is {name} {'.'.join(map(str, version))}; the debugger (debugpy "
            f"{_debugpy_version()}) needs CPython {wanted} or newer. Run the program with a newer "
            "interpreter, or without the debugger (tether run)"
        )
    if key is not None:
        _FIT.add(key)


def _identity(python: str, user: ProgramUser | None) -> tuple[str, int, int, int] | None:
    try:
        st = os.stat(python)
    except OSError:
        return None
    uid = -1 if user is None else user.uid
    return os.path.realpath(python), st.st_size, st.st_mtime_ns, uid


def _debugpy_version() -> str:
    import debugpy

    return str(debugpy.__version__)


#: debugpy's adapter process with TCP_NODELAY on its sockets (run as ``python DEBUGPY_HOME``)
ADAPTER = BOOT.with_name("_tether_debugpy_adapter.py")


def debugpy_home(where: Path, runtime: Runtime | None = None) -> Path:
    """A directory under ``where`` holding only the worker's ``debugpy`` package (a link): what
    the program's interpreter adds to its path to debug it, without seeing anything else the
    worker has installed. Its ``__main__.py`` (a link to :data:`ADAPTER`) is what debugpy's
    adapter process runs (``python HOME``: the boot script points debugpy there). ``runtime``:
    where those are (the worker's installed files by default)."""
    runtime = runtime or Runtime.installed()
    home = where / "debugpy-home"
    home.mkdir(mode=0o755, exist_ok=True)
    link = home / "debugpy"
    if not link.exists():
        link.symlink_to(runtime.debugpy, target_is_directory=True)
    main = home / "__main__.py"
    if not main.exists():
        main.symlink_to(runtime.script(ADAPTER.name))
    return home


def split_python_command(user_argv: list[str]) -> tuple[list[str], list[str]]:
    """``(python options, target)`` of a Python command; ``ValueError`` says why not.

    The target is ``[script, args...]``, ``["-m", module, args...]`` or ``["-c", code, args...]``.
    Short options are parsed the way CPython does (``-uOO``, ``-Xdev``, ``-um pkg``, ``-cCODE``)
    and come back one per item: ``["-u", "-O", "-O", "-X", "dev"]``.
    """
    if not user_argv:
        raise ValueError(f"{_USAGE}; got an empty command")
    program, *rest = user_argv
    if not is_python(program):
        if program.endswith(".py"):
            return [], list(user_argv)
        raise ValueError(f"{_USAGE}; got {program!r}")
    opts: list[str] = []
    i = 0
    while i < len(rest):
        arg = rest[i]
        i += 1
        if arg == "--check-hash-based-pycs":
            if i >= len(rest):
                raise ValueError(f"python {arg} needs an argument")
            opts += [arg, rest[i]]
            i += 1
            continue
        if arg == "--":
            break
        if arg == "-" or arg.startswith("--"):
            raise ValueError(f"unsupported python option {arg!r} in debug mode")
        if not arg.startswith("-"):
            return opts, rest[i - 1 :]
        for j, letter in enumerate(arg[1:], start=2):
            if letter in "cmWX":
                value = arg[j:]
                if not value:
                    if i >= len(rest):
                        raise ValueError(f"python -{letter} needs an argument")
                    value = rest[i]
                    i += 1
                if letter == "m" and value.split(".")[0] == "debugpy":
                    raise ValueError(
                        "the command already runs debugpy; tether starts debugpy itself, "
                        "give the program's own command"
                    )
                if letter in "cm":
                    return opts, [f"-{letter}", value, *rest[i:]]
                opts += [f"-{letter}", value]
                break
            if letter in _REFUSED:
                raise ValueError(_REFUSED[letter])
            if letter not in _FLAGS:
                raise ValueError(f"unsupported python option -{letter} in debug mode")
            opts.append(f"-{letter}")
    if i < len(rest) and not rest[i].startswith("-"):  # after "--"
        return opts, rest[i:]
    raise ValueError("the python command names no script, -m module or -c code")


def build_debug_argv(
    user_argv: list[str],
    *,
    python: str = sys.executable,
    fast: bool = True,
    home: str = "",
    subprocesses: bool = False,
    runtime: Runtime | None = None,
) -> list[str]:
    """The debuggee's argv: the user's Python options, debugpy held before user code, the target.

    The program runs on ``python``: the interpreter the command names, resolved by the caller
    (:func:`resolve_python`), or the worker's for a bare ``script.py``. ``fast`` runs debugpy's
    command line through ``_tether_debugpy_boot.py`` (no 40 ms stall per message), which first
    adds ``home`` (:func:`debugpy_home`) to the path; ``fast=False`` is stock ``python -m
    debugpy`` (the caller puts ``home`` on ``PYTHONPATH``). ``subprocesses``: debugpy debugs
    the program's Python children too (each announced to the shim, which configures it at once:
    :mod:`worker_shim.session.processes`); off, children run undebugged.
    """
    opts, target = split_python_command(user_argv)
    launcher = ["-m", "debugpy"]
    if fast:
        boot = runtime.script(BOOT.name) if runtime is not None else BOOT
        launcher = [str(boot), *(["--tether-debugpy", home] if home else [])]
    return [
        python,
        "-X",
        "frozen_modules=off",
        *opts,
        *launcher,
        "--listen",
        "127.0.0.1:0",
        "--wait-for-client",
        "--configure-subProcess",
        "true" if subprocesses else "false",
        *target,
    ]


def build_attachable_argv(
    user_argv: list[str],
    *,
    python: str = sys.executable,
    home: str = "",
    socket: str,
    post_mortem: bool = False,
    runtime: Runtime | None = None,
) -> list[str]:
    """The argv of a plain run that an IDE may attach to later (a debuggable run): the user's
    Python options, then the boot script, which runs the target at once and starts debugpy only
    when asked on the unix socket ``socket``, where the worker listens (``_tether_debugpy_boot.py``,
    ``--tether-attach``); ``post_mortem``: or when an uncaught exception would end the program
    (``--tether-post-mortem``).
    ``ValueError`` for a command that is not Python (:func:`split_python_command`)."""
    opts, target = split_python_command(user_argv)
    home_args = ["--tether-debugpy", home] if home else []
    return [
        python,
        "-X",
        "frozen_modules=off",
        *opts,
        str(runtime.script(BOOT.name) if runtime is not None else BOOT),
        *home_args,
        "--tether-attach",
        socket,
        *(["--tether-post-mortem"] if post_mortem else []),
        "--",
        *target,
    ]


#: why ``--processes main`` cannot debug a command that is not Python
NOT_WITH_MAIN_ONLY = (
    "{program} is not a Python program: its Python processes are its children, and "
    "--processes main debugs none of them; use --processes stopped (the default) or all"
)


def build_launch_argv(
    user_argv: list[str],
    *,
    boot_dir: str,
    fast: bool = True,
    home: str = "",
    python: str = sys.executable,
    runtime: Runtime | None = None,
) -> list[str]:
    """The argv of a debug run whose command is not Python (``./train.sh``, ``srun ...``):
    ``python`` (the worker's interpreter, or one the program's uid may run) runs :data:`LAUNCH`
    under debugpy with subprocess debugging on, which runs the command with ``boot_dir`` (holding
    ``sitecustomize.py``, a link to :data:`SITECUSTOMIZE`) first on ``PYTHONPATH``: every Python
    process the command starts is debugged as a child of the main process."""
    launch = runtime.script(LAUNCH.name) if runtime is not None else LAUNCH
    return build_debug_argv(
        [python, str(launch), boot_dir, "--", *user_argv],
        python=python,
        fast=fast,
        home=home,
        subprocesses=True,
        runtime=runtime,
    )


def boot_dir(where: Path, runtime: Runtime | None = None) -> Path:
    """A directory under ``where`` holding only ``sitecustomize.py`` (a link to
    :data:`SITECUSTOMIZE`, in ``runtime``): what :data:`LAUNCH` puts first on the command's
    ``PYTHONPATH``."""
    runtime = runtime or Runtime.installed()
    home = where / "boot"
    home.mkdir(mode=0o755, exist_ok=True)
    link = home / "sitecustomize.py"
    if not link.exists():
        link.symlink_to(runtime.script(SITECUSTOMIZE.name))
    return home


def debugged_children_env(env: dict[str, str], *, boot: str | None) -> dict[str, str]:
    """``env`` for a debug run whose children are debugged: every ``torch.distributed`` process
    group of the run gets a timeout of at least :data:`COLLECTIVE_TIMEOUT_FLOOR` from its creation
    (unless the user set ``TETHER_COLLECTIVE_TIMEOUT``, ``0`` for off), so a paused rank does not
    end the job; ``boot`` (a :func:`boot_dir`) goes first on ``PYTHONPATH``, so that every Python
    process of the run loads the ``sitecustomize`` that does it (``_tether_collectives.py``).
    ``None``: the launcher of a non-Python command puts it there itself."""
    out = {**env, COLLECTIVE_TIMEOUT_ENV: env.get(COLLECTIVE_TIMEOUT_ENV, COLLECTIVE_TIMEOUT_FLOOR)}
    if boot is not None:
        out["PYTHONPATH"] = os.pathsep.join(filter(None, [boot, env.get("PYTHONPATH")]))
    return out
