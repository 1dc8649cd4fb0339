"""A real Ray head (``ray start --head --block``) for the Ray backend's tests.

Ray lives in a venv of its own (``.venv-ray`` at the repository's root, made on first use with
``pip install ray[default]``, what a Ray head needs for its dashboard and Jobs API): the backend
itself needs no Ray, only HTTP. :func:`ray_bin` makes the venv, or says why it cannot::

    ray = ray_bin()  # skips (or fails, with TETHER_REQUIRE_RAY=1) when it cannot be made
    with RayHead(ray, tmp_dir, gpus=1, resources={"tether_test": 1}) as head:
        head.address  # http://127.0.0.1:PORT, the dashboard

A cluster whose nodes' loopbacks are apart (issue 43): the head on a bridge's address
(``host=nodes.bridge_address``), a node in a network namespace (``tests/netns.py``) joined with
``head.add_node(prefix=nodes.prefix(0), ip=nodes.addresses[0])``.

The head runs in the foreground (``--block``) as a child of this process, in a session of its
own, with its own temporary directory (``--temp-dir``) and ports: :meth:`RayHead.stop` ends it by
its PID (SIGTERM: Ray drains and stops every process it started), then kills what is left of its
process group and any process still naming its temporary directory. ``ray stop`` is never used:
it would stop every Ray on the machine. Declaring GPUs on a machine without any is allowed: Ray
only counts them (a job holding one sees ``CUDA_VISIBLE_DEVICES=0``).
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import socket
import subprocess
import tempfile
import time
import urllib.request
from pathlib import Path
from types import TracebackType

from venvs import ROOT, own_venv

RAY = "ray[default]==2.60.0"
_STOP_GRACE_S = 40.0


def ray_bin() -> Path:
    """The ``ray`` command of ``.venv-ray``, made if need be; skips the test (fails it with
    ``TETHER_REQUIRE_RAY=1``) when it cannot be made."""
    probe = "import ray.dashboard, aiohttp"
    return own_venv(".venv-ray", [RAY], probe, require="TETHER_REQUIRE_RAY").parent / "ray"


def ray_with_tether() -> Path:
    """The Python of ``.venv-ray-nodes``: Ray and this repository (editable) in one environment,
    as a cluster whose runs span nodes has them (the job's driver, ``worker_shim/backends/
    ray_nodes.py``, runs tether's module with Ray); made if need be, or the test skipped."""
    probe = "import ray.dashboard, aiohttp, adapter.cli"
    return own_venv(".venv-ray-nodes", [RAY, "-e", str(ROOT)], probe, require="TETHER_REQUIRE_RAY")


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


class RayHead:
    """One Ray head node on loopback, with ``cpus``, ``gpus`` and custom ``resources``."""

    def __init__(
        self,
        ray: Path,
        *,
        cpus: int = 2,
        gpus: int = 0,
        resources: dict[str, float] | None = None,
        env: dict[str, str] | None = None,
        host: str = "127.0.0.1",
    ) -> None:
        self.ray = ray
        #: the head's address (its dashboard's, its GCS's): a bridge's, for nodes in namespaces
        self.host = host
        self.cpus = cpus
        self.gpus = gpus
        self.resources = resources or {}
        self.env = env or {}
        # Ray's sockets live under the temporary directory: its path must stay short
        self.temp_dir = Path(tempfile.mkdtemp(prefix="tray-", dir="/tmp"))
        self.dashboard_port = _free_port()
        self.gcs_port = _free_port()
        self.process: subprocess.Popen[bytes] | None = None
        #: nodes joined later (:meth:`add_node`), each a ``ray start --address ... --block``
        self.nodes: list[subprocess.Popen[bytes]] = []

    @property
    def address(self) -> str:
        return f"http://{self.host}:{self.dashboard_port}"

    @property
    def log(self) -> Path:
        return self.temp_dir / "head.log"

    def start(self, timeout: float = 180.0) -> None:
        argv = [
            str(self.ray), "start", "--head", "--block",
            "--node-ip-address", self.host,
            "--port", str(self.gcs_port),
            "--dashboard-host", self.host,
            "--dashboard-port", str(self.dashboard_port),
            "--dashboard-agent-listen-port", str(_free_port()),
            "--num-cpus", str(self.cpus),
            "--num-gpus", str(self.gpus),
            "--resources", json.dumps(self.resources),
            "--object-store-memory", str(100_000_000),
            "--temp-dir", str(self.temp_dir),
            "--disable-usage-stats",
        ]  # fmt: skip
        env = {**os.environ, **self.env, "RAY_USAGE_STATS_ENABLED": "0"}
        with self.log.open("wb") as out:
            self.process = subprocess.Popen(
                argv, stdout=out, stderr=subprocess.STDOUT, env=env, start_new_session=True
            )
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.process.poll() is not None:
                raise RuntimeError(f"ray start ended: {self.log.read_text()[-2000:]}")
            if self._jobs_api_answers():
                return
            time.sleep(0.5)  # polling a daemon's startup from outside: nothing to wait on
        raise RuntimeError(f"Ray's Jobs API did not answer in {timeout:g} s")

    def add_node(
        self,
        *,
        cpus: int = 1,
        resources: dict[str, float] | None = None,
        prefix: list[str] | None = None,
        ip: str = "127.0.0.1",
    ) -> None:
        """A node joining the cluster (what an autoscaler does when a job asks for what no node
        has): ``ray start --address`` on this machine, with ``resources``; stopped with the
        head. ``prefix`` and ``ip``: a node in a network namespace of its own
        (``tests/netns.py``: ``Nodes.prefix(K)``, its address), the head on the bridge."""
        argv = [
            *(prefix or []),
            str(self.ray), "start", "--block", "--address", f"{self.host}:{self.gcs_port}",
            "--node-ip-address", ip, "--num-cpus", str(cpus),
            "--resources", json.dumps(resources or {}),
            "--object-store-memory", str(100_000_000), "--disable-usage-stats",
        ]  # fmt: skip
        env = {**os.environ, **self.env, "RAY_USAGE_STATS_ENABLED": "0"}
        with (self.temp_dir / f"node-{len(self.nodes)}.log").open("wb") as out:
            node = subprocess.Popen(
                argv, stdout=out, stderr=subprocess.STDOUT, env=env, start_new_session=True
            )
        self.nodes.append(node)

    def alive_nodes(self) -> list[str]:
        """The addresses of the cluster's nodes that are alive (the state API's node list)."""
        got = self.request("GET", "/api/v0/nodes?limit=100")
        assert isinstance(got, dict)
        nodes = got["data"]["result"]["result"]
        return sorted(str(n["node_ip"]) for n in nodes if n.get("state") == "ALIVE")

    def wait_nodes(self, count: int, timeout: float = 120.0) -> list[str]:
        """Block until ``count`` nodes are alive (a node's ``ray start`` takes seconds)."""
        deadline = time.monotonic() + timeout
        while len(alive := self.alive_nodes()) < count:
            if time.monotonic() > deadline:
                raise TimeoutError(f"{len(alive)} Ray nodes alive ({alive}), not {count}")
            time.sleep(0.5)  # polling a daemon's startup from outside: nothing to wait on
        return alive

    def _jobs_api_answers(self) -> bool:
        try:
            with urllib.request.urlopen(f"{self.address}/api/jobs/", timeout=5) as reply:
                return bool(reply.status == 200)
        except OSError:
            return False

    def request(self, method: str, path: str, body: dict[str, object] | None = None) -> object:
        """One call to the Jobs REST API, as ``ray job ...`` makes it."""
        data = json.dumps(body).encode() if body is not None else None
        req = urllib.request.Request(
            f"{self.address}{path}",
            data=data,
            method=method,
            headers={"Content-Type": "application/json"},
        )
        with urllib.request.urlopen(req, timeout=30) as reply:
            return json.loads(reply.read())

    def job(self, submission_id: str) -> dict[str, object]:
        got = self.request("GET", f"/api/jobs/{submission_id}")
        assert isinstance(got, dict)
        return got

    def job_resources(self, submission_id: str) -> dict[str, float]:
        """What the job's entrypoint holds: its supervisor actor's resources (state API)."""
        got = self.request("GET", "/api/v0/actors?detail=1&limit=10000")
        assert isinstance(got, dict)
        for actor in got["data"]["result"]["result"]:
            if actor.get("name") == f"_ray_internal_job_actor_{submission_id}":
                return dict(actor["required_resources"])
        raise KeyError(f"no supervisor actor for job {submission_id}")

    def wait_job(self, submission_id: str, states: set[str], timeout: float = 60.0) -> str:
        """Block until the job is in one of ``states`` (Ray's own state, polled as ``ray job
        status`` does); its state."""
        deadline = time.monotonic() + timeout
        while (status := str(self.job(submission_id)["status"])) not in states:
            if time.monotonic() > deadline:
                raise TimeoutError(f"job {submission_id} is {status}, not {sorted(states)}")
            time.sleep(0.2)
        return status

    def stop(self) -> None:
        """End the head (and the nodes that joined it) by their PIDs, then anything of them left
        (idempotent)."""
        nodes, self.nodes = self.nodes, []
        for node in nodes:
            _end(node)
        process, self.process = self.process, None
        if process is not None:
            _end(process)
        for pid in self._own_processes():
            try:
                os.kill(pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
        shutil.rmtree(self.temp_dir, ignore_errors=True)

    def _own_processes(self) -> list[int]:
        """Processes whose command line names this head's temporary directory."""
        mine = str(self.temp_dir).encode()
        pids = []
        for entry in Path("/proc").iterdir():
            if not entry.name.isdigit():
                continue
            try:
                if mine in (entry / "cmdline").read_bytes():
                    pids.append(int(entry.name))
            except OSError:
                continue
        return pids

    def __enter__(self) -> RayHead:
        try:
            self.start()
        except BaseException:
            self.stop()
            raise
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.stop()


def _end(process: subprocess.Popen[bytes]) -> None:
    """SIGTERM (Ray drains and stops what it started), a grace period, then its group killed."""
    if process.poll() is None:
        process.send_signal(signal.SIGTERM)
        try:
            process.wait(timeout=_STOP_GRACE_S)
        except subprocess.TimeoutExpired:
            pass
    try:
        os.killpg(process.pid, signal.SIGKILL)
    except ProcessLookupError:
        pass
    process.wait()
