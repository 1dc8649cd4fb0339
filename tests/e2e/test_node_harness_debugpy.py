"""The DebugClient harness (node_harness + node/vscode_scenario.mjs) against plain debugpy.

These pin what debugpy 1.8.22 itself answers to a VS Code-shaped session over the test programs in
``programs/``; the same scenarios pointed at tether's adapter must give the same answers (the
differential tests). Every message received is also checked against the DAP schema.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import trio
from direct_debugpy import copy_programs, listening_debugpy
from node_harness import normalise, open_vscode_session, run_vscode_session, scenario

from protocol_specs.dap.schema import validate_message

pytestmark = [pytest.mark.slow, pytest.mark.timeout(180)]

# programs/train.py and programs/mathutils.py (append-only files)
LOOP_LINE = 18  # train_step: loss += scale(x, lr)
HISTORY_LINE = 19  # train_step: HISTORY.append(step)
SPIN_LINES = (35, 36)  # spin: while keep_going: n += 1
SCALE_FIRST, SCALE_RETURN = 8, 9  # mathutils.scale
RAISE_LINE = 14  # mathutils.checked_ratio: raise ZeroDivisionError


@pytest.fixture
def workspace(tmp_path: Path) -> Path:
    return copy_programs(tmp_path / "ws")


def by_label(result: dict[str, Any]) -> dict[str, dict[str, Any]]:
    return dict(result["labels"])


def check_schema(messages: list[dict[str, Any]]) -> None:
    assert messages
    for message in messages:
        validate_message(message)


def rich_steps(workspace: Path) -> list[dict[str, Any]]:
    """A long VS Code-shaped session over programs/train.py: inspection, paging, evaluation in every
    context, stepping, live conditional breakpoints and logpoints, setVariable, exception filters.
    Also run through tether by the differential test (test_differential_rich.py)."""
    train, mathutils = str(workspace / "train.py"), str(workspace / "mathutils.py")
    return [
        {
            "op": "wait_stopped",
            "label": "hit",
            "reason": "breakpoint",
            "path": "train.py",
            "line": LOOP_LINE,
            "function": "train_step",
        },
        # VS Code's own paging was done by wait_stopped; page explicitly too
        {"op": "stack_trace", "label": "page1", "startFrame": 1, "levels": 1},
        {"op": "scopes", "label": "scopes"},
        {"op": "variables", "label": "locals", "scope": "Locals"},
        {
            "op": "variables",
            "label": "batch_page",
            "path": ["Locals", "batch"],
            "filter": "indexed",
            "start": 1,
            "count": 2,
        },
        {"op": "evaluate", "label": "repl", "expression": "loss + lr * 10", "context": "repl"},
        {"op": "evaluate", "label": "hover", "expression": "lr", "context": "hover"},
        {"op": "evaluate", "label": "watch", "expression": "len(batch)", "context": "watch"},
        {"op": "evaluate", "label": "struct", "expression": "{'lr': lr, 'xs': batch[:2]}"},
        {
            "op": "variables",
            "label": "struct_children",
            "variablesReference": {"$ref": "struct.variablesReference"},
        },
        {
            "op": "evaluate",
            "label": "bad",
            "expression": "no_such_name",
            "context": "watch",
            "allowError": True,
        },
        {"op": "step_in"},
        {
            "op": "wait_stopped",
            "label": "in",
            "reason": "step",
            "path": "mathutils.py",
            "line": SCALE_FIRST,
            "function": "scale",
        },
        {"op": "next"},
        {"op": "wait_stopped", "label": "next", "reason": "step", "line": SCALE_RETURN},
        {"op": "step_out"},
        {
            "op": "wait_stopped",
            "label": "out",
            "reason": "step",
            "function": "train_step",
            "line": LOOP_LINE,
        },
        {"op": "next"},
        {"op": "wait_stopped", "label": "next2", "reason": "step", "line": HISTORY_LINE},
        # live: a conditional breakpoint and a logpoint replace the plain one
        {
            "op": "set_breakpoints",
            "label": "live",
            "path": train,
            "breakpoints": [
                {"line": LOOP_LINE, "condition": "step == 2"},
                {"line": HISTORY_LINE, "logMessage": "history at {step}"},
            ],
        },
        {"op": "continue", "label": "cont"},
        {"op": "wait_output", "label": "logpoint", "contains": "history at 1"},
        {
            "op": "wait_stopped",
            "label": "cond",
            "reason": "breakpoint",
            "line": LOOP_LINE,
            "expect": {"hitBreakpointIds": [{"$ref": "live.breakpoints.0.id"}]},
        },
        {"op": "variables", "label": "cond_locals", "scope": "Locals"},
        {
            "op": "set_variable",
            "label": "setvar",
            "scope": "Locals",
            "name": "loss",
            "value": "100.0",
        },
        {"op": "evaluate", "label": "after_set", "expression": "loss"},
        # break on the handled exception in evaluate() -> checked_ratio
        {"op": "set_breakpoints", "path": train, "breakpoints": []},
        {"op": "set_exception_breakpoints", "filters": ["raised", "uncaught"]},
        {"op": "continue"},
        {
            "op": "wait_stopped",
            "label": "raised",
            "reason": "exception",
            "path": mathutils,
            "line": RAISE_LINE,
            "function": "checked_ratio",
        },
        {"op": "exception_info", "label": "info"},
        {"op": "set_exception_breakpoints", "filters": ["uncaught"]},
        {"op": "continue"},
        {"op": "wait_output", "label": "done", "contains": "eval ratio of 103.5 to zero"},
        {"op": "wait_terminated", "label": "terminated"},
        {"op": "disconnect", "label": "disconnect"},
    ]


def test_breakpoints_inspection_stepping_and_live_breakpoints(workspace: Path) -> None:
    train = str(workspace / "train.py")
    steps = rich_steps(workspace)
    with listening_debugpy(workspace, "train.py", "ok") as debuggee:
        result, messages = run_vscode_session(
            scenario(debuggee.port, workspace, steps, breakpoints={"train.py": [LOOP_LINE]}),
            timeout=120,
        )
        assert debuggee.wait() == 0, debuggee.output
    s = by_label(result)

    # configuration: debugpy verifies .py breakpoints at once, no breakpoint events
    [answer] = result["handshake"]["setBreakpoints"]
    assert [(b["verified"], b["line"]) for b in answer["breakpoints"]] == [(True, LOOP_LINE)]
    assert result["handshake"]["threads"]["threads"] == [{"id": 1, "name": "MainThread"}]
    assert result["capabilities"]["supportsConfigurationDoneRequest"] is True
    assert "breakpoint" not in result["eventCounts"]

    hit = s["hit"]
    assert hit["hitBreakpointIds"] == [answer["breakpoints"][0]["id"]]
    assert [f["name"] for f in hit["frames"]] == ["train_step", "main", "<module>"]
    assert hit["totalFrames"] == 3
    assert [len(r["body"]["stackFrames"]) for r in hit["raw"]["stackTrace"]] == [1, 2]
    assert hit["frames"][0]["path"] == train
    assert s["page1"]["names"] == ["main"] and s["page1"]["frames"][0]["line"] == 43

    assert s["scopes"]["names"] == ["Locals", "Globals"]
    assert s["locals"]["values"] == {
        "batch": "[1, 2, 3, 4]",
        "loss": "0.0",
        "lr": "0.5",
        "step": "0",
        "x": "1",
    }
    assert s["locals"]["types"]["batch"] == "list"
    # debugpy ignores variables paging (start/count): all children, plus its grouping entries
    assert s["batch_page"]["names"] == [
        "special variables",
        "function variables",
        "0",
        "1",
        "2",
        "3",
        "len()",
    ]
    assert [s["batch_page"]["values"][i] for i in "0123"] == ["1", "2", "3", "4"]

    assert (s["repl"]["result"], s["hover"]["result"], s["watch"]["result"]) == ("5.0", "0.5", "4")
    assert s["struct"]["variablesReference"] > 0
    assert s["struct_children"]["values"]["'lr'"] == "0.5"
    assert s["struct_children"]["values"]["'xs'"] == "[1, 2]"
    assert s["bad"]["success"] is False and "NameError" in s["bad"]["message"]

    assert s["in"]["frames"][1]["name"] == "train_step"
    assert s["cont"]["body"] == {"allThreadsContinued": True}
    assert s["logpoint"]["text"].endswith("history at 1\n")
    assert "history at 0" not in result["output"]["stdout"]  # we were stopped on that line
    assert s["cond_locals"]["values"]["step"] == "2"
    assert s["cond_locals"]["values"]["loss"] == "1.5"
    assert s["setvar"]["value"] == "100.0" and s["after_set"]["result"] == "100.0"

    assert s["raised"]["exception"]["exceptionId"] == "ZeroDivisionError"
    assert s["raised"]["exception"]["breakMode"] == "always"
    assert s["info"]["description"] == "ratio of 103.5 to zero"
    assert [f["name"] for f in s["raised"]["frames"][:2]] == ["checked_ratio", "evaluate"]

    # debugpy sends no `exited` in attach mode; it does send `terminated` before the answer
    assert s["terminated"]["exitCode"] is None
    assert s["disconnect"]["terminatedBeforeResponse"] is True
    assert result["sessions"][0]["closed"] is True
    assert result["messageCount"] == len(messages)
    assert messages[0]["event"] == "output" and messages[0]["body"]["category"] == "telemetry"
    check_schema(messages)

    # normalisable for differential tests: ids, seq and the workspace path drop out
    norm = normalise(hit, paths={str(workspace): "<ws>"})
    assert norm["frames"][0] == {
        "id": "<id>",
        "name": "train_step",
        "line": LOOP_LINE,
        "column": 1,
        "path": "<ws>/train.py",
        "sourceReference": 0,
    }
    assert norm["raw"]["event"]["seq"] == "<seq>"


def test_function_breakpoint_and_uncaught_exception(workspace: Path) -> None:
    steps: list[dict[str, Any]] = [
        {
            "op": "wait_stopped",
            "label": "fn",
            "reason": "function breakpoint",
            "function": "evaluate",
            "path": "train.py",
        },
        {"op": "variables", "label": "args", "scope": "Locals"},
        {"op": "continue"},
        {
            "op": "wait_stopped",
            "label": "crash",
            "reason": "exception",
            "path": "mathutils.py",
            "line": RAISE_LINE,
            "function": "checked_ratio",
        },
        {
            "op": "exception_info",
            "label": "info",
            "expect": {"exceptionId": "ZeroDivisionError", "breakMode": "unhandled"},
        },
        {"op": "evaluate", "label": "num", "expression": "numerator", "context": "hover"},
        {"op": "continue"},
        {"op": "wait_terminated"},
        {"op": "disconnect"},
    ]
    with listening_debugpy(workspace, "train.py", "crash") as debuggee:
        result, messages = run_vscode_session(
            scenario(debuggee.port, workspace, steps, function_breakpoints=[{"name": "evaluate"}]),
            timeout=120,
        )
        assert debuggee.wait() == 1
        assert "ZeroDivisionError: ratio of 4 to zero" in debuggee.output
    s = by_label(result)
    assert result["handshake"]["setFunctionBreakpoints"]["breakpoints"][0]["verified"] is True
    assert s["args"]["values"]["stats"] == "{'loss': 5.0, 'steps': 4}"
    assert s["crash"]["description"] == "ratio of 4 to zero"
    assert s["crash"]["text"] == "ZeroDivisionError"
    assert [f["name"] for f in s["crash"]["frames"]] == ["checked_ratio", "main", "<module>"]
    assert s["crash"]["exception"]["exceptionId"] == "ZeroDivisionError"
    assert s["num"]["result"] == "4"
    check_schema(messages)


async def test_pause_detach_reattach_and_set_variable(workspace: Path) -> None:
    """Pause a busy loop, detach (debugpy resumes it), re-attach on the same port, pause again and
    end the loop by setting a local. A `mark` lets the test look at the process while detached."""
    steps: list[dict[str, Any]] = [
        {"op": "wait_output", "contains": "spinning"},
        {"op": "pause", "label": "pause"},
        {
            "op": "wait_stopped",
            "label": "paused",
            "reason": "pause",
            "function": "spin",
            "expect": {"line": {"$any": list(SPIN_LINES)}},
        },
        {"op": "variables", "label": "spin_locals", "scope": "Locals"},
        {"op": "disconnect", "label": "detach", "terminateDebuggee": False},
        {"op": "mark", "name": "detached", "wait": True, "data": {"why": "check the process"}},
        {"op": "reconnect", "label": "again"},
        {"op": "pause"},
        {"op": "wait_stopped", "label": "paused2", "reason": "pause", "function": "spin"},
        {"op": "evaluate", "label": "busy", "expression": "n > 0", "context": "hover"},
        {
            "op": "set_variable",
            "label": "stop",
            "scope": "Locals",
            "name": "keep_going",
            "value": "False",
        },
        {"op": "continue"},
        {"op": "wait_output", "label": "spun", "contains": "spun True"},
        {"op": "wait_terminated"},
        {"op": "disconnect"},
    ]
    with listening_debugpy(workspace, "train.py", "spin") as debuggee:
        async with open_vscode_session(
            scenario(debuggee.port, workspace, steps), timeout=120
        ) as session:
            assert await session.wait_mark("detached") == {"why": "check the process"}
            assert debuggee.process.poll() is None  # detached, not killed
            await session.release("detached")
            result, messages = await session.result()
        assert await trio.to_thread.run_sync(debuggee.wait) == 0
    s = by_label(result)
    assert s["spin_locals"]["values"]["keep_going"] == "True"
    assert s["detach"]["arguments"] == {"restart": False, "terminateDebuggee": False}
    first, second = result["sessions"]
    assert first["closed"] and second["port"] == first["port"]
    # the new connection gets the whole handshake again, and debugpy re-announces the thread
    assert s["again"]["threads"]["threads"] == [{"id": 1, "name": "MainThread"}]
    second_events = [m.get("event") for m in messages[second["firstMessage"] :]]
    assert "initialized" in second_events and "thread" in second_events
    assert s["busy"]["result"] == "True"
    assert s["stop"]["value"] == "False"
    check_schema(messages)


def test_disconnect_with_terminate_debuggee_kills_the_program(workspace: Path) -> None:
    steps: list[dict[str, Any]] = [
        {"op": "wait_output", "contains": "spinning"},
        {"op": "pause"},
        {"op": "wait_stopped", "reason": "pause", "function": "spin"},
        {"op": "disconnect", "label": "kill", "terminateDebuggee": True},
    ]
    with listening_debugpy(workspace, "train.py", "spin") as debuggee:
        result, _ = run_vscode_session(scenario(debuggee.port, workspace, steps), timeout=120)
        debuggee.wait()  # would time out if the loop were still running
    assert result["labels"]["kill"]["success"] is True
    assert "spun" not in result["output"].get("stdout", "")
