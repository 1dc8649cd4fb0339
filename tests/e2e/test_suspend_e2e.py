"""A paused debug run that nobody attends gives its slot back (issue 44, item 4), end to end: a real
``tether up`` stack with a pool of ONE slot, real debugpy, VS Code's own client (Microsoft's
DebugClient under node).

- ``--on-unattended-stop suspend``: the IDE sees the stop at step 7 and leaves without ending the
  program; after ``--unattended-timeout`` the worker calls the program's ``tether.on_suspend``
  function in the paused process (it saves a checkpoint), the run is ``suspended`` and its slot is
  free (a run queued behind it runs and finishes); ``tether resume`` queues it again; ``tether
  attach`` and the IDE find it stopped at the same breakpoint, with the state restored from the
  checkpoint.
- no ``tether.on_suspend``: the notice says it cannot suspend, and ``--unattended-fallback
  terminate`` ends the run as ``terminate`` does (its program killed, the run failed).
"""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

import pytest
from node_harness import open_vscode_session, scenario
from stack import debug_run, relay_stack, status_saying, tether

pytestmark = [pytest.mark.slow, pytest.mark.timeout(240)]

#: keeps its state in the checkpoint directory, restores it at start, saves it when suspended
LOOP = """\
import sys, time
import tether

where = tether.checkpoint_dir()
start = tether.latest_checkpoint()
step = 0 if start is None else int((where / "step").read_text())
origin = "fresh" if start is None else (where / "origin").read_text()
if sys.argv[1:] != ["no-suspend"]:
    tether.on_suspend(lambda: tether.save_checkpoint(step))
print("starting at step", step, "restored", start, flush=True)
while step < 10:
    (where / "step").write_text(str(step))
    (where / "origin").write_text(f"saved at step {step}")
    if step == 7:
        reached = step  # the breakpoint: line 15
    step += 1
    time.sleep(0.05)
print("finished at step", step, flush=True)
"""
BREAKPOINT = 15
SMALL = 'print("small run done", flush=True)\n'


def project(tmp_path: Path) -> Path:
    workdir = tmp_path / "project"
    workdir.mkdir()
    (workdir / "loop.py").write_text(LOOP)
    (workdir / "small.py").write_text(SMALL)
    return workdir


def stop_then(port: int, workdir: Path, *then: dict[str, Any]) -> dict[str, Any]:
    """The IDE's session: the breakpoint, the stop at step 7, what it evaluates there, then
    ``then``."""
    steps = [
        {"op": "wait_stopped", "reason": "breakpoint", "line": BREAKPOINT, "label": "stopped"},
        {"op": "evaluate", "expression": "step", "label": "step"},
        {"op": "evaluate", "expression": "origin", "label": "origin"},
        {"op": "evaluate", "expression": "repr(start)", "label": "start"},
        *then,
    ]
    return scenario(port, workdir, steps, breakpoints={"loop.py": [BREAKPOINT]}, timeout_ms=90_000)


def values(result: dict[str, Any]) -> tuple[str, str, str]:
    labels = result["labels"]
    return labels["step"]["result"], labels["origin"]["result"], labels["start"]["result"]


LEAVE = {"op": "disconnect", "terminateDebuggee": False, "label": "left"}


