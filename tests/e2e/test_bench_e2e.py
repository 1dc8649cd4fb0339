"""The benchmarks keep working: their tiny version (``python -m bench --quick``) runs end to end and
writes a report with every figure. No time is asserted here; the figures live in bench/report.md."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest
import trio

pytestmark = [pytest.mark.slow, pytest.mark.timeout(600)]

REPO = Path(__file__).resolve().parents[2]


async def test_every_benchmark_runs_and_reports(tmp_path: Path) -> None:
    with trio.fail_after(560):
        done = await trio.run_process(
            [sys.executable, "-m", "bench", "--quick", "--out", str(tmp_path)],
            cwd=str(REPO),
            capture_stdout=True,
            capture_stderr=True,
            check=False,
        )
    output = done.stdout.decode() + done.stderr.decode()
    assert done.returncode == 0, output
    figures = json.loads((tmp_path / "results" / "figures.json").read_text())
    for key in (
        "requests",
        "steps",
        "stops",
        "flood",
        "first_stop",
        "idle",
        "snapshot",
        "resume",
        "processes",
        "wan",
        "debuggable",
        "scale_out",
        "ranks",
    ):
        assert key in figures, (key, sorted(figures))
    # every latency figure has samples of all three ways
    tables = [*figures["requests"].values(), figures["steps"], figures["stops"]]
    assert set(figures["requests"]["prefetched"]) == {
        "threads", "stackTrace (20 frames)", "scopes", "variables (Locals)", "evaluate (watch)"
    }  # fmt: skip
    for table in tables:
        for ways in table.values():
            assert set(ways) == {"tether", "debugpy", "floor"}
            assert all(len(w["samples"]) > 0 for w in ways.values())
    assert figures["idle"]["sessions"] == 20
    # several relays on a cluster: each configuration opened its idle sessions and echoed
    scale = figures["scale_out"]["configurations"]
    assert [(c["relays"], c["sessions"], c["failure"]) for c in scale] == [
        (1, 20, ""), (2, 20, ""), (4, 20, "")
    ]  # fmt: skip
    assert all(c["round_trips_per_s"] > 0 and len(c["beside"]["samples"]) == 5 for c in scale)
    assert all(
        len(p[way]["samples"]) == 2
        for p in figures["debuggable"]["programs"].values()
        for way in ("plain", "debuggable")
    )
    # the slow link: quick RTTs, every stop of both ways measured
    assert [r["rtt_ms"] for r in figures["wan"]["rows"]] == [0, 50]
    for row in figures["wan"]["rows"]:
        assert {w: len(d["samples"]) for w, d in row["whole"].items()} == {
            "tether": 3,
            "debugpy": 3,
        }
    assert [r["sessions_opened"] for r in figures["processes"]["memory"]["runs"]] == [1, 1, 2]
    for tree in (figures["snapshot"], figures["snapshot"]["big"]):
        assert all(r["blob_bytes"] == tree["file_bytes"] and r["trees"] >= 2
                   for r in tree["rounds"]["tether"])  # fmt: skip
    report = (tmp_path / "report.md").read_text()
    for heading in (
        "1. Request latency",
        "2. Stepping",
        "3. Output flood",
        "4. Time to first stop",
        "5. Idle scale",
        "6. Snapshot",
        "7. Resume",
        "8. Processes",
        "9. Over a slow link",
        "10. Debuggable runs",
        "12. Scale out",
    ):
        assert f"## {heading}" in report, heading


async def test_the_rank_group_benchmark_runs_and_reports(tmp_path: Path) -> None:
    """Section 15 on its own, tiny (a group of 2 against the one-rank baseline): figures for each
    rank count and both moves, and the cross-rank eval against one eval."""
    with trio.fail_after(300):
        done = await trio.run_process(
            [sys.executable, "-m", "bench", "--quick", "--only", "ranks", "--out", str(tmp_path)],
            cwd=str(REPO),
            capture_stdout=True,
            capture_stderr=True,
            check=False,
        )
    output = done.stdout.decode() + done.stderr.decode()
    assert done.returncode == 0, output
    figures = json.loads((tmp_path / "results" / "figures.json").read_text())
    assert "errors" not in figures, figures["errors"]
    ranks = figures["ranks"]
    assert ranks["counts"] == [2]
    for table in (ranks["baseline"], ranks["groups"]["2"]):
        assert {k: len(d["samples"]) for k, d in table.items()} == {"stop": 1, "continue": 1}
        assert all(d["samples"][0] > 0 for d in table.values())
    report = (tmp_path / "report.md").read_text()
    assert "## 15. A rank group: stop together, continue together" in report
    assert "| ranks | cross-rank eval, median |" in report
    evals = ranks["eval"]["2"]  # the cross-rank eval, measured (no timing asserted)
    assert {k: len(d["samples"]) for k, d in evals.items()} == {"cross": 10, "one": 10}
    assert all(x > 0 for d in evals.values() for x in d["samples"])


async def test_the_checkpoint_benchmark_runs_and_reports(tmp_path: Path) -> None:
    """Section 17 on its own, tiny (64 MiB): save 1 sends it all, save 2 about the 1% change
    (in whole chunks), rsync measured beside it, the restore byte-identical."""
    with trio.fail_after(300):
        done = await trio.run_process(
            [sys.executable, "-m", "bench", "--quick", "--only", "checkpoints", "--out",
             str(tmp_path)],
            cwd=str(REPO),
            capture_stdout=True,
            capture_stderr=True,
            check=False,
        )  # fmt: skip
    output = done.stdout.decode() + done.stderr.decode()
    assert done.returncode == 0, output
    figures = json.loads((tmp_path / "results" / "figures.json").read_text())
    assert "errors" not in figures, figures["errors"]
    f = figures["checkpoints"]
    size = f["second"]["size"]
    assert f["first"]["sent"] >= size and f["second"]["hashed"] == size
    assert f["changed"] < f["second"]["sent"] <= 8 * 2**20 + 2**16  # 4 regions: at most 8 chunks
    assert f["restore"] == {"ms": f["restore"]["ms"], "bytes": size, "identical": True}
    assert f["rsync"] is None or f["rsync"]["bytes"] > 0
    report = (tmp_path / "report.md").read_text()
    assert "## 17. Checkpoints: a second save with 1% changed, against rsync; a restore" in report
