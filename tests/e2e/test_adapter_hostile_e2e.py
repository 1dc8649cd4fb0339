"""Requests with arguments of every JSON type, at the real adapter (`tether debug`), in each phase
of a run: queued (no worker), live (the program runs under debugpy), paused.

Real processes (`tether up`, `tether debug`, `tether worker`), a real debuggee. Every request is
answered exactly once (by the adapter, or by debugpy through the worker), the adapter stays up,
and well-behaved requests after the flood still work. Arguments that are not a JSON object are
refused by the adapter whatever the command (even ``continue`` or ``disconnect``); objects with
junk in them go to debugpy only for commands that cannot change the program's course.
"""

from __future__ import annotations

import random
from pathlib import Path
from typing import Any

import pytest
import trio
from stack import PROJECT, debug_run, relay_stack, worker
from test_session_e2e import assert_schema_valid, ide_session, stopped_frame

from adapter.scripted_ide.dap_client import DapClient, open_dap_client
from protocol_specs.dap.framing import DapFramer, encode_message

pytestmark = [pytest.mark.slow, pytest.mark.timeout(240)]

#: every command the adapter handles, forwards, or refuses
COMMANDS = [
    "initialize", "attach", "launch", "configurationDone", "setBreakpoints",
    "setFunctionBreakpoints", "setExceptionBreakpoints", "threads", "disconnect", "terminate",
    "continue", "next", "stepIn", "stepOut", "pause", "goto", "restartFrame", "restart",
    "terminateThreads", "setVariable", "setExpression", "setDebuggerProperty", "stackTrace",
    "scopes", "variables", "source", "exceptionInfo", "modules", "gotoTargets", "stepInTargets",
    "completions", "evaluate", "pydevdSystemInfo", "loadedSources", "cancel", "readMemory",
    "bogus",
]  # fmt: skip
#: commands that may be given junk objects (or nothing) while the program runs: none of them
#: changes the program's course or the session (debugpy answers junk with an error)
HARMLESS = [
    "initialize", "attach", "launch", "configurationDone", "threads", "stackTrace", "scopes",
    "variables", "source", "exceptionInfo", "modules", "gotoTargets", "stepInTargets",
    "completions", "evaluate", "pydevdSystemInfo", "loadedSources", "cancel", "readMemory",
    "bogus",
]  # fmt: skip
KEYS = [
    "threadId", "frameId", "variablesReference", "expression", "context", "source", "line",
    "name", "format", "start", "count", "adapterID", "text", "column", "k",
]  # fmt: skip
MISSING = object()  # a request without "arguments"


def junk(rng: random.Random, depth: int = 0) -> Any:
    """A JSON value of any type (a string never long enough to be an expression that does
    anything: debugpy evaluates ``expression`` as given)."""
    match rng.randrange(7 if depth < 2 else 5):
        case 0:
            return None
        case 1:
            return rng.choice([True, False])
        case 2:
            return rng.choice([0, -1, 1, 7, 2**63 - 1, -(2**63), 2**64 - 1])
        case 3:
            return rng.choice([0.5, -1e308, 1e-9, 3.0])
        case 4:
            return rng.choice(["", "x", "\u00e9\u4e2d", "{", "1 +", "\x00", "a" * 3000])
        case 5:
            return [junk(rng, depth + 1) for _ in range(rng.randrange(4))]
        case _:
            return {rng.choice(KEYS): junk(rng, depth + 1) for _ in range(rng.randrange(1, 4))}


def hostile(rng: random.Random, *, program_runs: bool) -> tuple[str, Any]:
    """One request: a command and arguments of a JSON type chosen in turn. Objects (or nothing)
    go to :data:`HARMLESS` commands only while a program runs; while queued, to any command but
    a real ``disconnect`` or ``terminate``."""
    kind = rng.randrange(8)
    if kind < 5:
        command = rng.choice(COMMANDS)
    elif program_runs:
        command = rng.choice(HARMLESS)
    else:
        command = rng.choice([c for c in COMMANDS if c not in ("disconnect", "terminate")])
    match kind:
        case 0:
            return command, rng.choice([True, False])
        case 1:
            return command, rng.choice([0, -3, 2**64 - 1, 1.5])
        case 2:
            return command, rng.choice(["", "abc", "{}", "\u00e9"])
        case 3:
            return command, [junk(rng) for _ in range(rng.randrange(3))]
        case 4:
            return command, [1]
        case 5:
            return command, None  # an explicit null: counts as {}
        case 6:
            return command, MISSING
        case _:
            return command, {rng.choice(KEYS): junk(rng) for _ in range(rng.randrange(1, 4))}


def send(ide: DapClient, command: str, arguments: Any) -> int:
    """Queue a request whose ``arguments`` may be anything (DapClient sends objects only)."""
    message: dict[str, Any] = {"type": "request", "command": command}
    if arguments is not MISSING:
        message["arguments"] = arguments
    seq = ide._queue(message)
    ide._commands[seq] = command
    return seq


