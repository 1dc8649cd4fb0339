"""Run submission end to end, with real processes: snapshot dedup, the lifecycle (cancel while
queued, while paused), and a crashing attempt retried under the debugger with the IDE session going
on (breakpoints re-applied, the stop seen on attempt 2)."""

from __future__ import annotations

import re
from pathlib import Path

import pytest
import trio
from stack import TETHER, debug_run, home_env, relay_stack, status_saying, tether, worker
from test_session_e2e import assert_schema_valid, bp_args, ide_session, resume, stopped_frame

from adapter.scripted_ide.dap_client import open_dap_client

pytestmark = [pytest.mark.slow, pytest.mark.timeout(180)]

UPLOADED = re.compile(
    r"submitted run (\S+): .*\((\d+) files, .*; uploaded (\d+) new files, ([\d.]+) MiB; "
    r"(\d+) already on the relay\)"
)

#: attempt 1 dies before the breakpoint line; attempt 2 (a marker in the mounted state directory
#: says it is not the first) reaches it
FLAKY = """\
import os, pathlib, sys, time

state = pathlib.Path(os.environ["TETHER_MOUNT_STATE"])
first = not (state / "attempted").exists()
(state / "attempted").touch()
print("attempt", "first" if first else "again", flush=True)
if first:
    if sys.argv[1:] == ["hang"]:
        time.sleep(600)
    os._exit(3)
total = sum(range(10))
print("total", total, flush=True)
"""
FLAKY_BREAKPOINT = 11


async def submit(home: Path, workdir: Path, *args: str) -> re.Match[str]:
    async with tether(
        "run", "--workdir", str(workdir), *args, "--", "python", "main.py", home=home, name="run"
    ) as run:
        m = await run.wait_line(UPLOADED.pattern)
        assert await run.process.wait() == 0
    return m


async def test_a_second_submit_uploads_only_the_changed_file(tmp_path: Path) -> None:
    workdir = tmp_path / "project"
    (workdir / "data").mkdir(parents=True)
    for i in range(300):
        (workdir / "data" / f"part{i:03}.txt").write_text(f"{i}\n" * 2000)  # ~10 KB each
    (workdir / "main.py").write_text("print('hi')\n")
    home = tmp_path / "home"
    async with relay_stack(home, workers=0):
        first = await submit(home, workdir)
        assert (first.group(2), first.group(3), first.group(5)) == ("301", "301", "0")
        (workdir / "data" / "part123.txt").write_text("changed\n")
        second = await submit(home, workdir)
        assert (second.group(2), second.group(3), second.group(5)) == ("301", "1", "300")
        assert float(second.group(4)) < 0.01  # 8 bytes, against ~3 MiB the first time
        assert float(first.group(4)) > 2.0  # 300 files of 9.9 KB


async def test_cancel_while_queued_never_starts_the_run(tmp_path: Path) -> None:
    workdir = tmp_path / "project"
    workdir.mkdir()
    (workdir / "main.py").write_text("print('ran')\n")
    home = tmp_path / "home"
    async with relay_stack(home, workers=0) as (_up, relay):
        cancelled = (await submit(home, workdir)).group(1)
        async with tether("cancel", cancelled, home=home, name="cancel") as cancel:
            await cancel.wait_line(rf"run {cancelled}: cancelled")
        later = (await submit(home, workdir)).group(1)
        async with worker(home, relay) as pool:
            await pool.wait_line(rf"claimed run {later}")
            await pool.wait_line(rf"run {later} exited with 0")
            assert cancelled not in pool.output
        async with tether("status", cancelled, home=home, name="status") as status:
            await status.process.wait()
        assert re.search(r"state\s+cancelled: cancelled by the user", status.output)


async def test_paused_shows_where_and_cancel_while_paused_ends_the_session(
    tmp_path: Path,
) -> None:
    workdir = tmp_path / "project"
    workdir.mkdir()
    project = Path(__file__).resolve().parent / "project"
    for f in project.glob("*.py"):
        (workdir / f.name).write_text(f.read_text())
    home = tmp_path / "home"
    async with (
        relay_stack(home, workers=1) as (_up, relay),
        debug_run(home, relay, workdir, "python", "app.py") as (_debug, run_id, port),
        open_dap_client("127.0.0.1", port) as ide,
    ):
        async with ide_session(ide, [bp_args(workdir, "app.py", 11)]):
            pass
        _stopped, frame = await stopped_frame(ide)
        assert frame["line"] == 11
        # the worker reports a stop once it lasted half a second
        status = await status_saying(home, run_id, "paused at")
        assert re.search(r"state\s+paused", status)
        assert "paused at  app.py:11 in compute" in status
        async with tether("ls", home=home, name="ls") as ls:
            await ls.process.wait()
        assert re.search(rf"{run_id}\s+app.py\s+paused\s+local .* app.py:11 in compute", ls.output)
        async with tether("cancel", run_id, home=home, name="cancel") as cancel:
            await cancel.wait_line(rf"run {run_id}: cancelled")
        await ide.wait_event("terminated", timeout=30)
        assert_schema_valid(ide)


