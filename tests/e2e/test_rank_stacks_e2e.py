"""End to end, ``tether stacks RUN`` on a real stack (`tether up`, `tether worker`, `tether debug`,
real debugpy, the DebugClient harness): four torchrun-style ranks without PyTorch
(``programs/ranks_launcher.py``), breakpoints in rank 1 only (``--ranks 1``), which stops alone (``--stop one``). While rank 1 is
paused at its breakpoint the others wait for it in ``recv`` (native code, as in a collective):
rank 0 for rank 1's partial sum, ranks 2 and 3 for rank 0's total. The stacks of the running
ranks are read without stopping them and merged into classes; rank 1 is marked paused."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
import trio
from direct_debugpy import PROGRAMS, copy_programs
from node_harness import open_vscode_session, scenario
from stack import debug_run, program_python, relay_stack, tether, worker

pytestmark = [pytest.mark.slow, pytest.mark.timeout(300)]

RANK1_LINE = 36  # programs/ranks_worker.py, main(): peers[0].sendall(...), rank != 0 only
RANK0_WAIT = 32  # rank 0: sum(int(p.recv(64)) for p in peers)
OTHERS_WAIT = 37  # ranks 2, 3: total = int(peers[0].recv(64))
#: the module-level call of main(), the outermost frame every rank shares
MAIN_CALL = 1 + (PROGRAMS / "ranks_worker.py").read_text().splitlines().index("    main()")


async def stacks(home: Path, relay: str, run: str, *flags: str) -> str:
    async with tether("stacks", "--relay", relay, run, *flags, home=home, name="stacks") as s:
        await s.process.wait()
    assert s.process.returncode == 0, s.output
    return s.output


def _settled(report: dict[str, Any]) -> bool:
    """Every rank where this test puts it (they get there on their own, soon after the stop)."""
    want = {
        ("ranks 2-3", "running", OTHERS_WAIT),
        ("rank 0", "running", RANK0_WAIT),
        ("rank 1", "paused: breakpoint", RANK1_LINE),
    }
    got = {
        (c["label"], c["state"], c["frames"][-1]["line"]) for c in report["classes"] if c["frames"]
    }
    return want <= got


async def test_stacks_merges_running_ranks_and_marks_the_paused_one(tmp_path: Path) -> None:
    ws = copy_programs(tmp_path / "ws")
    home = tmp_path / "home"
    python = program_python()
    steps: list[dict[str, Any]] = [
        {"op": "mark", "name": "configured", "wait": True},
        {"op": "wait_session", "label": "rank1"},
        {
            "op": "wait_stopped",
            "session": "rank1",
            "reason": "breakpoint",
            "path": "ranks_worker.py",
            "line": RANK1_LINE,
        },
        {"op": "mark", "name": "paused", "wait": True},
        {"op": "continue", "session": "rank1"},
        {"op": "wait_output", "contains": "launcher done, rank exit codes [0, 0, 0, 0]"},
        {"op": "wait_terminated", "label": "end"},
        {"op": "disconnect"},
    ]
    async with (
        relay_stack(home, isolated=python is not None) as (_up, relay),
        debug_run(
            home,
            relay,
            ws,
            python or "python",
            "ranks_launcher.py",
            "4",
            extra=("--ranks", "1", "--stop", "one"),
        ) as (debug, run, port),
    ):
        spec = scenario(port, ws, steps, breakpoints={"ranks_worker.py": [RANK1_LINE]},
                        timeout_ms=200_000)  # fmt: skip
        async with open_vscode_session(spec, timeout=270) as session:
            await session.wait_mark("configured")
            async with worker(home, relay, isolated=python is not None):
                await session.release("configured")
                await session.wait_mark("paused", timeout=150)
                with trio.fail_after(60):  # the ranks reach their recv, the pause is recorded
                    while not _settled(
                        report := json.loads(await stacks(home, relay, run, "--json"))
                    ):
                        pass
                text = await stacks(home, relay, run)
                await session.release("paused")
                result, _messages = await session.result()
        await debug.wait_line(r"ended \(exited, exit code 0\)", timeout=60)
    assert result["labels"]["end"]["exitCode"] == 0
    # every process once: the launcher and four ranks (not the debugger's adapter)
    names = sorted(p["name"].split(" (")[0] for p in report["processes"])
    assert names == ["main process", "rank 0", "rank 1", "rank 2", "rank 3"], names
    assert report["unreadable"] == []
    [paused] = [p for p in report["processes"] if p["state"] == "paused"]
    assert (paused["rank"], paused["why"]) == (1, "breakpoint")
    # the debugger's frames are gone: the user's frame is on top of the paused rank
    [rank1] = [c for c in report["classes"] if c["label"] == "rank 1"]
    assert [f["function"] for f in rank1["frames"]] == ["<module>", "main"]
    lines = text.splitlines()
    assert lines[0].startswith(f"run {run}: 5 Python processes, 1 paused, in 4 places")
    assert f"ranks 0-3: ranks_worker.py:{MAIN_CALL} <module>" in lines, text
    assert f"  ranks 2-3 (running): ranks_worker.py:{OTHERS_WAIT} main" in lines, text
    assert f"  rank 1 (paused: breakpoint): ranks_worker.py:{RANK1_LINE} main" in lines, text
    assert any(
        line.startswith(f"  rank 0 (running): ranks_worker.py:{RANK0_WAIT} main > ")
        for line in lines
    ), text
