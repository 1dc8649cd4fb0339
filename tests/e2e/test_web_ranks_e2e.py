"""The run page's Ranks section in a real headless Chromium, against `tether up` with a real
worker: the torchrun-style launcher without PyTorch (``programs/ranks_launcher.py``) starts four
ranks that wait in the same loop; "Read the stacks" shows them merged into one class, below the
launcher, as ``tether stacks`` prints them (the worker reads them with py-spy, through a tunnel
the relay opens itself)."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest
import trio
from browser import chromium, run_scenario
from direct_debugpy import PROGRAMS
from stack import local_token, relay_stack, status_saying, tether
from test_web_e2e import run

pytestmark = [pytest.mark.slow, pytest.mark.web, pytest.mark.timeout(300)]

RANK = """\
import os
import time


def wait(rank):
    print(f"rank {rank} waits", flush=True)
    while not os.path.exists(os.environ["TRIGGER"]):
        time.sleep(0.05)  # line 8: every rank waits here
    print(f"rank {rank} done", flush=True)


wait(int(os.environ["RANK"]))
"""


async def logs(home: Path, run_id: str) -> str:
    async with tether("logs", run_id, home=home, name="logs") as shown:
        await shown.process.wait()
    return shown.output


async def test_the_run_page_shows_the_ranks_merged(tmp_path: Path, shared_tmp: Path) -> None:
    chromium()
    home, project = tmp_path / "home", tmp_path / "project"
    project.mkdir()
    shutil.copyfile(PROGRAMS / "ranks_launcher.py", project / "ranks_launcher.py")
    (project / "rank.py").write_text(RANK)
    trigger = shared_tmp / "trigger"  # the program (a uid of its own) looks for it
    async with relay_stack(home, workers=1) as (_up, relay):
        base = relay.replace("ws://", "http://")
        token = local_token(home)
        job = await run(home, relay, project, "--env", f"TRIGGER={trigger}", "--",
                        "python", "ranks_launcher.py", "4", "rank.py")  # fmt: skip
        shown = ""
        with trio.fail_after(60):  # every rank in its loop
            while not all(f"rank {r} waits" in shown for r in range(4)):
                shown = await logs(home, job)
        steps = [
            {"do": "goto", "path": "/ui/login"},
            {"do": "fill", "selector": "#token", "value": token},
            {"do": "click", "selector": "#login button[type=submit]"},
            {"do": "wait_url", "path": "/ui"},
            {"do": "goto", "path": f"/ui/runs/{job}"},
            {"do": "click", "selector": "#ranks-read"},
            {"do": "wait_text", "selector": "#ranks", "text": "ranks 0-3 (running)"},
            {"do": "text", "selector": "#ranks", "as": "ranks"},
            {"do": "text", "selector": "#ranks-read", "as": "button"},
            {"do": "screenshot", "name": "web-ranks", "full": True},
        ]
        got = (await run_scenario(base, steps, tmp_path / "shots"))["values"]
        trigger.touch()
        await status_saying(home, job, "state      succeeded", timeout=60)
    lines = got["ranks"].splitlines()
    assert lines[0].startswith(f"run {job}: 5 Python processes, in 2 places"), got["ranks"]
    assert any(line.startswith("main process (pid ") for line in lines), lines
    assert "ranks 0-3 (running): rank.py:12 <module> > rank.py:8 wait" in lines, lines
    assert got["button"] == "Refresh"
