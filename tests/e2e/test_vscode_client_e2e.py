"""End to end with a DAP client nobody here wrote: Microsoft's DebugClient (npm
``@vscode/debugadapter-testsupport``, pinned), run with node, following VS Code's attach sequence.

Also the differential test: the same scripted session straight against debugpy and through tether
gives the same answers once ``seq``, ids and timing-dependent fields are normalised.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
import trio
from stack import PROJECT, Proc, debug_run, relay_stack, worker

from adapter.demo import VSCODE_INITIALIZE
from protocol_specs.dap_schema import validate_message

pytestmark = [pytest.mark.slow, pytest.mark.timeout(240)]

NODE_DIR = Path(__file__).resolve().parent / "node"
SCRIPT = NODE_DIR / "vscode_session.mjs"


def ensure_node_modules() -> None:
    if shutil.which("node") is None or shutil.which("npm") is None:
        pytest.fail("the end-to-end tests need node and npm on the PATH (see README)")
    if not (NODE_DIR / "node_modules" / "@vscode" / "debugadapter-testsupport").is_dir():
        subprocess.run(
            ["npm", "ci", "--no-audit", "--no-fund", "--loglevel=error"], cwd=NODE_DIR, check=True
        )


@pytest.fixture
def workdir(tmp_path: Path) -> Path:
    dest = tmp_path / "project"
    dest.mkdir()
    for f in PROJECT.glob("*.py"):
        (dest / f.name).write_text(f.read_text())
    return dest


def scenario(tmp_path: Path, workdir: Path, port: int, *, direct: bool) -> Path:
    spec = {
        "port": port,
        "direct": direct,
        "initialize": {**VSCODE_INITIALIZE, "supportsStartDebuggingRequest": False},
        "attach": {
            "name": "Python Debugger: Remote Attach",
            "type": "debugpy",
            "request": "attach",
            "connect": {"host": "127.0.0.1", "port": port},
            "justMyCode": True,
            "debugOptions": ["RedirectOutput", "ShowReturnValue"],
            "showReturnValue": True,
            "workspaceFolder": str(workdir),
            "clientOS": "unix",
            # straight against debugpy the program runs in the workspace itself
            **(
                {"pathMappings": [{"localRoot": str(workdir), "remoteRoot": "."}]} if direct else {}
            ),
        },
        "breakpoints": [
            {"path": str(workdir / "app.py"), "lines": [11]},
            {"path": str(workdir / "helpers.py"), "lines": [6]},
        ],
        "expression": "factor * 2 + total",
        "record": str(tmp_path / f"messages-{'direct' if direct else 'tether'}.jsonl"),
    }
    path = tmp_path / f"scenario-{'direct' if direct else 'tether'}.json"
    path.write_text(json.dumps(spec))
    return path


async def run_node(
    path: Path, on_configured: Any = None
) -> tuple[dict[str, Any], list[dict[str, Any]]]:
    process = await trio.lowlevel.open_process(
        ["node", str(SCRIPT), str(path)], stdout=subprocess.PIPE, stderr=subprocess.STDOUT
    )
    proc = Proc(process, "node")
    async with trio.open_nursery() as nursery:
        nursery.start_soon(proc.pump)
        m = await proc.wait_line(r"^(CONFIGURED|ERROR) ", timeout=60)
        assert m.group(1) == "CONFIGURED", proc.output
        if on_configured is not None:
            async with on_configured():
                m = await proc.wait_line(r"^(RESULT|ERROR) ", timeout=120)
        else:
            m = await proc.wait_line(r"^(RESULT|ERROR) ", timeout=120)
        assert m.group(1) == "RESULT", proc.output
        await process.wait()
    line = next(line for line in proc.lines if line.startswith("RESULT "))
    record = json.loads(path.read_text())["record"]  # noqa: ASYNC240
    messages = [json.loads(line) for line in Path(record).read_text().splitlines()]  # noqa: ASYNC240
    return json.loads(line[len("RESULT ") :]), messages


async def test_vscode_debugclient_session_through_tether(tmp_path: Path, workdir: Path) -> None:
    ensure_node_modules()
    home = tmp_path / "home"
    async with (
        relay_stack(home) as (_up, relay),
        debug_run(home, relay, workdir, "python", "app.py") as (debug, _run_id, port),
    ):
        result, messages = await run_node(
            scenario(tmp_path, workdir, port, direct=False), lambda: worker(home, relay)
        )
        await debug.wait_line(r"ended \(exited, exit code 0\)")
    # answered before any worker existed
    queued = result["queued"]
    assert [b["verified"] for bps in queued["breakpoints"] for b in bps] == [False, False]
    assert queued["threads"] == []
    ids = [b["id"] for bps in queued["breakpoints"] for b in bps]
    assert sorted(int(i) for i in result["verified"]) == sorted(ids)
    assert all(v["reason"] == "changed" for v in result["verified"].values())
    stopped = result["stopped"]
    assert stopped["frame"] == {
        **stopped["frame"],
        "name": "compute",
        "line": 11,
        "path": str(workdir / "app.py"),
    }
    assert stopped["hitBreakpointIds"] == [ids[0]]
    assert stopped["callers"][:2] == ["main", "<module>"]
    assert result["locals"]["values"]["factor"] == "10"
    assert result["evaluate"] == {"repl": "20", "hover": "20", "watch": "20"}
    steps = [(s["reason"], s["frame"]["name"], s["frame"]["line"]) for s in result["steps"]]
    # next from compute:11 runs into the breakpoint in scale:6; stepIn on a return leaves to the
    # caller; stepOut of compute runs into compute's breakpoint on the next iteration
    assert steps == [
        ("breakpoint", "scale", 6),
        ("step", "compute", 11),
        ("breakpoint", "compute", 11),
    ], steps
    assert result["exitCode"] == 0
    for message in messages:
        validate_message(message)
    assert not any(
        m.get("event") == "output" and m["body"].get("category") == "telemetry" for m in messages
    )


def normalise(result: dict[str, Any]) -> dict[str, Any]:
    """Drop what legitimately differs: seq, thread/frame/breakpoint ids, tether's own additions."""

    def step(s: dict[str, Any]) -> dict[str, Any]:
        return {
            "reason": s["reason"],
            "name": s["frame"]["name"],
            "line": s["frame"]["line"],
            "path": s["frame"]["path"],
            "totalFrames": s["totalFrames"],
            "callers": s["callers"],
        }

    capabilities = dict(result["capabilities"])
    capabilities.pop("supportTerminateDebuggee", None)  # tether adds the correctly spelled key
    return {
        "capabilities": capabilities,
        "stopped": step(result["stopped"]),
        "locals": result["locals"],
        "evaluate": result["evaluate"],
        "steps": [step(s) for s in result["steps"]],
        "continued": result["continued"],
    }


