"""The worker shim debugs every Python process of a run: real debugpy, the real shim, a real relay.

An in-process relay on the in-memory store; the test plays the adapter through an ``ide`` link
(breakpoints written into ``to_worker`` before the worker starts, requests published with a
``process``, ``to_ide`` read). No adapter, no IDE: every child is configured by the shim alone.
"""

from __future__ import annotations

import hashlib
import sys
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import orjson
import pytest
import trio
from credentials import user_endpoint

from protocol_specs.runs.spec import RunSpec
from protocol_specs.session.processes import ProcessInfo
from protocol_specs.session.session import StatusEvent
from protocol_specs.snapshots.snapshots import Manifest, ManifestEntry
from protocol_specs.wire import wire
from protocol_specs.wire.wire import DapEntry, IdeLink, PresenceEntry, StatusEntry
from relay.client import Endpoint, RunLink, open_control, open_run_link
from relay.server import serve_relay, server_port
from relay.store import MemoryStore
from worker_shim.shim import run_shim

pytestmark = [pytest.mark.slow, pytest.mark.timeout(180)]


WORKDIR = "/home/me/project"

POOL = """\
import multiprocessing as mp

def square(x):
    return x * x

def main():
    with mp.get_context("spawn").Pool(16) as pool:
        total = sum(pool.map(square, range(64)))
    print("TOTAL", total)  # PARENT
    return total

if __name__ == "__main__":
    main()
"""

ONE_CHILD = """\
import multiprocessing as mp
import sys

def work(n):
    n = n + 1  # CHILD
    print("CHILD", n)

if __name__ == "__main__":
    p = mp.get_context(sys.argv[1]).Process(target=work, args=(41,))
    p.start()
    p.join()
    sys.exit(p.exitcode)
"""

RUNS_CHILD = """\
import subprocess, sys
sys.exit(subprocess.run([sys.executable, "child.py"]).returncode)
"""

CHILD_SCRIPT = """\
value = 6 * 7
print("CHILD", value)  # CHILD
"""


def line_of(source: str, marker: str) -> int:
    return next(n for n, line in enumerate(source.splitlines(), 1) if marker in line)


@dataclass
class Run:
    """One run, its worker (the real shim) and the test's ``ide`` link."""

    ide: RunLink
    code: list[int | None] = field(default_factory=list)
    seen: list[DapEntry | StatusEntry] = field(default_factory=list)

    async def until(self, match: Any) -> DapEntry | StatusEntry:
        """The next entry of ``to_ide`` for which ``match(entry)`` holds (all are kept)."""
        with trio.move_on_after(120):
            async for delivery in self.ide.deliveries:
                entry = wire.decode_entry(delivery.entry)
                if isinstance(entry, DapEntry | StatusEntry):
                    self.seen.append(entry)
                    if match(entry):
                        return entry
        raise AssertionError(f"not seen in to_ide; what was: {self.seen!r}")

    def statuses(self, event: str) -> list[StatusEntry]:
        return [e for e in self.seen if isinstance(e, StatusEntry) and e.event == event]


def status(event: str, process: str | None = None) -> Any:
    return lambda e: (
        isinstance(e, StatusEntry)
        and e.event == event
        and (process is None or e.process == process)
    )


def dap(kind: str, name: str) -> Any:
    def match(e: DapEntry | StatusEntry) -> bool:
        if not isinstance(e, DapEntry):
            return False
        msg = orjson.loads(e.body)
        return bool(msg.get("type") == kind and name in (msg.get("event"), msg.get("command")))

    return match


def set_breakpoints(path: str, line: int, seq: int) -> DapEntry:
    body = {
        "seq": seq,
        "type": "request",
        "command": "setBreakpoints",
        "arguments": {"source": {"path": f"{WORKDIR}/{path}"}, "breakpoints": [{"line": line}]},
    }
    return DapEntry(origin="ide1", body=orjson.dumps(body), bp_ids=[seq])


