"""End to end with a DAP client nobody here wrote: Microsoft's DebugClient (npm
``@vscode/debugadapter-testsupport``, pinned), run with node through the scenario runner
(``node/vscode_scenario.mjs``), following VS Code's attach sequence against ``tether debug``.

The worker is started only once the IDE finished its configuration, so the first answers are given
before any worker exists. The same scenarios run straight against debugpy in
``test_node_harness_debugpy.py`` and side by side in ``test_differential_rich.py``.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
from direct_debugpy import copy_programs
from node_harness import open_vscode_session, scenario
from stack import debug_run, relay_stack, worker
from test_node_harness_debugpy import LOOP_LINE, SCALE_FIRST

from protocol_specs.dap.schema import validate_message

pytestmark = [pytest.mark.slow, pytest.mark.timeout(240)]


async def test_vscode_debugclient_session_through_tether(tmp_path: Path) -> None:
    ws = copy_programs(tmp_path / "ws")
    train, mathutils = str(ws / "train.py"), str(ws / "mathutils.py")
    steps: list[dict[str, Any]] = [
        {"op": "threads", "label": "queued_threads"},
        {"op": "mark", "name": "configured", "wait": True},  # the test starts a worker here
        {"op": "wait_breakpoints_verified", "label": "verified"},
        {
            "op": "wait_stopped",
            "label": "hit",
            "reason": "breakpoint",
            "path": train,
            "line": LOOP_LINE,
            "function": "train_step",
        },
        {"op": "variables", "label": "locals", "scope": "Locals"},
        {"op": "evaluate", "label": "repl", "expression": "loss + lr", "context": "repl"},
        {"op": "evaluate", "label": "hover", "expression": "lr", "context": "hover"},
        {"op": "step_in"},
        {
            "op": "wait_stopped",
            "label": "in",
            "reason": "step",
            "path": mathutils,
            "line": SCALE_FIRST,
            "function": "scale",
        },
        {"op": "step_out"},
        {"op": "wait_stopped", "label": "out", "function": "train_step"},
        {"op": "set_breakpoints", "path": train, "breakpoints": []},
        {"op": "continue"},
        {"op": "wait_terminated", "label": "end"},
        {"op": "disconnect"},
    ]
    home = tmp_path / "home"
    async with (
        relay_stack(home) as (_up, relay),
        debug_run(home, relay, ws, "python", "train.py", "ok") as (debug, _run, port),
    ):
        spec = scenario(port, ws, steps, breakpoints={"train.py": [LOOP_LINE]}, timeout_ms=60_000)
        async with open_vscode_session(spec, timeout=180) as session:
            await session.wait_mark("configured")
            async with worker(home, relay):
                await session.release("configured")
                result, messages = await session.result()
        await debug.wait_line(r"ended \(exited, exit code 0\)")
    labels = result["labels"]
    # answered before any worker existed: unverified, no threads
    [answer] = result["handshake"]["setBreakpoints"]
    [bp] = answer["breakpoints"]
    assert bp["verified"] is False and "waiting for a worker" in bp["message"]
    assert labels["queued_threads"]["threads"] == []
    # then verified by `breakpoint` events under the id the IDE already holds
    verified = labels["verified"]["breakpoints"][str(bp["id"])]
    assert verified["verified"] is True and verified["reason"] == "changed"
    hit = labels["hit"]
    assert hit["hitBreakpointIds"] == [bp["id"]]
    assert [f["name"] for f in hit["frames"]] == ["train_step", "main", "<module>"]
    assert hit["frames"][0]["path"] == train  # the local path, mapped back from the run directory
    assert labels["locals"]["values"]["lr"] == "0.5"
    assert (labels["repl"]["result"], labels["hover"]["result"]) == ("0.5", "0.5")
    assert labels["end"]["exitCode"] == 0
    assert "telemetry" not in result["output"]
    for message in messages:
        validate_message(message)
