"""The README's demo command, `tether attach` rebuilding a session from the relay alone, and the
parts run as separate processes (`tether relay --redis URL`, `tether worker`, `tether debug`)."""

from __future__ import annotations

import os
import re
import signal
from pathlib import Path

import pytest
import trio
from stack import PROJECT, TETHER, admin_token, debug_run, home_env, relay_stack, tether, worker
from test_session_e2e import bp_args, ide_session, resume, stopped_frame

from adapter.scripted_ide.dap_client import open_dap_client

pytestmark = [pytest.mark.slow, pytest.mark.timeout(180)]


async def test_demo_tells_the_whole_story(tmp_path: Path) -> None:
    async with tether("demo", "--start-delay", "0.5", home=tmp_path, name="demo") as demo:
        await demo.wait_line(r"To debug your own code with VS Code instead", timeout=120)
        await demo.process.wait()
    assert demo.process.returncode == 0, demo.output
    out = demo.output
    for needle in [
        "submitted run",
        "verified=False",
        "attached; the run is still queued",
        "verified on the worker (line 18)",
        "train.py:18 in train_step()",
        "grad_w=",
        "evaluate 'weights - lr * grad_w' ->",
        "finished with exit code 0",
        "tether debug -- python train.py",
    ]:
        assert needle in out, f"{needle!r} missing from:\n{out}"
    lines = out.splitlines()
    order = [
        "attached; the run is still queued",
        "started on a worker",
        "verified on the worker",
        "stopped (breakpoint)",
        "terminated",
    ]
    positions = [next(i for i, line in enumerate(lines) if key in line) for key in order]
    assert positions == sorted(positions)


async def test_attach_rebuilds_a_paused_session_after_the_ide_side_is_gone(tmp_path: Path) -> None:
    """The user's side ends (laptop off) while the program is paused; `tether attach` rebuilds the
    IDE-facing state from the relay alone and the IDE carries on."""
    workdir = tmp_path / "project"
    workdir.mkdir()
    for f in PROJECT.glob("*.py"):
        (workdir / f.name).write_text(f.read_text())
    home = tmp_path / "home"
    async with relay_stack(home, workers=1) as (_up, relay):
        async with debug_run(home, relay, workdir, "python", "app.py") as (debug, run_id, port):
            async with open_dap_client("127.0.0.1", port) as ide:
                async with ide_session(ide, [bp_args(workdir, "app.py", 11)]) as responses:
                    bp_id = responses[0]["body"]["breakpoints"][0]["id"]
                _stopped, frame = await stopped_frame(ide)
                assert frame["line"] == 11
            os.killpg(debug.process.pid, signal.SIGKILL)  # every process on the user's side ends
            await debug.process.wait()
        async with tether(
            "attach", run_id, "--relay", relay, "--port", "0", home=home, name="attach"
        ) as attach:
            m = await attach.wait_line(r"adapter on 127\.0\.0\.1:(\d+)")
            async with open_dap_client("127.0.0.1", int(m.group(1))) as ide:
                async with ide_session(ide, [bp_args(workdir, "app.py", 11)]) as responses:
                    assert (
                        responses[0]["body"]["breakpoints"][0]["id"] == bp_id
                    )  # same id as before
                replayed = await ide.wait_event("stopped", timeout=10)
                thread = replayed["body"]["threadId"]
                assert replayed["body"]["reason"] == "breakpoint"
                stack = await ide.request(
                    "stackTrace", {"threadId": thread, "startFrame": 0, "levels": 1}
                )
                top = stack["body"]["stackFrames"][0]
                assert (top["name"], top["line"], top["source"]["path"]) == (
                    "compute",
                    11,
                    str(workdir / "app.py"),
                )
                scopes = await ide.request("scopes", {"frameId": top["id"]})
                variables = await ide.request(
                    "variables",
                    {"variablesReference": scopes["body"]["scopes"][0]["variablesReference"]},
                )
                assert {v["name"]: v["value"] for v in variables["body"]["variables"]}["i"] == "0"
                await ide.request("setBreakpoints", bp_args(workdir, "app.py"))
                await resume(ide, "continue", thread)
                exited = await ide.wait_event("exited", timeout=60)
                assert exited["body"]["exitCode"] == 0
            await attach.wait_line(r"ended \(exited, exit code 0\)")
        assert f"tether attach: run {run_id} attached; adapter on" in attach.output
        # an ended run has nothing to debug: refused at once, no adapter served
        done = await trio.run_process(
            [TETHER, "attach", run_id, "--relay", relay, "--port", "0"], env=home_env(home),
            capture_stdout=True, capture_stderr=True, check=False,
        )  # fmt: skip
        said = done.stderr.decode()
        assert done.returncode == 1 and b"adapter on" not in done.stdout, done.stdout
        assert said.startswith(f"tether: run {run_id} has ended (succeeded, exit 0): there is")
        assert f"tether logs {run_id}" in said and "Traceback" not in said


