"""What the last snapshot of a working directory learnt: each file's digest and each directory's
tree, trusted while their stats are unchanged.

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

import hashlib
import os
from array import array
from pathlib import Path
from typing import Any

import msgpack

from protocol_specs.snapshots.trees import Row

from .selection import Entries

__all__ = [
    "RACY_SECONDS",
    "HashCache",
    "directory_fingerprint",
    "file_stamp",
    "subtrees_fingerprint",
]


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


def directory_fingerprint(entries: Entries) -> bytes:
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


def file_stamp(st: os.stat_result) -> list[int]:
    """What a file's record is good for (as git's index: size, mtime, ctime, inode)."""
    return [st.st_size, st.st_mtime_ns, st.st_ctime_ns, st.st_ino]


def subtrees_fingerprint(subdirs: list[Row]) -> bytes:
    """What a directory's record is good for, too: its subdirectories' names and trees."""
    return hashlib.blake2b(repr(subdirs).encode(errors="surrogateescape"), digest_size=16).digest()
