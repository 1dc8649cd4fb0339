"""A worker's disk stays bounded: old run directories and least recently used blobs go."""

from __future__ import annotations

import os
from pathlib import Path

from worker_shim.backends.housekeeping import prune_cache, prune_runs


def test_only_the_newest_run_directories_and_their_logs_and_caches_are_kept(tmp_path: Path) -> None:
    runs = tmp_path / "runs"
    for i in range(5):
        run = runs / f"r{i}-1"
        run.mkdir(parents=True)
        (run / "train.py").write_text("x")
        log = runs / f"r{i}-1.log"
        log.write_text("out")
        (runs / f"r{i}-1.outputs-hashes").write_text("{}")
        os.utime(run, (1000 + i, 1000 + i))
    assert sorted(prune_runs(runs, keep=2)) == ["r0-1", "r1-1", "r2-1"]
    assert sorted(p.name for p in runs.iterdir()) == [
        "r3-1", "r3-1.log", "r3-1.outputs-hashes", "r4-1", "r4-1.log", "r4-1.outputs-hashes"
    ]  # fmt: skip
    assert prune_runs(tmp_path / "absent", keep=2) == []


def test_a_checkpoint_directory_goes_with_its_run_and_is_no_run_of_its_own(
    tmp_path: Path,
) -> None:
    runs = tmp_path / "runs"
    for i in range(3):
        run = runs / f"r{i}-1"
        (run.with_name(f"{run.name}.checkpoints") / "deep").mkdir(parents=True)
        (run.with_name(f"{run.name}.checkpoints") / "deep" / "state.pt").write_text("s")
        run.mkdir()
        os.utime(run, (1000 + i, 1000 + i))
    # three runs, kept two: the checkpoint directories count as none
    assert prune_runs(runs, keep=2) == ["r0-1"]
    assert sorted(p.name for p in runs.iterdir()) == [
        "r1-1", "r1-1.checkpoints", "r2-1", "r2-1.checkpoints",
    ]  # fmt: skip


def test_the_blob_cache_loses_its_least_recently_used_blobs_first(tmp_path: Path) -> None:
    cache = tmp_path / "blobs"
    for i, name in enumerate(["aa", "bb", "cc", "dd"]):
        blob = cache / name / "rest"
        blob.parent.mkdir(parents=True)
        blob.write_bytes(b"x" * 100)
        os.utime(blob, (2000 + i, 2000 + i))
    assert prune_cache(cache, max_bytes=250) == 200
    left = sorted(p.parent.name for p in cache.glob("*/*"))
    assert left == ["cc", "dd"]
    assert prune_cache(cache, max_bytes=1000) == 0
