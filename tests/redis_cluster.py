"""A real Redis Cluster on loopback: three masters (no replicas) started from a server binary.

For the store conformance suite and the end-to-end sessions on a cluster::

    cluster = RedisCluster.start(shutil.which("redis-server"))
    url = cluster.url                 # redis://127.0.0.1:P1,127.0.0.1:P2,127.0.0.1:P3 (seed nodes)
    cluster.restart(cluster.owner(key))   # SIGTERM a master, start it again from its files
    cluster.stop()

Each node runs in the foreground as a child of this process (stopped by PID: SIGTERM, a grace
period, then SIGKILL), in a temporary directory of its own with its cluster configuration
(``nodes.conf``) and an append-only file, on a loopback port and a cluster-bus port chosen free.
The cluster is made without ``redis-cli``: every node takes its third of the 16,384 slots
(``CLUSTER ADDSLOTSRANGE``), the first meets the others (``CLUSTER MEET``), and the cluster is
ready once every node says ``cluster_state:ok`` and knows them all. A restarted master comes back
with the same identity and slots (``nodes.conf``) and data (its append-only file), as a real one
after a crash or an upgrade does.
"""

from __future__ import annotations

import shutil
import socket
import subprocess
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path

from relay.embedded.server import STREAM_NODE_BYTES

__all__ = ["RedisCluster"]

SLOTS = 16384
MASTERS = 3
READY_TIMEOUT = 30.0


def _free_ports(count: int) -> list[int]:
    sockets = [socket.socket() for _ in range(count)]
    try:
        for s in sockets:
            s.bind(("127.0.0.1", 0))
        return [int(s.getsockname()[1]) for s in sockets]
    finally:
        for s in sockets:
            s.close()


def command(port: int, *args: str, timeout: float = 5) -> bytes:
    """One command to the node on ``port``; its reply's first line and any bulk payload, raw."""
    with socket.create_connection(("127.0.0.1", port), timeout=timeout) as s:
        s.sendall(
            f"*{len(args)}\r\n".encode()
            + b"".join(f"${len(a.encode())}\r\n{a}\r\n".encode() for a in args)
        )
        reply = b""
        while True:
            chunk = s.recv(65536)
            if not chunk:
                break
            reply += chunk
            head, _, rest = reply.partition(b"\r\n")
            if not _:
                continue
            if head[:1] == b"$":
                size = int(head[1:])
                if size < 0 or len(rest) >= size + 2:
                    return rest[: max(size, 0)]
            else:
                return head
    raise ConnectionError(f"node on port {port} closed the connection")


def _answers(port: int, *args: str) -> bytes | None:
    try:
        return command(port, *args, timeout=1)
    except OSError:
        return None


@dataclass
class Node:
    binary: str
    data_dir: Path
    port: int
    bus_port: int
    first_slot: int
    last_slot: int
    process: subprocess.Popen[bytes] | None = None

    def argv(self) -> list[str]:
        return [
            self.binary,
            "--port", str(self.port),
            "--bind", "127.0.0.1",
            "--cluster-enabled", "yes",
            "--cluster-port", str(self.bus_port),
            "--cluster-config-file", "nodes.conf",
            "--dir", str(self.data_dir),
            "--appendonly", "yes",
            "--appendfsync", "everysec",
            "--save", "",
            "--daemonize", "no",
            "--logfile", str(self.data_dir / "server.log"),
            # as tether up's server and the operator checklist (docs/deploying.md) have it
            "--stream-node-max-bytes", str(STREAM_NODE_BYTES),
        ]  # fmt: skip

    def start(self) -> None:
        self.process = subprocess.Popen(
            self.argv(),
            stdin=subprocess.DEVNULL,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
        )

    def stop(self) -> None:
        process, self.process = self.process, None
        if process is not None and process.poll() is None:
            process.terminate()  # a SIGTERM flushes the append-only file
            try:
                process.wait(10)
            except subprocess.TimeoutExpired:
                process.kill()
                process.wait()

    def log_tail(self) -> str:
        try:
            return "\n".join((self.data_dir / "server.log").read_text().splitlines()[-15:])
        except OSError:
            return "(no log)"


