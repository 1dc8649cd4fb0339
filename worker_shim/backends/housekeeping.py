"""A worker's disk: what its runs leave behind is kept within bounds.

Each attempt leaves a run directory (the snapshot, and whatever the program wrote there) and a log
file in ``runs/``; snapshot blobs are cached in ``blobs/`` so the next attempt of the same tree
fetches nothing. Without bounds, three submits of a 300 MB tree left 900 MB of run directories and
600 MB of blob copies. After every attempt the worker keeps the newest :data:`KEEP_RUNS` run
directories (and their logs), and trims the blob cache to :data:`CACHE_MAX_BYTES`, least recently
used first (a cached blob's mtime is refreshed whenever an attempt uses it).

Both are plain filesystem work, done in a thread.
"""

from __future__ import annotations

import contextlib
import os
import shutil
from collections.abc import Callable
from pathlib import Path

import trio

__all__ = ["CACHE_MAX_BYTES", "KEEP_RUNS", "tidy"]

KEEP_RUNS = 20
CACHE_MAX_BYTES = 20 * 1024**3


async def tidy(
    work_dir: Path,
    runs_dir: Path | None = None,
    *,
    keep_runs: int = KEEP_RUNS,
    cache_max: int = CACHE_MAX_BYTES,
    release: Callable[[Path], None] = lambda _dir: None,
) -> None:
    """Bound the run directories (in ``runs_dir``, by default ``work_dir/runs``) and
    ``work_dir``'s blob cache (see the module's docstring); ``release`` is told each run
    directory removed (its uid's lease ends: ``worker_shim/program/quarters.py``)."""
    runs = runs_dir or work_dir / "runs"
    await trio.to_thread.run_sync(_tidy, work_dir, runs, keep_runs, cache_max, release)


def _tidy(
    work_dir: Path, runs: Path, keep_runs: int, cache_max: int, release: Callable[[Path], None]
) -> None:
    prune_runs(runs, keep_runs, release)
    prune_cache(work_dir / "blobs", cache_max)


def prune_runs(
    runs: Path, keep: int, release: Callable[[Path], None] = lambda _dir: None
) -> list[str]:
    """Remove all but the ``keep`` newest run directories (and their logs); their names."""
    try:
        dirs = [p for p in runs.iterdir() if _run_dir(p)]
    except OSError:
        return []
    dirs.sort(key=_mtime, reverse=True)
    removed = []
    for old in dirs[max(keep, 0) :]:
        shutil.rmtree(old, ignore_errors=True)
        with contextlib.suppress(OSError):
            old.with_name(f"{old.name}.log").unlink()
        # its checkpoint directory (``worker_shim/program/checkpoints.py``) goes with it
        shutil.rmtree(old.with_name(f"{old.name}.checkpoints"), ignore_errors=True)
        release(old)
        removed.append(old.name)
    return removed


def _run_dir(path: Path) -> bool:
    """Whether ``path`` is a run's directory (not a link, not a checkpoint directory)."""
    return path.is_dir() and not path.is_symlink() and not path.name.endswith(".checkpoints")


def prune_cache(cache: Path, max_bytes: int) -> int:
    """Remove the least recently used blobs until the cache holds at most ``max_bytes``;
    returns the bytes removed."""
    blobs: list[tuple[float, int, Path]] = []
    for root, _dirs, files in os.walk(cache):
        for name in files:
            path = Path(root, name)
            with contextlib.suppress(OSError):
                st = path.stat()
                blobs.append((st.st_mtime, st.st_size, path))
    total = sum(size for _, size, _ in blobs)
    removed = 0
    for _, size, path in sorted(blobs):
        if total - removed <= max_bytes:
            break
        with contextlib.suppress(OSError):
            path.unlink()
            removed += size
    return removed


def _mtime(path: Path) -> float:
    try:
        return path.stat().st_mtime
    except OSError:
        return 0.0
