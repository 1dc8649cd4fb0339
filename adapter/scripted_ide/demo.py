"""The scripted IDE of ``tether demo`` (the stack and the run around it: ``adapter.cli.demo``).

It plays the IDE with tether's small DAP client, following VS Code's attach sequence against the
adapter of a run of ``examples/train.py``: the breakpoint is set while the run is still queued,
answered at once, verified when the worker starts; the program stops there, the client reads the
stack and a few locals, clears the breakpoint and continues to the end.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

from protocol_specs.dap import capabilities

from .dap_client import open_dap_client

__all__ = ["BREAK_FILE", "BREAK_LINE", "EXAMPLES", "VSCODE_INITIALIZE", "play_ide"]

EXAMPLES = Path(__file__).resolve().parents[2] / "examples"
BREAK_FILE, BREAK_LINE = "train.py", 18

#: VS Code's initialize arguments, minus the reverse requests this scripted client does not serve
VSCODE_INITIALIZE: dict[str, Any] = {
    **capabilities.VSCODE_INITIALIZE,
    "supportsRunInTerminalRequest": False,
    "supportsStartDebuggingRequest": False,
}


async def play_ide(port: int, workdir: Path, say: Callable[[str, str], None]) -> int:
    """Attach to the adapter on ``port`` as VS Code would and debug the run to its end, telling
    ``say(who, text)`` what happens; the run's exit code."""
    path = str(workdir / BREAK_FILE)
    async with open_dap_client("127.0.0.1", port) as ide:
        await ide.request("initialize", VSCODE_INITIALIZE)
        attach_seq = ide.send_request_nowait(
            "attach",
            {"name": "tether demo", "type": "debugpy", "request": "attach", "justMyCode": True},
        )
        await ide.wait_event("initialized")
        response = await ide.request(
            "setBreakpoints",
            {
                "source": {"name": BREAK_FILE, "path": path},
                "breakpoints": [{"line": BREAK_LINE}],
                "lines": [BREAK_LINE],
            },
        )
        bp = response["body"]["breakpoints"][0]
        say(
            "ide",
            f"breakpoint {BREAK_FILE}:{BREAK_LINE} -> id {bp['id']}, verified={bp['verified']} ({bp.get('message', '')})",
        )
        await ide.request("setExceptionBreakpoints", {"filters": ["uncaught"]})
        await ide.request("configurationDone")
        await ide.response(attach_seq)
        say("ide", "attached; the run is still queued")
        event = await ide.wait_event(
            "breakpoint",
            timeout=120,
            predicate=lambda e: e["body"]["breakpoint"].get("verified") is True,
        )
        say(
            "ide",
            f"breakpoint {event['body']['breakpoint']['id']} verified on the worker (line {event['body']['breakpoint'].get('line')})",
        )
        stopped = await ide.wait_event("stopped", timeout=120)
        thread = stopped["body"]["threadId"]
        stack = await ide.request("stackTrace", {"threadId": thread, "startFrame": 0, "levels": 1})
        frame = stack["body"]["stackFrames"][0]
        say(
            "ide",
            f"stopped ({stopped['body']['reason']}) at {frame['source']['path']}:{frame['line']} in {frame['name']}()",
        )
        scopes = await ide.request("scopes", {"frameId": frame["id"]})
        local_ref = scopes["body"]["scopes"][0]["variablesReference"]
        variables = await ide.request("variables", {"variablesReference": local_ref})
        shown = {
            v["name"]: v["value"]
            for v in variables["body"]["variables"]
            if not v["name"].startswith("(") and len(v["value"]) < 40
        }
        say("ide", "locals: " + ", ".join(f"{k}={v}" for k, v in list(shown.items())[:6]))
        value = await ide.request(
            "evaluate",
            {"expression": "weights - lr * grad_w", "frameId": frame["id"], "context": "repl"},
        )
        say("ide", f"evaluate 'weights - lr * grad_w' -> {value['body']['result']}")
        await ide.request(
            "setBreakpoints",
            {"source": {"name": BREAK_FILE, "path": path}, "breakpoints": [], "lines": []},
        )
        await ide.request("continue", {"threadId": thread})
        say("ide", "breakpoint cleared; continued")
        exited = await ide.wait_event("exited", timeout=120)
        await ide.wait_event("terminated", timeout=30)
        code = int(exited["body"]["exitCode"])
        say("ide", f"terminated: the run finished with exit code {code}")
        output = "".join(
            m["body"]["output"]
            for m in ide.received
            if m.get("event") == "output" and m["body"].get("category") == "stdout"
        )
        if output:
            say(
                "ide",
                "program output seen in the debug console: "
                + " | ".join(output.strip().splitlines()[-2:]),
            )
        await ide.request("disconnect", {})
        return code
