"""End to end, with real processes on loopback: `tether up` (bundled server + relay), `tether worker`,
`tether debug`, real debugpy, and tether's Python DAP client following VS Code's attach sequence.

The worker is started only after the IDE configured everything, so "answered before any worker
exists" is a fact of the test, not a race. Every message tether sends is validated against the DAP
schema.
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import pytest
import trio
from stack import debug_run, relay_stack, worker

from adapter.scripted_ide.dap_client import DapClient, open_dap_client
from adapter.scripted_ide.demo import VSCODE_INITIALIZE
from protocol_specs.dap.schema import validate_message

pytestmark = [pytest.mark.slow, pytest.mark.timeout(180)]

PROJECT = Path(__file__).resolve().parent / "project"


def src(workdir: Path, name: str) -> dict[str, str]:
    return {"name": name, "path": str(workdir / name)}


def bp_args(workdir: Path, name: str, *lines: int, **extra: Any) -> dict[str, Any]:
    return {
        "source": src(workdir, name),
        "lines": list(lines),
        "breakpoints": [{"line": n, **extra} for n in lines],
    }


@pytest.fixture
def workdir(tmp_path: Path) -> Path:
    """A copy of the user project (the snapshot root); frames must come back with these paths."""
    dest = tmp_path / "project"
    dest.mkdir()
    for f in PROJECT.glob("*.py"):
        (dest / f.name).write_text(f.read_text())
    return dest


@asynccontextmanager
async def ide_session(
    client: DapClient, breakpoints: list[dict[str, Any]], *, filters: list[str] | None = None
) -> AsyncIterator[list[dict[str, Any]]]:
    """VS Code's sequence: initialize, attach (not awaited), initialized, config in parallel, configurationDone."""
    init = await client.request("initialize", VSCODE_INITIALIZE)
    assert init["success"] and init["body"]["supportsConfigurationDoneRequest"]
    attach = client.send_request_nowait(
        "attach",
        {
            "name": "tether",
            "type": "debugpy",
            "request": "attach",
            "connect": {"host": "127.0.0.1", "port": 0},
            "justMyCode": True,
            "debugOptions": ["RedirectOutput", "ShowReturnValue"],
            "showReturnValue": True,
        },
    )
    await client.wait_event("initialized", timeout=10)
    seqs = [client.send_request_nowait("setBreakpoints", args) for args in breakpoints]
    seqs.append(client.send_request_nowait("setFunctionBreakpoints", {"breakpoints": []}))
    seqs.append(
        client.send_request_nowait(
            "setExceptionBreakpoints", {"filters": filters if filters is not None else ["uncaught"]}
        )
    )
    responses = [await client.response(s) for s in seqs]
    done = await client.request("configurationDone")
    assert done["success"]
    assert (await client.response(attach))["success"]
    yield responses


def assert_schema_valid(client: DapClient) -> None:
    for message in client.received:
        validate_message(message)


async def resume(client: DapClient, command: str, thread: int) -> dict[str, Any]:
    """Step or continue; stops reported before it are stale (debugpy may report one stop twice)."""
    client.discard_events("stopped")
    response = await client.request(command, {"threadId": thread})
    assert response["success"], response
    return response


async def stopped_frame(client: DapClient) -> tuple[dict[str, Any], dict[str, Any]]:
    stopped = await client.wait_event("stopped", timeout=60)
    thread = stopped["body"]["threadId"]
    stack = await client.request("stackTrace", {"threadId": thread, "startFrame": 0, "levels": 1})
    assert stack["success"], stack
    return stopped, stack["body"]["stackFrames"][0]