async def test_an_unattended_debug_run_suspends_frees_its_slot_and_resumes_at_the_breakpoint(
    tmp_path: Path,
) -> None:
    home = tmp_path / "home"
    workdir = project(tmp_path)
    flags = ("--on-unattended-stop", "suspend", "--unattended-timeout", "1")
    async with relay_stack(home, workers=1) as (up, relay):
        async with debug_run(home, relay, workdir, "python", "loop.py", extra=flags) as (
            debug,
            run_id,
            port,
        ):
            async with open_vscode_session(stop_then(port, workdir, LEAVE), timeout=120) as ide:
                first, _ = await ide.result()
            assert values(first) == ("7", "'fresh'", "'None'")
            # the IDE left the program paused: after 1 s its on_suspend saves, the run is suspended
            await debug.wait_line(
                rf"Run {run_id} suspended after 1 s with no IDE: tether resume {run_id} continues "
                r"it from step 7",
                timeout=90,
            )
            await debug.wait_line(rf"attempt 1 was preempted; run {run_id} is suspended")
            # the run did not finish: its attempt ended (it once said "exit code None")
            assert f"Run {run_id}: attempt 1 ended." in debug.output
            assert "finished with exit code" not in debug.output, debug.output
        status = await status_saying(home, run_id, "suspended", timeout=60)
        assert re.search(r"state\s+suspended", status), status
        assert "-> preempted" in status, status
        # the pool's one slot is free: a run submitted now runs and finishes
        async with tether(
            "run", "--relay", relay, "--workdir", str(workdir), "--follow",
            "--", "python", "small.py", home=home, name="small",
        ) as small:  # fmt: skip
            await small.wait_line("small run done", timeout=90)
            assert await small.process.wait() == 0, small.output
        # the user comes back: the IDE attaches to the suspended run, then `tether resume` (attached
        # first: the resumed attempt reaches the breakpoint at once, and the policy's 1 s holds)
        async with tether(
            "attach", run_id, "--relay", relay, "--port", "0", home=home, name="attach"
        ) as attach:
            m = await attach.wait_line(r"adapter on 127\.0\.0\.1:(\d+)")
            ended = [{"op": "continue"}, {"op": "wait_terminated", "label": "ended"}]
            again = stop_then(int(m.group(1)), workdir, *ended)
            async with open_vscode_session(again, timeout=120) as ide:
                await attach.wait_line("an IDE connected")
                async with tether("resume", run_id, home=home, name="resume") as resume:
                    assert await resume.process.wait() == 0, resume.output
                assert f"run {run_id}: queued; attempt 2 resumes from step 7" in resume.output
                second, _ = await ide.result()
            await attach.wait_line(r"ended \(exited, exit code 0\)", timeout=60)
        await up.wait_line(rf"claimed run {run_id} \(attempt 2\)")
        # the same breakpoint, the state the checkpoint kept
        assert values(second) == ("7", "'saved at step 7'", "'7'")
        assert second["labels"]["stopped"]["line"] == BREAKPOINT
        status = await status_saying(home, run_id, "succeeded", timeout=60)
    assert "-> preempted" in status and "-> succeeded" in status, status


async def test_without_on_suspend_the_run_cannot_suspend_and_the_fallback_terminates(
    tmp_path: Path,
) -> None:
    home = tmp_path / "home"
    workdir = project(tmp_path)
    flags = (
        "--on-unattended-stop", "suspend", "--unattended-timeout", "1",
        "--unattended-fallback", "terminate",
    )  # fmt: skip
    async with relay_stack(home, workers=1) as (_up, relay):
        async with debug_run(
            home, relay, workdir, "python", "loop.py", "no-suspend", extra=flags
        ) as (debug, run_id, port):
            async with open_vscode_session(stop_then(port, workdir, LEAVE), timeout=120) as ide:
                first, _ = await ide.result()
            assert values(first) == ("7", "'fresh'", "'None'")
            await debug.wait_line(
                rf"Run {run_id} cannot suspend: the program registered no tether\.on_suspend "
                r"function; --unattended-fallback terminate acts",
                timeout=90,
            )
            await debug.wait_line(r"Terminating: the program stayed paused", timeout=60)
            await debug.wait_line(r"ended \(exited, exit code -?\d+\)", timeout=60)
        status = await status_saying(home, run_id, "-> failed", timeout=60)
    # as terminate ends a run today: its program killed, the attempt failed, no retry left
    assert re.search(r"state\s+failed", status), status
    assert "-> failed (exit -15)" in status and "suspended" not in status, status
