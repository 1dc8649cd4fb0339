"""Starting the user's program under debugpy, held before user code, and its one connection.

Theory of operation. The program runs as ``python -X frozen_modules=off [user's python options]
_tether_debugpy_boot.py --listen 127.0.0.1:0 --wait-for-client --configure-subProcess BOOL
TARGET ARGS`` (``fast=False``: ``-m debugpy`` instead of the boot script); a command that is not
Python runs as the target ``_tether_launch.py BOOT_DIR -- COMMAND`` on the worker's interpreter
(``worker_shim.program.python_command.build_launch_argv``). The boot script is
debugpy's own command line plus ``TCP_NODELAY`` on pydevd's socket, which removes a ~40 ms
Nagle/delayed-ACK stall from every DAP round trip (see ``_tether_debugpy_boot.py``).

- debugpy's adapter listens on an ephemeral loopback port, and nothing of the user's code runs
  until a client has finished the configuration (``configurationDone``).
- Readiness comes from ``DEBUGPY_ADAPTER_ENDPOINTS``, a file debugpy's adapter writes once it
  listens; never from a TCP probe: a bare connect-and-close leaves the adapter unable to accept
  anyone (debugpy #1308, research/dap.md section 6.1).
- Subprocess debugging is off unless asked (``subprocesses=True``): debugpy blocks every child
  process until a client configures it, so the shim must configure each one at once
  (:mod:`worker_shim.session.processes`); with it off, children run undebugged.
- With subprocess debugging on, every Python process of the run loads tether's ``sitecustomize``
  (``PYTHONPATH``), which gives each ``torch.distributed`` process group a long timeout from its
  creation (``TETHER_COLLECTIVE_TIMEOUT``, ``_tether_collectives.py``): a paused rank must not
  make its peers' collectives time out and end the job.
- The program runs in a session (process group) of its own; ending the run signals the whole group,
  so its children go with it.
- debugpy's adapter is not in that group: it calls ``setsid()`` and double-forks. It exits by
  itself once the program is gone and its client has disconnected, except when the program dies
  before pydevd connected to it: then it waits for that first connection forever. So when
  :func:`start_debuggee` exits it also kills every process that still carries the attempt's mark
  (``TETHER_MARK``, ``worker_shim/program/reaper.py``) in its environment (the adapter, and any
  descendant that left the group). That scan uses Linux's ``/proc``; elsewhere it finds nothing.
- In an attempt's quarters (``worker_shim/program/quarters.py``) the program runs as the attempt's
  uid (on a worker that gives programs uids of their own), its debugpy and tether's scripts come
  from the runtime the worker published for them, and the worker connects only to a listener of that
  uid (``worker_shim/program/loopback.py``); debugpy's own listeners let in only that uid and the
  worker's (``_tether_guard.py``).

Output: the program's stdout and stderr are pipes read by an :class:`OutputPump`, which appends them
to the worker's log file and hands every chunk to ``on_output`` (the shim publishes them:
``worker_shim.session.output``); :attr:`OutputPump.done` is set once both pipes reached their end,
and :meth:`OutputPump.mark` / :meth:`OutputPump.reached` tell whether what the program wrote until
now was handed over (the shim's ordering barrier).

What a cancel leaves behind: nothing. The exit of :func:`start_debuggee` always runs shielded and
bounded (at most about 12 s): SIGTERM to the group, up to ``TERMINATE_GRACE`` (5 s), SIGKILL to the
group, up to 5 s for the program to go, then the stragglers' scan (up to 2 s).
"""

from __future__ import annotations

import contextlib
import fcntl
import json
import logging
import os
import signal
import socket
import struct
import subprocess
import sys
import tempfile
import termios
from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import asynccontextmanager, suppress
from pathlib import Path
from typing import Any, BinaryIO

import trio

from protocol_specs.access.redact import Redactor

