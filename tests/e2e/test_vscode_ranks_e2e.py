"""The extension's Ranks view in real VS Code (code-server, the project's own extension, a real
browser: ``codeserver.py``): the torchrun-style launcher without PyTorch starts 4 ranks
(``programs/ranks4_worker.py``), a breakpoint set before the launch stops rank 2 and the worker
pauses the others (``--stop all``, the default). The view shows the ranks grouped by where they
are, from ``tether stacks --json``; choosing rank 2 shows its session's line; "Continue all
ranks" (one continue to one rank's session) runs every rank to the end: the run succeeds.

With 10 ranks (``programs/ranksN_worker.py``, a breakpoint in rank 5) only rank 5's session is
offered; choosing rank 0 in the view, which has no session in the window, asks the adapter for it
(``tetherFocus``) and its session appears in the Call Stack view; "Continue all ranks" ends the
run with exit code 0."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
from codeserver import Trace, is_dap, vscode
from direct_debugpy import copy_programs
from stack import relay_stack
from test_vscode_e2e import record

pytestmark = [pytest.mark.slow, pytest.mark.vscode, pytest.mark.timeout(600)]

RANK2_LINE = 51  # programs/ranks4_worker.py, main(): only rank 2 runs it
#: the body of the Ranks view
RANKS_VIEW = '.pane:has(.pane-header:has-text("Ranks")) .pane-body'

LAUNCH = {
    "version": "0.2.0",
    "configurations": [
        {
            "type": "tether",
            "request": "launch",
            "name": "tether: ranks",
            "command": ["python", "ranks_launcher.py", "4", "ranks4_worker.py"],
            "runName": "ranks-from-vscode",
        }
    ],
}


def all_four_paused(event: dict[str, Any]) -> bool:
    """A Ranks view that shows rank 2 at its breakpoint and the other three paused by the group."""
    if event.get("ext") != "ranks":
        return False
    paused = {
        rank
        for group in event["groups"]
        if "(paused: " in group["label"]
        for rank in group["ranks"]
    }
    return paused == {0, 1, 2, 3} and any(
        group["label"] == "rank 2 (paused: breakpoint)"
        and group["where"] == f"ranks4_worker.py:{RANK2_LINE} main"
        for group in event["groups"]
    )


def stopped_sessions(trace: Trace) -> set[str]:
    return {e["session"] for e in trace.refresh() if is_dap("ide", "event", "stopped")(e)}


async def test_the_ranks_view_groups_the_ranks_and_continues_them_all(tmp_path: Path) -> None:
    home = tmp_path / "home"
    folder = copy_programs(tmp_path / "project")
    (folder / ".vscode").mkdir()
    (folder / ".vscode" / "launch.json").write_text(json.dumps(LAUNCH, indent=2))
    async with (
        relay_stack(home, workers=1),
        vscode(tmp_path, home, folder, "vscode-ranks") as (ide, trace),
    ):
        await ide.do("open", file="ranks4_worker.py", line=RANK2_LINE)
        await ide.do("press", keys="F9")
        # by name, not F5: a key pressed before the workbench has read launch.json is lost
        await ide.do("command", title="Debug: Select and Start Debugging")
        await ide.do("type", text="tether: ranks")
        await ide.do("wait_text", text="tether: ranks", selector=".quick-input-list")
        await ide.do("press", keys="Enter")
        served = await trace.wait("the submitted run", lambda e: e.get("ext") == "served")
        run = served["run"]
        await trace.wait(
            "rank 2 at its breakpoint",
            is_dap("ide", "event", "stopped", reason="breakpoint"),
            timeout=120,
        )
        # every rank a session of its own, each told of its stop
        await trace.wait(
            "four ranks stopped", lambda e: len(stopped_sessions(trace)) >= 4, timeout=60
        )

        await ide.do("press", keys="Control+Shift+D")  # Run and Debug, where the view is
        await ide.do("expand", title="Ranks")
        shown = await trace.wait("the ranks, grouped", all_four_paused, timeout=60)
        assert all(g["processes"] >= 1 for g in shown["groups"]), shown
        assert shown["run"] == run
        await ide.do("wait_text", text="rank 2 (paused: breakpoint)", selector=RANKS_VIEW)
        await ide.do("screenshot", name="ranks-view")

        # choosing rank 2's group shows its session's place
        await ide.do("click_text", text="rank 2 (paused: breakpoint)", selector=RANKS_VIEW)
        focused = await trace.wait("rank 2 shown", lambda e: e.get("ext") == "ranks focus")
        assert focused["process"] == "rank 2" and focused["session"].startswith("rank 2 (pid")
        assert focused["at"].endswith(f"ranks4_worker.py:{RANK2_LINE}"), focused

        # "Evaluate on all ranks...": the debug console's @all prefix, to a paused rank's session
        await ide.do("command", title="tether: Evaluate on all ranks")
        # the input box itself (not the palette it replaces): its prompt is shown
        await ide.do(
            "wait_text", text="Evaluate on every paused rank", selector=".quick-input-widget"
        )
        await ide.do("type", text="marker")
        await ide.do("press", keys="Enter")
        evaluated = await trace.wait("the evaluation", lambda e: e.get("ext") == "ranks eval")
        assert evaluated["session"] == focused["session"] or "(pid" in evaluated["session"]
        [asked] = [m for m in trace.dap("adapter", "request", "evaluate")
                   if m["arguments"]["expression"].startswith("@all")]  # fmt: skip
        assert asked["arguments"]["expression"] == "@all marker", asked
        assert asked["arguments"]["context"] == "repl" and "frameId" in asked["arguments"], asked
        # the answer, one line, in the "tether ranks" output channel (until the worker knows
        # the prefix: the debugger's error, its last line, never its traceback)
        assert evaluated["result"] and "Traceback" not in evaluated["result"], evaluated
        await ide.do("wait_text", text="> @all marker")

        # one action continues every rank: the launcher sees all four end well
        await ide.do("command", title="tether: Continue all ranks")
        await trace.wait("the continue", lambda e: e.get("ext") == "ranks continue")
        exited = await trace.wait(
            "the program's exit",
            lambda e: e.get("session") == "tether: ranks" and is_dap("ide", "event", "exited")(e),
            timeout=90,
        )
        assert exited["message"]["body"]["exitCode"] == 0
        await trace.wait("the served adapter stopped", lambda e: e.get("ext") == "stopped serving")
        assert (await record(home, run))["state"] == "succeeded"


RANK5_LINE = 55  # programs/ranksN_worker.py, main(): only rank 5 runs it
TEN = 10  # above 8 ranks only the stopping rank's session is offered
#: the body of the Call Stack view
CALL_STACK = '.pane:has(.pane-header:has-text("Call Stack")) .pane-body'


def ten_paused(event: dict[str, Any]) -> bool:
    """A Ranks view that shows every one of the ten ranks paused, rank 0 in a group of its own
    (it waits at another line than ranks 1-4,6-9)."""
    if event.get("ext") != "ranks":
        return False
    paused = {r for g in event["groups"] if "(paused: " in g["label"] for r in g["ranks"]}
    labels = {g["label"] for g in event["groups"]}
    return paused == set(range(TEN)) and "rank 0 (paused: pause)" in labels


def rank_sessions(trace: Trace) -> set[str]:
    """The names of the rank sessions the IDE side of the trace has seen."""
    return {e["session"] for e in trace.refresh() if e.get("session", "").startswith("rank ")}


async def test_the_ranks_view_opens_a_rank_that_has_no_session(tmp_path: Path) -> None:
    home = tmp_path / "home"
    folder = copy_programs(tmp_path / "project")
    (folder / ".vscode").mkdir()
    launch = {
        "version": "0.2.0",
        "configurations": [
            {
                **LAUNCH["configurations"][0],
                "command": ["python", "ranks_launcher.py", str(TEN), "ranksN_worker.py"],
                "runName": "ten-ranks-from-vscode",
            }
        ],
    }
    (folder / ".vscode" / "launch.json").write_text(json.dumps(launch, indent=2))
    async with (
        relay_stack(home, workers=1),
        vscode(tmp_path, home, folder, "vscode-ranks-ten") as (ide, trace),
    ):
        await ide.do("open", file="ranksN_worker.py", line=RANK5_LINE)
        await ide.do("press", keys="F9")
        await ide.do("command", title="Debug: Select and Start Debugging")
        await ide.do("type", text="tether: ranks")
        await ide.do("wait_text", text="tether: ranks", selector=".quick-input-list")
        await ide.do("press", keys="Enter")
        served = await trace.wait("the submitted run", lambda e: e.get("ext") == "served")
        await trace.wait(
            "rank 5 at its breakpoint",
            is_dap("ide", "event", "stopped", reason="breakpoint"),
            timeout=120,
        )
        # every other rank paused with it: one line says so, in rank 5's session
        await trace.wait(
            "the summary line",
            lambda e: (
                is_dap("ide", "event", "output")(e)
                and "paused with rank 5" in e["message"]["body"].get("output", "")
            ),
            timeout=90,
        )
        await ide.do("press", keys="Control+Shift+D")
        await ide.do("expand", title="Ranks")
        await ide.do("command", title="tether: Refresh ranks")  # read after the group stop
        shown = await trace.wait("ten ranks paused", ten_paused, timeout=90)
        assert shown["run"] == served["run"]
        # the group stop offered one session: rank 5's, alone in the Call Stack
        await ide.do("wait_text", text="rank 5 (pid", selector=CALL_STACK)
        [rank5] = rank_sessions(trace)
        assert rank5.startswith("rank 5 (pid"), rank5

        # choosing rank 0 (no session in the window): the view asks the adapter for it
        await ide.do("wait_text", text="rank 0 (paused: pause)", selector=RANKS_VIEW)
        await ide.do("click_text", text="rank 0 (paused: pause)", selector=RANKS_VIEW)
        asked = await trace.wait("rank 0 asked for", lambda e: e.get("ext") == "ranks focus asked")
        assert asked["rank"] == 0
        await trace.wait(
            "rank 0's session stopped",
            lambda e: (
                e.get("session", "").startswith("rank 0 (pid")
                and is_dap("ide", "event", "stopped")(e)
            ),
            timeout=60,
        )
        await ide.do("wait_text", text="rank 0 (pid", selector=CALL_STACK)
        await ide.do("screenshot", name="ranks-view-opened-rank-0")
        assert {s.split(" (")[0] for s in rank_sessions(trace)} == {"rank 0", "rank 5"}

        await ide.do("command", title="tether: Continue all ranks")
        await trace.wait("the continue", lambda e: e.get("ext") == "ranks continue")
        exited = await trace.wait(
            "the program's exit",
            lambda e: e.get("session") == "tether: ranks" and is_dap("ide", "event", "exited")(e),
            timeout=90,
        )
        assert exited["message"]["body"]["exitCode"] == 0
        await trace.wait("the served adapter stopped", lambda e: e.get("ext") == "stopped serving")
        assert (await record(home, served["run"]))["state"] == "succeeded"
