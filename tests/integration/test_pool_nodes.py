"""The local pool's nodes (``worker_shim/backends/nodes.py``): a real relay on a real
Redis-compatible server, a real pool with ``--nodes 2``, a run asking two nodes. Node 0 runs in
the pool's slot as any run; node 1's worker is launched through its ``--node-via`` prefix, here a
stand-in (``node_standin.py``) that notes how it was started instead of running the worker: its
command line, the worker token in its environment (the attempt's, looked up in the relay's
store), its own directory; it never ends by itself, so the pool stops it once node 0 ended.
"""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path

import pytest
import trio
from live_relay import live_relay

from protocol_specs.runs.resources import Resources
from protocol_specs.runs.spec import RunSpec
from relay.auth import TokenStore
from relay.client import open_control
from relay.server import RelayConfig
from relay.store import Store
from worker_shim.backends import nodes as nodes_module
from worker_shim.backends.pool import run_pool

pytestmark = [pytest.mark.redis, pytest.mark.slow, pytest.mark.timeout(120)]

STANDIN = """
import json, os, sys, time
out = os.environ["NODE_STANDIN_OUT"]
with open(out + ".tmp", "w") as f:
    json.dump({"argv": sys.argv[1:], "token": os.environ.get("TETHER_TOKEN", ""),
               "mark": os.environ.get("TETHER_MARK", ""), "pid": os.getpid()}, f)
os.rename(out + ".tmp", out)
print("node worker stand-in up", flush=True)
while True:
    time.sleep(60)
"""


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    try:  # a zombie is gone for this purpose
        return Path(f"/proc/{pid}/stat").read_text().split()[2] != "Z"
    except OSError:
        return False


async def test_the_pool_launches_a_runs_second_node_with_the_attempts_token_and_stops_it(
    redis_store: Store, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(nodes_module, "NODE_GRACE", 0.5)
    standin = tmp_path / "node_standin.py"
    standin.write_text(STANDIN)
    noted = tmp_path / "noted.json"
    monkeypatch.setenv("NODE_STANDIN_OUT", str(noted))
    said: list[str] = []
    stopped = trio.Event()

    def say(text: str) -> None:
        said.append(text)
        if "node 1: its worker was still running" in text:
            stopped.set()

    spec = RunSpec(
        command=["python", "-c", "print('node 0 ran')"], workdir="/w", debug=False,
        debuggable=False, resources=Resources(nodes=2),
    )  # fmt: skip
    async with live_relay(redis_store, RelayConfig(lease=3.0)) as relay:
        async with trio.open_nursery() as nursery:
            await nursery.start(
                lambda task_status: run_pool(
                    relay.pool, slots=1, work_dir=tmp_path / "pool", gpus=[], name="p",
                    on_event=say, nodes=2, node_via=[[sys.executable, str(standin)]],
                    task_status=task_status,
                )
            )  # fmt: skip
            async with open_control(relay.alice) as control:
                run = (await control.submit(spec)).id
            with trio.fail_after(60):
                await stopped.wait()
            nursery.cancel_scope.cancel()

    got = json.loads(noted.read_text())
    work_dir = tmp_path / "pool" / "nodes" / "node1"
    assert got["argv"] == [
        sys.executable, "-m", "adapter.cli", "worker", "--run", run, "--attempt", "1", "--node", "1",
        "--work-dir", str(work_dir), "--relay", relay.url, "--no-isolation",
    ]  # fmt: skip
    assert work_dir.is_dir()
    # the attempt's worker token, in the environment only
    info = await TokenStore(redis_store).get(got["token"].split("_")[1])
    assert info is not None and (info.run, info.attempt) == (run, 1), info
    assert got["mark"].endswith(f"/nodes-{run}-1")  # the pool's guard ends it with the pool
    assert any("p-0: node 1: node worker stand-in up" in line for line in said), said
    assert not _alive(got["pid"]), "the node's worker was stopped once node 0 ended"
