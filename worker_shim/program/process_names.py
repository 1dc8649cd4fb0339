"""What a debugged process is called: what the kernel says of it (``/proc``), its command line as
its user wrote it, and the program it runs.

A debugged Python process's real command line carries the debugger: tether's boot script and
debugpy's options for the main process (``python -X frozen_modules=off _tether_debugpy_boot.py
--listen 127.0.0.1:0 ... train.py``), ``pydevd.py --port N --access-token T ... --file child.py``
or a ``-c`` prefix that calls ``pydevd.settrace(..., access_token=T)`` for a child debugpy patched.
None of that is the user's, and the access tokens are credentials of debugpy's adapter: what is
published (:class:`~protocol_specs.session.processes.ProcessInfo`) is :func:`user_command`, the command
without the debugger, and never a token (a ``-c`` whose code cannot be told apart is left out).

:func:`program_of` names what a process runs (``train.py``, ``pkg.train``, ``python -c``), or
nothing for a worker of its parent (a multiprocessing or DataLoader worker, a fork): such a process
is called after its parent (``worker 2 of rank 0``).
"""

from __future__ import annotations

import os
import shlex
from dataclasses import dataclass, field
from pathlib import PurePath

from protocol_specs.session.processes import ProcessInfo, node_main, process_key

__all__ = ["ProcFacts", "describe", "program_of", "read_proc", "user_command"]

#: the longest command line kept in a ProcessInfo (its field's limit)
_COMMAND_MAX = 512

#: options of debugpy's command line (and tether's boot script) that take a value
_DEBUGPY_VALUED = frozenset(
    {"--listen", "--connect", "--log-to", "--pid", "--adapter-access-token",
     "--parent-session-pid", "--tether-debugpy", "--tether-attach"}
)  # fmt: skip
_DEBUGGER_SCRIPTS = frozenset({"_tether_debugpy_boot.py", "debugpy", "__main__.py"})
_LAUNCH = "_tether_launch.py"
#: what a ``-c`` that pydevd patched holds before the user's code, and the call it ends with
_PREFIX, _IMPORT, _SETTRACE = "import sys; ", "import pydevd;", "pydevd.settrace("
_SECRETS = ("access_token", "access-token")


@dataclass(frozen=True)
class ProcFacts:
    """What the kernel says of a process (empty when it cannot be read: gone, not Linux)."""

    environ: dict[str, str] = field(default_factory=dict)
    cmdline: list[str] = field(default_factory=list)
    ppid: int | None = None


def read_proc(pid: int, root: str = "/proc") -> ProcFacts:
    """``/proc/<pid>/environ``, ``cmdline`` and the parent pid from ``stat``; what cannot be read
    is left empty (a child may be gone already)."""
    base = os.path.join(root, str(pid))
    environ: dict[str, str] = {}
    cmdline: list[str] = []
    ppid = None
    try:
        with open(os.path.join(base, "environ"), "rb") as f:
            for item in f.read().split(b"\0"):
                name, eq, value = item.partition(b"=")
                if eq:
                    environ[name.decode(errors="replace")] = value.decode(errors="replace")
    except OSError:
        pass
    try:
        with open(os.path.join(base, "cmdline"), "rb") as f:
            cmdline = [a.decode(errors="replace") for a in f.read().split(b"\0")[:-1]]
    except OSError:
        pass
    try:
        with open(os.path.join(base, "stat"), "rb") as f:
            # "pid (comm) state ppid ...": comm may hold spaces and parentheses
            ppid = int(f.read().rpartition(b")")[2].split()[1])
    except (OSError, ValueError, IndexError):
        pass
    return ProcFacts(environ, cmdline, ppid)


def describe(
    pid: int,
    facts: ProcFacts,
    *,
    parent: str,
    nth: int,
    host: str,
    key: str | None = None,
    parent_cmdline: list[str] | None = None,
    command: list[str] | None = None,
    node: int = 0,
) -> ProcessInfo:
    """A process's :class:`ProcessInfo` from what the kernel says of it. ``parent_cmdline``: the
    parent's real command line (a child with the same one is a fork: a worker of its parent);
    ``command``: the command line to show, when known better than ``/proc`` (the main process's,
    as submitted); ``node``: the node of a run that spans nodes it runs on."""
    shown = user_command(facts.cmdline) if command is None else list(command)
    forked = bool(facts.cmdline) and facts.cmdline == parent_cmdline
    return ProcessInfo(
        key=process_key(pid, node) if key is None else key,
        pid=pid,
        parent=parent,
        host=host,
        rank=_int(facts.environ.get("RANK")),
        local_rank=_int(facts.environ.get("LOCAL_RANK")),
        world_size=_int(facts.environ.get("WORLD_SIZE")),
        nth=nth,
        command=_shorten(shlex.join(shown)),
        program="" if forked or key == node_main(node) else program_of(shown),
        node=node,
    )


