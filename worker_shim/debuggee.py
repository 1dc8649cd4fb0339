"""Starting the user's program under debugpy, held before user code, and its one connection.

Theory of operation. The program runs as ``python -X frozen_modules=off [user's python options]
_tether_debugpy_boot.py --listen 127.0.0.1:0 --wait-for-client --configure-subProcess false
TARGET ARGS`` (``fast=False``: ``-m debugpy`` instead of the boot script). The boot script is
debugpy's own command line plus ``TCP_NODELAY`` on pydevd's socket, which removes a ~40 ms
Nagle/delayed-ACK stall from every DAP round trip (see ``_tether_debugpy_boot.py``).

- debugpy's adapter listens on an ephemeral loopback port, and nothing of the user's code runs
  until a client has finished the configuration (``configurationDone``).
- Readiness comes from ``DEBUGPY_ADAPTER_ENDPOINTS``, a file debugpy's adapter writes once it
  listens; never from a TCP probe: a bare connect-and-close leaves the adapter unable to accept
  anyone (debugpy #1308, research/dap.md section 6.1).
- Subprocess debugging is off: debugpy would block every child process until a client attached to
  it, so a ``multiprocessing`` or DataLoader pool would hang. Children run undebugged instead.
- The program runs in a session (process group) of its own; ending the run signals the whole group,
  so its children go with it.
- debugpy's adapter is not in that group: it calls ``setsid()`` and double-forks. It exits by
  itself once the program is gone and its client has disconnected, except when the program dies
  before pydevd connected to it: then it waits for that first connection forever. So when
  :func:`start_debuggee` exits it also kills every process that still carries this run's
  ``DEBUGPY_ADAPTER_ENDPOINTS`` value in its environment (the adapter, and any descendant that left
  the group). That scan uses Linux's ``/proc``; elsewhere it finds nothing.

Output: the program's stdout and stderr are pipes read by an :class:`OutputPump`, which appends them
to the worker's log file and hands every chunk to ``on_output`` (the shim publishes them:
``worker_shim.output``); :attr:`OutputPump.done` is set once both pipes reached their end, and
:meth:`OutputPump.mark` / :meth:`OutputPump.reached` tell whether what the program wrote until now
was handed over (the shim's ordering barrier).

What a cancel leaves behind: nothing. The exit of :func:`start_debuggee` always runs shielded and
bounded (at most about 12 s): SIGTERM to the group, up to ``TERMINATE_GRACE`` (5 s), SIGKILL to the
group, up to 5 s for the program to go, then the stragglers' scan (up to 2 s).
"""

from __future__ import annotations

import fcntl
import json
import logging
import os
import re
import shutil
import signal
import socket
import struct
import subprocess
import sys
import tempfile
import termios
from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import asynccontextmanager, suppress
from pathlib import Path, PurePath
from typing import BinaryIO

import trio

from protocol_specs.redact import Redactor

