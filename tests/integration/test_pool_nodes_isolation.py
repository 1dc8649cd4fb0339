"""A root pool's nodes keep its isolation (``worker_shim/backends/nodes.py``): a real relay on a
real Redis-compatible server, a real root pool isolating programs (each under a uid of its own),
``--nodes 2`` with no ``--node-via`` (node 1's worker runs on this host, ``tether worker --run R
--attempt A --node 1``). Each node's program notes its uid and its directory's owner: both are
leased uids, not root, and each node's run directory belongs to its own program's uid.
"""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest
import trio
from live_relay import live_relay

from protocol_specs.runs.resources import Resources
from protocol_specs.runs.spec import RunSpec
from protocol_specs.session.session import StatusEvent
from protocol_specs.wire import wire
from protocol_specs.wire.wire import IdeLink, StatusEntry
from relay.client import open_control, open_run_link
from relay.store import Store
from worker_shim.backends.pool import run_pool
from worker_shim.program.identity import DEFAULT_UIDS, Isolation

pytestmark = [
    pytest.mark.redis,
    pytest.mark.slow,
    pytest.mark.timeout(120),
    pytest.mark.skipif(os.geteuid() != 0, reason="isolation needs a root worker"),
]

NOTE = (
    "import json, os; node = os.environ['TETHER_NODE']; "
    "json.dump({'uid': os.getuid(), 'gid': os.getgid(), 'cwd': os.getcwd(), "
    "'cwd_owner': os.stat('.').st_uid}, open(os.path.join(os.environ['OUT'], node + '.json'), 'w'))"
)


async def test_a_root_pools_second_node_runs_its_program_under_a_leased_uid_too(
    redis_store: Store, tmp_path: Path, shared_tmp: Path, runs_root: Path
) -> None:
    isolation = Isolation.decide()
    assert isolation.isolating and isolation.runs_root == runs_root
    spec = RunSpec(
        command=["/usr/bin/python3", "-c", NOTE], workdir="/w", debug=False, debuggable=False,
        env={"OUT": str(shared_tmp)}, resources=Resources(nodes=2),
    )  # fmt: skip
    said: list[str] = []
    exited: dict[str, int | None] = {}
    async with live_relay(redis_store) as relay, trio.open_nursery() as nursery:
        await nursery.start(
            lambda task_status: run_pool(
                relay.pool, slots=1, work_dir=tmp_path / "pool", gpus=[], name="p",
                on_event=said.append, isolation=isolation, nodes=2, task_status=task_status,
            )
        )  # fmt: skip
        async with open_control(relay.alice) as control:
            run = (await control.submit(spec)).id
        async with open_run_link(relay.alice, link=IdeLink(), run=run) as ide:
            with trio.fail_after(90):
                async for delivery in ide.deliveries:
                    entry = wire.decode_entry(delivery.entry)
                    if isinstance(entry, StatusEntry) and entry.event == StatusEvent.EXITED:
                        exited[entry.process] = entry.exit_code
                        if len(exited) == 2:
                            break
        nursery.cancel_scope.cancel()
    assert exited == {"": 0, "n1": 0}, said
    _check_housing(shared_tmp, runs_root, run)


def _check_housing(shared_tmp: Path, runs_root: Path, run: str) -> None:
    notes = {n: json.loads((shared_tmp / f"{n}.json").read_text()) for n in ("0", "1")}
    for node, note in notes.items():
        assert note["uid"] in DEFAULT_UIDS, (node, note)  # not root: a leased uid
        assert note["gid"] == note["uid"]
        assert note["cwd_owner"] == note["uid"], (node, note)
    # each node's run directory (under the runs root) belongs to its own program's uid
    [dir_0] = runs_root.glob(f"*/{run}-1")
    [dir_1] = runs_root.glob(f"*/{run}-1-n1")
    assert dir_0.stat().st_uid == notes["0"]["uid"]
    assert dir_1.stat().st_uid == notes["1"]["uid"]
    assert notes["1"]["cwd"].startswith(str(dir_1)), notes
