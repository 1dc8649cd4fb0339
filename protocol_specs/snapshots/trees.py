"""Snapshots as Merkle trees of directories: a second submit of a big tree sends what changed.

Theory of operation
-------------------
A directory's *tree object* lists its entries sorted by name, each ``[name, kind, mode, size, ref]``:
``"f"`` a file (``ref``: its blob's digest), ``"l"`` a symlink (``ref``: its target), ``"d"`` a
subdirectory (``ref``: its tree's digest; mode and size 0). It is encoded canonically (msgpack) and
stored as a blob named by the SHA-256 of those bytes, like a file's contents; the root tree's digest
names the whole snapshot. A file that changes changes its directory's tree and each tree above it,
and nothing else.

Submitting (``adapter/snapshots/snapshot.py``): the client builds the trees of its manifest
(:func:`build_trees`), asks the relay about the root, then about the children of each tree the relay
lacks, level by level (:meth:`Trees.children`): an unchanged subtree is one digest, however big.
It uploads the files the relay lacks, then the trees it lacks deepest first (:attr:`Trees.order`),
so a tree is never stored before what it names, and submits the root's digest. The relay expands
the root (:class:`Expansion`, fed the tree blobs one by one) into the :class:`Manifest` it has
always validated: a tree object comes from an untrusted peer, and expanding one is checked as
strictly as a manifest is decoded (names, order, kinds, digests, the entry and depth limits).
Nothing here performs I/O.
"""

from __future__ import annotations

import hashlib
from collections.abc import Iterable, Iterator
from dataclasses import dataclass, field
from typing import Any

import msgpack

from .snapshots import (
    MAX_FILE_BYTES,
    MAX_FILES,
    MAX_PATH_CHARS,
    Manifest,
    ManifestEntry,
    check_digest,
    file_entry,
)

__all__ = [
    "MAX_TREE_BYTES",
    "Expansion",
    "Paths",
    "Row",
    "TreeError",
    "Trees",
    "build_trees",
    "decode_tree",
    "encode_tree",
]

#: the largest tree object (a directory of about 200,000 entries)
MAX_TREE_BYTES = 32 * 1024 * 1024
#: the deepest a snapshot's directories nest (a path of MAX_PATH_CHARS holds at most half as many)
MAX_DEPTH = MAX_PATH_CHARS // 2

Row = tuple[str, str, int, int, str]
"""One entry of a tree object: ``(name, kind, mode, size, ref)``."""


class TreeError(ValueError):
    """A tree object that is malformed, or a tree that breaks a snapshot's limits."""


def encode_tree(rows: Iterable[Row]) -> bytes:
    return msgpack.packb([list(r) for r in rows], use_bin_type=True)  # type: ignore[no-any-return]


