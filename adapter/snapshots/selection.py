"""Which files a snapshot of the working directory holds, each with its ``lstat``.

Inside a git work tree, what git would commit (tracked files plus untracked ones not ignored:
``git ls-files --cached --others --exclude-standard``); elsewhere, every file except those
matched by the root ``.gitignore`` and the usual caches (``.git``, ``.venv``, ``__pycache__``,
``node_modules``). In both cases patterns in a root ``.tetherignore`` (``.gitignore`` syntax, no
``!``) are left out too, tracked or not: that is where large data and checkpoints go.

Symlinks are listed as symlinks, never followed (:mod:`adapter.snapshots.snapshot` keeps those
pointing inside the tree). Stats are taken relative to each directory: one system call a file,
which is most of what a second submit of a big tree costs.
"""

from __future__ import annotations

import fnmatch
import os
import stat
import subprocess
from pathlib import Path

__all__ = ["ALWAYS_SKIPPED", "Entries", "list_files", "scan", "scan_dirs"]

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


def list_files(root: Path) -> list[str]:
    """Relative paths of the files and symlinks a snapshot of ``root`` contains, sorted."""
    return [rel for rel, _ in scan(root)]


def scan(root: Path) -> Entries:
    """The files and symlinks a snapshot of ``root`` contains, sorted by path, each with its
    ``lstat``."""
    found = [
        (f"{d}/{name}" if d else name, st)
        for d, entries in scan_dirs(root).items()
        for name, st in entries
    ]
    found.sort(key=lambda item: item[0])
    return found


Entries = list[tuple[str, os.stat_result]]
"""A directory's files and symlinks: each one's name and ``lstat``."""


def scan_dirs(root: Path) -> dict[str, Entries]:
    """The files and symlinks a snapshot of ``root`` contains, by directory (relative; "" the
    root; only directories holding some), each with its name and ``lstat`` (one system call a
    file: a second submit of a big tree is mostly this)."""
    top = os.fspath(root)
    extra = _patterns(root / ".tetherignore")
    try:
        out = subprocess.run(
            ["git", "ls-files", "-z", "--cached", "--others", "--exclude-standard"],
            cwd=root,
            capture_output=True,
            check=True,
        ).stdout
    except (OSError, subprocess.CalledProcessError):
        return _walk(top, _patterns(root / ".gitignore") + extra)
    listed: dict[str, list[str]] = {}
    for rel in dict.fromkeys(out.decode().split("\0")):
        if not rel or _skipped(rel) or (extra and _ignored(rel, extra)):
            continue
        parent, _, name = rel.rpartition("/")
        listed.setdefault(parent, []).append(name)
    return {d: here for d, names in listed.items() if (here := _files_in(top, d, names))}


def _open_dir(path: str) -> int:
    return os.open(path, os.O_RDONLY | os.O_DIRECTORY)


def _files_in(top: str, rel_dir: str, names: list[str]) -> Entries:
    """The files and symlinks among ``names`` in the directory ``rel_dir``, each with its
    ``lstat``, taken relative to the directory (one name to resolve a call, not a whole path)."""
    try:
        fd = _open_dir(os.path.join(top, rel_dir))
    except OSError:
        return []  # gone since git listed it
    found = []
    try:
        for name in names:
            try:
                st = os.stat(name, dir_fd=fd, follow_symlinks=False)
            except OSError:
                continue  # deleted but still in git's index
            if stat.S_ISREG(st.st_mode) or stat.S_ISLNK(st.st_mode):
                found.append((name, st))
    finally:
        os.close(fd)
    return found


def _skipped(rel: str) -> bool:
    return any(part in ALWAYS_SKIPPED for part in rel.split("/"))


def _patterns(path: Path) -> list[str]:
    try:
        lines = path.read_text().splitlines()
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


def _walk(top: str, patterns: list[str]) -> dict[str, Entries]:
    """Every file and symlink under ``top`` but the usual caches and what ``patterns`` (the root
    ``.gitignore`` and ``.tetherignore``) name, by directory; a symlink to a directory is kept as a
    symlink, not entered."""
    found: dict[str, Entries] = {}
    pending = [""]
    while pending:
        rel_dir = pending.pop()
        try:
            fd = _open_dir(os.path.join(top, rel_dir))  # its entries' stats: relative to it
        except OSError:
            continue  # unreadable: left out, as os.walk does
        try:
            if here := _listing(fd, rel_dir, patterns, pending):
                found[rel_dir] = here
        except OSError:
            continue
        finally:
            os.close(fd)
    return found


def _listing(fd: int, rel_dir: str, patterns: list[str], subdirs: list[str]) -> Entries:
    """The files and symlinks of the directory open as ``fd``; its subdirectories go to
    ``subdirs``."""
    here: Entries = []
    with os.scandir(fd) as listing:
        for entry in listing:
            name = entry.name
            try:
                if name in ALWAYS_SKIPPED and entry.is_dir():
                    continue
                if patterns and _ignored(f"{rel_dir}/{name}" if rel_dir else name, patterns):
                    continue
                if entry.is_file(follow_symlinks=False) or entry.is_symlink():
                    here.append((name, entry.stat(follow_symlinks=False)))
                elif entry.is_dir():
                    subdirs.append(f"{rel_dir}/{name}" if rel_dir else name)
            except OSError:
                continue  # gone meanwhile
    return here
