"""The web view in a real headless Chromium, against `tether up` with real workers and debugpy.

A user logs in with their token and sees a queued, a paused (an uncaught exception, post-mortem)
and a failed run; opens a running one, watches a log line arrive live, cancels it and sees it
cancelled; is refused another user's run by id. A `tether ui RUN` link logs a fresh browser in
once, straight onto the run's page. Screenshots of the list and the run page are saved
(``tests/e2e/browser.py``: ``build/screenshots``, and ``$TETHER_SCREENSHOTS``).
"""

from __future__ import annotations

import re
from pathlib import Path

import pytest
import trio
from browser import chromium, run_scenario
from stack import PROJECT, debug_run, local_token, relay_stack, status_saying, tether
from test_experiments_e2e import SWEEP_TRAIN, finished_sweep, start_sweep
from test_session_e2e import bp_args, ide_session, stopped_frame
from test_unattended_e2e import ONCE_LINE

from adapter.scripted_ide.dap_client import open_dap_client

pytestmark = [pytest.mark.slow, pytest.mark.web, pytest.mark.timeout(300)]

SLOW = """\
import os, time
print("first line", flush=True)
while not os.path.exists(os.environ["TRIGGER"]):
    time.sleep(0.05)
print("second line, live", flush=True)
while True:
    time.sleep(1)
"""
BOOM = """\
def step(x):
    raise ValueError(f"bad {x}")


step(3)
"""


async def run(home: Path, relay: str, project: Path, *args: str, token: str = "") -> str:
    """`tether run ARGS`: the new run's id."""
    env = {"TETHER_TOKEN": token} if token else None
    async with tether("run", "--relay", relay, *args, home=home, cwd=project, extra_env=env) as p:
        with trio.fail_after(60):
            assert await p.process.wait() == 0, p.output
    return p.lines[-1].strip()


async def token_for(home: Path, relay: str, user: str) -> str:
    async with tether("token", "create", "--relay", relay, "--user", user, home=home) as p:
        with trio.fail_after(30):
            assert await p.process.wait() == 0, p.output
    found = re.search(r"tthu_\S+", p.output)
    assert found, p.output
    return found.group(0)