def _digest(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


@dataclass
class Trees:
    """The tree objects of one manifest."""

    root: str  #: the root tree's digest: the snapshot's name
    blobs: dict[str, bytes] = field(default_factory=dict)  #: tree digest -> its bytes
    #: every tree's digest, each after every tree below it (the order to upload them in)
    order: list[str] = field(default_factory=list)
    #: tree digest -> the digests it names: its subtrees' and its files' (read from its bytes
    #: when first asked for)
    refs: dict[str, list[str]] = field(default_factory=dict)

    def children(self, digests: Iterable[str]) -> list[str]:
        """What the trees among ``digests`` name (their subtrees and files), each once."""
        out: dict[str, None] = {}
        for digest in digests:
            refs = self.refs.get(digest)
            if refs is None and digest in self.blobs:
                rows = decode_tree(self.blobs[digest])
                refs = self.refs[digest] = [r[4] for r in rows if r[1] != "l"]
            for ref in refs or ():
                out[ref] = None
        return list(out)


def build_trees(manifest: Manifest) -> Trees:
    """The tree objects of ``manifest`` (whose entries are sorted by path, as it keeps them)."""
    # directory path -> its rows; "" is the root
    dirs: dict[str, list[Row]] = {"": []}
    for entry in manifest.entries:
        parent, _, name = entry.path.rpartition("/")
        if entry.kind == "file":
            row: Row = (name, "f", entry.mode, entry.size, entry.digest)
        else:
            row = (name, "l", 0, 0, entry.target)
        if parent not in dirs:
            _add_parents(dirs, parent)
        dirs[parent].append(row)
    trees = Trees(root="")
    # deepest first: a directory's tree is made once every subdirectory's is
    for path in sorted(dirs, key=lambda p: (-p.count("/") if p else 1, p)):
        rows = sorted(dirs[path])
        data = encode_tree(rows)
        digest = _digest(data)
        if digest not in trees.blobs:  # two directories alike are one tree
            trees.blobs[digest] = data
            trees.refs[digest] = [r[4] for r in rows if r[1] != "l"]
            trees.order.append(digest)
        if path:
            parent, _, name = path.rpartition("/")
            dirs[parent].append((name, "d", 0, 0, digest))
        else:
            trees.root = digest
    return trees


def _add_parents(dirs: dict[str, list[Row]], path: str) -> None:
    while path not in dirs:
        dirs[path] = []
        path = path.rpartition("/")[0]


def _check_name(name: object) -> str:
    if not isinstance(name, str) or not name or name in (".", ".."):
        raise TreeError(f"bad entry name {str(name)[:80]!r}")
    if "/" in name or "\x00" in name or "\\" in name:
        raise TreeError(f"bad entry name {name[:80]!r}")
    return name


def decode_tree(data: bytes) -> list[Row]:
    """A tree object's rows, checked: names sorted and unique, each row well formed."""
    if len(data) > MAX_TREE_BYTES:
        raise TreeError(f"a tree object of {len(data)} bytes (at most {MAX_TREE_BYTES})")
    try:
        raw: Any = msgpack.unpackb(data, raw=False, use_list=True, strict_map_key=True)
    except (ValueError, msgpack.ExtraData, msgpack.FormatError, msgpack.StackError) as exc:
        raise TreeError(f"not a tree object: {exc}") from None
    if not isinstance(raw, list):
        raise TreeError("not a tree object: not a list")
    rows: list[Row] = []
    previous = ""
    for item in raw:
        if not isinstance(item, list) or len(item) != 5:
            raise TreeError("a tree entry is not [name, kind, mode, size, ref]")
        name, kind, mode, size, ref = item
        _check_name(name)
        if rows and name <= previous:
            raise TreeError(f"tree entries out of order or repeated at {name[:80]!r}")
        previous = name
        if kind not in ("f", "l", "d") or not isinstance(ref, str):
            raise TreeError(f"{name[:80]!r}: bad kind or reference")
        if type(mode) is not int or type(size) is not int or not 0 <= mode <= 0o777:
            raise TreeError(f"{name[:80]!r}: bad mode or size")
        if not 0 <= size <= MAX_FILE_BYTES:
            raise TreeError(f"{name[:80]!r}: bad mode or size")
        if kind in ("f", "d"):
            try:
                check_digest(ref)
            except ValueError as exc:
                raise TreeError(f"{name[:80]!r}: {exc}") from None
        if kind != "f" and (mode or size):
            raise TreeError(f"{name[:80]!r}: only a file has a mode and a size")
        rows.append((name, kind, mode, size, ref))
    return rows


@dataclass
class Paths:
    """The paths a snapshot's trees place their entries at, counted against the limits (trees
    may share subtrees: a few bytes can name millions of paths, so each one placed is counted)."""

    count: int = 0

    def take(self, n: int) -> None:
        self.count += n
        if self.count > 2 * MAX_FILES:
            raise TreeError(f"more than {2 * MAX_FILES} files and directories")

    def place(self, rows: list[Row], prefixes: list[str]) -> Iterator[tuple[str, Row]]:
        """Each of ``rows`` (one tree's) at each of the paths the tree is at, with its path:
        :class:`TreeError` for one too deep or too long, or one path too many."""
        for prefix in prefixes:
            if prefix.count("/") >= MAX_DEPTH:
                raise TreeError(f"directories nest deeper than {MAX_DEPTH} levels")
            for row in rows:
                path = f"{prefix}/{row[0]}" if prefix else row[0]
                self.take(1)
                if len(path) > MAX_PATH_CHARS:
                    raise TreeError(f"{path[:200]!r}: longer than {MAX_PATH_CHARS} characters")
                yield path, row


@dataclass
class Expansion:
    """A root tree expanded into its manifest, one tree object at a time (the caller reads them).

    ``needs`` lists the trees to read next; :meth:`feed` each one's bytes; once ``needs`` is empty,
    :meth:`manifest` is the snapshot (validated as any manifest is). :class:`TreeError` at any step
    that breaks the format or the limits (files, depth, a tree's size).
    """

    root: str
    needs: list[str] = field(default_factory=list)
    trees: list[str] = field(default_factory=list)  #: every tree read, in order
    _where: dict[str, list[str]] = field(default_factory=dict)  #: tree -> the paths it is at
    _entries: list[ManifestEntry] = field(default_factory=list)
    _paths: Paths = field(default_factory=Paths)  #: files, symlinks and directories met

    def __post_init__(self) -> None:
        check_digest(self.root)
        self.needs = [self.root]
        self._where = {self.root: [""]}

    def feed(self, digest: str, data: bytes) -> list[Row]:
        """Take the bytes of ``digest``, one of :attr:`needs`; returns its rows (decoded and
        checked: the same digest's rows may be given to :meth:`feed_rows` another time)."""
        if digest not in self._where or digest not in self.needs:
            raise TreeError(f"tree {digest[:12]} was not asked for")
        if _digest(data) != digest:
            raise TreeError(f"tree {digest[:12]}: the bytes do not match the digest")
        rows = decode_tree(data)
        self.feed_rows(digest, rows)
        return rows

    def feed_rows(self, digest: str, rows: list[Row]) -> None:
        """Take the rows :meth:`feed` decoded from ``digest``'s bytes, one of :attr:`needs`."""
        if digest not in self._where or digest not in self.needs:
            raise TreeError(f"tree {digest[:12]} was not asked for")
        self.needs.remove(digest)
        self.trees.append(digest)
        for path, (_name, kind, mode, size, ref) in self._paths.place(
            rows, self._where.pop(digest)
        ):
            if kind == "d":
                if ref not in self._where:
                    self._where[ref] = []
                    self.needs.append(ref)
                self._where[ref].append(path)
            elif kind == "f":  # every field checked already (decode_tree, Paths.place)
                self._entries.append(file_entry(path, mode, size, ref))
            else:
                try:
                    entry = ManifestEntry(path=path, kind="symlink", target=ref)
                except ValueError as exc:
                    raise TreeError(str(exc)) from None
                self._entries.append(entry)

    def manifest(self) -> Manifest:
        if self.needs:
            raise TreeError(f"{len(self.needs)} trees not read yet")
        try:
            return Manifest(entries=sorted(self._entries, key=lambda e: e.path))
        except ValueError as exc:
            raise TreeError(str(exc)) from None
