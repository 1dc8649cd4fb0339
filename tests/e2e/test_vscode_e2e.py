"""tether's VS Code extension in real VS Code: code-server (pinned), the extension installed from the
.vsix the build makes, driven by keyboard in Debian's Chromium (``codeserver.py``).

Asserted on the DAP traffic between VS Code and tether's adapter and on the extension's own events
(its trace file), and on what the workbench shows; screenshots land in ``build/screenshots/``
(``TETHER_SCREENSHOTS=docs/images`` refreshes the images of README.md and docs/editors.md).
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
import trio
from codeserver import Trace, is_dap, vscode
from stack import relay_stack, tether, worker

pytestmark = [pytest.mark.slow, pytest.mark.vscode, pytest.mark.timeout(600)]

TRAIN = """\
import sys


def step(i, lr):
    loss = lr / (i + 1)
    return loss  # line 6: the breakpoint


lr = float(sys.argv[sys.argv.index("--lr") + 1])
total = 0.0
for i in range(3):
    total += step(i, lr)
print("total", total, flush=True)
"""
BREAKPOINT = 6
#: the breakpoint glyphs in the editor's margin (code-server 4.139.1's class names)
HOLLOW = ".glyph-margin-widgets .codicon-debug-breakpoint-unverified"
VERIFIED = ".glyph-margin-widgets .codicon-debug-breakpoint"
#: the debug toolbar's Continue button, shown (in place of Pause) while the program is stopped
CAN_CONTINUE = ".debug-toolbar .codicon-debug-continue"
#: the body of the "tether runs" view
RUNS_VIEW = '.pane:has(.pane-header:has-text("Tether Runs")) .pane-body'

CRASH = """\
def load(batch):
    rows = [1, 2, 3]
    return rows[batch]  # line 3: an IndexError for batch 7


for batch in (0, 7):
    load(batch)