async def test_a_user_watches_runs_in_a_real_browser(tmp_path: Path, shared_tmp: Path) -> None:
    chromium()  # skip early (or fail in CI) without a browser
    home, project = tmp_path / "home", tmp_path / "project"
    project.mkdir()
    (project / "slow.py").write_text(SLOW)
    (project / "boom.py").write_text(BOOM)
    trigger = shared_tmp / "trigger"  # the program (a uid of its own) looks for it
    async with relay_stack(home, workers=3) as (_up, relay):
        base = relay.replace("ws://", "http://")
        alice = await token_for(home, relay, "alice")  # a user: her own runs only
        failed = await run(home, relay, project, "--name", "fails", "--", "python", "-c",
                           "import sys; sys.exit(3)", token=alice)  # fmt: skip
        await status_saying(home, failed, "state      failed")
        queued = await run(home, relay, project, "--name", "waits", "--backend", "slurm", "--",
                           "python", "boom.py", token=alice)  # fmt: skip
        paused = await run(home, relay, project, "--name", "crashes", "--", "python", "boom.py",
                           token=alice)  # fmt: skip
        live = await run(home, relay, project, "--name", "live", "--env", f"TRIGGER={trigger}",
                         "--", "python", "slow.py", token=alice)  # fmt: skip
        await status_saying(home, paused, "paused at  uncaught ValueError at boom.py:2 in step")
        await status_saying(home, live, "state      running")
        bobs = await run(home, relay, project, "--name", "bobs-run", "--backend", "slurm", "--",
                         "python", "slow.py", token=await token_for(home, relay, "bob"))  # fmt: skip

        steps = [
            {"do": "goto", "path": "/ui"},
            {"do": "wait_url", "path": "/ui/login"},
            {"do": "fill", "selector": "#token", "value": alice},
            {"do": "click", "selector": "#login button[type=submit]"},
            {"do": "wait_url", "path": "/ui"},
            {"do": "wait_visible", "selector": ".live-dot"},
            {"do": "text", "selector": f"#run-{queued} .state", "as": "queued"},
            {"do": "text", "selector": f"#run-{paused} .state", "as": "paused"},
            {"do": "text", "selector": f"#run-{failed} .state", "as": "failed"},
            {"do": "text", "selector": "#runs", "as": "list"},
            {"do": "screenshot", "name": "web-runs"},
            {"do": "click", "selector": f"#run-{live} a"},
            {"do": "wait_url", "path": f"/ui/runs/{live}"},
            {"do": "wait_visible", "selector": ".live-dot"},
            {"do": "wait_text", "selector": "#log", "text": "first line"},
            {"do": "touch", "file": str(trigger)},
            {"do": "wait_text", "selector": "#log", "text": "second line, live"},
            {"do": "screenshot", "name": "web-run", "full": True},
            {"do": "click", "selector": "#summary button.danger", "dialog": "accept"},
            {"do": "wait_text", "selector": "#summary .status", "text": "cancelled"},
            {"do": "goto", "path": f"/ui/runs/{bobs}", "status": 404},
            {"do": "text", "selector": "main", "as": "bobs"},
        ]
        got = (await run_scenario(base, steps, tmp_path / "shots"))["values"]
        assert "queued" in got["queued"]
        assert (
            "paused" in got["paused"]
            and "uncaught ValueError at boom.py:2 in step" in got["paused"]
        )
        assert "failed" in got["failed"] and "exit 3" in got["failed"]
        assert "bobs-run" not in got["list"]
        assert "not yours" in got["bobs"] and "bobs-run" not in got["bobs"]
        cancelled = await status_saying(home, live, "state      cancelled")
        assert "cancelled in the web view" in cancelled
        async with tether("audit", live, "--relay", relay, home=home) as audit:
            await audit.process.wait()
        assert re.search(r"cancel\s+\S+ \(token \w+\) as web", audit.output), audit.output

        # `tether ui RUN` prints a link that logs a fresh browser in once, onto the run's page
        ui_env = {"TETHER_TOKEN": alice}
        async with tether(
            "ui", paused, "--relay", relay, "--no-open", home=home, extra_env=ui_env
        ) as ui:
            await ui.process.wait()
        link = re.search(r"open (http://\S+/ui/login#\S+)", ui.output)
        assert link, ui.output
        path = link.group(1).removeprefix(base)
        steps = [
            {"do": "goto", "path": path},
            {"do": "click", "selector": "#use-link"},  # never used without a click
            {"do": "wait_url", "path": f"/ui/runs/{paused}"},
            {"do": "text", "selector": "#summary", "as": "summary"},
            {"do": "goto", "path": "/ui/logout"},  # a GET changes nothing: 405
            {"do": "goto", "path": path},  # the code is spent: the login form says so
            {"do": "text", "selector": ".who-now", "as": "now"},
            {"do": "click", "selector": "#use-link"},
            {"do": "wait_text", "selector": "#login-error", "text": "used up"},
        ]
        got = (await run_scenario(base, steps, tmp_path / "shots-link"))["values"]
        assert "uncaught ValueError at boom.py:2 in step" in got["summary"]
        assert "logged in as alice" in got["now"]
        async with tether("status", paused, "--relay", relay, home=home) as status:
            await status.process.wait()
        assert f"page       {base}/ui/runs/{paused}" in status.output


