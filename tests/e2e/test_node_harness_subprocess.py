"""The DebugClient harness with several debug sessions, against plain debugpy: does it behave like VS
Code when a program starts Python children?

debugpy started with ``--configure-subProcess true`` announces every new Python child to the parent
session's client: the ``startDebugging`` reverse request when the client's ``initialize`` offered it,
else the ``debugpyAttach`` event. VS Code answers, opens a new connection to the port the
configuration names and runs the whole attach handshake there (same breakpoints as every session).
The runner (``node/vscode_scenario.mjs``) must do the same, or the child never runs past debugpy's
"wait for a client" gate; these tests pin that against the reference implementation, so that the
same scenarios against tether (``test_processes_e2e.py``) test tether and not the harness.
"""

from __future__ import annotations

import json
from functools import partial
from pathlib import Path
from typing import Any

import direct_debugpy
import pytest
import trio
from direct_debugpy import copy_programs, listening_debugpy
from node_harness import (
    run_vscode_session,
    scenario,
    session_messages,
    sessions_by_kind,
    vscode_initialize,
)

from protocol_specs.dap.schema import validate_message
from worker_shim.program.python_command import build_debug_argv

pytestmark = [pytest.mark.slow, pytest.mark.timeout(180)]

# programs/mp_spawn.py
CHILD_LINE = 9  # work: print(f"child total {total}")


@pytest.fixture
def workspace(tmp_path: Path) -> Path:
    return copy_programs(tmp_path / "ws")


@pytest.fixture
def subprocess_debugpy(monkeypatch: pytest.MonkeyPatch) -> None:
    """listening_debugpy, with debugpy's subprocess support on (as tether's worker turns it on)."""

    def argv(user_argv: list[str], **kwargs: Any) -> list[str]:
        args = build_debug_argv(user_argv, **kwargs)
        i = args.index("--configure-subProcess")
        return [*args[: i + 1], "true", *args[i + 2 :]]

    monkeypatch.setattr(direct_debugpy, "build_debug_argv", argv)


@pytest.mark.usefixtures("subprocess_debugpy")
@pytest.mark.parametrize("start_debugging", [True, False], ids=["startDebugging", "debugpyAttach"])
def test_child_session_stops_in_the_child_and_the_run_completes(
    workspace: Path, start_debugging: bool
) -> None:
    steps: list[dict[str, Any]] = [
        # spawn starts multiprocessing's resource tracker first: a child too, which never stops
        {"op": "wait_session", "label": "kid", "name": r"^Subprocess \d+$", "stopped": True},
        {
            "op": "wait_stopped",
            "session": "kid",
            "label": "hit",
            "reason": "breakpoint",
            "path": "mp_spawn.py",
            "line": CHILD_LINE,
            "function": "work",
        },
        {"op": "variables", "session": "kid", "label": "locals", "scope": "Locals"},
        {"op": "evaluate", "session": "kid", "label": "sum", "expression": "total + n"},
        {"op": "continue", "session": "kid"},
        {"op": "wait_terminated", "session": "kid", "label": "kid_end"},
        {"op": "wait_output", "label": "done", "contains": "parent done, child exit code 0"},
        {"op": "wait_terminated", "label": "end"},
        {"op": "disconnect"},
    ]
    spec = scenario(0, workspace, steps, breakpoints={"mp_spawn.py": [CHILD_LINE]})
    spec["initialize"] = vscode_initialize(supportsStartDebuggingRequest=start_debugging)
    spec["transcript"] = str(workspace.parent / "transcript.jsonl")
    with listening_debugpy(workspace, "mp_spawn.py") as debuggee:
        spec["port"] = debuggee.port
        spec["attach"]["connect"]["port"] = debuggee.port
        result, messages = run_vscode_session(spec, timeout=150)
        assert debuggee.wait() == 0, debuggee.output
    labels = result["labels"]

    [main] = sessions_by_kind(result, "main")
    children = sessions_by_kind(result, "child")
    kid = labels["kid"]
    child = result["sessions"][kid["session"]]
    assert len(children) == 2 and child in children  # the resource tracker and the worker
    pid = kid["subProcessId"]
    assert isinstance(pid, int) and pid != 0
    assert kid["parent"] == main["index"] and kid["child"] == child["child"]
    assert kid["name"] == f"Subprocess {pid}" and child["name"] == kid["name"]
    assert kid["port"] == debuggee.port  # debugpy names its own port for the child
    if start_debugging:
        assert kid["via"] == "startDebugging"
        reverse = main["reverseRequests"]
        assert [r["command"] for r in reverse] == ["startDebugging"] * 2
        assert {r["arguments"]["request"] for r in reverse} == {"attach"}
        assert pid in [r["arguments"]["configuration"]["subProcessId"] for r in reverse]
    else:
        assert kid["via"] == "debugpyAttach" and main["reverseRequests"] == []
    # the child's handshake: the main session's breakpoints, attach = the configuration
    handshake = kid["handshake"]
    [answer] = handshake["setBreakpoints"]
    assert [(b["verified"], b["line"]) for b in answer["breakpoints"]] == [(True, CHILD_LINE)]
    assert handshake["attach"]["success"] is True
    assert handshake["initialize"]["success"] is True

    hit = labels["hit"]
    assert hit["session"] == child["index"]
    assert hit["frames"][0]["path"] == str(workspace / "mp_spawn.py")
    assert labels["locals"]["values"]["total"] == "42"
    assert labels["locals"]["values"]["n"] == "6"
    assert labels["sum"]["result"] == "48"
    # the child's stop and output went to the child's session only
    assert "stopped" not in result["eventCounts"]
    assert child["eventCounts"]["stopped"] == 1
    assert "child total 42" in child["output"]["stdout"]
    assert "child total 42" not in result["output"].get("stdout", "")
    assert child["eventCounts"]["terminated"] == 1
    # VS Code disconnects a session whose debuggee terminated; so does the runner
    sent = [json.loads(line) for line in Path(spec["transcript"]).read_text().splitlines()]
    child_sent = [
        t["msg"] for t in sent if t["session"] == child["index"] and t["dir"] == "client->adapter"
    ]
    assert [m["command"] for m in child_sent][:2] == ["initialize", "attach"]
    assert child_sent[1]["arguments"]["subProcessId"] == pid
    assert child_sent[1]["arguments"]["request"] == "attach"
    # VS Code gives the new session its own id
    assert child_sent[1]["arguments"]["__sessionId"] != spec["attach"]["__sessionId"]
    assert child_sent[-1]["command"] == "disconnect"

    # every message is attributed to the session that received it
    assert len(result["messageSessions"]) == len(messages) == result["messageCount"]
    child_messages = session_messages(result, messages, child["index"])
    assert len(child_messages) == child["messageCount"]
    assert any(m.get("event") == "stopped" for m in child_messages)
    assert all(m.get("event") != "stopped" for m in session_messages(result, messages, 0))
    for message in messages:
        validate_message(message)


