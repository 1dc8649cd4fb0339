"""Post-mortem: a plain run whose program raises an uncaught exception hours in does not end; it
stops in the raising frame, the user is told (the terminal following its logs rings, the webhook
gets the notice, ``tether ls`` shows where), and ``tether attach`` debugs it as it was.

Real processes (the relay, Redis, a worker pool, debugpy) and VS Code's own client (Microsoft's
DebugClient under node):

- found paused, inspected through ``exceptionInfo``, ``stackTrace`` and ``variables``, continued:
  the program ends as it would have, with its traceback and exit code 1;
- nobody comes: the run's unattended-stop policy (continue after the timeout) lets it end, and the
  retry it asked for runs (and stops post-mortem) again.
"""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

import pytest
import trio
from node_harness import open_vscode_session, scenario
from stack import relay_stack, status_saying, tether, worker
from test_unattended_e2e import _webhook_server

pytestmark = [pytest.mark.slow, pytest.mark.timeout(240)]

CRASH = """\
import sys
import time


def step(batch):
    loss = batch * 0.5
    if batch == 7:
        raise ValueError(f"bad batch {batch}")  # line 8
    return loss


for batch in range(100):
    if sys.argv[1:] != ["fast"]:
        time.sleep(0.1)  # a while into training
    if batch == 3:
        print("training", flush=True)
    step(batch)
"""
RAISE = 8
WHERE = f"crash.py:{RAISE} in step"


def project(tmp_path: Path) -> Path:
    workdir = tmp_path / "project"
    workdir.mkdir()
    (workdir / "crash.py").write_text(CRASH)
    return workdir


async def test_a_crashed_run_is_found_paused_inspected_and_continued_to_its_exit_code(
    tmp_path: Path,
) -> None:
    home = tmp_path / "home"
    workdir = project(tmp_path)
    received: list[dict[str, Any]] = []
    arrived = trio.Event()
    async with trio.open_nursery() as nursery:
        hook = await _webhook_server(nursery, received, arrived)
        async with relay_stack(home) as (_up, relay), worker(home, relay):
            async with tether(
                "run", "--relay", relay, "--workdir", str(workdir),
                "--webhook", f"http://127.0.0.1:{hook}/tether", "--", "python", "crash.py",
                home=home, name="run",
            ) as run:  # fmt: skip
                run_id = (await run.wait_line(r"^(\S+)$")).group(1)
            async with tether(
                "logs", run_id, "-f", "--relay", relay, home=home, name="logs"
            ) as logs:
                await logs.wait_line("training", timeout=120)
                # the terminal following the run rings and says what, where, and what to do
                notice = await logs.wait_line(r"-- tether: Run .* no IDE is attached\.", timeout=60)
                assert notice.string.startswith("\a")
                assert (
                    f"Run {run_id} stopped on an uncaught ValueError (bad batch 7) at {WHERE} and "
                    f"no IDE is attached. If no IDE attaches within 300 s, it will continue. "
                    f"Attach with: tether attach {run_id}"
                ) in notice.string
                with trio.fail_after(30):
                    await arrived.wait()
                [posted] = received
                assert posted["event"] == "unattended_stop" and posted["run"] == run_id
                assert posted["data"]["where"] == WHERE
                assert posted["data"]["exception"] == {
                    "id": "ValueError",
                    "description": "bad batch 7",
                    "break_mode": "unhandled",
                }
                # the worker reports a stop once it lasted half a second
                status = await status_saying(home, run_id, "paused at")
                assert re.search(r"state\s+paused", status)
                assert f"paused at  uncaught ValueError at {WHERE}" in status
                async with tether("ls", "--relay", relay, home=home, name="ls") as ls:
                    await ls.process.wait()
                assert re.search(
                    rf"{run_id}\s+crash.py\s+paused\s+.*uncaught ValueError", ls.output
                )
                async with tether(
                    "attach", run_id, "--relay", relay, "--port", "0", home=home, name="attach"
                ) as attach:
                    m = await attach.wait_line(r"adapter on 127\.0\.0\.1:(\d+)")
                    steps = [
                        {"op": "wait_stopped", "reason": "exception", "line": RAISE,
                         "function": "step", "label": "stopped"},
                        {"op": "variables", "scope": "Locals", "label": "locals"},
                        {"op": "stack_trace", "label": "stack"},
                        {"op": "continue"},
                        {"op": "wait_terminated", "label": "ended"},
                    ]  # fmt: skip
                    spec = scenario(int(m.group(1)), workdir, steps, timeout_ms=120_000)
                    async with open_vscode_session(spec, timeout=180) as session:
                        result, _messages = await session.result()
                    await attach.wait_line(r"ended \(exited, exit code 1\)", timeout=60)
                # once let go, it ends as it would have: its traceback, then the failure
                await logs.wait_line(r"ValueError: bad batch 7", timeout=60)
                await logs.wait_line(rf"run {run_id} failed, exit code 1", timeout=60)
        nursery.cancel_scope.cancel()
    labels = dict(result["labels"])
    stopped = labels["stopped"]
    assert stopped["exception"]["exceptionId"] == "ValueError"
    assert stopped["exception"]["description"] == "bad batch 7"
    assert stopped["exception"]["breakMode"] == "unhandled"
    assert (
        labels["locals"]["values"]["batch"] == "7" and labels["locals"]["values"]["loss"] == "3.5"
    )
    assert labels["stack"]["names"] == ["step", "<module>"]
    assert labels["ended"]["exitCode"] == 1


async def test_an_unattended_post_mortem_ends_by_the_policy_and_the_retry_runs(
    tmp_path: Path,
) -> None:
    """Nobody attaches: after --unattended-timeout the program goes on, that is, ends as it
    would have (exit code 1); the attempt failed, so the retry asked for runs, and stops again."""
    home = tmp_path / "home"
    workdir = project(tmp_path)
    async with relay_stack(home) as (_up, relay), worker(home, relay):
        async with tether(
            "run", "--relay", relay, "--workdir", str(workdir), "-f",
            "--unattended-timeout", "1s", "--max-retries", "1", "--retry-backoff", "0",
            "--", "python", "crash.py", "fast",
            home=home, name="run",
        ) as run:  # fmt: skip
            for attempt in (1, 2):
                notice = await run.wait_line(r"-- tether: Run .* stopped on", timeout=120)
                assert (
                    f"stopped on an uncaught ValueError (bad batch 7) at {WHERE} and no IDE is "
                    "attached. If no IDE attaches within 1 s, it will continue."
                ) in notice.string, attempt
                await run.wait_line(r"ValueError: bad batch 7", timeout=60)
            await run.wait_line(r"-- tether: run \S+ failed, exit code 1", timeout=60)
            with trio.fail_after(30):
                assert await run.process.wait() == 1
