"""Experiments end to end, with real processes: a run's metrics from ``tether.report`` (in a
Python environment of the user's that has no tether installed) and from its output lines, read back
with ``tether metrics`` and ``tether ls``."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
import trio
from stack import relay_stack, tether

pytestmark = [pytest.mark.slow, pytest.mark.timeout(180)]

TRAIN = """\
import math, sys
import tether

lr = float(sys.argv[1])
for step in range(50):
    loss = math.exp(-lr * step)
    tether.report(step=step, loss=loss)
    if step % 10 == 0:
        print(f"epoch {step // 10} val_loss={loss * 1.5:.6f}", flush=True)
print("done", tether.params(), tether.should_stop(), flush=True)
"""


def bare_venv(where: Path) -> Path:
    """A Python environment with the standard library only (as a user's may be: no tether)."""
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(where)], check=True)
    python = where / "bin" / "python"
    probe = subprocess.run([str(python), "-c", "import tether"], capture_output=True, cwd=where)
    assert probe.returncode != 0, "the bare venv sees tether: the test would prove nothing"
    return python


async def run_cli(home: Path, *args: str) -> str:
    async with tether(*args, home=home, name=args[0]) as proc:
        with trio.fail_after(60):
            code = await proc.process.wait()
            while not proc.eof:  # all it printed
                await proc._changed.wait()
    assert code == 0, proc.output
    return proc.output


async def test_a_run_reports_metrics_by_the_api_and_by_its_output_lines(tmp_path: Path) -> None:
    workdir = tmp_path / "project"
    workdir.mkdir()
    (workdir / "train.py").write_text(TRAIN)
    python = bare_venv(tmp_path / "venv")
    home = tmp_path / "home"
    async with relay_stack(home, workers=1):
        out = await run_cli(
            home, "run", "--workdir", str(workdir), "-f",
            "--metric", r"epoch (?P<step>\d+) val_loss=(?P<val_loss>[\d.e+-]+)",
            "--", str(python), "train.py", "0.1",
        )  # fmt: skip
        assert "done {} False" in out
        listed = await run_cli(home, "ls", "--json")
        record = json.loads(listed[listed.index("[") :])[0]
        points = [
            json.loads(line)
            for line in (await run_cli(home, "metrics", record["id"], "--json")).splitlines()
            if line.startswith("{")
        ]
        losses = [p for p in points if "loss" in p]
        # every report exactly once, in order
        assert [p["step"] for p in losses] == list(range(50))
        assert losses[-1]["loss"] == pytest.approx(2.718281828 ** (-4.9))
        epochs = [(p["step"], p["val_loss"]) for p in points if "val_loss" in p]
        assert [step for step, _ in epochs] == [0, 1, 2, 3, 4]
        assert epochs[0][1] == pytest.approx(1.5)
        assert record["metrics"]["loss"] == pytest.approx(losses[-1]["loss"])
        table = await run_cli(home, "ls")
        assert "METRICS" in table and "loss 0.007447" in table, table
        text = await run_cli(home, "metrics", record["id"])
        assert "step 49  loss 0.007447" in text