async def test_the_run_page_shows_breakpoints_and_the_stopped_stack(tmp_path: Path) -> None:
    """A debug run stopped at a breakpoint an IDE set: the page says the breakpoint is verified
    and shows the stopped thread's frames, read-only, with no IDE attached any more."""
    chromium()
    home, workdir = tmp_path / "home", tmp_path / "project"
    workdir.mkdir()
    for f in PROJECT.glob("*.py"):
        (workdir / f.name).write_text(f.read_text())
    async with relay_stack(home, workers=1) as (_up, relay):
        base = relay.replace("ws://", "http://")
        token = local_token(home)
        async with debug_run(home, relay, workdir, "python", "app.py") as (_debug, run_id, port):
            async with open_dap_client("127.0.0.1", port) as ide:
                async with ide_session(ide, [bp_args(workdir, "app.py", ONCE_LINE)]):
                    pass
                stopped, frame = await stopped_frame(ide)
                assert frame["line"] == ONCE_LINE, stopped
                await ide.request("disconnect", {"terminateDebuggee": False})
            await status_saying(home, run_id, f"paused at  app.py:{ONCE_LINE} in compute")
            steps = [
                {"do": "goto", "path": "/ui/login"},
                {"do": "fill", "selector": "#token", "value": token},
                {"do": "click", "selector": "#login button[type=submit]"},
                {"do": "wait_url", "path": "/ui"},
                {"do": "goto", "path": f"/ui/runs/{run_id}"},
                {"do": "text", "selector": "#debug", "as": "debug"},
                {"do": "screenshot", "name": "web-debug", "full": True},
                # the top frame's link opens the snapshot's copy of the file at that line
                {"do": "click", "selector": "#debug table.stack tbody tr:first-child a"},
                {"do": "wait_url", "path": f"/ui/runs/{run_id}/files/app.py"},
                {"do": "text", "selector": f"#L{ONCE_LINE}", "as": "line"},
            ]
            got = (await run_scenario(base, steps, tmp_path / "shots"))["values"]
    debug = got["debug"]
    assert f"app.py:{ONCE_LINE}" in debug and "verified" in debug and "pending" not in debug
    assert "main process stopped" in debug and "(breakpoint)" in debug
    assert "compute" in debug and "main" in debug and "<module>" in debug
    assert (
        got["line"].strip() == (workdir / "app.py").read_text().splitlines()[ONCE_LINE - 1].strip()
    )


async def test_a_sweep_and_its_charts_in_a_real_browser(tmp_path: Path) -> None:
    chromium()
    home, project = tmp_path / "home", tmp_path / "project"
    project.mkdir()
    (project / "train.py").write_text(SWEEP_TRAIN)
    async with relay_stack(home, workers=3) as (_up, relay):
        base = relay.replace("ws://", "http://")
        token = local_token(home)
        sweep = await start_sweep(
            home, project, "--name", "lr search", "--param", "lr=log:1e-3:1e-1",
            "--param", "bs=16,32", "--trials", "6", "--parallel", "3", "--objective", "loss:min",
            "--", "python", "train.py", "{lr}", "{bs}", "12", "0.05",
        )  # fmt: skip
        info = await finished_sweep(home, sweep)
        best = info["trials"][info["sweep"]["best"]]
        steps = [
            {"do": "goto", "path": "/ui/login"},
            {"do": "fill", "selector": "#token", "value": token},
            {"do": "click", "selector": "#login button[type=submit]"},
            {"do": "wait_url", "path": "/ui"},
            # the header's Sweeps link, then the sweep from that list
            {"do": "click", "selector": "header.top nav a[href='/ui/sweeps']"},
            {"do": "wait_url", "path": "/ui/sweeps"},
            {"do": "text", "selector": "main", "as": "sweeps"},
            {"do": "screenshot", "name": "web-sweeps"},
            {"do": "click", "selector": f"main a[href='/ui/sweeps/{sweep}']"},
            {"do": "wait_url", "path": f"/ui/sweeps/{sweep}"},
            {"do": "wait_visible", "selector": "svg.chart polyline"},
            {"do": "text", "selector": "main", "as": "sweep"},
            {"do": "screenshot", "name": "web-sweep", "full": True},
            {"do": "click", "selector": f"dd a[href='/ui/runs/{best['run']}']"},
            {"do": "wait_url", "path": f"/ui/runs/{best['run']}"},
            {"do": "wait_visible", "selector": "section.metrics svg.chart polyline"},
            {"do": "text", "selector": "section.metrics", "as": "metrics"},
        ]
        got = (await run_scenario(base, steps, tmp_path / "shots"))["values"]
    assert sweep in got["sweeps"] and "lr search" in got["sweeps"] and "6/6" in got["sweeps"]
    assert f"trial {best['n']} ({best['run']})" in got["sweep"]
    assert "6 complete" in got["sweep"] and "lr search" in got["sweep"]
    assert "12 points" in got["metrics"]
