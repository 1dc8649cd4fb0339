"""A run started without the debugger, debugged later: ``tether run`` starts a Python program so
that ``tether attach`` can debug it at any time, without a restart and without ptrace.

Real processes (the relay, Redis, a worker pool, debugpy) and VS Code's own client (Microsoft's
DebugClient under node): the program has been running for a while when the IDE attaches; the
breakpoint it sets at attach time is hit in the running loop, the IDE inspects and changes a value,
clears the breakpoint and continues, and the program ends with its own exit code.
"""

from __future__ import annotations

from pathlib import Path

import pytest
from node_harness import open_vscode_session, scenario
from stack import relay_stack, tether, worker
from test_bad_input_e2e import tether_cli

pytestmark = [pytest.mark.slow, pytest.mark.timeout(240)]

BUSY = """\
import time

done = False


def step(i):
    value = i * 2
    return value  # line 8: the breakpoint


i = 0
while not done:
    step(i)
    i += 1
    if i == 50:
        print("running", flush=True)
    time.sleep(0.01)
print("stopped at", i, flush=True)
raise SystemExit(3)
"""
BREAK = 8


async def test_a_plain_run_is_attached_to_mid_run_and_its_breakpoint_is_hit(
    tmp_path: Path,
) -> None:
    home = tmp_path / "home"
    workdir = tmp_path / "project"
    workdir.mkdir()
    (workdir / "busy.py").write_text(BUSY)
    async with relay_stack(home) as (_up, relay), worker(home, relay):
        async with tether(
            "run", "--relay", relay, "--workdir", str(workdir), "--", "python", "busy.py",
            home=home, name="run",
        ) as run:  # fmt: skip
            run_id = (await run.wait_line(r"^(\S+)$")).group(1)
        async with tether("logs", run_id, "-f", "--relay", relay, home=home, name="logs") as logs:
            await logs.wait_line(r"running", timeout=120)  # it runs, and no debugger is in it
            async with tether(
                "attach", run_id, "--relay", relay, "--port", "0", home=home, name="attach"
            ) as attach:
                m = await attach.wait_line(r"adapter on 127\.0\.0\.1:(\d+)")
                steps = [
                    {"op": "wait_stopped", "reason": "breakpoint", "line": BREAK,
                     "function": "step", "label": "stopped"},
                    {"op": "evaluate", "expression": "value", "context": "watch",
                     "label": "value"},
                    {"op": "evaluate", "expression": "globals().update(done=True)",
                     "context": "repl"},
                    {"op": "set_breakpoints", "path": str(workdir / "busy.py"), "lines": []},
                    {"op": "continue"},
                    {"op": "wait_terminated", "label": "ended"},
                ]  # fmt: skip
                # no exception filter: debugpy would stop at the SystemExit(3) (as in any run)
                spec = scenario(
                    int(m.group(1)), workdir, steps, breakpoints={"busy.py": [BREAK]},
                    exception_filters=(), timeout_ms=120_000,
                )  # fmt: skip
                async with open_vscode_session(spec, timeout=180) as session:
                    result, _messages = await session.result()
                await attach.wait_line(r"ended \(exited, exit code 3\)", timeout=60)
            await logs.wait_line(r"stopped at \d+", timeout=60)
    labels = dict(result["labels"])
    stopped, value, ended = labels["stopped"], labels["value"], labels["ended"]
    assert stopped["line"] == BREAK and stopped["function"] == "step"
    assert int(value["result"]) % 2 == 0 and int(value["result"]) >= 100  # it had been running
    assert ended["exitCode"] == 3


async def test_a_run_nothing_can_attach_to_is_refused_at_once(tmp_path: Path) -> None:
    """``--no-debuggable``, and a command that is not Python: ``tether attach`` says why, before
    serving anything (the runs stay queued: no worker)."""
    home = tmp_path / "home"
    workdir = tmp_path / "project"
    workdir.mkdir()
    (workdir / "busy.py").write_text(BUSY)
    async with relay_stack(home) as (_up, relay):
        refused = {}
        for name, command in (
            ("opted out", ["--no-debuggable", "--", "python", "busy.py"]),
            ("not python", ["--", "sh", "-c", "sleep 60"]),
        ):
            code, out = await tether_cli(
                home, "run", "--relay", relay, "--workdir", str(workdir), *command, cwd=workdir
            )
            assert code == 0, out
            run_id = out.strip().splitlines()[-1]
            code, out = await tether_cli(home, "attach", run_id, "--relay", relay, cwd=workdir)
            assert code != 0 and "Traceback" not in out
            refused[name] = out
    assert "was started with --no-debuggable" in refused["opted out"]
    assert "tether debug -- python busy.py" in refused["opted out"]
    assert "not a Python program" in refused["not python"]