@asynccontextmanager
async def debug_run(
    tmp_path: Path,
    files: dict[str, str],
    command: list[str],
    breakpoints: list[DapEntry | PresenceEntry],
    **spec: Any,
) -> AsyncIterator[Run]:
    """The run submitted with ``files``, ``breakpoints`` (and presence) written before the worker
    starts, the shim running it (its exit code in ``Run.code`` once it returned)."""
    store = MemoryStore()
    async with trio.open_nursery() as nursery:
        server = await nursery.start(
            lambda task_status: serve_relay(store, port=0, task_status=task_status)
        )
        url: Endpoint = await user_endpoint(store, f"ws://127.0.0.1:{server_port(server)}")
        blobs = {hashlib.sha256(t.encode()).hexdigest(): t.encode() for t in files.values()}
        manifest = Manifest(
            entries=[
                ManifestEntry(
                    path=p, size=len(t.encode()), digest=hashlib.sha256(t.encode()).hexdigest()
                )
                for p, t in sorted(files.items())
            ]
        )
        fields = {"workdir": WORKDIR, "wait_for_ide": False, "debug": True, **spec}
        async with open_control(url) as control:
            for digest, data in blobs.items():
                await control.put_blob(digest, data)
            record = await control.submit(RunSpec(command=command, **fields), manifest)
            async with open_run_link(url, link=IdeLink(), run=record.id) as ide:
                for entry in breakpoints:
                    await ide.publish(entry)
                await ide.flush()
                assigned = await control.claim("w-0")
                run = Run(ide)
                done = trio.Event()

                async def worker() -> None:
                    code = await run_shim(
                        url.with_token(assigned.token),
                        assigned.run,
                        assigned.manifest,
                        runs_dir=tmp_path / "runs",
                        fetch=control.read_blob,
                        cache=tmp_path / "cache",
                        python=sys.executable,
                    )
                    run.code.append(code)
                    done.set()

                nursery.start_soon(worker)
                yield run
                with trio.fail_after(60):
                    await done.wait()  # the shim returns once the exit status is out
        nursery.cancel_scope.cancel()


async def test_a_spawn_pool_of_16_runs_to_completion_with_breakpoints_in_the_parent_only(
    tmp_path: Path,
) -> None:
    bp = set_breakpoints("main.py", line_of(POOL, "# PARENT"), 1)
    async with debug_run(
        tmp_path,
        {"main.py": POOL},
        [sys.executable, "main.py"],
        [bp],
        on_unattended_stop="continue",
        unattended_timeout=0,
    ) as run:
        exited = await run.until(status(StatusEvent.EXITED))
        assert isinstance(exited, StatusEntry) and exited.exit_code == 0
        started = run.statuses(StatusEvent.PROCESS_STARTED)
        # the pool's workers (a worker the pool ended before debugpy announced it never is)
        assert started
        gone = {e.process for e in run.statuses(StatusEvent.PROCESS_EXITED)}
        assert gone == {s.process for s in started}
        infos = [ProcessInfo.model_validate(s.data) for s in started]
        assert all(
            i.parent == "" and s.process == i.key for i, s in zip(infos, started, strict=True)
        )
        assert sorted(i.nth for i in infos) == list(range(1, len(infos) + 1))
        # the parent stopped at its breakpoint, unattended, and went on
        [stopped] = [e for e in run.seen if dap("event", "stopped")(e)]
        assert isinstance(stopped, DapEntry) and stopped.process == ""
        assert run.statuses(StatusEvent.UNATTENDED_STOP)
    assert run.code == [0]


