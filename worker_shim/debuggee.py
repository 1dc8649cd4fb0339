"""Starting the user's program under debugpy, held before user code, and its one connection.

The program runs as ``python -m debugpy --listen 127.0.0.1:0 --wait-for-client
--configure-subProcess false ...``: debugpy's adapter listens on an ephemeral loopback port and
nothing of the user's code runs until a client finished the configuration (``configurationDone``).
Readiness comes from ``DEBUGPY_ADAPTER_ENDPOINTS`` (a file debugpy writes once it listens), never from
a TCP probe: a bare connect-and-close leaves debugpy's adapter unable to accept anyone (debugpy #1308).

Subprocess debugging is off: debugpy blocks every child process until a client attaches to it, so a
``multiprocessing`` or DataLoader pool would hang; children run undebugged instead.

The program runs in its own session (process group), so terminating it also ends debugpy's adapter
process and any children.
"""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import tempfile
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from dataclasses import dataclass
from pathlib import Path

import trio

__all__ = [
    "Debuggee",
    "DebuggeeStartError",
    "build_debug_argv",
    "split_python_command",
    "start_debuggee",
    "start_plain",
]

READY_TIMEOUT = 60.0
_PYTHON_OPTS_WITH_VALUE = {"-X", "-W", "--check-hash-based-pycs"}
_PYTHON_FLAGS = set("bBdEhiIOPqsSuvx")


class DebuggeeStartError(RuntimeError):
    pass


def _is_python(program: str) -> bool:
    name = Path(program).name
    return (
        name == "python"
        or name.startswith("python3")
        or name == "python2"
        or program == sys.executable
    )


def split_python_command(user_argv: list[str]) -> tuple[list[str], list[str]]:
    """``(python options, target and its args)`` of a Python command; raises ``ValueError``.

    The target is ``script.py ARGS``, ``-m module ARGS`` or ``-c code ARGS``.
    """
    if not user_argv:
        raise ValueError("empty command")
    if user_argv[0].endswith(".py"):
        return [], list(user_argv)
    if not _is_python(user_argv[0]):
        raise ValueError(
            f"debug mode needs a Python command (python script.py, python -m module, script.py); "
            f"got {user_argv[0]!r}"
        )
    opts: list[str] = []
    rest = user_argv[1:]
    i = 0
    while i < len(rest):
        arg = rest[i]
        if arg in ("-m", "-c"):
            if i + 1 >= len(rest):
                raise ValueError(f"python {arg} needs an argument")
            return opts, rest[i:]
        if arg in _PYTHON_OPTS_WITH_VALUE:
            opts += rest[i : i + 2]
            i += 2
            continue
        if arg.startswith(("-X", "-W")) or (
            arg.startswith("-") and len(arg) > 1 and set(arg[1:]) <= _PYTHON_FLAGS
        ):
            opts.append(arg)
            i += 1
            continue
        if arg.startswith("-"):
            raise ValueError(f"unsupported python option {arg!r} in debug mode")
        return opts, rest[i:]
    raise ValueError("the python command names no script, -m module or -c code")


#: debugpy's command line with pydevd's socket made TCP_NODELAY (see ``_tether_debugpy_boot.py``)
BOOT = Path(__file__).resolve().with_name("_tether_debugpy_boot.py")


def build_debug_argv(
    user_argv: list[str], *, python: str = sys.executable, fast: bool = True
) -> list[str]:
    """The debuggee's argv: the user's Python options, debugpy held before user code, the target.

    ``fast`` runs debugpy through ``_tether_debugpy_boot.py`` (no 40 ms stall per message); otherwise it is
    plain ``python -m debugpy``.
    """
    opts, target = split_python_command(user_argv)
    launcher = [str(BOOT)] if fast else ["-m", "debugpy"]
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
        "false",
        *target,
    ]