async def test_breakpoints_set_while_queued_apply_when_the_worker_starts(
    tmp_path: Path, workdir: Path
) -> None:
    home = tmp_path / "home"
    async with (
        relay_stack(home) as (_up, relay),
        debug_run(home, relay, workdir, "python", "app.py") as (debug, _run_id, port),
    ):
        async with open_dap_client("127.0.0.1", port) as ide:
            async with ide_session(
                ide, [bp_args(workdir, "app.py", 11), bp_args(workdir, "helpers.py", 5)]
            ) as responses:
                app_bp, helper_bp = (r["body"]["breakpoints"][0] for r in responses[:2])
                # answered before any worker exists
                assert not app_bp["verified"] and "waiting for a worker" in app_bp["message"]
                assert app_bp["id"] != helper_bp["id"]
            assert (await ide.request("threads"))["body"] == {"threads": []}
            refused = await ide.request("evaluate", {"expression": "1+1", "context": "repl"})
            assert not refused["success"] and "queued" in refused["message"]

            async with worker(home, relay):
                verified = {}
                while len(verified) < 2:
                    event = await ide.wait_event(
                        "breakpoint",
                        timeout=60,
                        predicate=lambda e: e["body"]["breakpoint"]["id"] not in verified,
                    )
                    bp = event["body"]["breakpoint"]
                    assert event["body"]["reason"] == "changed" and bp["verified"] is True
                    verified[bp["id"]] = bp
                assert set(verified) == {app_bp["id"], helper_bp["id"]}

                stopped, frame = await stopped_frame(ide)
                assert stopped["body"]["reason"] == "breakpoint"
                assert stopped["body"]["hitBreakpointIds"] == [app_bp["id"]]
                assert (frame["name"], frame["line"], frame["source"]["path"]) == (
                    "compute",
                    11,
                    str(workdir / "app.py"),
                )
                thread = stopped["body"]["threadId"]

                threads = await ide.request("threads")
                assert thread in [t["id"] for t in threads["body"]["threads"]]
                rest = await ide.request(
                    "stackTrace", {"threadId": thread, "startFrame": 1, "levels": 19}
                )
                assert [f["name"] for f in rest["body"]["stackFrames"]][:2] == ["main", "<module>"]

                scopes = await ide.request("scopes", {"frameId": frame["id"]})
                local_ref = scopes["body"]["scopes"][0]["variablesReference"]
                variables = await ide.request("variables", {"variablesReference": local_ref})
                values = {v["name"]: v["value"] for v in variables["body"]["variables"]}
                assert values["factor"] == "10" and values["total"] == "0" and values["i"] == "0"
                for context in ("repl", "hover", "watch"):
                    result = await ide.request(
                        "evaluate",
                        {"expression": "factor * 2", "frameId": frame["id"], "context": context},
                    )
                    assert result["body"]["result"] == "20"
                changed = await ide.request(
                    "setVariable",
                    {"variablesReference": local_ref, "name": "factor", "value": "100"},
                )
                assert changed["body"]["value"] == "100"

                await resume(ide, "stepIn", thread)
                _, frame = await stopped_frame(ide)
                assert (frame["name"], frame["source"]["path"]) == (
                    "scale",
                    str(workdir / "helpers.py"),
                )
                await resume(ide, "next", thread)
                _, frame = await stopped_frame(ide)
                assert frame["name"] == "scale" and frame["line"] == 6
                await resume(ide, "stepOut", thread)
                _, frame = await stopped_frame(ide)
                assert frame["name"] == "compute"

                # a breakpoint added while live takes effect; conditional, plus a logpoint
                live = await ide.request(
                    "setBreakpoints",
                    {
                        "source": src(workdir, "app.py"),
                        "lines": [11, 12],
                        "breakpoints": [
                            {"line": 11, "condition": "i == 3"},
                            {"line": 12, "logMessage": "total is {total}"},
                        ],
                    },
                )
                assert [b["verified"] for b in live["body"]["breakpoints"]] == [True, True]
                assert live["body"]["breakpoints"][0]["id"] == app_bp["id"]  # stable across edits
                await ide.request(
                    "setBreakpoints",
                    {"source": src(workdir, "helpers.py"), "lines": [], "breakpoints": []},
                )
                await resume(ide, "continue", thread)
                _, frame = await stopped_frame(ide)
                scopes = await ide.request("scopes", {"frameId": frame["id"]})
                variables = await ide.request(
                    "variables",
                    {"variablesReference": scopes["body"]["scopes"][0]["variablesReference"]},
                )
                assert {v["name"]: v["value"] for v in variables["body"]["variables"]}["i"] == "3"

                await ide.request(
                    "setBreakpoints",
                    {
                        "source": src(workdir, "app.py"),
                        "lines": [12],
                        "breakpoints": [{"line": 12, "logMessage": "total is {total}"}],
                    },
                )
                await resume(ide, "continue", thread)
                log = await ide.wait_event(
                    "output", timeout=30, predicate=lambda e: "total is" in e["body"]["output"]
                )
                assert log["body"]["output"].startswith("total is")
                exited = await ide.wait_event("exited", timeout=60)
                assert exited["body"]["exitCode"] == 0
                await ide.wait_event("terminated", timeout=10)
                assert_schema_valid(ide)
                await ide.request("disconnect", {})
        await debug.wait_line(r"ended \(exited, exit code 0\)")