def user_command(argv: list[str]) -> list[str]:
    """``argv`` without what debugpy, pydevd or tether put in to debug the process: the command
    its user (or the program that started it) wrote. Never holds an access token."""
    if not argv:
        return []
    python, rest = argv[0], argv[1:]
    opts: list[str] = []
    i = 0
    while i < len(rest) and rest[i].startswith("-") and rest[i] != "-":
        arg = rest[i]
        if arg in ("-c", "-m"):
            if i + 1 >= len(rest):
                break
            if arg == "-m" and rest[i + 1] == "debugpy":
                return _debugged(python, opts, rest[i + 2 :])
            value = _user_code(rest[i + 1]) if arg == "-c" else rest[i + 1]
            return _safe([python, *opts, arg, value, *rest[i + 2 :]])
        if arg in ("-X", "-W") and i + 1 < len(rest):
            if rest[i + 1] != "frozen_modules=off":  # tether's, for debugpy
                opts += [arg, rest[i + 1]]
            i += 2
            continue
        opts.append(arg)
        i += 1
    script, args = (rest[i], rest[i + 1 :]) if i < len(rest) else ("", [])
    name = PurePath(script).name
    if name == "pydevd.py":
        return _safe([python, *opts, *_pydevd_target(args)])
    if name in _DEBUGGER_SCRIPTS and (name != "__main__.py" or "debugpy" in script):
        return _debugged(python, opts, args)
    return _safe(argv)


def _debugged(python: str, opts: list[str], args: list[str]) -> list[str]:
    """The command debugpy's command line (or tether's boot script) runs, from the arguments
    after it: its own options first, then the target; for tether's launcher of a non-Python
    command, that command."""
    i = 0
    while i < len(args) and args[i].startswith("--"):
        i += 2 if args[i] in _DEBUGPY_VALUED or args[i].startswith("--configure-") else 1
    target = args[i:]
    if target and PurePath(target[0]).name == _LAUNCH and "--" in target:
        return _safe(target[target.index("--") + 1 :])  # [launcher, boot dir, --, command...]
    if target[:1] == ["-c"] and len(target) > 1:
        target = ["-c", _user_code(target[1]), *target[2:]]
    return _safe([python, *opts, *target])


def _pydevd_target(args: list[str]) -> list[str]:
    """``pydevd.py [options] --file TARGET args`` (``--module``: TARGET is a module)."""
    if "--file" not in args:
        return []
    at = args.index("--file")
    target = args[at + 1 :]
    return ["-m", *target] if "--module" in args[:at] and target else target


def _user_code(code: str) -> str:
    """The code of a ``-c`` that pydevd patched, without its prefix (kept: ``__future__``
    imports before it); ``...`` when the prefix cannot be told apart from the user's code."""
    start = code.find(_PREFIX)
    call = code.find(_SETTRACE, start)
    if start < 0 or call < 0 or not 0 <= code.find(_IMPORT, start) < call:
        return code
    end = _closing(code, call + len(_SETTRACE))
    if end is None:
        return "..."
    rest = code[end + 1 :].lstrip()
    return code[:start] + (rest[1:].lstrip() if rest.startswith(";") else rest)


def _closing(code: str, i: int) -> int | None:
    """The index of the ``)`` closing the call whose arguments start at ``i`` (Python literals:
    strings in either quote, with backslash escapes; nested brackets)."""
    depth, quote = 1, ""
    while i < len(code):
        c = code[i]
        if quote:
            if c == "\\":
                i += 1
            elif c == quote:
                quote = ""
        elif c in "'\"":
            quote = c
        elif c in "([{":
            depth += 1
        elif c in ")]}":
            depth -= 1
            if depth == 0:
                return i
        i += 1
    return None


def _safe(argv: list[str]) -> list[str]:
    """``argv``, or its first word only when anything in it still names an access token."""
    if any(secret in arg for arg in argv for secret in _SECRETS):
        return [*argv[:1], "..."]
    return argv


def program_of(argv: list[str]) -> str:
    """What a process runs, from its :func:`user_command`: the script's file name, the module,
    ``python -c`` (or a non-Python command's first word); ``""`` for a multiprocessing worker (its
    name comes from its parent)."""
    if "--multiprocessing-fork" in argv:
        return ""
    rest = argv[1:]
    i = 0
    while i < len(rest) and rest[i].startswith("-") and rest[i] != "-":
        if rest[i] == "-m" and i + 1 < len(rest):
            return rest[i + 1]
        if rest[i] == "-c":
            code = rest[i + 1] if i + 1 < len(rest) else ""
            worker = "spawn_main" in code or "forkserver" in code
            return "" if worker else "python -c"
        i += 2 if rest[i] in ("-X", "-W") else 1
    if i < len(rest):
        return PurePath(rest[i]).name
    return PurePath(argv[0]).name if argv else ""


def _int(value: str | None) -> int | None:
    try:
        return int(value) if value is not None else None
    except ValueError:
        return None


def _shorten(text: str) -> str:
    return text if len(text) <= _COMMAND_MAX else text[: _COMMAND_MAX - 3] + "..."