"""

LAUNCH = {
    "version": "0.2.0",
    "configurations": [
        {
            "type": "tether",
            "request": "launch",
            "name": "tether: train",
            "program": "${workspaceFolder}/train.py",
            "args": ["--lr", "0.5"],
            "runName": "train-from-vscode",
        }
    ],
}


def project(tmp_path: Path) -> Path:
    folder = tmp_path / "project"
    (folder / ".vscode").mkdir(parents=True)
    (folder / "train.py").write_text(TRAIN)
    (folder / "crash.py").write_text(CRASH)
    (folder / ".vscode" / "launch.json").write_text(json.dumps(LAUNCH, indent=2))
    return folder


async def cli(home: Path, *args: str) -> str:
    async with tether(*args, home=home, name=args[0]) as proc:
        with trio.fail_after(60):
            code = await proc.process.wait()
            while not proc.eof:
                await proc._changed.wait()
    assert code == 0, proc.output
    return proc.output


async def record(home: Path, run: str) -> dict[str, Any]:
    out = await cli(home, "status", run, "--json")
    return json.loads(out[out.index("{") :])  # type: ignore[no-any-return]


def answered(trace: Trace, command: str) -> list[dict[str, Any]]:
    return trace.dap("ide", "response", command)


async def test_f5_submits_a_queued_run_whose_breakpoint_is_verified_hit_and_inspected(
    tmp_path: Path,
) -> None:
    home = tmp_path / "home"
    folder = project(tmp_path)
    async with (
        relay_stack(home, workers=0) as (_up, relay),
        vscode(tmp_path, home, folder, "vscode-launch") as (ide, trace),
    ):
        await ide.do("open", file="train.py", line=BREAKPOINT)
        await ide.do("press", keys="F5")  # the launch configuration: submit, then debug
        served = await trace.wait("the submitted run", lambda e: e.get("ext") == "served")
        run = served["run"]
        assert (await record(home, run))["state"] == "queued"  # no worker yet
        launch = await trace.wait("the launch", is_dap("adapter", "request", "launch"))
        assert launch["message"]["arguments"]["tetherRun"] == run
        await trace.wait("the launch answered", lambda e: bool(answered(trace, "launch")))
        assert answered(trace, "launch")[0]["success"], answered(trace, "launch")

        # a breakpoint set while the run is queued: answered at once, not verified yet
        await ide.do("open", file="train.py", line=BREAKPOINT)
        await ide.do("press", keys="F9")
        await trace.wait(
            "breakpoints set while queued",
            lambda e: any(
                r.get("body", {}).get("breakpoints") for r in answered(trace, "setBreakpoints")
            ),
        )
        (bp,) = next(r for r in answered(trace, "setBreakpoints") if r["body"]["breakpoints"])[
            "body"
        ]["breakpoints"]
        assert bp["verified"] is False and "waiting for a worker" in bp["message"], bp
        progress = trace.dap("ide", "event", "progressStart")
        assert progress and f"Run {run} is queued" in progress[0]["body"]["message"], progress
        await ide.do("wait_text", text="waiting for a worker")  # the progress VS Code shows
        await ide.do("wait_selector", selector=HOLLOW)  # the breakpoint shows unverified
        await ide.do("screenshot", name="queued")

        async with worker(home, relay):
            stopped = await trace.wait(
                "the stop at the breakpoint",
                is_dap("ide", "event", "stopped", reason="breakpoint"),
                timeout=120,
            )
            verified = [e["body"]["breakpoint"] for e in trace.dap("ide", "event", "breakpoint")]
            assert any(b["verified"] and b.get("line") == BREAKPOINT for b in verified), verified
            # VS Code asks for the stack and the locals by itself: the top frame is our line
            frames = await trace.wait(
                "the stack", lambda e: bool(answered(trace, "stackTrace")), timeout=30
            )
            top = answered(trace, "stackTrace")[0]["body"]["stackFrames"][0]
            assert top["line"] == BREAKPOINT and top["source"]["path"] == str(folder / "train.py")
            await ide.do("wait_selector", selector=VERIFIED)  # and now verified
            await ide.do("press", keys="Control+Shift+D")  # Run and Debug
            await ide.do("click_text", text="Locals")  # open the scope: VS Code asks its variables
            await trace.wait(
                "the locals",
                lambda e: any(
                    {"i", "lr", "loss"} <= {v["name"] for v in r["body"].get("variables", [])}
                    for r in answered(trace, "variables")
                ),
            )
            local = {
                v["name"]: v["value"]
                for r in answered(trace, "variables")
                for v in r["body"].get("variables", [])
            }
            assert (local["i"], local["lr"], local["loss"]) == ("0", "0.5", "0.5"), local
            await ide.do("wait_text", text="loss")  # the Variables view shows them
            await ide.do("screenshot", name="stopped")
            assert stopped and frames

            # the runs view lists it, paused there, with this IDE attached
            await ide.do("expand", title="Tether Runs")  # the view, collapsed below the others
            await trace.wait(
                "the run in the runs view",
                lambda e: (
                    e.get("ext") == "runs"
                    and any(
                        r["id"] == run and r["description"].startswith("paused at train.py:6")
                        for r in e["rows"]
                    )
                ),
            )
            await ide.do("wait_text", text="train-from-vscode", selector=RUNS_VIEW)
            await ide.do("screenshot", name="stopped-and-runs-view")

            # continue: the breakpoint is hit once a step (three stops), then the program ends
            for stops in (2, 3):
                await ide.do("click", selector=CAN_CONTINUE)  # shown once VS Code took the stop
                await trace.wait(
                    f"stop {stops}",
                    lambda e, stops=stops: len(trace.dap("ide", "event", "stopped")) >= stops,
                )
            await ide.do("click", selector=CAN_CONTINUE)
            exited = await trace.wait(
                "the program's exit", is_dap("ide", "event", "exited"), timeout=60
            )
            assert exited["message"]["body"]["exitCode"] == 0
            await trace.wait("the end", is_dap("ide", "event", "terminated"))
            await trace.wait(
                "the served adapter stopped with its session",
                lambda e: e.get("ext") == "stopped serving" and e.get("run") == run,
            )
        assert (await record(home, run))["state"] == "succeeded"


async def test_a_run_paused_with_no_ide_is_announced_and_attached_from_the_runs_view(
    tmp_path: Path,
) -> None:
    home = tmp_path / "home"
    folder = project(tmp_path)
    bad = [  # refused by the extension, then by tether at submit: a clear line each
        {**LAUNCH["configurations"][0], "name": "bad gpus", "gpus": -1},
        {**LAUNCH["configurations"][0], "name": "bad memory", "mem": "lots"},
    ]
    (folder / ".vscode" / "launch.json").write_text(json.dumps({"configurations": bad}))
    async with (
        relay_stack(home, workers=1),
        vscode(tmp_path, home, folder, "vscode-attach") as (ide, trace),
    ):
        await ide.do("open", file="train.py")
        # by name, not F5: a key pressed before the workbench has read launch.json is lost
        await ide.do("command", title="Debug: Select and Start Debugging")
        await ide.do("type", text="bad gpus")
        await ide.do("wait_text", text="bad gpus", selector=".quick-input-list")
        await ide.do("press", keys="Enter")
        refused = await trace.wait("the refusal", lambda e: e.get("ext") == "refused")
        assert refused["message"] == 'tether: "gpus" must be a whole number.', refused
        await ide.do("wait_text", text='"gpus" must be a whole number')
        await ide.do("command", title="Debug: Select and Start Debugging")
        await ide.do("type", text="bad memory")
        await ide.do("wait_text", text="bad memory", selector=".quick-input-list")
        await ide.do("press", keys="Enter")
        refused = await trace.wait(
            "the refusal at submit",
            lambda e: e.get("ext") == "refused" and "--mem" in e["message"],
        )
        assert refused["message"] == (
            "tether: argument --mem: 'lots' is not an amount of memory (examples: 512M, 16G)"
        ), refused
        await ide.do("screenshot", name="refused")
        # a plain run (no debugger) whose uncaught exception stops it post-mortem, unattended
        out = await cli(home, "run", "--workdir", str(folder), "--", "python", "crash.py")
        run = out.strip().splitlines()[-1]
        notified = await trace.wait(
            "the notice", lambda e: e.get("ext") == "notified" and e.get("run") == run, timeout=120
        )
        assert "paused: uncaught IndexError at crash.py:3 in load" in notified["text"], notified
        await ide.do("wait_text", text="with no IDE attached")  # the notification
        await ide.do("screenshot", name="notified")

        await ide.do("press", keys="Control+Shift+D")  # Run and Debug, where the runs view is
        await ide.do("expand", title="Tether Runs")
        await ide.do("wait_text", text="uncaught IndexError at crash.py:3", selector=RUNS_VIEW)
        await ide.do("screenshot", name="runs-view")
        await ide.do("hover_click", row=run, label="Attach")
        served = await trace.wait("the attach", lambda e: e.get("ext") == "served")
        assert served["run"] == run
        stopped = await trace.wait(
            "the paused program", is_dap("ide", "event", "stopped"), timeout=60
        )
        assert stopped["message"]["body"]["reason"] == "exception"
        await trace.wait("the stack", lambda e: bool(answered(trace, "stackTrace")))
        top = answered(trace, "stackTrace")[0]["body"]["stackFrames"][0]
        assert (top["name"], top["line"]) == ("load", 3), top
        await trace.wait(
            "the locals",
            lambda e: any(
                {"batch", "rows"} <= {v["name"] for v in r["body"].get("variables", [])}
                for r in answered(trace, "variables")
            ),
        )
        await ide.do("wait_text", text="batch")
        await ide.do("screenshot", name="attached")
        await ide.do("click", selector=CAN_CONTINUE)  # let it go: it ends as it would have
        exited = await trace.wait("the exit", is_dap("ide", "event", "exited"), timeout=60)
        assert exited["message"]["body"]["exitCode"] == 1
        await trace.wait("the end", is_dap("ide", "event", "terminated"))
        assert (await record(home, run))["state"] == "failed"
        await trace.wait("the served adapter stopped", lambda e: e.get("ext") == "stopped serving")

        # its logs in an output channel, then a rerun from the row's menu
        await ide.do("hover_click", row=run, label="Show logs")
        await ide.do("wait_text", text="IndexError: list index out of range")
        await ide.do("menu_click", row=run, item="Rerun", within=RUNS_VIEW)
        rerun = await trace.wait("the rerun", lambda e: e.get("ext") == "rerun")
        again = await record(home, rerun["as"])
        assert again["rerun_of"] == run and again["spec"]["command"] == ["python", "crash.py"]


POOL = """\
import multiprocessing as mp


