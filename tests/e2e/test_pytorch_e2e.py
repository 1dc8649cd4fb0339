"""Real PyTorch through tether: ``torchrun --nproc-per-node 2`` on the CPU (gloo), each rank with a
DataLoader of 2 workers, a breakpoint in rank 1's training step set while the run was queued.

PyTorch lives in a venv of its own (``.venv-torch`` at the repository's root, made here on first
use with ``pip install torch==2.13.0 numpy``), and tether runs the program on that interpreter,
lending it only its debugpy: the user's environment, as in real use. Marked ``torch``: ``./dev
test -m torch`` runs it alone; the whole suite and CI run it too (``TETHER_REQUIRE_TORCH=1``, set
by ``.ci/run``: a venv that cannot be made fails the test instead of skipping it).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
from test_processes_e2e import run_through_tether
from venvs import own_venv

from protocol_specs.session.processes import COLLECTIVE_TIMEOUT_HINT

pytestmark = [pytest.mark.slow, pytest.mark.torch, pytest.mark.timeout(600)]

TORCH = "torch==2.13.0"  # the CPU build this machine keeps on disk (pip takes it from there)
PROGRAM = Path(__file__).resolve().parent / "programs" / "train_ddp.py"
#: train_step(): the line only rank 1 runs, at step 2
STEP_LINE = next(
    n for n, line in enumerate(PROGRAM.read_text().splitlines(), 1) if "# the breakpoint" in line
)


@pytest.fixture(scope="module")
def torch_python() -> str:
    probe = "import torch, numpy"
    return str(own_venv(".venv-torch", [TORCH, "numpy"], probe, require="TETHER_REQUIRE_TORCH"))


async def test_torchrun_rank_1_stops_in_its_training_step(
    tmp_path: Path, torch_python: str
) -> None:
    steps: list[dict[str, Any]] = [
        {
            "op": "wait_session",
            "label": "rank1",
            "expect": {"name": {"$regex": r"^rank 1 \(pid \d+\)"}},
        },
        {
            "op": "wait_stopped",
            "session": "rank1",
            "label": "hit",
            "reason": "breakpoint",
            "path": "train_ddp.py",
            "line": STEP_LINE,
            "function": "train_step",
        },
        {"op": "variables", "session": "rank1", "label": "locals", "scope": "Locals"},
        {
            "op": "evaluate",
            "session": "rank1",
            "label": "world",
            "expression": "__import__('os').environ['WORLD_SIZE']",
        },
        {
            "op": "wait_output",
            "session": "rank1",
            "category": "important",
            "contains": COLLECTIVE_TIMEOUT_HINT,
        },
        {"op": "continue", "session": "rank1"},
        {"op": "wait_output", "contains": "rank 1 done, 4 steps"},
        {"op": "wait_terminated", "label": "end"},
        {"op": "disconnect"},
    ]
    command = ["-m", "torch.distributed.run", "--nproc-per-node", "2", "train_ddp.py"]
    result, _messages, _port = await run_through_tether(
        tmp_path, command, {"train_ddp.py": [STEP_LINE]}, steps, program=torch_python
    )
    labels = result["labels"]
    values = labels["locals"]["values"]
    assert (values["step"], values["rank"]) == ("2", "1")
    assert labels["world"]["result"] == "'2'"
    assert labels["end"]["exitCode"] == 0