__all__ = [
    "BOOT",
    "MIN_PYTHON",
    "Debuggee",
    "DebuggeeStartError",
    "OutputPump",
    "build_debug_argv",
    "check_python",
    "debugpy_home",
    "resolve_python",
    "split_python_command",
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


#: debugpy's command line with pydevd's socket made TCP_NODELAY
BOOT = Path(__file__).resolve().with_name("_tether_debugpy_boot.py")

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


class DebuggeeStartError(RuntimeError):
    """The program did not get as far as debugpy listening; the message ends with its log's tail."""


def _is_python(program: str) -> bool:
    return _PYTHON_NAME.fullmatch(PurePath(program).name) is not None or program == sys.executable


#: the oldest CPython the debugpy tether installs runs on (its ``Requires-Python``)
MIN_PYTHON = (3, 10)


def resolve_python(program: str, *, env: dict[str, str], cwd: str) -> str:
    """The interpreter a command names, as the run's environment finds it: a path (relative to the
    run directory), or a name looked up on the run's ``PATH``. A bare ``python``/``python3`` that
    is not on that ``PATH`` is the worker's own interpreter; any other name must be found."""
    if os.sep in program or (os.altsep and os.altsep in program):
        path = Path(cwd, program)
        if not (path.is_file() and os.access(path, os.X_OK)):
            raise ValueError(f"no interpreter at {program!r} on the worker (relative to the run)")
        return str(path)
    found = shutil.which(program, path=env.get("PATH", os.defpath))
    if found is not None:
        return found
    if program in ("python", "python3"):
        return sys.executable
    raise ValueError(f"no interpreter named {program!r} on the worker's PATH")


#: interpreters already found fit for debugpy: (path, size, mtime) of their executable
_FIT: set[tuple[str, int, int]] = set()


async def check_python(python: str, *, env: dict[str, str], cwd: str) -> None:
    """Raise ``ValueError`` saying why ``python`` cannot run debugpy (not CPython, or too old).
    An interpreter found fit is not asked again (while its executable is unchanged)."""
    key = _identity(python)
    if key in _FIT:
        return
    probe = "import sys; print(sys.implementation.name, *sys.version_info[:3])"
    try:
        with trio.fail_after(30):
            done = await trio.run_process(
                [python, "-c", probe], env=env, cwd=cwd, capture_stdout=True, capture_stderr=True,
                check=False,
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


def _identity(python: str) -> tuple[str, int, int] | None:
    try:
        st = os.stat(python)
    except OSError:
        return None
    return os.path.realpath(python), st.st_size, st.st_mtime_ns


def _debugpy_version() -> str:
    import debugpy

    return str(debugpy.__version__)


def debugpy_home(where: Path) -> Path:
    """A directory under ``where`` holding only the worker's ``debugpy`` package (a link): what
    the program's interpreter adds to its path to debug it, without seeing anything else the
    worker has installed."""
    home = where / "debugpy-home"
    home.mkdir(exist_ok=True)
    link = home / "debugpy"
    if not link.exists():
        import debugpy

        link.symlink_to(Path(debugpy.__file__).resolve().parent, target_is_directory=True)
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
    if not _is_python(program):
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
    user_argv: list[str], *, python: str = sys.executable, fast: bool = True, home: str = ""
) -> list[str]:
    """The debuggee's argv: the user's Python options, debugpy held before user code, the target.

    The program runs on ``python``: the interpreter the command names, resolved by the caller
    (:func:`resolve_python`), or the worker's for a bare ``script.py``. ``fast`` runs debugpy's
    command line through ``_tether_debugpy_boot.py`` (no 40 ms stall per message), which first
    adds ``home`` (:func:`debugpy_home`) to the path; ``fast=False`` is stock ``python -m
    debugpy`` (the caller puts ``home`` on ``PYTHONPATH``).
    """
    opts, target = split_python_command(user_argv)
    launcher = ["-m", "debugpy"]
    if fast:
        launcher = [str(BOOT), *(["--tether-debugpy", home] if home else [])]
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


class Debuggee:
    """A program started by :func:`start_debuggee`, held until a client configures debugpy."""

    def __init__(self, process: trio.Process, port: int, output: OutputPump) -> None:
        self.process = process
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
        stream = await trio.open_tcp_stream("127.0.0.1", self.port)
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
) -> AsyncIterator[Debuggee]:
    """Start the program under debugpy, held before user code, and yield once debugpy listens.

    stdout and stderr are appended to ``log_path``. Raises ``ValueError`` for a command that is not
    Python, :class:`DebuggeeStartError` when debugpy does not get to listen. On exit (normal,
    error or cancel), shielded: the program's group is ended (:meth:`Debuggee.terminate`), then
    debugpy's adapter and any other process of this run still alive are killed.
    """
    program = user_argv[0] if user_argv else ""
    if _is_python(program):
        python = resolve_python(program, env=env, cwd=cwd)
    split_python_command(user_argv)  # a command that is not Python: said before anything starts
    await check_python(python, env=env, cwd=cwd)
    with tempfile.TemporaryDirectory(prefix="tether-debugpy-") as tmp:
        home = str(debugpy_home(Path(tmp)))
        argv = build_debug_argv(user_argv, python=python, fast=fast, home=home)
        endpoints = Path(tmp) / "endpoints.json"
        child_env = {
            **env,
            "DEBUGPY_ADAPTER_ENDPOINTS": str(endpoints),
            "PYDEVD_DISABLE_FILE_VALIDATION": "1",
        }
        if not fast:
            child_env["PYTHONPATH"] = os.pathsep.join(filter(None, [home, env.get("PYTHONPATH")]))
        marker = os.fsencode(f"DEBUGPY_ADAPTER_ENDPOINTS={endpoints}")
        process = await _open(argv, cwd=cwd, env=child_env)
        output = OutputPump(process, log_path, on_output, secrets)
        try:
            async with trio.open_nursery() as nursery:
                nursery.start_soon(output.run)
                try:
                    port = await _wait_endpoints(endpoints, process, output)
                    yield Debuggee(process, port, output)
                finally:
                    with trio.CancelScope(shield=True):
                        await _end_group(process, TERMINATE_GRACE)
                        await _kill_stragglers(marker)
                        await output.drained()
                    nursery.cancel_scope.cancel()
        except BaseExceptionGroup as group:
            # the pump never raises: whatever is in the group came from the body; pass it on as is
            if len(group.exceptions) == 1:
                raise group.exceptions[0] from None
            raise


