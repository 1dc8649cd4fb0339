"""Plain debugpy as the DAP server, for the reference side of the end-to-end and differential tests.

``python -m debugpy --listen 127.0.0.1:0 --wait-for-client script.py ...`` in a copy of
``programs/``. Readiness comes from the ``DEBUGPY_ADAPTER_ENDPOINTS`` file debugpy writes once it
listens, never from a TCP probe: a bare connect+close makes debugpy's adapter stop accepting
clients (debugpy #1308, research/dap.md §6.1).
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

from worker_shim.program.python_command import build_debug_argv

__all__ = ["PROGRAMS", "DebugpyProcess", "copy_programs", "listening_debugpy"]

PROGRAMS = Path(__file__).resolve().parent / "programs"


def copy_programs(dest: Path) -> Path:
    """Copy the test programs into ``dest`` (created) and return it: the debuggee's workspace."""
    dest.mkdir(parents=True, exist_ok=True)
    for f in PROGRAMS.glob("*.py"):
        shutil.copyfile(f, dest / f.name)
    return dest


@dataclass
class DebugpyProcess:
    process: subprocess.Popen[bytes]
    port: int
    workspace: Path
    log: Path

    def wait(self, timeout: float = 30) -> int:
        return self.process.wait(timeout=timeout)

    @property
    def output(self) -> str:
        return self.log.read_text(errors="replace")


@contextmanager
def listening_debugpy(
    workspace: Path, script: str, *args: str, ready_timeout: float = 30
) -> Iterator[DebugpyProcess]:
    """Start ``script`` under debugpy in ``workspace``, waiting for a client; kill it on exit."""
    state = workspace.parent / f".debugpy-{workspace.name}"
    state.mkdir(exist_ok=True)
    endpoints = state / "endpoints.json"
    endpoints.unlink(missing_ok=True)
    log = state / "debuggee.log"
    env = {
        **os.environ,
        "DEBUGPY_ADAPTER_ENDPOINTS": str(endpoints),
        "PYDEVD_DISABLE_FILE_VALIDATION": "1",
        "PYTHONUNBUFFERED": "1",
    }
    # stock debugpy, exactly as a user would start it (tether's worker uses its faster boot script)
    argv = build_debug_argv(["python", script, *args], fast=False)
    with log.open("wb") as out:
        process = subprocess.Popen(
            argv, cwd=workspace, env=env, stdout=out, stderr=subprocess.STDOUT
        )
    try:
        deadline = time.monotonic() + ready_timeout
        port = None
        while port is None:
            # debugpy writes the file when its adapter listens (atomically enough: retry on partial JSON)
            if endpoints.exists():
                try:
                    port = int(json.loads(endpoints.read_text())["client"]["port"])
                except (ValueError, KeyError):
                    port = None
            if port is None:
                if process.poll() is not None:
                    raise RuntimeError(
                        f"debugpy exited ({process.returncode}) before listening:\n"
                        + log.read_text(errors="replace")
                    )
                if time.monotonic() > deadline:
                    raise RuntimeError(f"debugpy did not listen within {ready_timeout} s")
                time.sleep(0.02)
        yield DebugpyProcess(process, port, workspace, log)
    finally:
        if process.poll() is None:
            process.kill()
        process.wait(timeout=30)
