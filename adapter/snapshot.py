"""The submitted working directory, as one gzip tar (a full upload; content-addressed later).

Which files: inside a git work tree, what git would commit (tracked files plus untracked ones not
ignored: ``git ls-files --cached --others --exclude-standard``); elsewhere, every file except those
matched by the root ``.gitignore`` and the usual caches (``.git``, ``.venv``, ``__pycache__``,
``node_modules``).
"""

from __future__ import annotations

import fnmatch
import io
import os
import subprocess
import tarfile
from pathlib import Path

from protocol_specs.wire import MAX_SNAPSHOT_BYTES

__all__ = ["SnapshotTooLarge", "list_files", "make_snapshot"]

ALWAYS_SKIPPED = {
    ".git",
    ".venv",
    "venv",
    "__pycache__",
    "node_modules",
    ".mypy_cache",
    ".pytest_cache",
    ".ruff_cache",
}


class SnapshotTooLarge(ValueError):
    pass


def list_files(root: Path) -> list[str]:
    """Relative paths of the files a snapshot of ``root`` contains, sorted."""
    try:
        out = subprocess.run(
            ["git", "ls-files", "-z", "--cached", "--others", "--exclude-standard"],
            cwd=root,
            capture_output=True,
            check=True,
        ).stdout
        names = [n for n in out.decode().split("\0") if n]
        return sorted(n for n in names if (root / n).is_file() and not _skipped(n))
    except (OSError, subprocess.CalledProcessError):
        return _walk(root)


def _skipped(rel: str) -> bool:
    return any(part in ALWAYS_SKIPPED for part in Path(rel).parts)


def _gitignore_patterns(root: Path) -> list[str]:
    try:
        lines = (root / ".gitignore").read_text().splitlines()
    except OSError:
        return []
    return [line.strip() for line in lines if line.strip() and not line.startswith(("#", "!"))]


def _ignored(rel: str, patterns: list[str]) -> bool:
    parts = rel.split("/")
    for pattern in patterns:
        p = pattern.rstrip("/")
        anchored = p.startswith("/")
        p = p.lstrip("/")
        if "/" in p or anchored:
            if fnmatch.fnmatch(rel, p) or any(
                fnmatch.fnmatch("/".join(parts[:i]), p) for i in range(1, len(parts))
            ):
                return True
        elif any(fnmatch.fnmatch(part, p) for part in parts):
            return True
    return False


def _walk(root: Path) -> list[str]:
    patterns = _gitignore_patterns(root)
    found = []
    for dirpath, dirnames, filenames in os.walk(root):
        rel_dir = os.path.relpath(dirpath, root)
        dirnames[:] = [
            d
            for d in dirnames
            if d not in ALWAYS_SKIPPED
            and not _ignored(os.path.normpath(os.path.join(rel_dir, d)), patterns)
        ]
        for name in filenames:
            rel = os.path.normpath(os.path.join(rel_dir, name))
            if not _ignored(rel, patterns) and os.path.isfile(os.path.join(dirpath, name)):
                found.append(rel)
    return sorted(found)


def make_snapshot(root: Path, *, limit: int = MAX_SNAPSHOT_BYTES) -> tuple[bytes, int]:
    """``(gzip tar bytes, file count)`` of ``root``; raises :class:`SnapshotTooLarge` past ``limit``."""
    buffer = io.BytesIO()
    files = list_files(root)
    too_large = SnapshotTooLarge(
        f"the working directory snapshot exceeds {limit / (1024 * 1024):g} MiB; "
        "add large files (data, checkpoints) to .gitignore"
    )
    with tarfile.open(fileobj=buffer, mode="w:gz", compresslevel=6) as tar:
        for rel in files:
            tar.add(root / rel, arcname=rel, recursive=False)
            if buffer.tell() > limit:
                raise too_large
    data = buffer.getvalue()
    if len(data) > limit:
        raise too_large
    return data, len(files)