async def flood(
    ide: DapClient, rng: random.Random, count: int, *, program_runs: bool
) -> dict[int, dict[str, Any]]:
    """``count`` hostile requests, pipelined; their answers by ``seq``."""
    answers: dict[int, dict[str, Any]] = {}
    later = []
    for _ in range(count):
        command, arguments = hostile(rng, program_runs=program_runs)
        seq = send(ide, command, arguments)
        if isinstance(arguments, dict) or arguments in (None, MISSING) or command == "threads":
            later.append(seq)  # answered by the adapter or by debugpy: collected below
            continue
        answers[seq] = await ide.response(seq, timeout=10)  # refused by the adapter, at once
        assert answers[seq]["success"] is False, answers[seq]
        assert "must be a JSON object" in answers[seq]["message"], answers[seq]
    for seq in later:
        answers[seq] = await ide.response(seq, timeout=30)
    return answers


def from_debugpy(answers: dict[int, dict[str, Any]]) -> int:
    """How many of ``answers`` debugpy gave (tether's own texts start differently)."""
    return sum(
        1
        for a in answers.values()
        if a["command"] not in ("initialize", "configurationDone", "threads", "attach", "launch")
        and (a["success"] or "__init__()" in a.get("message", ""))
    )


async def test_requests_with_arguments_of_every_json_type_in_every_phase(tmp_path: Path) -> None:
    workdir = tmp_path / "project"
    workdir.mkdir()
    for f in PROJECT.glob("*.py"):
        (workdir / f.name).write_text(f.read_text())
    home = tmp_path / "home"
    rng = random.Random(20260311)
    flooded: dict[int, dict[str, Any]] = {}
    async with (
        relay_stack(home) as (_up, relay),
        debug_run(
            home, relay, workdir, "python", "app.py", "spin", extra=("--request-timeout", "5")
        ) as (debug, _run, port),
    ):
        # the reported crash, on a connection of its own: initialize "abc", attach,
        # configurationDone while the run is queued
        stream = await trio.open_tcp_stream("127.0.0.1", port)
        framer = DapFramer()
        answered: dict[int, dict[str, Any]] = {}
        for seq, command, arguments in (
            (1, "initialize", "abc"),
            (2, "attach", {}),
            (3, "configurationDone", None),
            (4, "disconnect", [1]),
        ):
            request = {"seq": seq, "type": "request", "command": command, "arguments": arguments}
            await stream.send_all(encode_message(request))
        with trio.fail_after(10):
            while len(answered) < 4:
                while (msg := framer.next_message()) is not None:
                    if msg["type"] == "response":
                        assert msg["request_seq"] not in answered
                        answered[msg["request_seq"]] = msg
                if len(answered) < 4:
                    framer.receive_data(await stream.receive_some(65536))
        assert [answered[s]["success"] for s in (1, 2, 3, 4)] == [False, True, True, False]
        await stream.aclose()

        async with open_dap_client("127.0.0.1", port) as ide:
            async with ide_session(ide, []):
                pass
            with trio.fail_after(60):
                flooded.update(await flood(ide, rng, 100, program_runs=False))  # queued
            assert (await ide.request("threads"))["body"] == {"threads": []}

            async with worker(home, relay):
                thread = (await ide.wait_event("thread", timeout=60))["body"]["threadId"]
                await ide.wait_event(
                    "output", timeout=60, predicate=lambda e: "outcome" in e["body"]["output"]
                )
                with trio.fail_after(60):
                    live = await flood(ide, rng, 100, program_runs=True)
                assert from_debugpy(live) > 10  # many reached debugpy through the worker
                flooded.update(live)
                threads = await ide.request("threads")
                assert thread in [t["id"] for t in threads["body"]["threads"]]
                assert not any(m.get("event") == "stopped" for m in ide.received)

                assert (await ide.request("pause", {"threadId": thread}))["success"]
                _stopped, frame = await stopped_frame(ide)
                assert frame["name"] == "main"
                with trio.fail_after(60):
                    paused = await flood(ide, rng, 100, program_runs=True)
                assert from_debugpy(paused) > 10
                flooded.update(paused)
                # well-behaved requests still work
                result = await ide.request(
                    "evaluate", {"expression": "n >= 0", "frameId": frame["id"], "context": "repl"}
                )
                assert result["success"] and result["body"]["result"] == "True", result
                stack = await ide.request("stackTrace", {"threadId": thread, "levels": 1})
                assert stack["body"]["stackFrames"][0]["name"] == "main"

                answers: dict[int, int] = {}
                for msg in ide.received:
                    if msg["type"] == "response":
                        answers[msg["request_seq"]] = answers.get(msg["request_seq"], 0) + 1
                assert len(flooded) == 300
                assert [s for s in flooded if answers.get(s) != 1] == []  # each exactly once
                assert_schema_valid(ide)
                await ide.request("disconnect", {"terminateDebuggee": True})
        await debug.wait_line(r"ended \(cancelled", timeout=60)
    assert "Traceback" not in debug.output, debug.output
