"""Issue 44's "done when", as a user meets it: the `tether` CLI, a `tether up` stack (its relay
and bundled server, no slots of its own) and two `tether worker` pools on it.

A training loop checkpoints every 3 steps (``tether.save_checkpoint``, its state in
``tether.checkpoint_dir()``), prints its steps and writes an output file (``--outputs``):

- its worker is SIGKILLed midway (the real ``tether worker`` process); attempt 2, on the other
  worker, starts past step 0 from the latest checkpoint and finishes (``--max-retries 1``);
- a second run is paused (``tether pause``: the program sees ``should_preempt()``, saves and
  exits), is ``suspended`` with its slot free, and ``tether resume`` continues it from the step
  it saved;
- with both workers stopped, ``tether cp`` fetches each run's output byte-identical, and
  ``tether status`` shows the checkpoints, the outputs and each attempt's outcome.

Nothing waits by sleeping: each step waits for a line of a process's output (the logs followed,
a worker's, a command's) with a timeout.
"""

from __future__ import annotations

import random
import re
import signal
import sys
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path

import pytest
import trio
from stack import Proc, program_python, relay_stack, tether

pytestmark = [pytest.mark.slow, pytest.mark.timeout(120)]

STEPS, EVERY = 10, 3

#: ``kill``: attempt 1 blocks after step 7 (its worker is killed there); ``pause``: attempt 1
#: waits at step 7 for its preempt, saves step 7 and exits. The output depends on the state
#: carried through the checkpoint (the sum of the steps run).
TRAIN = f"""\
import random, sys, time
from pathlib import Path
import tether

mode = sys.argv[1]
start = tether.latest_checkpoint()
where = tether.checkpoint_dir()
total = 0 if start is None else int((where / "total").read_text())
first = 0 if start is None else start + 1
print(f"first step {{first}} (restored {{start}})", flush=True)


def save(step):
    (where / "total").write_text(str(total))
    stored = tether.save_checkpoint(step)
    print(f"saved step {{stored['step']}}", flush=True)


for step in range(first, {STEPS}):
    total += step
    print(f"step {{step}}", flush=True)
    if step % {EVERY} == 0:
        save(step)
    if start is None and step == 7:
        if mode == "kill":
            print("midway", flush=True)
            time.sleep(3600)  # until its worker is killed
        print("waiting for a preempt", flush=True)
        while not tether.should_preempt():
            time.sleep(0.05)
        save(step)
        sys.exit(3)
Path("out").mkdir(exist_ok=True)
Path("out/result.bin").write_bytes(random.Random(total).randbytes(3 * 2**20 + 123))
print(f"finished with total {{total}}", flush=True)
"""

TOTAL = sum(range(STEPS))


def expected_output() -> bytes:
    return random.Random(TOTAL).randbytes(3 * 2**20 + 123)


@asynccontextmanager
async def pool(home: Path, relay: str, name: str, isolated: bool) -> AsyncIterator[Proc]:
    """A `tether worker` with one slot, in a work directory of its own."""
    async with tether(
        "worker", "--relay", relay, "--slots", "1", "--name", name,
        "--work-dir", str(home / name), *(() if isolated else ("--no-isolation",)),
        home=home, name=name,
    ) as proc:  # fmt: skip
        await proc.wait_line(r"tether worker: ready")
        yield proc


async def submit(home: Path, workdir: Path, python: str, mode: str) -> str:
    async with tether(
        "run", "--workdir", str(workdir), "--name", mode, "--max-retries", "1",
        "--retry-backoff", "0s", "--preempt-grace", "30s", "--outputs", "out/",
        "--", python, "train.py", mode, home=home, name=f"run {mode}",
    ) as run:  # fmt: skip
        m = await run.wait_line(r"submitted run (\S+):")
        assert await run.process.wait() == 0, run.output
    return m.group(1)


def first_steps(logs: Proc) -> list[str]:
    """Where each attempt of a run started, from its logs."""
    return re.findall(r"^first step (.*)$", logs.output, re.M)