async def test_a_crashed_attempt_is_retried_and_the_ide_sees_the_stop_on_attempt_2(
    tmp_path: Path, shared_tmp: Path
) -> None:
    workdir = tmp_path / "project"
    workdir.mkdir()
    (workdir / "flaky.py").write_text(FLAKY)
    state = shared_tmp / "state"  # mounted: the program (a uid of its own) writes in it
    state.mkdir()
    state.chmod(0o777)
    home = tmp_path / "home"
    retry = ("--max-retries", "2", "--retry-backoff", "0", "--mount", f"state={state}")
    async with relay_stack(home, workers=1) as (up, relay):
        async with (
            debug_run(home, relay, workdir, "python", "flaky.py", extra=retry) as (
                debug,
                run_id,
                port,
            ),
            open_dap_client("127.0.0.1", port) as ide,
        ):
            async with ide_session(ide, [bp_args(workdir, "flaky.py", FLAKY_BREAKPOINT)]) as got:
                bp_id = got[0]["body"]["breakpoints"][0]["id"]
            retrying = await ide.wait_event(
                "output",
                timeout=60,
                predicate=lambda e: "attempt 1 exited with code 3" in e["body"]["output"],
            )
            assert "attempt 2 of 3 starts in 0 s" in retrying["body"]["output"]
            stopped, frame = await stopped_frame(ide)
            assert stopped["body"]["reason"] == "breakpoint"
            assert stopped["body"].get("hitBreakpointIds", [bp_id]) == [bp_id]
            assert (frame["line"], frame["source"]["path"]) == (
                FLAKY_BREAKPOINT,
                str(workdir / "flaky.py"),
            )
            assert not any(e.get("event") == "terminated" for e in ide.received)
            await resume(ide, "continue", stopped["body"]["threadId"])
            exited = await ide.wait_event("exited", timeout=60)
            assert exited["body"]["exitCode"] == 0
            await ide.wait_event("terminated", timeout=30)
            assert_schema_valid(ide)
            await up.wait_line(rf"claimed run {run_id} \(attempt 2\)")
            await debug.wait_line(r"ended \(exited, exit code 0\)")
        async with tether("status", run_id, home=home, name="status") as status:
            await status.process.wait()
        async with tether("logs", run_id, home=home, name="logs") as logs:
            await logs.process.wait()
    assert re.search(r"#1 on \S+ .*-> failed \(exit 3\)", status.output), status.output
    assert re.search(r"#2 on \S+ .*-> succeeded", status.output), status.output
    lines = [line for line in logs.output.splitlines() if line.strip()]
    order = [
        "attempt 1 started",
        "attempt first",
        "attempt 1 exited with code 3",
        "attempt 2 started",
        "attempt again",
        "total 45",
        f"run {run_id} succeeded",
    ]
    positions = [next(i for i, line in enumerate(lines) if key in line) for key in order]
    assert positions == sorted(positions), logs.output


async def test_logs_are_complete_and_in_order(tmp_path: Path) -> None:
    """20,000 numbered lines on stdout and 2,000 on stderr, printed as fast as Python can."""
    workdir = tmp_path / "project"
    workdir.mkdir()
    (workdir / "main.py").write_text(
        "import sys\n"
        "for i in range(20000):\n"
        "    print(f'out {i}')\n"
        "    if i % 10 == 0:\n"
        "        print(f'err {i // 10}', file=sys.stderr)\n"
    )
    home = tmp_path / "home"
    async with relay_stack(home, workers=1):
        run_id = (await submit(home, workdir)).group(1)
        with trio.fail_after(60):
            logs = await trio.run_process(
                [TETHER, "logs", "--follow", run_id],
                capture_stdout=True,
                capture_stderr=True,
                env=home_env(home),
            )
    stdout, stderr = logs.stdout.decode().splitlines(), logs.stderr.decode().splitlines()
    assert stdout == [f"out {i}" for i in range(20000)]
    assert [line for line in stderr if not line.startswith("-- tether:")] == [
        f"err {i}" for i in range(2000)
    ]
    assert stderr[-1] == f"-- tether: run {run_id} succeeded, exit code 0"