from .identity import UNREACHABLE_HINT
from .loopback import connect_owned
from .python_command import (
    NOT_WITH_MAIN_ONLY,
    boot_dir,
    build_debug_argv,
    build_launch_argv,
    check_python,
    debugged_children_env,
    debugpy_home,
    is_launcher,
    is_python,
    python_launcher,
    resolve_python,
    split_python_command,
)
from .quarters import Quarters, read_private
from .reaper import kill_marked

__all__ = [
    "Debuggee",
    "DebuggeeStartError",
    "OutputPump",
    "kill_stragglers",
    "start_debuggee",
    "start_plain",
    "terminate_group",
]

#: How long debugpy may take to listen (usually ~0.3 s; the first start on a cold disk is slower).
READY_TIMEOUT = 60.0
#: SIGTERM to SIGKILL, when the context manager ends the program.
TERMINATE_GRACE = 5.0
_POLL_INTERVAL = 0.02
#: After SIGKILL, how long to wait for the program: a process stuck in the kernel (a hung GPU
#: driver) may never go, and cleanup must not hang with it.
_KILL_WAIT = 5.0
_STRAGGLERS_WAIT = 2.0
_LOG_TAIL_BYTES = 4096
#: the most bytes of output handed over at once
OUTPUT_CHUNK = 16 * 1024
#: after the program exited, how long to wait for the rest of its output (a daemon it left
#: behind may hold the pipe open for ever)
OUTPUT_DRAIN = 5.0

#: on_output(stream name, bytes): "stdout" or "stderr"
Output = Callable[[str, bytes], Awaitable[None]]


class OutputPump:
    """Reads a process's stdout and stderr pipes into a log file and ``on_output``."""

    def __init__(
        self,
        process: trio.Process,
        log_path: str,
        on_output: Output | None,
        secrets: list[str] | None = None,
    ) -> None:
        self.process = process
        self.log_path = log_path
        self.on_output = on_output
        #: the log file (0600) and the output tail kept for errors get secret values blanked
        self._blank = {name: Redactor(secrets or []) for name in ("stdout", "stderr")}
        self.tail = bytearray()
        self.done = trio.Event()
        self._failed = False
        self._read = {"stdout": 0, "stderr": 0}  # bytes read from each pipe
        self._passed = {"stdout": 0, "stderr": 0}  # ... and handed over (``on_output`` returned)
        self._ended: set[str] = set()
        self._moved = trio.Event()

    def mark(self) -> dict[str, int]:
        """Where each open pipe's output reaches now: what was read plus what the pipe still holds
        (``FIONREAD``). Everything the program has written so far lies before this mark."""
        return {
            name: self._read[name] + _pipe_bytes(stream)
            for name, stream in self._streams()
            if name not in self._ended
        }

    def reached(self, mark: dict[str, int]) -> bool:
        """Whether every byte before ``mark`` was handed over (or its pipe ended)."""
        return all(name in self._ended or self._passed[name] >= at for name, at in mark.items())

    async def moved(self) -> None:
        """Return once more output was handed over, or a pipe ended."""
        await self._moved.wait()

    def _streams(self) -> list[tuple[str, trio.abc.ReceiveStream]]:
        pipes = (("stdout", self.process.stdout), ("stderr", self.process.stderr))
        return [(name, stream) for name, stream in pipes if stream is not None]

    def _move(self) -> None:
        self._moved.set()
        self._moved = trio.Event()

    async def run(self) -> None:
        try:
            async with trio.open_nursery() as nursery:
                for name, stream in self._streams():
                    nursery.start_soon(self._pump, name, stream)
        finally:
            self.done.set()

    async def drained(self, timeout: float = OUTPUT_DRAIN) -> None:
        with trio.move_on_after(timeout):
            await self.done.wait()

    async def _pump(self, name: str, stream: trio.abc.ReceiveStream) -> None:
        try:
            await self._pump_into_log(name, stream)
        finally:
            self._ended.add(name)
            self._move()

    async def _pump_into_log(self, name: str, stream: trio.abc.ReceiveStream) -> None:
        blank = self._blank[name]
        with _private_log(self.log_path) as log:
            while True:
                try:
                    chunk = await stream.receive_some(OUTPUT_CHUNK)
                except (trio.BrokenResourceError, trio.ClosedResourceError):
                    chunk = b""
                if not chunk:
                    log.write(blank.flush())
                    return
                # counted before any checkpoint: a byte is always either in the pipe or counted
                self._read[name] += len(chunk)
                shown = blank.feed(bytes(chunk))
                log.write(shown)
                log.flush()
                self.tail += shown
                del self.tail[:-_LOG_TAIL_BYTES]
                if self.on_output is not None and not self._failed:
                    try:
                        await self.on_output(name, bytes(chunk))
                    except Exception as exc:  # the log file keeps the rest
                        self._failed = True
                        logging.getLogger("tether.worker").warning(
                            "cannot forward the program's output any more: %s", exc
                        )
                self._passed[name] += len(chunk)
                self._move()