@dataclass
class RedisCluster:
    binary: str
    root: Path
    nodes: list[Node] = field(default_factory=list)

    @property
    def url(self) -> str:
        """Every master as a seed node (any one of them would do)."""
        return "redis://" + ",".join(f"127.0.0.1:{n.port}" for n in self.nodes)

    @classmethod
    def start(cls, binary: str, *, masters: int = MASTERS) -> RedisCluster:
        cluster = cls(binary, Path(tempfile.mkdtemp(prefix="tether-redis-cluster-")))
        try:
            cluster._create(masters)
        except BaseException:
            cluster.stop()
            raise
        return cluster

    def _create(self, masters: int) -> None:
        ports = _free_ports(2 * masters)  # released before the nodes bind them: rarely taken
        share = SLOTS // masters
        for i in range(masters):
            data_dir = self.root / f"node{i}"
            data_dir.mkdir()
            last = SLOTS - 1 if i == masters - 1 else (i + 1) * share - 1
            self.nodes.append(
                Node(self.binary, data_dir, ports[2 * i], ports[2 * i + 1], i * share, last)
            )
        for node in self.nodes:
            node.start()
        for node in self.nodes:
            self._wait(
                lambda node=node: _answers(node.port, "PING") == b"+PONG",
                f"node {node.port} to answer",
            )
        for node in self.nodes:
            reply = command(
                node.port, "CLUSTER", "ADDSLOTSRANGE", str(node.first_slot), str(node.last_slot)
            )
            assert reply == b"+OK", reply
        first = self.nodes[0]
        for node in self.nodes[1:]:
            reply = command(
                first.port, "CLUSTER", "MEET", "127.0.0.1", str(node.port), str(node.bus_port)
            )
            assert reply == b"+OK", reply
        self.wait_ready()

    def wait_ready(self) -> None:
        """Until every node says the cluster is ok and knows every master."""
        want = f"cluster_known_nodes:{len(self.nodes)}".encode()

        def ready() -> bool:
            for node in self.nodes:
                info = _answers(node.port, "CLUSTER", "INFO") or b""
                if b"cluster_state:ok" not in info or want not in info:
                    return False
            return True

        self._wait(ready, "the cluster to be ready")

    def _wait(self, check: object, what: str) -> None:
        assert callable(check)
        deadline = time.monotonic() + READY_TIMEOUT
        while time.monotonic() < deadline:
            if any(n.process is not None and n.process.poll() is not None for n in self.nodes):
                break
            if check():
                return
            time.sleep(0.02)  # polling a server process we started, not test synchronisation
        logs = "\n".join(f"--- node {n.port}\n{n.log_tail()}" for n in self.nodes)
        raise RuntimeError(f"timed out waiting for {what} ({self.binary}):\n{logs}")

    def owner(self, key: str) -> int:
        """The index of the master that holds ``key``'s slot."""
        slot = int(command(self.nodes[0].port, "CLUSTER", "KEYSLOT", key)[1:])
        return next(i for i, n in enumerate(self.nodes) if n.first_slot <= slot <= n.last_slot)

    def restart(self, index: int) -> None:
        """Stop master ``index`` (SIGTERM) and start it again on the same files and ports."""
        node = self.nodes[index]
        node.stop()
        node.start()
        self._wait(lambda: _answers(node.port, "PING") == b"+PONG", f"node {node.port} to answer")
        self.wait_ready()

    def flushall(self) -> None:
        for node in self.nodes:
            command(node.port, "FLUSHALL")

    def stop(self) -> None:
        for node in self.nodes:
            node.stop()
        shutil.rmtree(self.root, ignore_errors=True)