async def command(home: Path, *args: str) -> str:
    """``tether ARGS``, to its end: its output (it must succeed)."""
    async with tether(*args, home=home, name=args[0]) as proc:
        with trio.fail_after(60):
            code = await proc.process.wait()
    assert code == 0, proc.output
    return proc.output


async def test_a_long_run_survives_a_killed_worker_and_a_pause(tmp_path: Path) -> None:
    python = program_python()
    isolated = python is not None  # else the programs run as the workers' user
    workdir = tmp_path / "project"
    workdir.mkdir()
    (workdir / "train.py").write_text(TRAIN)
    (workdir / "other.py").write_text("print('the slot was free')\n")
    home = tmp_path / "home"
    stack = relay_stack(home, isolated=isolated, flags=("--lease", "3s"))
    async with stack as (_up, relay):
        async with pool(home, relay, "first", isolated) as first:
            killed = await submit(home, workdir, python or sys.executable, "kill")
            async with tether("logs", "--follow", killed, home=home, name="logs") as logs:
                await logs.wait_line(r"^midway")
                async with pool(home, relay, "second", isolated) as second:
                    first.process.send_signal(signal.SIGKILL)  # the worker, not its run
                    # attempt 1 saved steps 0, 3 and 6: attempt 2 starts past the latest
                    await logs.wait_count(r"^first step", 2)
                    assert first_steps(logs) == ["0 (restored None)", "7 (restored 6)"], logs.output
                    await logs.wait_line(r"^finished with total", timeout=60)
                    with trio.fail_after(30):
                        assert await logs.process.wait() == 0
                    await second.wait_line(rf"claimed run {killed}")

                    paused = await submit(home, workdir, python or sys.executable, "pause")
                    async with tether("logs", "--follow", paused, home=home) as plogs:
                        await plogs.wait_line(r"^waiting for a preempt")
                        said = await command(home, "pause", paused)
                        assert "then the run is suspended" in said, said
                        await plogs.wait_line(rf"run {paused} is suspended")
                        suspended = await command(home, "status", paused)
                        assert re.search(r"state\s+suspended", suspended), suspended
                        # its slot is free: the second pool's only slot runs another run
                        said = await command(
                            home, "run", "--follow", "--workdir", str(workdir),
                            "--", python or sys.executable, "other.py",
                        )  # fmt: skip
                        assert "the slot was free" in said, said
                        await command(home, "resume", paused)
                        # the pause saved step 7 on its way out: attempt 2 starts at 8
                        await plogs.wait_count(r"^first step", 2)
                        assert first_steps(plogs) == ["0 (restored None)", "8 (restored 7)"]
                        await plogs.wait_line(r"^finished with total", timeout=60)
                        with trio.fail_after(30):
                            assert await plogs.process.wait() == 0
        # both workers are gone; the relay still has the outputs
        for run in (killed, paused):
            await command(home, "cp", f"{run}:out/result.bin", str(tmp_path / f"{run}.bin"))
            assert (tmp_path / f"{run}.bin").read_bytes() == expected_output()
        shown = {run: await command(home, "status", run) for run in (killed, paused)}
    for logged in (logs.output, plogs.output):  # each step once, the state carried over
        assert logged.count("finished with total") == 1, logged
        assert f"finished with total {TOTAL}" in logged, logged
    for run, outcomes in ((killed, ["lost", "succeeded"]), (paused, ["preempted", "succeeded"])):
        status = shown[run]
        assert re.search(r"state\s+succeeded", status), status
        assert re.findall(r"^\s+#\d .*-> (\w+)", status, re.M) == outcomes, status
        assert re.search(r"^checkpoints: \d+ kept, latest step 9 \(attempt 2\)", status, re.M)
        assert re.search(r"^outputs: 1 file, 3\.0 MiB", status, re.M), status
    assert re.search(r"#1 on first.*-> lost.*\n(.*\n)*\s+#2 on second", shown[killed]), shown