def _private_log(path: str) -> BinaryIO:
    """The run's log file, appended to, readable by the worker's user only (it holds the
    program's output)."""
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o600)
    return os.fdopen(fd, "ab")


def _pipe_bytes(stream: trio.abc.ReceiveStream) -> int:
    """Bytes waiting in a pipe (``FIONREAD``); 0 if that cannot be asked (closed, not a pipe)."""
    fileno = getattr(stream, "fileno", None)
    if fileno is None:
        return 0
    try:
        raw = fcntl.ioctl(fileno(), termios.FIONREAD, b"\0\0\0\0")
    except (OSError, ValueError, trio.ClosedResourceError):
        return 0
    return int(struct.unpack("i", raw)[0])


class DebuggeeStartError(RuntimeError):
    """The program did not get as far as debugpy listening; the message ends with its log's tail."""


class Debuggee:
    """A program started by :func:`start_debuggee`, held until a client configures debugpy."""

    def __init__(
        self,
        process: trio.Process,
        port: int,
        output: OutputPump,
        *,
        launched: bool = False,
        uid: int | None = None,
    ) -> None:
        self.process = process
        #: whose debugpy the worker may connect to: the program's uid (the worker's by default)
        self.uid = os.geteuid() if uid is None else uid
        #: the command is not Python: the main process is tether's launcher, which runs no user
        #: code; the command's Python processes are its children (``_tether_launch.py``)
        self.launched = launched
        #: the program's output; ``output.done`` once all of it was handed over
        self.output = output
        #: debugpy's adapter's client port on 127.0.0.1
        self.port = port
        self._connected = False

    def __repr__(self) -> str:
        code = self.process.returncode
        state = "running" if code is None else f"exited {code}"
        return f"<Debuggee pid={self.process.pid} port={self.port} {state}>"

    async def connect(self) -> trio.SocketStream:
        """The one connection to debugpy's adapter, for the whole life of the program.

        Only one attempt is allowed: debugpy resumes the program and forgets all breakpoints when
        its client goes, and a connection closed before it spoke (a failed or cancelled attempt)
        can leave the adapter accepting no one again (debugpy #1308). End the run instead.
        """
        if self._connected:
            raise RuntimeError("debugpy takes one connection for the life of the program")
        self._connected = True
        return await self.connect_child()

    async def connect_child(self) -> trio.SocketStream:
        """A connection to debugpy's adapter (the main one, or a child process's session), once
        its listener is known to be the program's own: the port came from the program, which
        could name another run's debugger (``worker_shim/program/loopback.py``)."""
        stream = await connect_owned(self.port, self.uid)
        # trio sets it already; the point of this connection is latency, so say it here too
        stream.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        return stream

    async def wait(self) -> int:
        """The program's exit code (negative: killed by that signal)."""
        return await self.process.wait()

    async def terminate(self, grace: float = TERMINATE_GRACE) -> None:
        """End the program and its process group: SIGTERM, up to ``grace`` s, then SIGKILL.

        debugpy's adapter stays until its client disconnects, so that client still receives
        ``terminated``; leaving :func:`start_debuggee` removes it in any case.
        """
        await _end_group(self.process, grace)


