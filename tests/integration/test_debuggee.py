"""Starting programs under real debugpy: readiness without probing, exit codes, cleanup."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from adapter.dap_client import open_dap_client
from worker_shim.debuggee import start_debuggee

pytestmark = [pytest.mark.slow, pytest.mark.timeout(60)]


def _group_members(pgid: int) -> list[int]:
    members = []
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                fields = (entry / "stat").read_text().rsplit(")", 1)[1].split()
            except OSError:
                continue
            if int(fields[2]) == pgid:
                members.append(int(entry.name))
    return members


async def _run_to_end(port: int) -> None:
    async with open_dap_client("127.0.0.1", port) as ide:
        await ide.request("initialize", {"adapterID": "debugpy"})
        attach = ide.send_request_nowait("attach", {"justMyCode": True})
        await ide.wait_event("initialized")
        await ide.request("configurationDone")
        await ide.response(attach)
        await ide.wait_event("terminated", timeout=30)


@pytest.mark.parametrize("fast", [True, False])
async def test_held_until_configured_then_exit_code_is_reported(tmp_path: Path, fast: bool) -> None:
    (tmp_path / "prog.py").write_text(
        "import pathlib, sys\npathlib.Path('ran').write_text('yes')\nsys.exit(3)\n"
    )
    async with start_debuggee(
        ["python", "prog.py"],
        cwd=str(tmp_path),
        env=dict(os.environ),
        log_path=str(tmp_path / "log"),
        fast=fast,
    ) as debuggee:
        assert not (tmp_path / "ran").exists()  # nothing of the program ran before configuration
        await _run_to_end(debuggee.port)
        assert await debuggee.wait() == 3
    assert (tmp_path / "ran").read_text() == "yes"


async def test_terminate_leaves_no_process_behind(tmp_path: Path) -> None:
    (tmp_path / "prog.py").write_text("import time\nwhile True:\n    time.sleep(0.1)\n")
    async with start_debuggee(
        ["python", "prog.py"],
        cwd=str(tmp_path),
        env=dict(os.environ),
        log_path=str(tmp_path / "log"),
    ) as debuggee:
        async with open_dap_client("127.0.0.1", debuggee.port) as ide:
            await ide.request("initialize", {"adapterID": "debugpy"})
            attach = ide.send_request_nowait("attach", {"justMyCode": True})
            await ide.wait_event("initialized")
            await ide.request("configurationDone")
            await ide.response(attach)
            await ide.wait_event("thread")  # the program runs its endless loop
            pgid = debuggee.process.pid
            await debuggee.terminate(grace=5)
            await ide.wait_event("terminated", timeout=30)  # debugpy's adapter saw it go
    assert debuggee.process.returncode is not None
    assert _group_members(pgid) == []


async def test_a_missing_script_fails_the_run_with_the_reason_in_its_log(tmp_path: Path) -> None:
    log = tmp_path / "log"
    async with start_debuggee(
        ["python", "missing.py"], cwd=str(tmp_path), env=dict(os.environ), log_path=str(log)
    ) as debuggee:
        await _run_to_end(debuggee.port)
        assert await debuggee.wait() != 0
    assert "missing.py" in log.read_text()