async def _stop_in_child_then_continue(run: Run) -> str:
    """The child's ``stopped`` (after its ``process_started``), a ``continue`` for it."""
    stopped = await run.until(lambda e: dap("event", "stopped")(e) and e.process != "")
    assert isinstance(stopped, DapEntry)
    key = stopped.process
    [started] = [s for s in run.statuses(StatusEvent.PROCESS_STARTED) if s.process == key]
    assert ProcessInfo.model_validate(started.data).pid == int(key)
    # every DAP entry of the child came after its process_started, and carries its key
    first = next(i for i, e in enumerate(run.seen) if e.process == key)
    assert run.seen[first] is started
    # the IDE looks, then lets it go: requests routed to the child's connection by ``process``
    thread = orjson.loads(stopped.body)["body"]["threadId"]
    trace = {
        "seq": 7,
        "type": "request",
        "command": "stackTrace",
        "arguments": {"threadId": thread},
    }
    await run.ide.publish(DapEntry(origin="ide1", body=orjson.dumps(trace), process=key))
    answer = await run.until(lambda e: dap("response", "stackTrace")(e) and e.process == key)
    assert isinstance(answer, DapEntry)
    frames = orjson.loads(answer.body)
    assert frames["request_seq"] == 7 and frames["success"] is True
    assert frames["body"]["stackFrames"][0]["source"]["path"].startswith(WORKDIR)
    go = {"seq": 8, "type": "request", "command": "continue", "arguments": {"threadId": thread}}
    await run.ide.publish(DapEntry(origin="ide1", body=orjson.dumps(go), process=key))
    resumed = await run.until(lambda e: dap("response", "continue")(e) and e.process == key)
    assert isinstance(resumed, DapEntry) and orjson.loads(resumed.body)["request_seq"] == 8
    gone = await run.until(status(StatusEvent.PROCESS_EXITED, key))
    assert isinstance(gone, StatusEntry)
    exited = await run.until(status(StatusEvent.EXITED))
    assert isinstance(exited, StatusEntry) and exited.exit_code == 0
    return key


@pytest.mark.parametrize("method", ["spawn", "fork"])
async def test_a_breakpoint_in_a_child_stops_it_and_a_request_for_it_resumes_it(
    tmp_path: Path, method: str
) -> None:
    bp = set_breakpoints("main.py", line_of(ONE_CHILD, "# CHILD"), 1)
    command = [sys.executable, "main.py", method]
    async with debug_run(tmp_path, {"main.py": ONE_CHILD}, command, [bp]) as run:
        await _stop_in_child_then_continue(run)
    assert run.code == [0]


async def test_a_child_that_stops_while_an_ide_is_attached_is_not_called_unattended(
    tmp_path: Path,
) -> None:
    """The IDE attached while the run was queued, long before the child existed: the child's stop
    is attended (no "no IDE is attached" notice), as the main process's would be."""
    attached = PresenceEntry(origin="ide1", epoch=1, attached=True)
    bp = set_breakpoints("main.py", line_of(ONE_CHILD, "# CHILD"), 1)
    command = [sys.executable, "main.py", "spawn"]
    async with debug_run(tmp_path, {"main.py": ONE_CHILD}, command, [attached, bp]) as run:
        stopped = await run.until(lambda e: dap("event", "stopped")(e) and e.process != "")
        # decided at the stop, a notice goes out before the pause report that follows it
        await run.until(status(StatusEvent.PAUSED, stopped.process))
        assert not run.statuses(StatusEvent.UNATTENDED_STOP)
        thread = orjson.loads(stopped.body)["body"]["threadId"]
        go = {"seq": 9, "type": "request", "command": "continue", "arguments": {"threadId": thread}}
        await run.ide.publish(
            DapEntry(origin="ide1", body=orjson.dumps(go), process=stopped.process)
        )
        exited = await run.until(status(StatusEvent.EXITED))
        assert isinstance(exited, StatusEntry) and exited.exit_code == 0
        assert not run.statuses(StatusEvent.UNATTENDED_STOP)
    assert run.code == [0]


async def test_a_subprocess_run_child_is_debugged_the_same_way(tmp_path: Path) -> None:
    bp = set_breakpoints("child.py", line_of(CHILD_SCRIPT, "# CHILD"), 1)
    files = {"main.py": RUNS_CHILD, "child.py": CHILD_SCRIPT}
    async with debug_run(tmp_path, files, [sys.executable, "main.py"], [bp]) as run:
        await _stop_in_child_then_continue(run)
    assert run.code == [0]


async def test_with_processes_main_children_are_not_debugged(tmp_path: Path) -> None:
    bp = set_breakpoints("main.py", line_of(ONE_CHILD, "# CHILD"), 1)
    command = [sys.executable, "main.py", "spawn"]
    async with debug_run(tmp_path, {"main.py": ONE_CHILD}, command, [bp], processes="main") as run:
        exited = await run.until(status(StatusEvent.EXITED))
        assert isinstance(exited, StatusEntry) and exited.exit_code == 0
        assert not run.statuses(StatusEvent.PROCESS_STARTED)
        assert not [e for e in run.seen if dap("event", "stopped")(e)]
    assert run.code == [0]