@asynccontextmanager
async def start_debuggee(
    user_argv: list[str],
    *,
    cwd: str,
    env: dict[str, str],
    log_path: str,
    python: str = sys.executable,
    fast: bool = True,
    on_output: Output | None = None,
    secrets: list[str] | None = None,
    subprocesses: bool = False,
    quarters: Quarters | None = None,
) -> AsyncIterator[Debuggee]:
    """Start the program under debugpy, held before user code, and yield once debugpy listens.
    ``quarters``: the attempt's private directory and the uid its processes run as (without:
    a temporary directory, the worker's uid).

    A command that is not Python (a shell script, ``srun``) runs under tether's launcher
    (``_tether_launch.py``): every Python process it starts is debugged as a child.

    stdout and stderr are appended to ``log_path``. Raises ``ValueError`` for a command that cannot
    be debugged (saying why), :class:`DebuggeeStartError` when debugpy does not get to listen. On exit (normal,
    error or cancel), shielded: the program's group is ended (:meth:`Debuggee.terminate`), then
    debugpy's adapter and any other process of this run still alive are killed.
    """
    user = quarters.user if quarters is not None else None
    runtime = quarters.runtime if quarters is not None else None
    program = user_argv[0] if user_argv else ""
    launched = False  # a command that is not Python, run under tether's launcher
    if is_launcher(program):  # torchrun, accelerate, deepspeed: Python scripts on the PATH
        found = python_launcher(program, env=env, cwd=cwd, user=user)
        launched = found is None  # a shell script, srun, mpirun: any other program
        if found is not None:
            user_argv = [*found, *user_argv[1:]]
            program = user_argv[0]
    if launched and not subprocesses:
        raise ValueError(NOT_WITH_MAIN_ONLY.format(program=program))
    if is_python(program) or (launched and user is not None):
        python = resolve_python(program if not launched else "python", env=env, cwd=cwd, user=user)
    if not launched:
        split_python_command(user_argv)  # a command that is not Python: said before it starts
    await check_python(python, env=env, cwd=cwd, user=user)
    with contextlib.ExitStack() as places:
        if quarters is None:
            where = Path(
                places.enter_context(tempfile.TemporaryDirectory(prefix="tether-debugpy-"))
            )
            endpoints, mark = where / "endpoints.json", ""
        else:
            where, endpoints, mark = quarters.private, quarters.endpoints, quarters.mark
        home = str(debugpy_home(where, runtime))
        if launched:
            boot = str(boot_dir(where, runtime))
            argv = build_launch_argv(
                user_argv, boot_dir=boot, fast=fast, home=home, python=python, runtime=runtime
            )
        else:
            argv = build_debug_argv(
                user_argv, python=python, fast=fast, home=home, subprocesses=subprocesses,
                runtime=runtime,
            )  # fmt: skip
        child_env = {
            **env,
            "DEBUGPY_ADAPTER_ENDPOINTS": str(endpoints),
            "PYDEVD_DISABLE_FILE_VALIDATION": "1",
        }
        if subprocesses:  # a pause in one rank must not end a torch.distributed job
            child_env = debugged_children_env(
                child_env, boot=None if launched else str(boot_dir(where, runtime))
            )
        if not fast:
            child_env["PYTHONPATH"] = os.pathsep.join(
                filter(None, [home, child_env.get("PYTHONPATH")])
            )
        if not mark:  # no attempt's mark: this start's own
            mark = f"tether-debugpy/{os.getpid()}-{os.urandom(6).hex()}"
            child_env["TETHER_MARK"] = mark
        spawn = quarters.spawn() if quarters is not None else {}
        process = await _open(argv, cwd=cwd, env=child_env, **spawn)
        output = OutputPump(process, log_path, on_output, secrets)
        try:
            async with trio.open_nursery() as nursery:
                nursery.start_soon(output.run)
                try:
                    port = await _wait_endpoints(endpoints, process, output)
                    uid = user.uid if user is not None else None
                    yield Debuggee(process, port, output, launched=launched, uid=uid)
                finally:
                    with trio.CancelScope(shield=True):
                        await _end_group(process, TERMINATE_GRACE)
                        await kill_stragglers(mark)
                        await output.drained()
                    nursery.cancel_scope.cancel()
        except BaseExceptionGroup as group:
            # the pump never raises: whatever is in the group came from the body; pass it on as is
            if len(group.exceptions) == 1:
                raise group.exceptions[0] from None
            raise


