"""Snapshotting the submitted working directory: a Merkle tree of content-addressed files.

Which files: inside a git work tree, what git would commit (tracked files plus untracked ones not
ignored: ``git ls-files --cached --others --exclude-standard``); elsewhere, every file except those
matched by the root ``.gitignore`` and the usual caches (``.git``, ``.venv``, ``__pycache__``,
``node_modules``). In both cases patterns in a root ``.tetherignore`` (``.gitignore`` syntax, no
``!``) are left out too, tracked or not: that is where large data and checkpoints go.

Symlinks are kept as symlinks when they point inside the tree; one pointing out (``data ->
/mnt/datasets``) is left out with a warning: hand such data to the run with ``--mount``.

:func:`build_snapshot` hashes every file (SHA-256) into a tree object per directory
(``protocol_specs/trees.py``): the root's digest names the snapshot.
``adapter/snapshots/snapshot_upload.py`` uploads what the relay lacks, asking about the root, then
only about what each changed directory names, so a second submit of a big tree with one changed file
sends that file and the few trees above it.

Hashing a big tree on every submit would cost more than the upload it saves, so a
:class:`HashCache` (one small file per working directory under ``$TETHER_HOME/cache``) remembers
each file's digest with its size, mtime, ctime and inode, as git's index does: a file whose stat
is unchanged is not read again. It remembers each directory's tree too, with a fingerprint of its
entries' stats: a directory where nothing changed costs its files' ``lstat`` and nothing more (a
second submit of 20,000 files is mostly the one system call a file). A file modified within
:data:`RACY_SECONDS` of when its digest was taken is never trusted (a write in the same clock tick
would leave its stat unchanged), nor is its directory's record.
"""

from __future__ import annotations

import fnmatch
import hashlib
import itertools
import os
import stat
import subprocess
from array import array
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from functools import cached_property
from pathlib import Path
from time import time_ns
from typing import Any

import msgpack
from pydantic import ValidationError

from protocol_specs.snapshots import (
    MAX_FILE_BYTES,
    MAX_FILES,
    MAX_PATH_CHARS,
    Manifest,
    ManifestEntry,
    check_relative_path,
)
from protocol_specs.trees import Expansion, Row, Trees, decode_tree, encode_tree

__all__ = [
    "DEFAULT_LIMIT",
    "HashCache",
    "Snapshot",
    "SnapshotError",
    "build_snapshot",
    "list_files",
    "scan",
]

#: the most bytes a snapshot may hold unless the user says otherwise (``--snapshot-limit``)
DEFAULT_LIMIT = 2 * 1024**3

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


class SnapshotError(ValueError):
    """The working directory cannot be snapshotted as it is; the message says what to change."""


def _size(n: float) -> str:
    for unit in ("bytes", "KiB", "MiB", "GiB"):
        if n < 1024 or unit == "GiB":
            return f"{n:.0f} {unit}" if unit == "bytes" else f"{n:.1f} {unit}"
        n /= 1024
    return ""


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


@dataclass
class Snapshot:
    """A working directory as its trees (``protocol_specs/trees.py``): the root's digest names it."""

    root: Path
    trees: Trees
    #: tree digest -> a directory (relative; "" the root) holding that tree: where its files are
    dirs: dict[str, str]
    files: int  #: files and symlinks
    size: int  #: bytes in all
    #: what was left out, and why (symlinks pointing out of the tree)
    warnings: list[str] = field(default_factory=list)

    @cached_property
    def manifest(self) -> Manifest:
        """Every file and symlink (expanded from the trees: for a check of every file)."""
        expansion = Expansion(self.trees.root)
        while expansion.needs:
            wanted = expansion.needs[0]
            expansion.feed_rows(wanted, decode_tree(self.trees.blobs[wanted]))
        return expansion.manifest()

    def files_in(self, trees: Iterable[str]) -> dict[str, tuple[str, int]]:
        """The files the trees among ``trees`` name: digest -> (a relative path holding those
        bytes, size)."""
        out: dict[str, tuple[str, int]] = {}
        for digest in trees:
            if digest not in self.dirs:
                continue
            base = self.dirs[digest]
            for name, kind, _mode, size, ref in decode_tree(self.trees.blobs[digest]):
                if kind == "f" and ref not in out:
                    out[ref] = (f"{base}/{name}" if base else name, size)
        return out

    @cached_property
    def sources(self) -> dict[str, str]:
        """digest -> a relative path holding those bytes, for every file."""
        return {d: rel for d, (rel, _) in self.files_in(self.trees.order).items()}


