"""``tether demo``: the delayed-worker story on one machine, with a scripted IDE.

Starts the embedded stack (bundled Redis-compatible server, relay, one worker slot with a start delay
standing in for a GPU queue), submits ``examples/train.py`` in debug mode as ``tether debug`` would,
serves its adapter, and plays the IDE against it (:func:`adapter.scripted_ide.demo.play_ide`).
"""

from __future__ import annotations

import argparse
import shutil
import tempfile
import time
from pathlib import Path

import trio

from adapter.scripted_ide.demo import EXAMPLES, play_ide

from .submission import build_spec, submit_run

__all__ = ["cmd_demo", "run_demo"]


async def cmd_demo(args: argparse.Namespace) -> int:
    return await run_demo(start_delay=args.start_delay, keep=args.keep)


class _Printer:
    def __init__(self) -> None:
        self.start = time.monotonic()

    def __call__(self, who: str, text: str) -> None:
        print(f"[{time.monotonic() - self.start:6.2f}s] {who:<8} {text}", flush=True)


async def run_demo(*, start_delay: float = 3.0, keep: bool = False) -> int:
    from adapter.dap.server import serve_adapter

    from .local_stack import open_local_stack

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
            code = await play_ide(port, workdir, say)
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