async def start_plain(
    user_argv: list[str], *, cwd: str, env: dict[str, str], quarters: Quarters | None = None
) -> trio.Process:
    """Run the command as given (no debugger), in its own process group, stdout and stderr piped
    (read them with an :class:`OutputPump`); as ``quarters``' user, if it has one."""
    user = quarters.user if quarters is not None else None
    argv = list(user_argv)
    if argv and argv[0] in ("python", "python3"):
        argv[0] = resolve_python(argv[0], env=env, cwd=cwd, user=user)
    return await _open(argv, cwd=cwd, env=env, **(quarters.spawn() if quarters else {}))


async def _open(argv: list[str], *, cwd: str, env: dict[str, str], **spawn: Any) -> trio.Process:
    try:
        return await trio.lowlevel.open_process(
            argv,
            cwd=cwd,
            env=env,
            stdin=subprocess.DEVNULL,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            start_new_session=True,
            **spawn,
        )
    except PermissionError as exc:
        if "user" not in spawn:
            raise
        raise PermissionError(
            exc.errno,
            f"the run's user (uid {spawn['user']}) may not run it ({exc.strerror}): "
            f"{UNREACHABLE_HINT}",
            exc.filename,
        ) from None


async def _wait_endpoints(path: Path, process: trio.Process, output: OutputPump) -> int:
    """debugpy's client port, from the file its adapter writes once it listens (polled)."""
    with trio.move_on_after(READY_TIMEOUT):
        while process.poll() is None:
            port = _read_port(path)
            if port is not None:
                return port
            await trio.sleep(_POLL_INTERVAL)  # product code waiting for a file, not a test
        await output.drained(2.0)
        raise DebuggeeStartError(
            f"the program exited with {process.returncode} before debugpy was ready; "
            f"end of its output:\n{output.tail.decode(errors='replace')}"
        )
    raise DebuggeeStartError(
        f"debugpy was not ready within {READY_TIMEOUT:g} s; end of its output:\n"
        f"{output.tail.decode(errors='replace')}"
    )


def _read_port(path: Path) -> int | None:
    """The adapter's client port, from a file the program's uid wrote (read as such)."""
    raw = read_private(path)
    if raw is None:
        return None
    try:
        port = int(json.loads(raw)["client"]["port"])
    except (ValueError, KeyError, TypeError):  # half written
        return None
    return port if 0 < port < 65536 else None


async def terminate_group(process: trio.Process, grace: float = TERMINATE_GRACE) -> None:
    """End a program started here and everything in its process group (its children too)."""
    await _end_group(process, grace)


async def _end_group(process: trio.Process, grace: float) -> None:
    """SIGTERM the program's group, wait up to ``grace``, SIGKILL the group (always: children the
    program left behind), wait up to ``_KILL_WAIT``."""
    if process.returncode is None:
        _signal_group(process.pid, signal.SIGTERM)
        with trio.move_on_after(grace):
            await process.wait()
    _signal_group(process.pid, signal.SIGKILL)
    with trio.move_on_after(_KILL_WAIT):
        await process.wait()


def _signal_group(pgid: int, sig: int) -> None:
    with suppress(ProcessLookupError, PermissionError):
        os.killpg(pgid, sig)


async def kill_stragglers(mark: str) -> None:
    """SIGKILL the processes marked ``mark`` (``TETHER_MARK``: the program's, whatever group they
    went to, debugpy's adapter among them) until none is left (bounded)."""
    with trio.move_on_after(_STRAGGLERS_WAIT):
        while await trio.to_thread.run_sync(kill_marked, mark):  # noqa: ASYNC110 (polls /proc)
            await trio.sleep(_POLL_INTERVAL)