@pytest.mark.redis
async def test_separate_processes_relay_worker_and_debug(tmp_path: Path, redis_server: str) -> None:
    workdir = tmp_path / "project"
    workdir.mkdir()
    for f in PROJECT.glob("*.py"):
        (workdir / f.name).write_text(f.read_text())
    home = tmp_path / "home"
    await admin_token(home, redis_server)
    async with tether(
        "relay", "--redis", redis_server, "--port", "0", home=home, name="relay"
    ) as relay_proc:
        relay = (await relay_proc.wait_line(r"ready relay=(\S+)")).group(1)
        async with (
            worker(home, relay),
            debug_run(home, relay, workdir, "python", "app.py", extra=("--no-wait",)) as (
                debug,
                _run,
                _port,
            ),
        ):
            await debug.wait_line(r"ended \(exited, exit code 0\)", timeout=60)


async def test_run_without_debugger_and_commands_find_tether_up_on_their_own(
    tmp_path: Path,
) -> None:
    """`tether up` records its address: `tether run`, `status` and `logs` need no --relay.
    `run --follow` streams the program's output and ends with its exit code."""
    workdir = tmp_path / "project"
    workdir.mkdir()
    for f in PROJECT.glob("*.py"):
        (workdir / f.name).write_text(f.read_text())
    home = tmp_path / "home"
    async with relay_stack(home, workers=1):
        async with tether(
            "run",
            "--follow",
            "--no-post-mortem",  # the crash ends the program at once
            "--name",
            "crashy",
            "--workdir",
            str(workdir),
            "--",
            "python",
            "app.py",
            "crash",
            home=home,
            name="run",
        ) as run:
            run_id = (await run.wait_line(r"tether run: run (\S+) queued")).group(1)
            # (stdout and stderr are two pipes: a line of one may land inside one of the other)
            await run.wait_line(r"boom: 150")
            await run.wait_line(r"-- tether: run \S+ failed, exit code 1")
            assert await run.process.wait() == 1
        async with tether("status", run_id, home=home, name="status") as status:
            assert await status.process.wait() == 0
        assert re.search(r"state\s+failed", status.output), status.output
        assert re.search(r"#1 on \S+ .*-> failed \(exit 1\)", status.output), status.output
        async with tether("logs", run_id, home=home, name="logs") as logs:
            assert await logs.process.wait() == 0
        assert "boom: 150" in logs.output and "ValueError" in logs.output
        async with tether("ls", home=home, name="ls") as ls:
            assert await ls.process.wait() == 0
        assert re.search(rf"{run_id}\s+crashy\s+failed\s+local\s+\S+\s+1/1\s+exit 1", ls.output)
        (workdir / "app.py").write_text("changed locally since\n")  # a rerun does not care
        async with tether("rerun", run_id, "--follow", home=home, name="rerun") as rerun:
            again = (await rerun.wait_line(rf"run (\S+) queued: a rerun of {run_id}")).group(1)
            await rerun.wait_line(r"ValueError: boom: 150")
            assert await rerun.process.wait() == 1
        async with tether("status", again, home=home, name="status") as status:
            assert await status.process.wait() == 0
        assert f"rerun of   {run_id}" in status.output
    async with tether("status", run_id, home=home, name="status") as status:
        await status.process.wait()
    assert (
        status.process.returncode != 0 and "tether up" in status.output
    )  # nothing recorded any more


async def test_cancelling_a_plain_run_ends_its_whole_process_group(tmp_path: Path) -> None:
    workdir = tmp_path / "project"
    workdir.mkdir()
    (workdir / "spawner.py").write_text(
        "import subprocess, sys, time\n"
        "child = subprocess.Popen([sys.executable, '-c', 'import time; time.sleep(600)'])\n"
        "print('child', child.pid, flush=True)\n"
        "time.sleep(600)\n"
    )
    home = tmp_path / "home"
    async with relay_stack(home, workers=1) as (up, _relay):
        async with tether(
            "run", "--workdir", str(workdir), "--", "python", "spawner.py", home=home, name="run"
        ) as run:
            run_id = (await run.wait_line(r"tether run: run (\S+) queued")).group(1)
        async with tether("logs", "--follow", run_id, home=home, name="logs") as logs:
            child = int((await logs.wait_line(r"^child (\d+)")).group(1))
            async with tether("cancel", run_id, home=home, name="cancel") as cancel:
                await cancel.wait_line(r"cancelled")
            await logs.wait_line(rf"-- tether: run {run_id} cancelled")
            assert await logs.process.wait() == 1
        await up.wait_line(rf"run {run_id} exited with -15")
        assert (
            not Path(f"/proc/{child}").exists()
            or "Z" in Path(f"/proc/{child}/stat").read_text().split()[2]
        )