def _hash_file(path: str | Path) -> str:
    digest = hashlib.sha256()
    with open(path, "rb") as f:
        while chunk := f.read(1024 * 1024):
            digest.update(chunk)
    return digest.hexdigest()


#: a digest taken this close to the file's last change is not reused
RACY_SECONDS = 2.0


class HashCache:
    """What the last snapshot of a tree learnt, by directory, kept in ``path`` between snapshots
    (see the module doc). A directory's record: ``[fingerprint of its files, of its subtrees,
    tree digest, tree bytes, files, bytes, file records, links, warnings]``; its file records
    (``name -> [size, mtime, ctime, inode, digest]``) stay packed unless the directory changed."""

    VERSION = 3

    def __init__(self, path: Path) -> None:
        self.path = path
        self._old: dict[str, list[Any]] = {}
        self._new: dict[str, list[Any]] = {}
        try:
            loaded = msgpack.unpackb(path.read_bytes())
            if isinstance(loaded, dict) and loaded.get("v") == self.VERSION:
                dirs = loaded.get("dirs")
                self._old = dirs if isinstance(dirs, dict) else {}
        except (
            OSError,
            ValueError,
            msgpack.ExtraData,
            msgpack.FormatError,
            msgpack.StackError,
        ):
            pass

    @classmethod
    def for_tree(cls, cache_dir: Path, root: Path) -> HashCache:
        key = hashlib.sha256(str(root.resolve()).encode()).hexdigest()[:32]
        return cls(cache_dir / f"{key}.msgpack")

    def directory(self, rel: str) -> list[Any] | None:
        """The directory's record from the last snapshot, if it is whole (the file is the user's
        and may be damaged: a record whose tree is not what its digest says is not used)."""
        record = self._old.get(rel)
        if not isinstance(record, list) or len(record) != 9:
            return None
        fingerprint, subtrees, digest, data, files, size, packed, links, warnings = record
        if not (
            isinstance(fingerprint, bytes)
            and isinstance(subtrees, bytes)
            and isinstance(data, bytes)
            and isinstance(packed, bytes)
            and type(files) is int
            and type(size) is int
            and isinstance(links, list)
            and all(isinstance(x, list) and len(x) == 2 for x in links)
            and isinstance(warnings, list)
            and hashlib.sha256(data).hexdigest() == digest
        ):
            return None
        return record

    @staticmethod
    def file_records(record: list[Any] | None) -> dict[str, list[Any]]:
        if record is None:
            return {}
        try:
            files = msgpack.unpackb(record[6])
        except (ValueError, TypeError, msgpack.ExtraData, msgpack.FormatError, msgpack.StackError):
            return {}
        return files if isinstance(files, dict) else {}

    def keep(self, rel: str, record: list[Any]) -> None:
        self._new[rel] = record

    def save(self) -> None:
        """Keep what this snapshot learnt (only the directories it saw); a failure only costs
        speed."""
        try:
            self.path.parent.mkdir(parents=True, exist_ok=True)
            tmp = self.path.with_suffix(".tmp")
            tmp.write_bytes(msgpack.packb({"v": self.VERSION, "dirs": self._new}))
            tmp.replace(self.path)
        except OSError:
            pass


def _fingerprint(entries: Entries) -> bytes:
    """What a directory's record is good for: its files' names and stats (made for speed: a
    second submit of a big tree takes one of these a directory)."""
    fields = [
        x
        for _, s in entries
        for x in (s.st_size, s.st_mtime_ns, s.st_ctime_ns, s.st_ino, s.st_mode)
    ]
    try:
        stats = array("q", fields).tobytes()
    except OverflowError:  # an inode number past 2**63
        stats = repr(fields).encode()
    h = hashlib.blake2b(stats, digest_size=16)
    h.update("\0".join([n for n, _ in entries]).encode(errors="surrogateescape"))
    return h.digest()


def _stamp(st: os.stat_result) -> list[int]:
    """What a file's record is good for (as git's index: size, mtime, ctime, inode)."""
    return [st.st_size, st.st_mtime_ns, st.st_ctime_ns, st.st_ino]


def _subtrees(subdirs: list[Row]) -> bytes:
    """What a directory's record is good for, too: its subdirectories' names and trees."""
    return hashlib.blake2b(repr(subdirs).encode(errors="surrogateescape"), digest_size=16).digest()