async def start_plain(user_argv: list[str], *, cwd: str, env: dict[str, str]) -> trio.Process:
    """Run the command as given (no debugger), in its own process group, stdout and stderr piped
    (read them with an :class:`OutputPump`)."""
    argv = list(user_argv)
    if argv and argv[0] in ("python", "python3"):
        argv[0] = resolve_python(argv[0], env=env, cwd=cwd)
    return await _open(argv, cwd=cwd, env=env)


async def _open(argv: list[str], *, cwd: str, env: dict[str, str]) -> trio.Process:
    return await trio.lowlevel.open_process(
        argv,
        cwd=cwd,
        env=env,
        stdin=subprocess.DEVNULL,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        start_new_session=True,
    )


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
    try:
        endpoints = json.loads(path.read_bytes())
        return int(endpoints["client"]["port"])
    except (OSError, ValueError, KeyError, TypeError):  # not there yet, or half written
        return None


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


async def _kill_stragglers(marker: bytes) -> None:
    """SIGKILL the processes whose environment holds ``marker`` until none is left (bounded)."""
    with trio.move_on_after(_STRAGGLERS_WAIT):
        while await trio.to_thread.run_sync(_kill_marked, marker):  # noqa: ASYNC110 (polls /proc)
            await trio.sleep(_POLL_INTERVAL)


def _kill_marked(marker: bytes) -> list[int]:
    """SIGKILL every live process (but this one) whose environment holds ``marker``; their pids."""
    try:
        names = os.listdir("/proc")
    except OSError:  # no procfs: nothing to find
        return []
    found = []
    for name in names:
        if name.isdigit() and int(name) != os.getpid() and _has_marker(int(name), marker):
            found.append(int(name))
            _kill_if_marked(int(name), marker)
    return found


def _has_marker(pid: int, marker: bytes) -> bool:
    try:
        with open(f"/proc/{pid}/environ", "rb") as f:  # empty for a zombie
            return marker in f.read().split(b"\0")
    except OSError:  # gone, or not ours to read
        return False


def _kill_if_marked(pid: int, marker: bytes) -> None:
    """SIGKILL ``pid`` unless, since the scan, it died and its pid went to another process."""
    try:
        pidfd = os.pidfd_open(pid)
    except AttributeError:  # no pidfd_open (not Linux): the scan was a moment ago
        with suppress(OSError):
            os.kill(pid, signal.SIGKILL)
        return
    except OSError:  # gone already
        return
    try:
        if _has_marker(pid, marker):  # the pidfd pins the process this check reads
            signal.pidfd_send_signal(pidfd, signal.SIGKILL)
    except OSError:
        pass
    finally:
        os.close(pidfd)