# --- the runner's own bookkeeping, against a scripted adapter ------------------------------------------

HEADER_END = b"\r\n\r\n"


class FakeParentAdapter:
    """Each connection a session: the main one (no ``subProcessId``) announces children 10 and 11
    with ``startDebugging`` once configured, child 11 announces 12; every child stops at once
    (thread id = its pid) and answers ``evaluate`` with its pid."""

    def __init__(self, port_box: list[int]) -> None:
        self.port_box = port_box
        self.attach_args: list[dict[str, Any]] = []
        self.replies: list[dict[str, Any]] = []

    async def handle(self, stream: trio.SocketStream) -> None:
        seq = 0
        attach: dict[str, Any] = {}

        async def send(message: dict[str, Any]) -> None:
            nonlocal seq
            seq += 1
            body = json.dumps({"seq": seq, **message}).encode()
            await stream.send_all(b"Content-Length: %d\r\n\r\n" % len(body) + body)

        async def respond(request: dict[str, Any], body: Any = None) -> None:
            await send(
                {
                    "type": "response",
                    "request_seq": request["seq"],
                    "command": request["command"],
                    "success": True,
                    **({"body": body} if body is not None else {}),
                }
            )

        async def start_debugging(pid: int) -> None:
            configuration = {
                "name": f"rank {pid - 10} (pid {pid})",
                "subProcessId": pid,
                "connect": {"host": "127.0.0.1", "port": self.port_box[0]},
            }
            await send(
                {
                    "type": "request",
                    "command": "startDebugging",
                    "arguments": {"request": "attach", "configuration": configuration},
                }
            )

        buffer = b""
        async for chunk in stream:
            buffer += chunk
            while HEADER_END in buffer:
                header, rest = buffer.split(HEADER_END, 1)
                length = int(header.split(b":")[1])
                if len(rest) < length:
                    break
                msg, buffer = json.loads(rest[:length]), rest[length:]
                if msg["type"] == "response":
                    self.replies.append(msg)
                    continue
                command, args = msg["command"], msg.get("arguments", {})
                pid = attach.get("arguments", {}).get("subProcessId")
                if command == "initialize":
                    await respond(msg, {"supportsConfigurationDoneRequest": True})
                elif command == "attach":
                    attach = msg
                    self.attach_args.append(args)
                    await send({"type": "event", "event": "initialized"})
                elif command == "setBreakpoints":
                    bps = [
                        {"id": 1, "verified": True, "line": b["line"]} for b in args["breakpoints"]
                    ]
                    await respond(msg, {"breakpoints": bps})
                elif command == "setFunctionBreakpoints":
                    await respond(msg, {"breakpoints": []})
                elif command == "configurationDone":
                    await respond(msg)
                    await respond(attach)
                    for child in {None: [10, 11], 11: [12]}.get(pid, []):
                        await start_debugging(child)
                    if pid is not None:
                        body = {"reason": "breakpoint", "threadId": pid}
                        await send({"type": "event", "event": "stopped", "body": body})
                elif command == "threads":
                    await respond(msg, {"threads": [{"id": pid or 1, "name": "MainThread"}]})
                elif command == "stackTrace":
                    top = {"id": 1, "name": f"fn{pid}", "line": 3, "column": 1}
                    await respond(msg, {"stackFrames": [top], "totalFrames": 1})
                elif command == "evaluate":
                    await respond(msg, {"result": str(pid), "variablesReference": 0})
                else:  # setExceptionBreakpoints, disconnect
                    await respond(msg)


