"""End to end on a Redis Cluster: a VS Code debug session (Microsoft's DebugClient under node)
through two relay processes on a real cluster of three masters, with the master that holds the
run restarted while the program is paused.

The IDE's adapter talks to relay A, the worker to relay B: every message crosses from one relay to
the other through the cluster (stored in the run's slot, announced by a PUBLISH every node hears).
At a breakpoint the master holding the run's keys is stopped (SIGTERM) and started again from its
append-only file; the session then goes on as if nothing happened: locals, a step into another
file, a step out, and the program's end, all through the restarted master.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import trio
from direct_debugpy import copy_programs
from node_harness import open_vscode_session, scenario
from redis_cluster import RedisCluster
from stack import admin_token, debug_run, tether, worker
from test_node_harness_debugpy import LOOP_LINE, SCALE_FIRST

from protocol_specs.dap.schema import validate_message
from relay.store import keys

pytestmark = [pytest.mark.slow, pytest.mark.redis, pytest.mark.cluster, pytest.mark.timeout(240)]


async def test_a_vscode_session_through_two_relays_survives_a_master_restart(
    tmp_path: Path, redis_cluster: RedisCluster
) -> None:
    ws = copy_programs(tmp_path / "ws")
    train, mathutils = str(ws / "train.py"), str(ws / "mathutils.py")
    steps: list[dict[str, Any]] = [
        {"op": "mark", "name": "configured", "wait": True},  # the test starts a worker here
        {
            "op": "wait_stopped",
            "label": "hit",
            "reason": "breakpoint",
            "path": train,
            "line": LOOP_LINE,
        },
        {"op": "mark", "name": "paused", "wait": True},  # the run's master restarts here
        {"op": "variables", "label": "locals", "scope": "Locals"},
        {"op": "step_in"},
        {"op": "wait_stopped", "label": "in", "reason": "step", "path": mathutils},
        {"op": "step_out"},
        {"op": "wait_stopped", "label": "out", "function": "train_step"},
        {"op": "set_breakpoints", "path": train, "breakpoints": []},
        {"op": "continue"},
        {"op": "wait_terminated", "label": "end"},
        {"op": "disconnect"},
    ]
    home = tmp_path / "home"
    await admin_token(home, redis_cluster.url)
    relay_args = ("relay", "--redis", redis_cluster.url, "--port", "0")
    async with (
        tether(*relay_args, home=home, name="relay-a") as relay_a,
        tether(*relay_args, home=home, name="relay-b") as relay_b,
    ):
        url_a = (await relay_a.wait_line(r"ready relay=(\S+)")).group(1)
        url_b = (await relay_b.wait_line(r"ready relay=(\S+)")).group(1)
        async with debug_run(home, url_a, ws, "python", "train.py", "ok") as (debug, run, port):
            spec = scenario(
                port, ws, steps, breakpoints={"train.py": [LOOP_LINE]}, timeout_ms=90_000
            )
            async with open_vscode_session(spec, timeout=200) as session:
                await session.wait_mark("configured")
                async with worker(home, url_b):
                    await session.release("configured")
                    await session.wait_mark("paused")
                    owner = redis_cluster.owner(keys.record(run))
                    await trio.to_thread.run_sync(redis_cluster.restart, owner)
                    await session.release("paused")
                    result, messages = await session.result()
            await debug.wait_line(r"ended \(exited, exit code 0\)")
    labels = result["labels"]
    assert [f["name"] for f in labels["hit"]["frames"]] == ["train_step", "main", "<module>"]
    assert labels["locals"]["values"]["lr"] == "0.5"
    assert labels["in"]["frames"][0]["line"] == SCALE_FIRST
    assert labels["end"]["exitCode"] == 0
    for message in messages:
        validate_message(message)
