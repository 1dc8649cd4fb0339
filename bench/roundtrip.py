"""Round-trip latency of DAP requests while paused: straight to debugpy vs through tether.

    .venv/bin/python bench/roundtrip.py [--requests N]

Both measured in the same run on this machine (ratios, not absolutes, are the point): the baseline
is a DAP client attached to ``python -m debugpy --listen`` directly; tether's path is IDE -> adapter
-> relay -> Redis -> worker shim -> debugpy and back, all on loopback with the bundled server.
Writes a JSON report to ``bench/results/roundtrip.json``.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import trio

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from adapter.dap_client import DapClient, open_dap_client  # noqa: E402
from adapter.demo import VSCODE_INITIALIZE  # noqa: E402

PROGRAM = ROOT / "tests" / "e2e" / "project"
COMMANDS: list[tuple[str, Any]] = [
    ("threads", None),
    ("stackTrace", "frames"),
    ("evaluate", "expr"),
]


async def configure(client: DapClient, workdir: Path, *, mappings: bool) -> dict[str, Any]:
    await client.request("initialize", VSCODE_INITIALIZE)
    attach_args: dict[str, Any] = {"justMyCode": True}
    if mappings:
        attach_args["pathMappings"] = [{"localRoot": str(workdir), "remoteRoot": "."}]
    attach = client.send_request_nowait("attach", attach_args)
    await client.wait_event("initialized")
    source = {"path": str(workdir / "app.py")}
    await client.request("setBreakpoints", {"source": source, "breakpoints": [{"line": 11}]})
    await client.request("configurationDone")
    await client.response(attach)
    return await client.wait_event("stopped", timeout=120)


async def measure(client: DapClient, thread: int, n: int) -> dict[str, float]:
    stack = await client.request("stackTrace", {"threadId": thread, "levels": 1})
    frame = stack["body"]["stackFrames"][0]["id"]
    args = {
        "threads": None,
        "stackTrace": {"threadId": thread, "startFrame": 0, "levels": 20},
        "evaluate": {"expression": "factor * 2", "frameId": frame, "context": "watch"},
    }
    result = {}
    for command, arguments in args.items():
        samples = []
        for _ in range(n):
            t0 = time.perf_counter()
            response = await client.request(command, arguments)
            samples.append((time.perf_counter() - t0) * 1000)
            assert response["success"], response
        result[command] = statistics.median(samples)
    return result


async def direct(workdir: Path, n: int) -> dict[str, float]:
    """Stock debugpy (``python -m debugpy --listen``), the program in the workspace itself."""
    from worker_shim.debuggee import start_debuggee

    async with (
        start_debuggee(
            ["python", "app.py"],
            cwd=str(workdir),
            env=dict(os.environ),
            log_path=str(workdir.parent / "direct.log"),
            fast=False,
        ) as debuggee,
        open_dap_client("127.0.0.1", debuggee.port) as client,
    ):
        stopped = await configure(client, workdir, mappings=True)
        return await measure(client, stopped["body"]["threadId"], n)


async def through_tether(workdir: Path, tmp: Path, n: int) -> dict[str, float]:
    from adapter.cli import build_spec, submit_run
    from adapter.local_stack import open_local_stack
    from adapter.server import serve_adapter

    async with open_local_stack(tmp, workers=1) as stack, trio.open_nursery() as nursery:
        relay = stack.endpoint
        args = argparse.Namespace(
            command=["python", "app.py"],
            workdir=str(workdir),
            env=[],
            name="bench",
            no_wait=False,
        )
        record = await submit_run(relay, build_spec(args, debug=True), lambda _t: None)
        port = await nursery.start(
            lambda task_status: serve_adapter(relay, record.id, port=0, task_status=task_status)
        )
        async with open_dap_client("127.0.0.1", port) as client:
            stopped = await configure(client, workdir, mappings=False)
            result = await measure(client, stopped["body"]["threadId"], n)
        nursery.cancel_scope.cancel()
    return result


async def main(n: int) -> None:
    tmp = Path(tempfile.mkdtemp(prefix="tether-bench-"))
    workdir = tmp / "project"
    shutil.copytree(PROGRAM, workdir)
    try:
        baseline = await direct(workdir, n)
        tethered = await through_tether(workdir, tmp, n)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    report = {
        "requests_per_command": n,
        "median_ms": {"debugpy_direct": baseline, "through_tether": tethered},
        "ratio_tether_over_direct": {k: tethered[k] / baseline[k] for k in baseline},
    }
    out = ROOT / "bench" / "results" / "roundtrip.json"
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(report, indent=2))
    print(f"{'request':<12}{'debugpy direct':>16}{'through tether':>16}{'ratio':>8}")
    for k in baseline:
        print(
            f"{k:<12}{baseline[k]:>13.2f} ms{tethered[k]:>13.2f} ms{tethered[k] / baseline[k]:>8.2f}"
        )
    print(f"report: {out}")


if __name__ == "__main__":
    parser = argparse.ArgumentParser()
    parser.add_argument("--requests", type=int, default=20)
    trio.run(main, parser.parse_args().requests)
