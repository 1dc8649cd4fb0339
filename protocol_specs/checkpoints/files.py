"""Stored file sets: what a run's checkpoints and outputs are made of.

Theory of operation
-------------------
A :class:`FileSet` lists files, each a :class:`StoredFile` whose bytes are cut into fixed-size
chunks of :data:`CHUNK` bytes (the last one shorter), every chunk a blob named by its SHA-256
digest in the relay's blob store (``relay/snapshots/blobs.py``, the same store as snapshots).
Saving a directory again sends the chunks the relay lacks: a file rewritten in place with 1% of
its bytes changed sends about 1% of its chunks.

Why fixed-size chunks and not content-defined ones: the files a training loop checkpoints
(``torch.save``'s zip, safetensors, ``.npy``) keep every tensor at the offset the state dict's
structure gives it, so in-place updates keep chunk boundaries where they were, and a fixed cut costs
nothing beyond hashing (``hashlib`` at GB/s) where a rolling hash in Python would cost a Python step
per byte. An insertion shifts every later chunk; checkpoints rarely do that.

The set itself is stored as a blob too (:meth:`FileSet.encode`, msgpack), named by its digest:
a checkpoint or an outputs listing is one digest. A file set comes from an untrusted peer (a
worker), so decoding validates it as strictly as a snapshot's manifest: relative paths of normal
names, each listed once, none under another, a chunk count that matches the size. Nothing here
performs I/O.
"""

from __future__ import annotations

import hashlib
from collections.abc import Iterable

import msgpack
from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator, model_validator

from ..snapshots.snapshots import check_digest, check_relative_path

__all__ = [
    "CHUNK",
    "MAX_SET_BYTES",
    "MAX_SET_FILES",
    "FileSet",
    "StoredFile",
    "chunk_count",
    "merge",
]

#: the bytes of one chunk (the last chunk of a file is shorter)
CHUNK = 1024 * 1024
#: the most files one set lists
MAX_SET_FILES = 20_000
#: the most bytes one set's files hold together (the relay may allow less: its limit)
MAX_SET_BYTES = 64 * 1024**3


def chunk_count(size: int) -> int:
    """How many chunks a file of ``size`` bytes has (an empty file has none)."""
    return -(-size // CHUNK)


class StoredFile(BaseModel):
    """One file of a set: its path in the set, mode, size, modification time and chunks."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    path: str
    #: permission bits only
    mode: int = Field(default=0o644, ge=0, le=0o777)
    #: no limit of its own beyond the set's: a file is stored as chunks, never as one blob
    size: int = Field(default=0, ge=0, le=MAX_SET_BYTES)
    #: the file's modification time on the worker that stored it (seconds since the epoch)
    mtime: float = 0.0
    #: the attempt that stored this version of it (outputs list it); 0: not said
    attempt: int = Field(default=0, ge=0)
    #: the digests of its chunks, in order
    chunks: list[str] = Field(default_factory=list)

    @field_validator("path")
    @classmethod
    def _path(cls, value: str) -> str:
        return check_relative_path(value)

    @model_validator(mode="after")
    def _chunks(self) -> StoredFile:
        if len(self.chunks) != chunk_count(self.size):
            raise ValueError(
                f"{self.path}: {self.size} bytes need {chunk_count(self.size)} chunks, "
                f"not {len(self.chunks)}"
            )
        for digest in self.chunks:
            check_digest(digest)
        return self


class FileSet(BaseModel):
    """Files sorted by path, each listed once, none under another."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    files: list[StoredFile] = Field(default_factory=list, max_length=MAX_SET_FILES)

    @model_validator(mode="after")
    def _consistent(self) -> FileSet:
        paths = [f.path for f in self.files]
        if paths != sorted(paths):
            raise ValueError("a file set lists its files sorted by path")
        previous = ""
        for path in paths:
            if path == previous:
                raise ValueError(f"{path} is listed twice")
            previous = path
        listed = set(paths)
        for path in paths:
            parts = path.split("/")
            for i in range(1, len(parts)):
                if "/".join(parts[:i]) in listed:
                    raise ValueError(f"{path} lies under the file {'/'.join(parts[:i])}")
        if self.size > MAX_SET_BYTES:
            raise ValueError(f"a file set of {self.size} bytes exceeds {MAX_SET_BYTES}")
        return self

    @property
    def size(self) -> int:
        """The bytes of its files together."""
        return sum(f.size for f in self.files)

    @property
    def digests(self) -> set[str]:
        """Every chunk it names."""
        return {d for f in self.files for d in f.chunks}

    def get(self, path: str) -> StoredFile | None:
        for stored in self.files:
            if stored.path == path:
                return stored
        return None

    def under(self, prefix: str) -> list[StoredFile]:
        """The file ``prefix`` names, or the files of the directory it names (all: ``""``)."""
        prefix = prefix.strip("/")
        if not prefix:
            return list(self.files)
        return [f for f in self.files if f.path == prefix or f.path.startswith(prefix + "/")]

    def encode(self) -> bytes:
        """Its canonical bytes (stored as a blob named by :meth:`digest`)."""
        rows = [[f.path, f.mode, f.size, f.mtime, f.attempt, f.chunks] for f in self.files]
        data: bytes = msgpack.packb({"v": 1, "files": rows}, use_bin_type=True)
        return data

    def digest(self) -> str:
        return hashlib.sha256(self.encode()).hexdigest()

    @classmethod
    def decode(cls, data: bytes) -> FileSet:
        """The set ``data`` encodes; ``ValueError`` says why it is not one."""
        try:
            raw = msgpack.unpackb(data, raw=False)
            rows = raw["files"] if isinstance(raw, dict) and raw.get("v") == 1 else None
            if not isinstance(rows, list):
                raise ValueError("not a file set")
            keys = ("path", "mode", "size", "mtime", "attempt", "chunks")
            files = [dict(zip(keys, row, strict=True)) for row in rows]
            return cls.model_validate({"files": files})
        except (ValidationError, ValueError, TypeError, KeyError) as exc:
            raise ValueError(f"not a valid file set: {str(exc)[:300]}") from None
        except Exception as exc:  # msgpack's own errors
            raise ValueError(f"not a valid file set: {type(exc).__name__}") from None


def merge(sets: Iterable[FileSet]) -> FileSet:
    """One set of ``sets``' files, a later set's file replacing an earlier one's at its path (and
    any earlier file it lies under, or that lies under it)."""
    merged: dict[str, StoredFile] = {}
    for one in sets:
        for stored in one.files:
            parts = stored.path.split("/")
            for i in range(1, len(parts)):
                merged.pop("/".join(parts[:i]), None)
            prefix = stored.path + "/"
            for path in [p for p in merged if p.startswith(prefix)]:
                del merged[path]
            merged[stored.path] = stored
    return FileSet(files=[merged[p] for p in sorted(merged)])