@dataclass
class Debuggee:
    process: trio.Process
    port: int

    async def connect(self) -> trio.SocketStream:
        """The one connection to debugpy's adapter, for the whole life of the program."""
        stream = await trio.open_tcp_stream("127.0.0.1", self.port)
        stream.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        return stream

    async def wait(self) -> int:
        return await self.process.wait()

    async def terminate(self, grace: float = 5.0) -> None:
        await _terminate_group(self.process, grace)


async def _terminate_group(process: trio.Process, grace: float) -> None:
    if process.returncode is not None:
        _kill_group(process.pid, signal.SIGKILL)  # stragglers: debugpy's adapter, children
        return
    _kill_group(process.pid, signal.SIGTERM)
    with trio.move_on_after(grace):
        await process.wait()
    _kill_group(process.pid, signal.SIGKILL)
    await process.wait()


def _kill_group(pid: int, sig: int) -> None:
    try:
        os.killpg(pid, sig)
    except (ProcessLookupError, PermissionError):
        pass


def _tail(path: str, lines: int = 20) -> str:
    try:
        return "\n".join(Path(path).read_text(errors="replace").splitlines()[-lines:])
    except OSError:
        return ""


async def _open(argv: list[str], *, cwd: str, env: dict[str, str], log_path: str) -> trio.Process:
    with open(log_path, "ab") as log:  # noqa: ASYNC230 (opening a local log file)
        return await trio.lowlevel.open_process(
            argv,
            cwd=cwd,
            env=env,
            stdin=subprocess.DEVNULL,
            stdout=log,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )


@asynccontextmanager
async def start_debuggee(
    user_argv: list[str],
    *,
    cwd: str,
    env: dict[str, str],
    log_path: str,
    python: str = sys.executable,
    fast: bool = True,
) -> AsyncIterator[Debuggee]:
    """Start the program under debugpy, held before user code; on exit it is terminated if alive.

    ``fast=False`` starts stock ``python -m debugpy`` (the benchmark's baseline).
    """
    argv = build_debug_argv(user_argv, python=python, fast=fast)
    with tempfile.TemporaryDirectory(prefix="tether-debugpy-") as tmp:
        endpoints = Path(tmp) / "endpoints.json"
        child_env = {
            **env,
            "DEBUGPY_ADAPTER_ENDPOINTS": str(endpoints),
            "PYDEVD_DISABLE_FILE_VALIDATION": "1",
        }
        process = await _open(argv, cwd=cwd, env=child_env, log_path=log_path)
        try:
            port = await _wait_endpoints(endpoints, process, log_path)
            yield Debuggee(process, port)
        finally:
            with trio.CancelScope(shield=True):
                await _terminate_group(process, 5.0)


async def _wait_endpoints(path: Path, process: trio.Process, log_path: str) -> int:
    with trio.move_on_after(READY_TIMEOUT) as scope:
        while True:
            if process.returncode is not None or process.poll() is not None:
                raise DebuggeeStartError(
                    f"the program exited with {process.returncode} before debugpy was ready:\n{_tail(log_path)}"
                )
            try:
                data = json.loads(path.read_text())  # noqa: ASYNC240 (a tiny local file)
                return int(data["client"]["port"])
            except (OSError, ValueError, KeyError):
                pass
            await trio.sleep(
                0.02
            )  # product code polling a file debugpy writes; not test synchronisation
    assert scope.cancelled_caught
    raise DebuggeeStartError(
        f"debugpy was not ready within {READY_TIMEOUT:g} s:\n{_tail(log_path)}"
    )


async def start_plain(
    user_argv: list[str], *, cwd: str, env: dict[str, str], log_path: str
) -> trio.Process:
    """Run the command as given (no debugger)."""
    argv = list(user_argv)
    if argv and _is_python(argv[0]) and argv[0] in ("python", "python3"):
        argv[0] = sys.executable
    return await _open(argv, cwd=cwd, env=env, log_path=log_path)
