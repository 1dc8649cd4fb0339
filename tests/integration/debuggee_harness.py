"""What the debuggee tests share: a program's workspace run under real debugpy (:class:`Run`),
the processes it left (``TETHER_TEST_RUN``), and an IDE's side of the session (:func:`client`,
:func:`configure`, :func:`evaluate`)."""

from __future__ import annotations

import os
import sys
import uuid
from collections.abc import AsyncIterator, Sequence
from contextlib import AbstractAsyncContextManager, asynccontextmanager
from pathlib import Path
from typing import Any

from adapter.scripted_ide.dap_client import DapClient, open_dap_client_on_stream
from protocol_specs.dap.capabilities import VSCODE_INITIALIZE
from worker_shim.program.debuggee import Debuggee, start_debuggee

LOCAL_ROOT = "/home/dev/project"  # the IDE's side of pathMappings; does not exist here

PROGRAM = """\
def compute(n):
    total = 0
    for i in range(n):
        total += i
    return total


print("result", compute(4))
"""
RETURN_LINE = 5


def live_processes(mark: str) -> list[str]:
    """``pid cmdline`` of every live process whose environment holds ``TETHER_TEST_RUN=mark``."""
    needle = f"TETHER_TEST_RUN={mark}".encode()
    found = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            if needle in (entry / "environ").read_bytes().split(b"\0"):  # empty for a zombie
                cmdline = (entry / "cmdline").read_bytes().replace(b"\0", b" ").decode()
                found.append(f"{entry.name} {cmdline}")
        except OSError:
            continue
    return found


class Run:
    """A program's workspace, environment and log; ``start()`` runs it under debugpy."""

    def __init__(self, tmp_path: Path, source: str = PROGRAM) -> None:
        self.dir = tmp_path / "work"
        self.dir.mkdir()
        (self.dir / "prog.py").write_text(source)
        self.mark = uuid.uuid4().hex
        self.env = {**os.environ, "TETHER_TEST_RUN": self.mark}
        self.log = tmp_path / "run.log"

    def start(self, *options: str, fast: bool = True) -> AbstractAsyncContextManager[Debuggee]:
        return start_debuggee(
            [sys.executable, *options, "prog.py"],  # an interpreter that has debugpy (faults)
            cwd=str(self.dir),
            env=self.env,
            log_path=str(self.log),
            fast=fast,
        )

    def leftovers(self) -> list[str]:
        return live_processes(self.mark)


@asynccontextmanager
async def client(debuggee: Debuggee) -> AsyncIterator[DapClient]:
    async with open_dap_client_on_stream(await debuggee.connect()) as ide:
        yield ide


async def configure(
    ide: DapClient,
    *,
    breakpoints: Sequence[int] = (),
    just_my_code: bool = True,
    initialize: dict[str, Any] = VSCODE_INITIALIZE,
) -> list[dict[str, Any]]:
    """VS Code's handshake with pathMappings; the setBreakpoints response's breakpoints."""
    await ide.request("initialize", initialize)
    attach = ide.send_request_nowait(
        "attach",
        {
            "justMyCode": just_my_code,
            "pathMappings": [{"localRoot": LOCAL_ROOT, "remoteRoot": "."}],
        },
    )
    await ide.wait_event("initialized")
    response = await ide.request(
        "setBreakpoints",
        {
            "source": {"path": f"{LOCAL_ROOT}/prog.py"},
            "breakpoints": [{"line": line} for line in breakpoints],
        },
    )
    assert response["success"], response
    await ide.request("setExceptionBreakpoints", {"filters": []})
    assert (await ide.request("configurationDone"))["success"]
    assert (await ide.response(attach))["success"]
    result: list[dict[str, Any]] = response["body"]["breakpoints"]
    return result


async def evaluate(ide: DapClient, frame_id: int, expression: str) -> str:
    response = await ide.request(
        "evaluate", {"expression": expression, "frameId": frame_id, "context": "repl"}
    )
    assert response["success"], response
    result: str = response["body"]["result"]
    return result
