"""Pause and resume a debug run end to end (issue 44): the real CLI (``tether pause``,
``tether resume``), a real ``tether up`` stack, a real DAP client. The breakpoints the IDE set
stay with the run: the resumed attempt stops at the same breakpoint."""

from __future__ import annotations

from pathlib import Path

import pytest
from stack import debug_run, relay_stack, tether
from test_runs_e2e import FLAKY, FLAKY_BREAKPOINT
from test_session_e2e import bp_args, ide_session, resume, stopped_frame

from adapter.scripted_ide.dap_client import open_dap_client

pytestmark = [pytest.mark.slow, pytest.mark.timeout(180)]


async def test_a_paused_debug_run_resumes_and_stops_at_the_same_breakpoint(
    tmp_path: Path, shared_tmp: Path
) -> None:
    workdir = tmp_path / "project"
    workdir.mkdir()
    (workdir / "flaky.py").write_text(FLAKY)
    state = shared_tmp / "state"
    state.mkdir()
    state.chmod(0o777)
    home = tmp_path / "home"
    extra = ("--mount", f"state={state}", "--preempt-grace", "1")
    async with relay_stack(home, workers=1) as (up, relay):
        async with (
            debug_run(home, relay, workdir, "python", "flaky.py", "hang", extra=extra) as (
                _debug,
                run_id,
                port,
            ),
            open_dap_client("127.0.0.1", port) as ide,
        ):
            async with ide_session(ide, [bp_args(workdir, "flaky.py", FLAKY_BREAKPOINT)]) as got:
                bp_id = got[0]["body"]["breakpoints"][0]["id"]
            async with tether("logs", "--follow", run_id, home=home, name="logs") as logs:
                await logs.wait_line("attempt first")  # attempt 1 runs, before the breakpoint
                async with tether("pause", run_id, home=home, name="pause") as pause:
                    assert await pause.process.wait() == 0
                await logs.wait_line(rf"attempt 1 was preempted; run {run_id} is suspended")
            await ide.wait_event(
                "output",
                timeout=60,
                predicate=lambda e: f"tether resume {run_id} continues it" in e["body"]["output"],
            )
            async with tether("resume", run_id, home=home, name="resume") as refused:
                assert await refused.process.wait() != 0
            assert "has no checkpoint: it would start again from step 0; add --from-start" in (
                refused.output
            )
            async with tether("resume", run_id, "--from-start", home=home, name="resume") as again:
                assert await again.process.wait() == 0
            stopped, frame = await stopped_frame(ide)
            assert stopped["body"]["reason"] == "breakpoint"
            assert stopped["body"].get("hitBreakpointIds", [bp_id]) == [bp_id]
            assert (frame["line"], frame["source"]["path"]) == (
                FLAKY_BREAKPOINT,
                str(workdir / "flaky.py"),
            )
            await resume(ide, "continue", stopped["body"]["threadId"])
            # attempt 1's exit (ended at the grace) came first; attempt 2's ends the run
            await ide.wait_event(
                "exited", timeout=60, predicate=lambda e: e["body"]["exitCode"] == 0
            )
            await up.wait_line(rf"claimed run {run_id} \(attempt 2\)")
        async with tether("status", run_id, home=home, name="status") as status:
            await status.process.wait()
    assert "-> preempted" in status.output, status.output
    assert "-> succeeded" in status.output, status.output
