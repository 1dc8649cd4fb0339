"""Every node's tunnels (issue 43): a real relay on a real Redis-compatible server, a real pool with
``--nodes 2`` (node 1's worker a real ``tether worker --run R --attempt A --node 1`` process on
this host, in its own directory), real debugpy and py-spy. Each node's program is a launcher that
starts one rank (``RANK`` = its node), which stops at a breakpoint set while the run is queued.
``tether stacks`` and ``tether eval`` show the ranks of BOTH nodes (a tunnel per node, merged);
``tether exec --node 1`` runs on node 1 (``TETHER_NODE=1`` in its environment); a node the run
does not have is refused at once, in one line.
"""

from __future__ import annotations

import hashlib
import io
import json
import sys
from pathlib import Path

import orjson
import pytest
import trio
from live_relay import live_relay

from adapter.cli.parser import build_parser
from adapter.cli.tunnel import _open, open_tunnel_once, run_tunnel
from protocol_specs.runs.resources import Resources
from protocol_specs.runs.spec import RunSpec
from protocol_specs.session.session import StatusEvent
from protocol_specs.snapshots.snapshots import Manifest, ManifestEntry
from protocol_specs.wire import wire
from protocol_specs.wire.tunnels import TunnelSpec
from protocol_specs.wire.wire import DapEntry, IdeLink, StatusEntry
from relay.client import open_control, open_run_link
from relay.store import Store
from worker_shim.backends.pool import run_pool

pytestmark = [pytest.mark.redis, pytest.mark.slow, pytest.mark.timeout(240)]

WORKDIR = "/home/me/project"
MAIN = """\
import os, subprocess, sys

node = int(os.environ["TETHER_NODE"])
if "RANK" not in os.environ:  # the node's launcher: one rank per node, as torchrun's would
    env = {**os.environ, "RANK": str(node), "LOCAL_RANK": "0", "WORLD_SIZE": "2"}
    sys.exit(subprocess.call([sys.executable, os.path.abspath(__file__)], env=env))


def step(rank):
    value = rank * 10 + 7
    return value  # STOP


step(int(os.environ["RANK"]))
"""
LINE = next(n for n, line in enumerate(MAIN.splitlines(), 1) if "# STOP" in line)
VALUE = "int(os.environ['RANK']) * 10 + 7"


async def cli(*argv: str) -> None:
    args = build_parser().parse_args(list(argv))
    await args.fn(args)


