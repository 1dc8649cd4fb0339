"""A run that spans two nodes (issue 43), both node workers on this host: the real relay on a real
Redis-compatible server, the real shim, real debugpy. Node 0 is claimed as a pool's slot claims
it; node 1 joins through ``run_node`` (``tether worker --run R --attempt A --node 1``), waits for
node 0's rendezvous, then starts. A breakpoint set while the run is queued, in the main session,
in a function both nodes' programs run, is hit on BOTH nodes (``stopped`` with process ``""`` and
``"n1"``); each program sees the rendezvous in its environment.
"""

from __future__ import annotations

import hashlib
import json
import sys
from pathlib import Path
from typing import Any

import orjson
import pytest
import trio
from live_relay import live_relay

from protocol_specs.runs.resources import Resources
from protocol_specs.runs.spec import RunSpec
from protocol_specs.session.session import StatusEvent
from protocol_specs.snapshots.snapshots import Manifest, ManifestEntry
from protocol_specs.wire import wire
from protocol_specs.wire.wire import DapEntry, IdeLink, StatusEntry
from relay.client import open_control, open_run_link
from relay.store import Store
from worker_shim.backends.pool import run_node
from worker_shim.shim import run_shim

pytestmark = [pytest.mark.slow, pytest.mark.timeout(180)]

WORKDIR = "/home/me/project"
MAIN = """\
import json, os

NAMES = ("NNODES", "NODE_RANK", "MASTER_ADDR", "MASTER_PORT", "PET_NNODES", "PET_NODE_RANK",
         "PET_RDZV_ENDPOINT", "PET_RDZV_ID", "TETHER_NODE", "TETHER_NNODES")


def check(node):
    value = node * 10
    return value  # BOTH


node = int(os.environ["TETHER_NODE"])
with open(os.path.join(os.environ["OUT"], f"env-{node}.json"), "w") as f:
    json.dump({name: os.environ.get(name) for name in NAMES}, f)
check(node)
"""
LINE = next(n for n, line in enumerate(MAIN.splitlines(), 1) if "# BOTH" in line)


def stopped(entry: Any) -> bool:
    return isinstance(entry, DapEntry) and orjson.loads(entry.body).get("event") == "stopped"


async def test_a_breakpoint_set_while_queued_is_hit_on_both_nodes_of_a_two_node_run(
    tmp_path: Path, redis_store: Store
) -> None:
    out = tmp_path / "out"
    out.mkdir()
    data = MAIN.encode()
    digest = hashlib.sha256(data).hexdigest()
    manifest = Manifest(entries=[ManifestEntry(path="main.py", size=len(data), digest=digest)])
    spec = RunSpec(
        command=[sys.executable, "main.py"],
        workdir=WORKDIR,
        wait_for_ide=False,
        env={"OUT": str(out)},
        resources=Resources(nodes=2),
        on_unattended_stop="continue",
        unattended_timeout=0,
    )
    bp = {
        "seq": 1,
        "type": "request",
        "command": "setBreakpoints",
        "arguments": {"source": {"path": f"{WORKDIR}/main.py"}, "breakpoints": [{"line": LINE}]},
    }
    seen: list[DapEntry | StatusEntry] = []
    codes: dict[int, int | None] = {}
    said: list[str] = []
    done = {0: trio.Event(), 1: trio.Event()}
    async with live_relay(redis_store) as relay, trio.open_nursery() as nursery:
        async with open_control(relay.alice) as alice:
            await alice.put_blob(digest, data)
            record = await alice.submit(spec, manifest)
        async with open_run_link(relay.alice, link=IdeLink(), run=record.id) as ide:
            await ide.publish(DapEntry(origin="ide1", body=orjson.dumps(bp), bp_ids=[1]))
            await ide.flush()
            async with open_control(relay.pool) as pool:
                assigned = await pool.claim("w-0")
            as_worker = relay.bare(assigned.token)

            async def node_0() -> None:
                async with open_control(as_worker) as control:
                    codes[0] = await run_shim(
                        as_worker, assigned.run, assigned.manifest, runs_dir=tmp_path / "n0",
                        fetch=control.read_blob, cache=tmp_path / "cache0", python=sys.executable,
                    )  # fmt: skip
                done[0].set()

            async def node_1() -> None:
                codes[1] = await run_node(
                    as_worker, record.id, assigned.run.attempt, 1, work_dir=tmp_path / "n1",
                    worker="w-1", on_event=said.append,
                )  # fmt: skip
                done[1].set()

            nursery.start_soon(node_0)
            nursery.start_soon(node_1)
            exited: dict[str, int | None] = {}
            with trio.fail_after(120):
                async for delivery in ide.deliveries:
                    entry = wire.decode_entry(delivery.entry)
                    if isinstance(entry, DapEntry | StatusEntry):
                        seen.append(entry)
                    if isinstance(entry, StatusEntry) and entry.event == StatusEvent.EXITED:
                        exited[entry.process] = entry.exit_code
                        if len(exited) == 2:
                            break
        with trio.fail_after(30):  # the workers return once their exit is out
            for event in done.values():
                await event.wait()
        nursery.cancel_scope.cancel()
    assert exited == {"": 0, "n1": 0}
    assert codes == {0: 0, 1: 0}
    # the breakpoint, set in the main session while queued, stopped both nodes' programs
    hits = {e.process for e in seen if stopped(e)}
    assert hits == {"", "n1"}
    for entry in seen:
        if stopped(entry):
            assert orjson.loads(entry.body)["body"]["reason"] == "breakpoint"
    # node 1's program was announced like a child, named with its node
    [announced] = [
        e for e in seen if isinstance(e, StatusEntry) and e.event == StatusEvent.PROCESS_STARTED
    ]
    assert announced.process == "n1" and " on node 1 " in announced.detail
    # node 0 published the rendezvous; node 1 said it waited for it
    [started_0] = [
        e
        for e in seen
        if isinstance(e, StatusEntry) and e.event == StatusEvent.STARTED and e.process == ""
    ]
    rdzv = started_0.data["rendezvous"]
    assert rdzv["addr"] == "127.0.0.1" and rdzv["port"] > 0
    assert any("waiting for node 0's rendezvous" in line for line in said)
    envs = {n: json.loads((out / f"env-{n}.json").read_text()) for n in (0, 1)}
    for n, env in envs.items():
        assert env == {
            "NNODES": "2",
            "NODE_RANK": str(n),
            "MASTER_ADDR": "127.0.0.1",
            "MASTER_PORT": str(rdzv["port"]),
            "PET_NNODES": "2",
            "PET_NODE_RANK": str(n),
            "PET_RDZV_ENDPOINT": f"127.0.0.1:{rdzv['port']}",
            "PET_RDZV_ID": record.id,
            "TETHER_NODE": str(n),
            "TETHER_NNODES": "2",
        }