LAUNCH_SH = """\
#!/bin/sh
# a launcher in shell: two Python processes, one after the other, then one started by the first
python3 prep.py
exec python3 train.py
"""

PREP = """\
print("PREP done")
"""

TRAIN = """\
import subprocess, sys
value = 6 * 7  # TRAIN
print("TRAIN", value, flush=True)
sys.exit(subprocess.run(["sh", "-c", "python3 child.py"]).returncode)
"""


async def test_a_shell_script_launcher_has_every_python_process_debugged(tmp_path: Path) -> None:
    """``./launch.sh`` runs python twice (the second by ``exec``), and the second starts a Python
    process through ``sh -c``: each is debugged as a child, and stops at its breakpoint, set before
    the worker existed; the grandchild names the process that started it as its parent."""
    bps = [
        set_breakpoints("train.py", line_of(TRAIN, "# TRAIN"), 1),
        set_breakpoints("child.py", line_of(CHILD_SCRIPT, "# CHILD"), 2),
    ]
    files = {"launch.sh": LAUNCH_SH, "prep.py": PREP, "train.py": TRAIN, "child.py": CHILD_SCRIPT}
    bin_dir = Path(sys.executable).parent
    async with debug_run(
        tmp_path, files, ["sh", "launch.sh"], bps, env={"PATH": f"{bin_dir}:/usr/bin:/bin"}
    ) as run:
        train = await _stopped_then_continue(run)
        child = await _stopped_then_continue(run)
        exited = await run.until(status(StatusEvent.EXITED))
        assert isinstance(exited, StatusEntry) and exited.exit_code == 0
        infos = {
            s.process: ProcessInfo.model_validate(s.data)
            for s in run.statuses(StatusEvent.PROCESS_STARTED)
        }
        # prep.py, train.py and child.py: each a debugged process (prep.py ran to its end)
        assert len(infos) == 3, infos
        assert infos[train].parent == "" and infos[train].command.endswith("train.py")
        assert infos[child].parent == train and infos[child].command.endswith("child.py")
        # named after what they run, not as workers of the launcher
        assert infos[train].title().startswith(f"train.py (pid {infos[train].pid})")
        assert {e.process for e in run.statuses(StatusEvent.PROCESS_EXITED)} == set(infos)
    assert run.code == [0]


async def _stopped_then_continue(run: Run) -> str:
    stopped = await run.until(lambda e: dap("event", "stopped")(e) and e.process != "")
    assert isinstance(stopped, DapEntry)
    thread = orjson.loads(stopped.body)["body"]["threadId"]
    go = {"seq": 9, "type": "request", "command": "continue", "arguments": {"threadId": thread}}
    await run.ide.publish(DapEntry(origin="ide1", body=orjson.dumps(go), process=stopped.process))
    await run.until(lambda e: dap("response", "continue")(e) and e.process == stopped.process)
    return stopped.process


async def test_a_non_python_command_ends_with_its_own_exit_code(tmp_path: Path) -> None:
    async with debug_run(tmp_path, {"x.txt": ""}, ["sh", "-c", "echo hi; exit 3"], []) as run:
        exited = await run.until(status(StatusEvent.EXITED))
        assert isinstance(exited, StatusEntry) and exited.exit_code == 3
        assert not run.statuses(StatusEvent.PROCESS_STARTED)
    assert run.code == [3]


async def test_a_non_python_command_with_processes_main_is_refused_with_a_sentence(
    tmp_path: Path,
) -> None:
    command = ["sh", "-c", "python3 -c pass"]
    async with debug_run(tmp_path, {"x.txt": ""}, command, [], processes="main") as run:
        failed = await run.until(status(StatusEvent.START_FAILED))
        assert isinstance(failed, StatusEntry)
        assert "sh is not a Python program" in failed.detail
        assert "--processes main debugs none of them" in failed.detail