async def test_only_the_last_configuration_per_source_applies(
    tmp_path: Path, workdir: Path
) -> None:
    home = tmp_path / "home"
    async with (
        relay_stack(home) as (_up, relay),
        debug_run(home, relay, workdir, "python", "app.py") as (_debug, _run, port),
    ):
        async with open_dap_client("127.0.0.1", port) as ide:
            async with ide_session(
                ide, [bp_args(workdir, "app.py", 9), bp_args(workdir, "helpers.py", 5)]
            ):
                pass
            await ide.request("setBreakpoints", bp_args(workdir, "app.py", 19))
            await ide.request("setBreakpoints", bp_args(workdir, "helpers.py"))
            final = await ide.request("setBreakpoints", bp_args(workdir, "app.py", 12))
            final_id = final["body"]["breakpoints"][0]["id"]
            async with worker(home, relay):
                stopped, frame = await stopped_frame(ide)
                assert frame["line"] == 12 and stopped["body"]["hitBreakpointIds"] == [final_id]
                await ide.request("continue", {"threadId": stopped["body"]["threadId"]})
                exited = await ide.wait_event("exited", timeout=60)
                assert exited["body"]["exitCode"] == 0
        assert_schema_valid(ide)


async def test_uncaught_exception_stops_with_exception_info_and_fails_the_run(
    tmp_path: Path, workdir: Path
) -> None:
    home = tmp_path / "home"
    async with (
        relay_stack(home, workers=1) as (_up, relay),
        debug_run(home, relay, workdir, "python", "app.py", "crash") as (debug, _run, port),
    ):
        async with open_dap_client("127.0.0.1", port) as ide:
            async with ide_session(ide, []):
                pass
            stopped, _frame = await stopped_frame(ide)
            assert stopped["body"]["reason"] == "exception"
            info = await ide.request("exceptionInfo", {"threadId": stopped["body"]["threadId"]})
            assert (
                info["body"]["exceptionId"].endswith("ValueError")
                and "boom: 150" in info["body"]["description"]
            )
            await ide.request("continue", {"threadId": stopped["body"]["threadId"]})
            exited = await ide.wait_event("exited", timeout=60)
            assert exited["body"]["exitCode"] == 1
            assert_schema_valid(ide)
        await debug.wait_line(r"ended \(exited, exit code 1\)")


async def test_multiprocessing_pool_runs_to_completion(tmp_path: Path, workdir: Path) -> None:
    home = tmp_path / "home"
    async with (
        relay_stack(home, workers=1) as (_up, relay),
        debug_run(home, relay, workdir, "python", "pool.py") as (_debug, _run, port),
    ):
        async with open_dap_client("127.0.0.1", port) as ide:
            async with ide_session(ide, [bp_args(workdir, "pool.py", 14)]):
                pass
            stopped, frame = await stopped_frame(ide)
            assert frame["line"] == 14
            scopes = await ide.request("scopes", {"frameId": frame["id"]})
            variables = await ide.request(
                "variables",
                {"variablesReference": scopes["body"]["scopes"][0]["variablesReference"]},
            )
            assert {v["name"]: v["value"] for v in variables["body"]["variables"]}[
                "results"
            ] == "[0, 1, 4, 9, 16, 25, 36, 49]"
            await ide.request("continue", {"threadId": stopped["body"]["threadId"]})
            exited = await ide.wait_event("exited", timeout=60)
            assert exited["body"]["exitCode"] == 0


