"""The worker's stack sampler (``worker_shim/program/sampler.py``) on real processes with the real
py-spy: a program and its child, as a uid of their own, read by py-spy from the runtime the
worker publishes for such uids, without stopping them; and what it says where it cannot read."""

from __future__ import annotations

import json
import os
import subprocess
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import pytest
import trio

from protocol_specs.session.stacks import ProcessStack
from worker_shim.program.identity import ProgramUser, Runtime, spawn_options
from worker_shim.program.sampler import sample_stacks

pytestmark = pytest.mark.timeout(120)

NOBODY = ProgramUser(65534)
PROGRAM = """\
import subprocess, sys, time

def waiting_child():
    print("child ready", flush=True)
    time.sleep(600)

def waiting_parent(child):
    print("parent ready", flush=True)
    child.wait()

if len(sys.argv) > 1:
    waiting_child()
else:
    waiting_parent(subprocess.Popen([sys.executable, __file__, "child"]))
"""


def _python() -> str:
    for candidate in ("/usr/bin/python3", "/usr/local/bin/python3"):
        if NOBODY.can_run(candidate):
            return candidate
    pytest.skip("no interpreter uid 65534 may run")


@asynccontextmanager
async def program(shared_tmp: Path, user: ProgramUser | None) -> AsyncIterator[int]:
    """The program running as ``user``, its child started: its pid."""
    script = shared_tmp / "waits.py"
    script.write_text(PROGRAM)
    script.chmod(0o644)
    process = await trio.lowlevel.open_process(
        [_python(), str(script)], stdout=subprocess.PIPE, **spawn_options(user)
    )
    try:
        assert process.stdout is not None
        said = b""
        with trio.fail_after(30):
            while said.count(b"ready") < 2:
                said += await process.stdout.receive_some()
        yield process.pid
    finally:
        for pid in _children(process.pid):
            os.kill(pid, 9)
        process.kill()
        await process.wait()


def _children(pid: int) -> list[int]:
    with open(f"/proc/{pid}/task/{pid}/children") as f:
        return [int(p) for p in f.read().split()]


def _stacks(answer: bytes) -> tuple[int, list[ProcessStack]]:
    data: dict[str, Any] = json.loads(answer)
    return data["program"], [ProcessStack.model_validate(p) for p in data["processes"]]


async def test_a_programs_processes_are_read_as_its_uid_without_stopping_them(
    shared_tmp: Path, runs_root: Path
) -> None:
    runtime = Runtime.installed().publish(runs_root)
    assert runtime.pyspy is not None and runtime.pyspy.is_relative_to(runs_root)
    async with program(shared_tmp, NOBODY) as pid:
        got, processes = _stacks(await sample_stacks(pid, runtime.pyspy, NOBODY))
        assert got == pid
        parent, child = processes
        assert (parent.pid, parent.error, parent.state) == (pid, "", "running")
        assert parent.name == f"main process (pid {pid})"  # as tether status says
        assert [f.function for f in parent.main_frames()][:2] == ["<module>", "waiting_parent"]
        assert child.error == "" and child.pid != pid
        assert [f.function for f in child.main_frames()] == ["<module>", "waiting_child"]
        assert child.main_frames()[-1].text() == "waits.py:5 waiting_child"
        # not stopped: the processes still run (a stopped one's state is "T")
        for p in processes:
            stat = await trio.Path(f"/proc/{p.pid}/stat").read_text()
            assert stat.rpartition(")")[2].split()[0] == "S"


async def test_what_cannot_be_read_is_said_per_process(shared_tmp: Path) -> None:
    async with program(shared_tmp, None) as pid:  # root's processes, read as uid 65534
        pyspy = Runtime.installed().pyspy
        _, processes = _stacks(await sample_stacks(pid, pyspy, NOBODY))
        assert len(processes) == 2
        for p in processes:
            assert p.threads == [] and "not permitted" in p.error
        _, missing = _stacks(await sample_stacks(pid, None, None))
        assert {p.error for p in missing} == {
            "py-spy is not installed on the worker (pip install py-spy)"
        }