async def test_differential_debugpy_direct_and_through_tether_agree(
    tmp_path: Path, workdir: Path
) -> None:
    ensure_node_modules()
    # 1. straight against debugpy, the program in the workspace
    endpoints = tmp_path / "endpoints.json"
    direct_dir = tmp_path / "direct"
    direct_dir.mkdir()
    argv = [
        sys.executable,
        "-X",
        "frozen_modules=off",
        "-m",
        "debugpy",
        "--listen",
        "127.0.0.1:0",
        "--wait-for-client",
        "--configure-subProcess",
        "false",
        "app.py",
    ]
    env = {
        **os.environ,
        "DEBUGPY_ADAPTER_ENDPOINTS": str(endpoints),
        "PYDEVD_DISABLE_FILE_VALIDATION": "1",
    }
    debuggee = await trio.lowlevel.open_process(
        argv, cwd=str(workdir), env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL
    )
    try:
        with trio.fail_after(30):
            while not endpoints.exists() or not endpoints.read_text():  # noqa: ASYNC110
                await trio.sleep(
                    0.02
                )  # debugpy writes this file when it listens (never TCP-probe it)
        port = json.loads(endpoints.read_text())["client"]["port"]
        spec = scenario(tmp_path, workdir, port, direct=True)
        direct, _ = await _run_direct(spec)
    finally:
        debuggee.kill()
        await debuggee.wait()
    # 2. the same session through tether
    home = tmp_path / "home"
    async with (
        relay_stack(home) as (_up, relay),
        debug_run(home, relay, workdir, "python", "app.py") as (_debug, _run, port),
    ):
        tethered, _ = await run_node(
            scenario(tmp_path, workdir, port, direct=False), lambda: worker(home, relay)
        )
    assert normalise(tethered) == normalise(direct)


async def _run_direct(path: Path) -> tuple[dict[str, Any], list[dict[str, Any]]]:
    """debugpy verifies at once and sends no breakpoint events, no exited event in attach mode."""
    process = await trio.lowlevel.open_process(
        ["node", str(SCRIPT), str(path)], stdout=subprocess.PIPE, stderr=subprocess.STDOUT
    )
    proc = Proc(process, "node")
    async with trio.open_nursery() as nursery:
        nursery.start_soon(proc.pump)
        m = await proc.wait_line(r"^(RESULT|ERROR) ", timeout=120)
        assert m.group(1) == "RESULT", proc.output
        await process.wait()
    line = next(line for line in proc.lines if line.startswith("RESULT "))
    return json.loads(line[len("RESULT ") :]), []