async def test_stacks_eval_and_exec_reach_every_node_of_a_two_node_run(
    tmp_path: Path,
    redis_store: Store,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> None:
    data = MAIN.encode()
    digest = hashlib.sha256(data).hexdigest()
    manifest = Manifest(entries=[ManifestEntry(path="main.py", size=len(data), digest=digest)])
    spec = RunSpec(
        command=[sys.executable, "main.py"], workdir=WORKDIR, wait_for_ide=False,
        resources=Resources(nodes=2), stop="one",  # each rank at its breakpoint, none paused by the group
    )  # fmt: skip
    bp = {
        "seq": 1, "type": "request", "command": "setBreakpoints",
        "arguments": {"source": {"path": f"{WORKDIR}/main.py"}, "breakpoints": [{"line": LINE}]},
    }  # fmt: skip
    said: list[str] = []
    async with live_relay(redis_store) as relay, trio.open_nursery() as nursery:
        monkeypatch.setenv("TETHER_HOME", str(tmp_path / "home"))
        monkeypatch.setenv("TETHER_TOKEN", relay.alice.token)
        async with open_control(relay.alice) as alice:
            await alice.put_blob(digest, data)
            run = (await alice.submit(spec, manifest)).id
        async with open_run_link(relay.alice, link=IdeLink(), run=run) as ide:
            await ide.publish(DapEntry(origin="ide1", body=orjson.dumps(bp), bp_ids=[1]))
            await ide.flush()
            await nursery.start(
                lambda task_status: run_pool(
                    relay.pool, slots=1, work_dir=tmp_path / "pool", gpus=[], name="p",
                    on_event=said.append, nodes=2, task_status=task_status,
                )
            )  # fmt: skip
            paused: set[str] = set()
            with trio.fail_after(150):  # each node's rank stops at the breakpoint
                async for delivery in ide.deliveries:
                    entry = wire.decode_entry(delivery.entry)
                    if isinstance(entry, StatusEntry) and entry.event == StatusEvent.PAUSED:
                        if entry.process not in ("", "n1"):  # a rank, not a node's launcher
                            paused.add(entry.process)
                    if len(paused) == 2:
                        break
        assert {key.startswith("n1:") for key in paused} == {True, False}, paused

        with trio.fail_after(60):
            await cli("stacks", "--relay", relay.url, run)
        stacks = capsys.readouterr()
        with trio.fail_after(60):
            await cli("stacks", "--relay", relay.url, run, "--json")
        report = json.loads(capsys.readouterr().out)
        with trio.fail_after(60):
            await cli("eval", "--relay", relay.url, run, VALUE)
        evaluated = capsys.readouterr()

        out, err = io.BytesIO(), io.BytesIO()
        command = ["sh", "-c", 'echo "node=$TETHER_NODE nnodes=$TETHER_NNODES"; pwd']
        with trio.fail_after(60):
            opened = await open_tunnel_once(
                relay.alice, run, TunnelSpec(kind="exec", argv=command, node=1)
            )
            assert isinstance(opened, wire.TunnelOpened), opened
            code, problem = await run_tunnel(relay.alice, opened, stdin=None, out={1: out, 2: err})
            on_0 = io.BytesIO()
            opened_0 = await open_tunnel_once(
                relay.alice, run, TunnelSpec(kind="exec", argv=command)
            )
            assert isinstance(opened_0, wire.TunnelOpened), opened_0
            code_0, _ = await run_tunnel(relay.alice, opened_0, stdin=None, out={1: on_0, 2: err})
            refused = await _open(relay.alice, run, TunnelSpec(kind="exec", argv=command, node=2))
        async with open_control(relay.alice) as alice:
            await alice.cancel(run)
        nursery.cancel_scope.cancel()

    # tether stacks: both nodes' ranks, merged; the paused ones named with their node
    assert not stacks.err, stacks.err
    lines = stacks.out.splitlines()
    assert (
        lines[0]
        == f"run {run}: 4 Python processes, 2 paused, in 2 places (main threads, outermost call first)"
    ), "\n".join(lines)
    assert any(
        line.startswith("ranks 0-1 (paused: breakpoint): ") and f"main.py:{LINE} step" in line
        for line in lines
    ), "\n".join(lines)
    processes = {(p["node"], p["rank"]): p for p in report["processes"]}
    assert set(processes) == {(0, None), (0, 0), (1, None), (1, 1)}, processes
    assert " on node 1 " in processes[(1, 1)]["name"] and processes[(1, 1)]["state"] == "paused"
    assert processes[(0, 0)]["state"] == "paused" and "node" not in processes[(0, 0)]["name"]
    # tether eval: every node's rank
    assert not evaluated.err, evaluated.err
    assert evaluated.out.splitlines()[:3] == [
        f"run {run}: {VALUE}  (2 of 2 ranks evaluated)", "rank 0: 7", "rank 1: 17",
    ]  # fmt: skip
    # tether exec --node 1: node 1's worker ran it, in node 1's own directory
    assert (code, problem) == (0, ""), err.getvalue()
    node_line, where = out.getvalue().decode().splitlines()
    assert node_line == "node=1 nnodes=2"
    assert where.startswith(str(tmp_path / "pool" / "nodes" / "node1")), where
    assert code_0 == 0 and on_0.getvalue().decode().splitlines()[0] == "node=0 nnodes=2"
    assert refused == f"the command did not run: run {run} has no node 2: it runs on nodes 0-1"