async def test_child_sessions_are_selected_by_label_pid_number_and_name(tmp_path: Path) -> None:
    path = str(tmp_path / "x.py")
    steps: list[dict[str, Any]] = [
        {"op": "wait_session", "label": "r1", "subProcessId": 11},
        {"op": "wait_session", "label": "grandchild", "name": r"\(pid 12\)"},
        {"op": "wait_stopped", "session": "r1", "label": "s11", "function": "fn11"},
        {"op": "evaluate", "session": 10, "label": "by_pid", "expression": "pid"},
        {"op": "evaluate", "session": "child:2", "label": "by_number", "expression": "pid"},
        {"op": "evaluate", "session": "^rank 2 ", "label": "by_name", "expression": "pid"},
        {"op": "evaluate", "session": "grandchild", "label": "by_label", "expression": "pid"},
        {"op": "threads", "label": "main_threads"},
        {"op": "set_breakpoints", "path": path, "lines": [5]},
        {"op": "evaluate", "session": "nobody", "expression": "1", "timeoutMs": 300},
    ]
    port_box: list[int] = []
    fake = FakeParentAdapter(port_box)
    async with trio.open_nursery() as nursery:
        listeners = await nursery.start(partial(trio.serve_tcp, fake.handle, 0, host="127.0.0.1"))
        port_box.append(listeners[0].socket.getsockname()[1])
        spec = scenario(port_box[0], tmp_path, steps, breakpoints={path: [3]})
        result, messages = await trio.to_thread.run_sync(
            partial(run_vscode_session, spec, timeout=60, check=False)
        )
        nursery.cancel_scope.cancel()
    labels = result["labels"]
    # every step but the last passed; the last waited for a child nobody opened
    assert result["failedStep"] == len(steps) - 1
    assert 'no child session "nobody" within 300 ms' in result["error"]
    children = sessions_by_kind(result, "child")
    assert [c["subProcessId"] for c in children] == [10, 11, 12]
    assert [c["parent"] for c in children] == [0, 0, children[1]["index"]]
    assert labels["r1"]["child"] == 2 and labels["grandchild"]["child"] == 3
    assert (labels["s11"]["threadId"], labels["s11"]["session"]) == (11, children[1]["index"])
    results = [labels[k]["result"] for k in ("by_pid", "by_number", "by_name", "by_label")]
    assert results == ["10", "11", "12", "12"]
    assert labels["main_threads"]["threads"] == [{"id": 1, "name": "MainThread"}]
    # startDebugging answered success at once, on the connection that asked
    assert len(fake.replies) == 3 and all(r["success"] for r in fake.replies)
    # each child attached with its configuration, and got the scenario's breakpoints
    main_attach, *child_attach = fake.attach_args
    assert "subProcessId" not in main_attach
    assert sorted(a["subProcessId"] for a in child_attach) == [10, 11, 12]
    assert all(a["request"] == "attach" for a in child_attach)
    for child in children:
        assert [b["line"] for b in child["breakpoints"].values()] == [3]
    assert sum(len(session_messages(result, messages, c["index"])) for c in children) == sum(
        c["messageCount"] for c in children
    )