async def test_pause_detach_reattach_and_terminate(tmp_path: Path, workdir: Path) -> None:
    """Pause a running program; a closed IDE connection only detaches (the program stays paused);
    a new IDE sees the stop replayed; disconnect with terminateDebuggee cancels the run."""
    home = tmp_path / "home"
    async with (
        relay_stack(home, workers=1) as (_up, relay),
        debug_run(home, relay, workdir, "python", "app.py", "spin") as (debug, _run_id, port),
    ):
        async with open_dap_client("127.0.0.1", port) as ide:
            async with ide_session(ide, []):
                pass
            thread_event = await ide.wait_event("thread", timeout=60)
            thread = thread_event["body"]["threadId"]
            # the program's own output reaches the IDE; once it printed, it is spinning in main()
            await ide.wait_event(
                "output", timeout=60, predicate=lambda e: "outcome" in e["body"]["output"]
            )
            paused = await ide.request("pause", {"threadId": thread})
            assert paused["success"]
            stopped, frame = await stopped_frame(ide)
            assert stopped["body"]["reason"] == "pause" and frame["source"]["path"] == str(
                workdir / "app.py"
            ), frame
            assert frame["name"] == "main", frame
        # the IDE is gone; a new one attaches and is told the thread is stopped
        async with open_dap_client("127.0.0.1", port) as ide:
            async with ide_session(ide, []):
                pass
            stopped = await ide.wait_event("stopped", timeout=10)
            assert stopped["body"]["threadId"] == thread
            stack = await ide.request(
                "stackTrace", {"threadId": thread, "startFrame": 0, "levels": 1}
            )
            assert stack["body"]["stackFrames"][0]["name"] == "main", stack["body"]
            await ide.request("disconnect", {"terminateDebuggee": True})
        await debug.wait_line(r"ended \(cancelled", timeout=60)


async def test_bad_input_gets_errors_and_the_adapter_survives(
    tmp_path: Path, workdir: Path
) -> None:
    home = tmp_path / "home"
    async with (
        relay_stack(home, workers=1) as (_up, relay),
        debug_run(home, relay, workdir, "python", "app.py", extra=("--request-timeout", "2")) as (
            debug,
            _run,
            port,
        ),
    ):
        # non-JSON body with a valid header: an error response, the connection stays usable
        stream = await trio.open_tcp_stream("127.0.0.1", port)
        await stream.send_all(b"Content-Length: 5\r\n\r\nhello")
        from protocol_specs.dap.framing import DapFramer, encode_message

        framer = DapFramer()
        with trio.fail_after(10):
            while (msg := framer.next_message()) is None:
                framer.receive_data(await stream.receive_some(65536))
        assert msg["event"] == "output" and "malformed" in msg["body"]["output"]
        await stream.send_all(
            encode_message(
                {
                    "seq": 1,
                    "type": "request",
                    "command": "initialize",
                    "arguments": {"adapterID": "x"},
                }
            )
        )
        with trio.fail_after(10):
            while (msg := framer.next_message()) is None:
                framer.receive_data(await stream.receive_some(65536))
        assert msg["command"] == "initialize" and msg["success"]
        # a broken header or an oversized body: the connection is closed
        for garbage in (b"Content-Length: banana\r\n\r\n", b"Content-Length: 999999999999\r\n\r\n"):
            bad = await trio.open_tcp_stream("127.0.0.1", port)
            await bad.send_all(garbage)
            with trio.fail_after(10):
                assert await bad.receive_some(65536) == b""
            await bad.aclose()
        await stream.aclose()
        assert "bad DAP input" in debug.output or "closed the IDE connection" in debug.output
        # the adapter and the run survive: a real session still works, unknown commands time out
        async with open_dap_client("127.0.0.1", port) as ide:
            async with ide_session(ide, [bp_args(workdir, "app.py", 11)]):
                pass
            stopped, _frame = await stopped_frame(ide)
            # debugpy never answers requests it does not know, and stalls meanwhile: refused at once
            unknown = await ide.request("loadedSources", timeout=1)
            assert unknown["success"] is False and "not supported" in unknown["message"]
            threads = await ide.request("threads")
            assert threads["success"]
            cleared = await ide.request("setBreakpoints", bp_args(workdir, "app.py"))
            assert cleared["success"], cleared.get("message")
            resumed = await ide.request("continue", {"threadId": stopped["body"]["threadId"]})
            assert resumed["success"], resumed
            exited = await ide.wait_event("exited", timeout=60)
            assert exited["body"]["exitCode"] == 0
            assert_schema_valid(ide)