def build_snapshot(
    root: Path,
    *,
    limit: int = DEFAULT_LIMIT,
    cache: HashCache | None = None,
    save: bool = True,
    progress: Callable[[int, int], None] = lambda _done, _total: None,
) -> Snapshot:
    """Hash the files of ``root`` into its trees; :class:`SnapshotError` says what is wrong.
    With ``cache``, a directory whose entries' stats did not change is not built again, and a
    file whose stat did not change is not read again; what it learnt is saved unless ``save`` is
    false (the CLI saves it while it uploads: the cache of a big tree is megabytes).
    ``progress(bytes hashed, bytes to hash)`` after each file read."""
    by_dir = scan_dirs(root)
    by_dir.setdefault("", [])
    for rel in list(by_dir):
        if rel:
            _add_parents(by_dir, rel.rpartition("/")[0])
    build = _Build(root, limit, cache or HashCache(Path(os.devnull)), time_ns(), progress)
    build.plan(by_dir)
    subdirs: dict[str, list[Row]] = {}
    # deepest first: a directory's tree is made once every subdirectory's is
    for rel in sorted(by_dir, key=lambda p: (-p.count("/") if p else 1, p)):
        # in the order the directory lists them: an order that changed only costs a rebuild
        digest = build.directory(rel, by_dir[rel], sorted(subdirs.pop(rel, [])))
        if rel:
            parent, _, name = rel.rpartition("/")
            subdirs.setdefault(parent, []).append((name, "d", 0, 0, digest))
        else:
            build.trees.root = digest
    if build.files > MAX_FILES:
        raise SnapshotError(
            f"the working directory holds {build.files} files, over the {MAX_FILES} limit; add "
            "what the run does not need to .tetherignore"
        )
    if build.links:
        try:
            links = [ManifestEntry(path=p, kind="symlink", target=t) for p, t in build.links]
            Manifest(entries=sorted(links, key=lambda e: e.path))
        except ValidationError as exc:
            raise SnapshotError(f"cannot snapshot {root}: {exc.errors()[0]['msg']}") from None
    if cache is not None and save:
        cache.save()
    return Snapshot(root, build.trees, build.dirs, build.files, build.size, build.warnings)


def _add_parents(by_dir: dict[str, Entries], path: str) -> None:
    while path not in by_dir:  # the root is in it
        by_dir[path] = []
        path = path.rpartition("/")[0]