def work(n):
    square = n * n
    return square  # line 6: the breakpoint, in the child process


if __name__ == "__main__":
    with mp.get_context("spawn").Pool(1) as pool:
        print("squares", pool.map(work, [3]), flush=True)
"""
IN_CHILD = 6


async def test_a_child_process_opens_its_own_session_in_the_same_window(tmp_path: Path) -> None:
    """A Pool worker stops at a breakpoint: tether's adapter offers it (``startDebugging``), VS
    Code opens a child session beside the launch's, the stop is inspected there."""
    home = tmp_path / "home"
    folder = project(tmp_path)
    (folder / "pool.py").write_text(POOL)
    launch = {**LAUNCH["configurations"][0], "name": "tether: pool", "runName": "pool"}
    launch.update(program="${workspaceFolder}/pool.py", args=[])
    (folder / ".vscode" / "launch.json").write_text(json.dumps({"configurations": [launch]}))
    async with (
        relay_stack(home, workers=1),
        vscode(tmp_path, home, folder, "vscode-child") as (ide, trace),
    ):
        await ide.do("open", file="pool.py", line=IN_CHILD)
        await ide.do("press", keys="F9")
        await ide.do("press", keys="F5")
        offer = await trace.wait(
            "the child offered", is_dap("ide", "request", "startDebugging"), timeout=120
        )
        child = offer["message"]["arguments"]["configuration"]
        assert child["request"] == "attach" and child["subProcessId"] > 0, child
        attach = await trace.wait(
            "the child's session attaching",
            lambda e: (
                e.get("to") == "adapter"
                and e["message"].get("command") == "attach"
                and e["message"]["arguments"].get("subProcessId") == child["subProcessId"]
            ),
        )
        assert attach["session"] != "tether: pool"  # a session of its own
        stopped = await trace.wait(
            "the child's stop",
            lambda e: (
                e.get("session") == attach["session"]
                and is_dap("ide", "event", "stopped", reason="breakpoint")(e)
            ),
            timeout=60,
        )
        assert stopped
        await trace.wait(
            "the child's frame",
            lambda e: (
                e.get("session") == attach["session"]
                and e["message"].get("command") == "stackTrace"
                and e["message"].get("type") == "response"
                and e["message"]["body"]["stackFrames"][:1] != []
                and e["message"]["body"]["stackFrames"][0]["line"] == IN_CHILD
            ),
        )
        await ide.do("press", keys="Control+Shift+D")
        await ide.do("wait_text", text=f"pid {child['subProcessId']}")  # in the Call Stack
        await ide.do("screenshot", name="child-session")
        await ide.do("click", selector=CAN_CONTINUE)
        exited = await trace.wait(
            "the program's exit",
            lambda e: e.get("session") == "tether: pool" and is_dap("ide", "event", "exited")(e),
            timeout=60,
        )
        assert exited["message"]["body"]["exitCode"] == 0
        await trace.wait("the adapter stopped", lambda e: e.get("ext") == "stopped serving")
        served = [e for e in trace.refresh() if e.get("ext") == "served"]
        assert len(served) == 1, served  # the child's session needed nothing served


