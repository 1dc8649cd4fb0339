"""Issue 42, item 3: a pause does not kill the job. Real PyTorch (CPU, gloo): ``torchrun
--nproc-per-node 2`` whose process group has a 10 s timeout; rank 1 stops at a breakpoint before its
step's backward, so rank 0 already waits in DDP's gradient all_reduce (a collective in flight when
the pause began); the run is held paused for 30 s, three times the timeout, then continued, and
the job ends with exit code 0. Without tether raising the groups' timeouts from their creation
(``worker_shim/inject/_tether_collectives.py``), rank 0's all_reduce fails after 10 s and torchrun
ends the job. Also ``torch.distributed.breakpoint()``: a debugger stop in its rank's session (issue
42, item 7). Marked ``torch``, like ``test_pytorch_e2e.py`` (whose venv it shares).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
from test_processes_e2e import run_through_tether
from venvs import own_venv

from protocol_specs.session.processes import COLLECTIVE_TIMEOUT_HINT

pytestmark = [pytest.mark.slow, pytest.mark.torch, pytest.mark.timeout(600)]

PROGRAM = Path(__file__).resolve().parent / "programs" / "ddp_pause.py"
#: step(): the line only rank 1 runs, at step 2, before its backward
PAUSE_LINE = next(
    n for n, line in enumerate(PROGRAM.read_text().splitlines(), 1) if "# the breakpoint" in line
)
#: how long the run is held paused: three times the program's process-group timeout (10 s)
PAUSE_S = 30


@pytest.fixture(scope="module")
def torch_python() -> str:
    probe = "import torch, numpy"
    return str(
        own_venv(".venv-torch", ["torch==2.13.0", "numpy"], probe, require="TETHER_REQUIRE_TORCH")
    )


async def test_a_rank_paused_past_the_group_timeout_does_not_end_the_job(
    tmp_path: Path, torch_python: str
) -> None:
    steps: list[dict[str, Any]] = [
        {"op": "wait_session", "label": "rank1", "expect": {"name": {"$regex": r"^rank 1 "}}},
        {
            "op": "wait_stopped",
            "session": "rank1",
            "label": "hit",
            "reason": "breakpoint",
            "path": "ddp_pause.py",
            "line": PAUSE_LINE,
            "function": "step",
        },
        {
            "op": "wait_output",
            "session": "rank1",
            "category": "important",
            "contains": COLLECTIVE_TIMEOUT_HINT,
        },
        {"op": "mark", "name": "paused", "wait": True},  # held here PAUSE_S seconds
        {"op": "continue", "session": "rank1"},
        {"op": "wait_output", "contains": "rank 0 done, 4 steps"},
        {"op": "wait_terminated", "label": "end"},
        {"op": "disconnect"},
    ]
    command = ["-m", "torch.distributed.run", "--nproc-per-node", "2", "ddp_pause.py"]
    result, _messages, _port = await run_through_tether(
        tmp_path,
        command,
        {"ddp_pause.py": [PAUSE_LINE]},
        steps,
        program=torch_python,
        held={"paused": PAUSE_S},
    )
    assert result["labels"]["end"]["exitCode"] == 0
    output = "".join(str(v) for v in result.get("output", {}).values())
    assert "process groups get a timeout of 24h (not 10s)" in output  # said by rank 0, at once


DIST_BREAKPOINT = PROGRAM.with_name("dist_breakpoint.py")
#: the line after ``dist.breakpoint(rank=1)``: where rank 1 stops
AFTER_LINE = next(
    n
    for n, line in enumerate(DIST_BREAKPOINT.read_text().splitlines(), 1)
    if "# after torch.distributed.breakpoint()" in line
)


async def test_torch_distributed_breakpoint_stops_its_rank_in_the_debugger(
    tmp_path: Path, torch_python: str
) -> None:
    """``torch.distributed.breakpoint()`` is a debugger stop in its rank's session (torch's own
    runs pdb, reading a stdin that is not the user's, and no session is offered)."""
    steps: list[dict[str, Any]] = [
        {"op": "wait_session", "label": "rank1", "expect": {"name": {"$regex": r"^rank 1 "}}},
        {
            "op": "wait_stopped",
            "session": "rank1",
            "path": "dist_breakpoint.py",
            "line": AFTER_LINE,
            "function": "main",
        },
        {
            "op": "evaluate",
            "session": "rank1",
            "expression": "value",
            "label": "value",
            "expect": {"result": "20"},
        },
        {"op": "continue", "session": "rank1"},
        {"op": "wait_output", "contains": "rank 1 done, values [11, 21]"},
        {"op": "wait_terminated", "label": "end"},
        {"op": "disconnect"},
    ]
    command = ["-m", "torch.distributed.run", "--nproc-per-node", "2", DIST_BREAKPOINT.name]
    result, _messages, _port = await run_through_tether(
        tmp_path, command, {}, steps, program=torch_python
    )
    assert result["labels"]["end"]["exitCode"] == 0
