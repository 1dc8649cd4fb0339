"""Snapshotting the submitted working directory: a Merkle tree of content-addressed files.

Which files (:mod:`adapter.snapshots.selection`): what git would commit, or every file but the
ignored ones and the usual caches, less what a root ``.tetherignore`` names. Symlinks are kept as
symlinks when they point inside the tree; one pointing out (``data -> /mnt/datasets``) is left out
with a warning: hand such data to the run with ``--mount``.

:func:`build_snapshot` hashes every file (SHA-256) into a tree object per directory
(``protocol_specs/snapshots/trees.py``): the root's digest names the snapshot.
``adapter/snapshots/snapshot_upload.py`` uploads what the relay lacks, asking about the root, then
only about what each changed directory names, so a second submit of a big tree with one changed
file sends that file and the few trees above it.

A :class:`~adapter.snapshots.hash_cache.HashCache` keeps what the last snapshot learnt: a file
whose stat is unchanged is not read again, a directory where nothing changed is not built again.
"""

from __future__ import annotations

import hashlib
import itertools
import os
import stat
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from functools import cached_property
from pathlib import Path
from time import time_ns
from typing import Any

import msgpack
from pydantic import ValidationError

from protocol_specs.snapshots.snapshots import (
    MAX_FILE_BYTES,
    MAX_FILES,
    MAX_PATH_CHARS,
    Manifest,
    ManifestEntry,
    check_relative_path,
)
from protocol_specs.snapshots.trees import Expansion, Row, Trees, decode_tree, encode_tree

from .hash_cache import (
    RACY_SECONDS,
    HashCache,
    directory_fingerprint,
    file_stamp,
    subtrees_fingerprint,
)
from .selection import Entries, scan_dirs

__all__ = ["DEFAULT_LIMIT", "Snapshot", "SnapshotError", "build_snapshot"]

#: the most bytes a snapshot may hold unless the user says otherwise (``--snapshot-limit``)
DEFAULT_LIMIT = 2 * 1024**3


class SnapshotError(ValueError):
    """The working directory cannot be snapshotted as it is; the message says what to change."""


def _size(n: float) -> str:
    for unit in ("bytes", "KiB", "MiB", "GiB"):
        if n < 1024 or unit == "GiB":
            return f"{n:.0f} {unit}" if unit == "bytes" else f"{n:.1f} {unit}"
        n /= 1024
    return ""


@dataclass
class Snapshot:
    """A working directory as its trees (``protocol_specs/snapshots/trees.py``): the root's digest names it."""

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
            fingerprint = self.prints[rel] = directory_fingerprint(entries)
            old = self.olds[rel] = self.cache.directory(rel)
            if old is not None and old[0] == fingerprint:
                continue
            known = self.known[rel] = self.cache.file_records(old)
            for name, st in entries:
                was = known.get(name)
                if stat.S_ISREG(st.st_mode) and (was is None or was[:4] != file_stamp(st)):
                    self.to_hash += st.st_size

    def directory(self, rel: str, entries: Entries, subdirs: list[Row]) -> str:
        """The tree digest of directory ``rel``: its record's if nothing in it changed, else
        built (reading only the files whose stat changed)."""
        fingerprint, subtrees = self.prints[rel], subtrees_fingerprint(subdirs)
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
                stamp = file_stamp(st)
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