@dataclass
class _Build:
    """One snapshot being built, a directory at a time."""

    root: Path
    limit: int
    cache: HashCache
    now: int  #: when it started (ns): a stat this close to it is racy
    progress: Callable[[int, int], None]
    #: each directory's fingerprint, and the file records of those whose files changed
    prints: dict[str, bytes] = field(default_factory=dict)
    known: dict[str, dict[str, list[Any]]] = field(default_factory=dict)
    #: each directory's record from the last snapshot, checked once (its tree's digest)
    olds: dict[str, list[Any] | None] = field(default_factory=dict)
    to_hash: int = 0  #: bytes of the files whose stat changed
    hashed: int = 0
    trees: Trees = field(default_factory=lambda: Trees(root=""))
    dirs: dict[str, str] = field(default_factory=dict)
    files: int = 0
    size: int = 0  #: bytes so far
    links: list[tuple[str, str]] = field(default_factory=list)
    warnings: list[str] = field(default_factory=list)

    def plan(self, by_dir: dict[str, Entries]) -> None:
        """How many bytes are to be read (for :attr:`progress`): the files whose stat changed, in
        the directories whose files changed."""
        for rel, entries in by_dir.items():
            fingerprint = self.prints[rel] = _fingerprint(entries)
            old = self.olds[rel] = self.cache.directory(rel)
            if old is not None and old[0] == fingerprint:
                continue
            known = self.known[rel] = self.cache.file_records(old)
            for name, st in entries:
                was = known.get(name)
                if stat.S_ISREG(st.st_mode) and (was is None or was[:4] != _stamp(st)):
                    self.to_hash += st.st_size

    def directory(self, rel: str, entries: Entries, subdirs: list[Row]) -> str:
        """The tree digest of directory ``rel``: its record's if nothing in it changed, else
        built (reading only the files whose stat changed)."""
        fingerprint, subtrees = self.prints[rel], _subtrees(subdirs)
        old = self.olds[rel]
        if old is not None and old[0] == fingerprint and old[1] == subtrees:
            record = old
        else:
            known = self.known.get(rel)
            if known is None:
                known = self.cache.file_records(old)
            record = self._build(rel, entries, subdirs, [fingerprint, subtrees], known)
        self.cache.keep(rel, record)
        _, _, digest, data, files, size, _, links, warnings = record
        self.files += files
        self.size += size
        if self.size > self.limit:
            raise SnapshotError(
                f"the working directory holds more than {_size(self.limit)} (reached in "
                f"{rel or 'the top directory'}); add large files (data, checkpoints) to "
                ".tetherignore or .gitignore, or raise --snapshot-limit"
            )
        self.links += [(f"{rel}/{n}" if rel else n, t) for n, t in links]
        self.warnings += warnings
        if digest not in self.trees.blobs:  # two directories alike are one tree
            self.trees.blobs[digest] = data
            self.trees.order.append(digest)
            self.dirs[digest] = rel
        return str(digest)

    def _build(
        self,
        rel: str,
        entries: Entries,
        subdirs: list[Row],
        prints: list[bytes],
        known: dict[str, list[Any]],
    ) -> list[Any]:
        top = os.fspath(self.root)
        rows: list[Row] = list(subdirs)
        records: dict[str, list[Any]] = {}
        links: list[tuple[str, str]] = []
        warnings: list[str] = []
        size = 0
        racy = False
        for name, st in sorted(entries, key=lambda e: e[0]):
            path_rel = f"{rel}/{name}" if rel else name
            path = os.path.join(top, path_rel)
            if self.now - st.st_mtime_ns <= RACY_SECONDS * 1e9:
                racy = True
            try:
                if "\\" in path_rel or len(path_rel) > MAX_PATH_CHARS:
                    check_relative_path(path_rel)  # else a scanned name is a normal one
                if stat.S_ISLNK(st.st_mode):
                    target = os.readlink(path)
                    try:
                        ManifestEntry(path=path_rel, kind="symlink", target=target)
                    except ValidationError:
                        warnings.append(
                            f"{path_rel} -> {target} points outside the working directory; left "
                            "out (give such data to the run with --mount NAME=PATH)"
                        )
                        continue
                    rows.append((name, "l", 0, 0, target))
                    links.append((name, target))
                    continue
                if st.st_size > MAX_FILE_BYTES:
                    raise SnapshotError(
                        f"{path_rel} is {_size(st.st_size)}, over the {_size(MAX_FILE_BYTES)} "
                        "limit for one file; add it to .tetherignore (and hand it to the run with "
                        "--mount)"
                    )
                if self.size + size + st.st_size > self.limit:
                    raise SnapshotError(
                        f"the working directory holds more than {_size(self.limit)} (reached at "
                        f"{path_rel}); add large files (data, checkpoints) to .tetherignore or "
                        ".gitignore, or raise --snapshot-limit"
                    )
                stamp = _stamp(st)
                was = known.get(name)
                if was is not None and was[:4] == stamp:
                    digest = str(was[4])
                else:
                    digest = _hash_file(path)
                    self.hashed += st.st_size
                    self.progress(self.hashed, self.to_hash)
            except PermissionError:
                raise SnapshotError(
                    f"cannot read {path_rel}: permission denied; add it to .tetherignore"
                ) from None
            except OSError as exc:
                raise SnapshotError(f"cannot read {path_rel}: {exc.strerror or exc}") from None
            except ValueError as exc:
                if isinstance(exc, SnapshotError):
                    raise
                raise SnapshotError(f"cannot snapshot {path_rel!r}: {exc}") from None
            if self.now - st.st_mtime_ns > RACY_SECONDS * 1e9:
                records[name] = [*stamp, digest]
            rows.append((name, "f", st.st_mode & 0o777, st.st_size, digest))
            size += st.st_size
        rows.sort()
        for before, after in itertools.pairwise(rows):
            if before[0] == after[0]:
                clash = f"{rel}/{after[0]}" if rel else after[0]
                raise SnapshotError(f"cannot snapshot {clash!r}: a file and a directory at once")
        data = encode_tree(rows)
        digest = hashlib.sha256(data).hexdigest()
        files = len(rows) - len(subdirs)
        # a record whose fingerprint never matches: its files' digests are still good
        marks = [b"", b""] if racy else prints
        packed = msgpack.packb(records)
        return [*marks, digest, data, files, size, packed, links, warnings]
