"""Differential test on a long session: the same VS Code-shaped scenario (Microsoft's DebugClient,
``rich_steps``) straight against debugpy and through tether must give the same answers once seq,
ids, references and timing are normalised. Only what legitimately differs is set aside: how
breakpoints are verified (tether answers before a worker exists, then sends ``breakpoint``
events), debugpy's telemetry events, and how the session ends (tether adds ``exited``)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import trio
from direct_debugpy import copy_programs, listening_debugpy
from node_harness import normalise, run_vscode_session, scenario
from stack import debug_run, relay_stack
from test_node_harness_debugpy import LOOP_LINE, rich_steps

from protocol_specs.dap.schema import validate_message

pytestmark = [pytest.mark.slow, pytest.mark.timeout(240)]

#: labels whose answers legitimately differ: the connection's first messages (debugpy's telemetry),
#: the handshake (breakpoints verified later by events), the session's end (tether adds `exited`)
DIFFERENT_BY_DESIGN = {"connect", "handshake", "terminated", "disconnect"}


def comparable(result: dict[str, Any], workspace: Path) -> dict[str, Any]:
    labels = {k: v for k, v in result["labels"].items() if k not in DIFFERENT_BY_DESIGN}
    for step in labels.values():
        if step.get("op") == "wait_output":  # tether's own status lines share the debug console
            step["text"] = step["text"].splitlines()[-1]
    return normalise(labels, paths={str(workspace): "<ws>"}, drop=frozenset({"raw"}))


async def test_rich_session_matches_debugpy(tmp_path: Path) -> None:
    direct_ws = copy_programs(tmp_path / "direct" / "ws")
    with listening_debugpy(direct_ws, "train.py", "ok") as debuggee:
        direct, _ = await trio.to_thread.run_sync(
            lambda: run_vscode_session(
                scenario(
                    debuggee.port,
                    direct_ws,
                    rich_steps(direct_ws),
                    breakpoints={"train.py": [LOOP_LINE]},
                ),
                timeout=120,
            )
        )
    tether_ws = copy_programs(tmp_path / "tether" / "ws")
    home = tmp_path / "home"
    async with (
        relay_stack(home, workers=1) as (_up, relay),
        debug_run(home, relay, tether_ws, "python", "train.py", "ok") as (debug, _run, port),
    ):
        tethered, messages = await trio.to_thread.run_sync(
            lambda: run_vscode_session(
                scenario(
                    port, tether_ws, rich_steps(tether_ws), breakpoints={"train.py": [LOOP_LINE]}
                ),
                timeout=120,
            )
        )
        await debug.wait_line(r"ended \(exited, exit code 0\)")
    assert tethered["ok"], tethered.get("error")
    got, want = comparable(tethered, tether_ws), comparable(direct, direct_ws)
    differing = {
        k: (got.get(k), want.get(k)) for k in set(got) | set(want) if got.get(k) != want.get(k)
    }
    assert not differing, differing
    assert len(got) >= 20  # the comparison covered the whole session
    capabilities = dict(tethered["capabilities"])
    assert capabilities.pop("supportTerminateDebuggee") is True
    assert capabilities == direct["capabilities"]
    assert tethered["labels"]["terminated"]["exitCode"] == 0  # tether's `exited` carries it
    assert "telemetry" not in tethered["output"]
    for message in messages:
        validate_message(message)
