"""A local pool whose slots are held by runs nobody attends: the queued run says what holds them.

Real processes (``tether up`` with a pool of two slots, the relay, Redis, debugpy): a plain run
crashes and stops post-mortem, a ``tether debug`` run starts and waits for an IDE that never
comes (its terminal ended with Ctrl-C); a third run, queued, names both in what ``tether run -f``
prints while it waits, in ``tether ls`` and in ``tether status``. Each submit said what happens
to its run if nobody comes.
"""

from __future__ import annotations

import re
from pathlib import Path

import pytest
from stack import relay_stack, status_saying, tether
from test_post_mortem_e2e import WHERE, project

pytestmark = [pytest.mark.slow, pytest.mark.timeout(240)]


async def test_a_queued_run_names_the_paused_and_the_waiting_runs_that_hold_the_slots(
    tmp_path: Path,
) -> None:
    home = tmp_path / "home"
    workdir = project(tmp_path)
    (workdir / "ok.py").write_text("print('third ran')\n")
    async with relay_stack(home, workers=2) as (_up, relay):
        async with tether(
            "run", "--relay", relay, "--workdir", str(workdir), "--", "python", "crash.py", "fast",
            home=home, name="crash",
        ) as run:  # fmt: skip
            crashed = (await run.wait_line(r"^(\S+)$")).group(1)
        said = "\n".join(run.lines)
        assert (
            "if nobody comes: when the run pauses with no IDE attached (a crash, post-mortem), "
            "it goes on 5m later (--on-unattended-stop continue --unattended-timeout 5m)"
        ) in said
        await status_saying(home, crashed, "paused at", timeout=120)

        async with tether(
            "debug", "--relay", relay, "--port", "0", "--workdir", str(workdir), "--",
            "python", "ok.py", home=home, name="debug",
        ) as debug:  # fmt: skip
            m = await debug.wait_line(r"tether debug: run (\S+) queued")
            waiting = m.group(1)
            assert re.search(
                r"if nobody comes: when the run waits for an IDE or pauses with none attached, "
                r"it ends 5m later, freeing its slot \(--on-unattended-stop terminate "
                r"--unattended-timeout 5m\)",
                debug.output,
            )
            # the terminal rings: the run started, holds its slot, and what happens if nobody comes
            notice = await debug.wait_line(r"started and waits for an IDE", timeout=120)
            assert notice.string.startswith("\a")
            assert (
                f"Run {waiting} started and waits for an IDE before its first line, and no IDE "
                "is attached. If no IDE attaches within 300 s, it will terminate."
            ) in notice.string
            # started, then waiting for the IDE's configuration: one line for both
            started = [line for line in debug.lines if "applying breakpoints" in line]
            assert len(started) == 1, debug.output
        # the tether debug terminal ended with Ctrl-C: the run still waits, holding its slot
        await status_saying(home, waiting, "waiting for an IDE")

        async with tether(
            "run", "--relay", relay, "--workdir", str(workdir), "-f", "--", "python", "ok.py",
            home=home, name="third",
        ) as third:  # fmt: skip
            m = await third.wait_line(r"tether run: run (\S+) queued")
            queued = m.group(1)
            why = (
                f"2 of 2 slots held: run {crashed} paused on uncaught ValueError at {WHERE}, "
                f"run {waiting} waiting for an IDE"
            )
            await third.wait_line(rf"^-- tether: queued: {re.escape(why)}$", timeout=30)
            status = await status_saying(home, queued, "slots held")
            assert re.search(r"state\s+queued", status)
            assert f"waiting    {why}" in status
            async with tether("ls", "--relay", relay, home=home, name="ls") as ls:
                await ls.process.wait()
            row = next(line for line in ls.lines if line.startswith(queued))
            assert re.search(rf"queued .* 2 of 2 slots held: run {crashed} paused on", row), row
            assert row.endswith("\u2026")  # cut to the column, saying so
            async with tether("cancel", waiting, "--relay", relay, home=home) as cancel:
                await cancel.process.wait()
            # a slot is free: the third run goes, and its terminal follows it to its end
            await third.wait_line(r"third ran", timeout=120)
            await third.wait_line(rf"run {queued} succeeded", timeout=60)
