"""``tether demo``: the delayed-worker story on one machine, with a scripted IDE.

Starts the embedded stack (bundled Redis-compatible server, relay, one worker slot with a start delay
standing in for a GPU queue), submits ``examples/train.py`` in debug mode, and plays the IDE with
tether's small DAP client, following VS Code's attach sequence: the breakpoint is set while the run
is still queued, answered at once, verified when the worker starts; the program stops there, the
client reads the stack and a few locals, clears the breakpoint and continues to the end.
"""

from __future__ import annotations

import argparse
import shutil
import tempfile
import time
from pathlib import Path
from typing import Any

import trio

from protocol_specs import capabilities

from .dap_client import open_dap_client

__all__ = ["EXAMPLES", "VSCODE_INITIALIZE", "run_demo"]

EXAMPLES = Path(__file__).resolve().parent.parent / "examples"
BREAK_FILE, BREAK_LINE = "train.py", 18

#: VS Code's initialize arguments, minus the reverse requests this scripted client does not serve
VSCODE_INITIALIZE: dict[str, Any] = {
    **capabilities.VSCODE_INITIALIZE,
    "supportsRunInTerminalRequest": False,
    "supportsStartDebuggingRequest": False,
}


class _Printer:
    def __init__(self) -> None:
        self.start = time.monotonic()

    def __call__(self, who: str, text: str) -> None:
        print(f"[{time.monotonic() - self.start:6.2f}s] {who:<8} {text}", flush=True)


async def run_demo(*, start_delay: float = 3.0, keep: bool = False) -> int:
    from .cli import build_spec, submit_run
    from .local_stack import open_local_stack
    from .server import serve_adapter

    say = _Printer()
    tmp = Path(tempfile.mkdtemp(prefix="tether-demo-"))
    workdir = tmp / "project"
    shutil.copytree(EXAMPLES, workdir, ignore=shutil.ignore_patterns("__pycache__"))
    try:
        async with (
            open_local_stack(
                tmp,
                workers=1,
                start_delay=start_delay,
                on_worker_event=lambda text: say("worker", text),
            ) as stack,
            trio.open_nursery() as nursery,
        ):
            relay = stack.endpoint
            say("stack", f"bundled server at {stack.redis}; relay at {stack.relay}")
            say(
                "stack",
                f"local worker pool: 1 slot, start delay {start_delay:g} s (a stand-in GPU queue)",
            )
            args = argparse.Namespace(
                command=["python", "train.py"],
                workdir=str(workdir),
                env=[],
                name="demo",
                no_wait=False,
            )
            record = await submit_run(relay, build_spec(args, debug=True), lambda t: say("cli", t))
            port = await nursery.start(
                lambda task_status: serve_adapter(
                    relay,
                    record.id,
                    port=0,
                    on_event=lambda t: say("adapter", t),
                    task_status=task_status,
                )
            )
            say("adapter", f"listening on 127.0.0.1:{port}")
            code = await _play_ide(port, workdir, say)
            nursery.cancel_scope.cancel()
    finally:
        if keep:
            print(f"demo files kept in {tmp}")
        else:
            shutil.rmtree(tmp, ignore_errors=True)
    print()
    print("To debug your own code with VS Code instead:")
    print("  terminal 1:  tether up --start-delay 10")
    print("  terminal 2:  tether debug -- python train.py")
    print('  VS Code: add the printed "attach" entry to .vscode/launch.json and start it;')
    print("  set breakpoints while the run is queued; they apply when the worker starts.")
    return code


async def _play_ide(port: int, workdir: Path, say: _Printer) -> int:
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
