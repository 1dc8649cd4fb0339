"""The pieces that keep one run's program from another's and from its worker, on real processes
and a real kernel (root: they make processes of other uids): uid leases and the end of every
process of a uid, the marks the worker's guard sweeps by, files read in a program's reach, the
owner of a loopback listener, and a debug run whose program runs as a uid of its own."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import tempfile
from collections.abc import Iterator
from pathlib import Path

import pytest
import trio

from adapter.scripted_ide.dap_client import open_dap_client_on_stream
from worker_shim.program.debuggee import start_debuggee
from worker_shim.program.identity import ProgramUser, Runtime, spawn_options
from worker_shim.program.loopback import NotTheRuns, connect_owned
from worker_shim.program.python_command import resolve_python
from worker_shim.program.quarters import open_quarters, read_private
from worker_shim.program.reaper import MARK_ENV, kill_marked, open_guard
from worker_shim.program.uid_leases import Lease, UidLeases, processes_of, reap, remove_leftovers

pytestmark = pytest.mark.skipif(
    not sys.platform.startswith("linux") or os.geteuid() != 0,
    reason="makes processes of other uids (root), reads /proc (Linux)",
)

UIDS = range(61200, 61210)


@pytest.fixture
def shared() -> Iterator[Path]:
    """A directory every uid can reach (pytest's own is root's only)."""
    with tempfile.TemporaryDirectory() as where:
        os.chmod(where, 0o711)
        yield Path(where)


def python_for(user: ProgramUser) -> str:
    for candidate in ("/usr/bin/python3", sys.executable):
        if user.can_run(candidate):
            return candidate
    pytest.skip("no interpreter another uid may run")


def sleeper(user: ProgramUser | None = None, **env: str) -> subprocess.Popen[bytes]:
    return subprocess.Popen(
        ["sleep", "600"], start_new_session=True, env={**os.environ, **env},
        **spawn_options(user),
    )  # fmt: skip


def test_leases_give_each_run_its_own_uid_and_end_with_its_last_directory(shared: Path) -> None:
    leases = UidLeases(shared / ".uids", UIDS)
    a1, a2, b1 = shared / "aaa-1", shared / "aaa-2", shared / "bbb-1"
    for place in (a1, a2, b1):
        place.mkdir()
    first, again, second = leases.lease(a1), leases.lease(a2), leases.lease(b1)
    assert first == again  # a retry of the run keeps its uid (it may use what attempt 1 left)
    assert first.uid != second.uid and {first.uid, second.uid} <= set(UIDS)
    assert leases.holder(first.uid) == Lease(shared, "aaa")
    os.chown(a1, first.uid, first.gid)
    assert leases.owner(a1) == first and leases.owner(b1) is None  # b1 is still root's
    # the uid's processes, whatever their session, and what it left in /tmp, go with the lease,
    # once the run's last directory is gone
    stray = sleeper(first)
    left = Path(tempfile.mkdtemp(dir="/tmp"))
    os.chown(left, first.uid, first.gid)
    a1.rmdir()
    leases.release(a1)
    assert stray.poll() is None and leases.holder(first.uid) is not None  # aaa-2 is still there
    a2.rmdir()
    leases.release(a2)
    assert stray.wait(timeout=10) == -signal.SIGKILL
    assert not left.exists()
    assert leases.holder(first.uid) is None and leases.holder(second.uid) == Lease(shared, "bbb")


def test_a_lease_whose_directories_are_gone_is_taken_again(shared: Path) -> None:
    leases = UidLeases(shared / ".uids", range(61210, 61211))  # one uid
    gone = shared / "gone-1"
    gone.mkdir()
    user = leases.lease(gone)
    with pytest.raises(RuntimeError, match="no free uid"):
        leases.lease(shared / "other-1")
    gone.rmdir()  # a worker that crashed before tidying
    running = sleeper(user)  # ... but a process of the uid still runs: not stale yet
    with pytest.raises(RuntimeError, match="no free uid"):
        leases.lease(shared / "other-1")
    assert reap(user) and running.wait(timeout=10) == -signal.SIGKILL
    assert leases.lease(shared / "other-1") == user


def test_reaping_a_uid_ends_every_process_of_it_and_nothing_else() -> None:
    user, other = ProgramUser(61220), ProgramUser(61221)
    mine = [sleeper(user) for _ in range(3)]
    theirs = sleeper(other)
    assert len(processes_of([user.uid])[user.uid]) == 3
    assert reap(user)
    assert all(p.wait(timeout=10) == -signal.SIGKILL for p in mine)
    assert theirs.poll() is None
    reap(other)
    assert theirs.wait(timeout=10) == -signal.SIGKILL
    assert remove_leftovers(user, places=[]) == []


def test_marked_processes_are_found_and_killed_by_their_mark() -> None:
    attempt, other_attempt = sleeper(**{MARK_ENV: "w1/r-1"}), sleeper(**{MARK_ENV: "w1/r-2"})
    not_ours = sleeper(**{MARK_ENV: "w10/r-1"})  # a prefix of the name is not the worker
    assert kill_marked("w1/r-1") == [attempt.pid]
    assert attempt.wait(timeout=10) == -signal.SIGKILL and other_attempt.poll() is None
    assert kill_marked("w1") == [other_attempt.pid]  # the worker's mark: all of its attempts
    assert other_attempt.wait(timeout=10) == -signal.SIGKILL
    assert not_ours.poll() is None
    not_ours.kill()
    not_ours.wait()


async def test_the_guard_sweeps_the_workers_processes_once_its_pipe_closes(shared: Path) -> None:
    leases = UidLeases(shared / ".uids", UIDS)
    runs = shared / "runs"
    runs.mkdir()
    run_dir = runs / "rrr-1"
    run_dir.mkdir()
    user = leases.lease(run_dir)
    marked, as_uid = sleeper(**{MARK_ENV: "w7/r-1"}), sleeper(user)
    async with open_guard("w7", leases=leases.where, runs_dir=runs, uids=UIDS):
        await trio.lowlevel.checkpoint()  # the worker goes (here: it leaves): so do its processes
    assert marked.wait(timeout=10) == -signal.SIGKILL
    assert as_uid.wait(timeout=10) == -signal.SIGKILL


def test_a_file_in_a_programs_reach_is_read_without_trusting_it(shared: Path) -> None:
    (shared / "ok").write_bytes(b'{"client": {"port": 1}}')
    assert read_private(shared / "ok") == b'{"client": {"port": 1}}'
    os.symlink("/etc/shadow", shared / "link")
    os.mkfifo(shared / "fifo")  # opening it to read would wait for a writer for ever
    (shared / "big").write_bytes(b"x" * 100_000)
    for name in ("link", "fifo", "big", "missing"):
        assert read_private(shared / name) is None, name


async def test_the_worker_connects_only_to_listeners_of_the_runs_uid() -> None:
    nobody = ProgramUser(65534)
    code = (
        "import socket, sys\ns = socket.socket(); s.bind(('127.0.0.1', 0)); s.listen()\n"
        "print(s.getsockname()[1], flush=True)\nwhile True: s.accept()[0].close()\n"
    )
    listener = await trio.lowlevel.open_process(
        [python_for(nobody), "-c", code], stdout=subprocess.PIPE, **spawn_options(nobody)
    )
    try:
        assert listener.stdout is not None
        port = int((await listener.stdout.receive_some(100)).decode())
        with pytest.raises(NotTheRuns, match="belongs to uid 65534"):
            await connect_owned(port, 0)
        stream = await connect_owned(port, 65534)
        await stream.aclose()
    finally:
        listener.kill()
        await listener.wait()


async def test_a_debug_run_as_a_uid_of_its_own(shared: Path) -> None:
    user = ProgramUser(61230)
    python = python_for(user)
    run_dir = shared / "run"
    run_dir.mkdir()
    (run_dir / "main.py").write_text("import os\nprint('uid', os.getuid(), os.environ['HOME'])\n")
    os.chown(run_dir, user.uid, user.gid)
    runtime = Runtime.installed().publish(shared)  # the worker's own may be under /root
    output: list[bytes] = []

    async def on_output(_name: str, data: bytes) -> None:
        output.append(data)

    async with open_quarters(run_dir, user=user, runtime=runtime, mark="wt/r-1") as quarters:
        env = quarters.env(dict(os.environ), {"PATH": f"{Path(python).parent}:/usr/bin:/bin"})
        async with start_debuggee(
            ["python", "main.py"], cwd=str(run_dir), env=env, log_path=str(shared / "log"),
            on_output=on_output, quarters=quarters,
        ) as debuggee:  # fmt: skip
            assert debuggee.uid == user.uid
            stream = await debuggee.connect()  # the adapter is the program's uid's: let in
            async with open_dap_client_on_stream(stream) as client:
                await client.request("initialize", {"adapterID": "t", "pathFormat": "path"})
                attached = client.send_request_nowait("attach", {"justMyCode": True})
                await client.wait_event("initialized")
                await client.request("configurationDone", {})
                await client.response(attached)
                with trio.fail_after(30):
                    assert await debuggee.wait() == 0
            await debuggee.output.drained()
    said = b"".join(output).decode()
    assert f"uid {user.uid} {quarters.private / 'home'}" in said, said


def test_an_interpreter_the_uid_may_not_run_is_not_found(shared: Path) -> None:
    user = ProgramUser(61240)
    private = shared / "private"
    private.mkdir(mode=0o700)
    (private / "python3").write_text("#!/bin/sh\n")
    (private / "python3").chmod(0o755)
    env = {"PATH": f"{private}:/usr/bin:/bin"}
    assert resolve_python("python3", env=env, cwd=str(shared)) == str(private / "python3")
    found = resolve_python("python", env=env, cwd=str(shared), user=user)
    assert found.startswith(("/usr/bin/", "/bin/")), found
    with pytest.raises(ValueError, match="may not run"):
        resolve_python(str(private / "python3"), env=env, cwd=str(shared), user=user)