async def test_the_editors_guides_attach_configuration_with_an_empty_run_picks_from_a_list(
    tmp_path: Path,
) -> None:
    """The attach entry of docs/editors.md and the extension's own snippet leave ``"run": ""``: F5 lists the
    runs to debug, as leaving the key out does, and attaches to the one picked."""
    home = tmp_path / "home"
    folder = project(tmp_path)
    attach = {"type": "tether", "request": "attach", "name": "tether: attach to a run", "run": ""}
    (folder / ".vscode" / "launch.json").write_text(json.dumps({"configurations": [attach]}))
    async with (
        relay_stack(home),  # no worker: the run stays queued, and can be attached to
        vscode(tmp_path, home, folder, "vscode-pick") as (ide, trace),
    ):
        out = await cli(home, "run", "--workdir", str(folder), "--name", "picked-from-the-list",
                        "--", "python", "train.py", "--lr", "0.5")  # fmt: skip
        run = out.strip().splitlines()[-1]
        await ide.do("open", file="train.py")
        await ide.do("press", keys="F5")
        await ide.do("wait_text", text="picked-from-the-list", selector=".quick-input-list")
        await ide.do("screenshot", name="pick-a-run")
        await ide.do("press", keys="Enter")
        served = await trace.wait("the attach", lambda e: e.get("ext") == "served")
        assert served["run"] == run, served
        assert not [e for e in trace.refresh() if e.get("ext") == "refused"]
        await trace.wait("the IDE's attach answered", is_dap("ide", "response", "attach"))
        await cli(home, "cancel", run)
