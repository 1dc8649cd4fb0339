"""Materialising a run's working-directory snapshot on the worker."""

from __future__ import annotations

import io
import tarfile
from pathlib import Path

__all__ = ["extract_snapshot"]


def extract_snapshot(data: bytes, dest: Path) -> int:
    """Unpack a snapshot (gzip tar made by ``adapter.snapshot``) into ``dest``; returns the file count.

    Uses tarfile's ``data`` filter: absolute paths, ``..``, links leaving ``dest`` and device files
    are refused, so a snapshot can never write outside its run directory.
    """
    dest.mkdir(parents=True, exist_ok=True)
    if not data:
        return 0
    with tarfile.open(fileobj=io.BytesIO(data), mode="r:gz") as tar:
        members = tar.getmembers()
        tar.extractall(dest, filter="data")
    return sum(1 for m in members if m.isfile())
