"""Working-directory snapshots: content-addressed files listed by a manifest.

Theory of operation
-------------------
A snapshot is a :class:`Manifest`: one :class:`ManifestEntry` per file or symlink (path, mode, size,
SHA-256 digest; a symlink's target instead). File contents are *blobs* named by their digest, stored
once however many snapshots list them. Submitting a tree is therefore: build the manifest, ask the
relay which digests it lacks, upload those blobs alone (in :data:`BLOB_CHUNK` pieces), submit the
manifest. A second submit of a large tree with one changed file uploads that one file.

A manifest comes from an untrusted peer wherever it is read, so validation here is the security
boundary, enforced by pydantic when the manifest is decoded (relay and worker alike):

- paths are relative POSIX paths of normal components: no ``..``, no ``.``, no empty component, no
  leading ``/``, no backslash, no NUL, at most :data:`MAX_PATH_CHARS` characters;
- no path is listed twice, and no entry lies *under* another file or symlink (``a`` and ``a/b``),
  so materialising one entry can never redirect another through a symlink it created;
- a symlink's target is relative and, resolved from the link's directory, stays inside the tree;
- sizes are bounded per file (:data:`MAX_FILE_BYTES`) and in total (:data:`MAX_TOTAL_BYTES`), and the
  entry count by :data:`MAX_FILES`.

The worker (``worker_shim.program.files``) checks every digest it downloads and still materialises
with ``O_NOFOLLOW`` under directories it created itself. Nothing here performs I/O.
"""

from __future__ import annotations

import hashlib
import posixpath
import re
from typing import Annotated, Literal

from pydantic import (
    AfterValidator,
    BaseModel,
    ConfigDict,
    Field,
    field_validator,
    model_validator,
)

__all__ = [
    "BLOB_CHUNK",
    "MAX_FILES",
    "MAX_FILE_BYTES",
    "MAX_PATH_CHARS",
    "MAX_TOTAL_BYTES",
    "Digest",
    "Manifest",
    "ManifestEntry",
    "check_digest",
    "check_relative_path",
    "digest_of",
    "file_entry",
]

#: the most bytes one blob upload or download frame carries
BLOB_CHUNK = 4 * 1024 * 1024
MAX_FILES = 200_000
MAX_FILE_BYTES = 2 * 1024**3
MAX_TOTAL_BYTES = 20 * 1024**3
MAX_PATH_CHARS = 4096

_DIGEST = re.compile(r"^[0-9a-f]{64}$")


def digest_of(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


def check_digest(value: str) -> str:
    if not _DIGEST.match(value):
        raise ValueError(f"{value[:80]!r} is not a SHA-256 hex digest")
    return value


#: a SHA-256 hex digest, checked wherever one is decoded
Digest = Annotated[str, AfterValidator(check_digest)]


def check_relative_path(path: str) -> str:
    """``path`` if it is a safe relative POSIX path inside a tree; ``ValueError`` says why not."""
    if not path:
        raise ValueError("empty path")
    if len(path) > MAX_PATH_CHARS:
        raise ValueError(f"path longer than {MAX_PATH_CHARS} characters")
    if "\x00" in path:
        raise ValueError(f"path {path[:200]!r} contains NUL")
    if "\\" in path:
        raise ValueError(f"path {path[:200]!r} contains a backslash")
    if path.startswith("/") or re.match(r"^[A-Za-z]:", path):
        raise ValueError(f"path {path[:200]!r} is absolute")
    for part in path.split("/"):
        if part in ("", ".", ".."):
            raise ValueError(f"path {path[:200]!r} has a {part or 'empty'!r} component")
    return path


class ManifestEntry(BaseModel):
    model_config = ConfigDict(frozen=True, extra="forbid")

    path: str
    kind: Literal["file", "symlink"] = "file"
    #: permission bits only (``0o644``, ``0o755``); set-id and sticky bits are never carried
    mode: int = Field(default=0o644, ge=0, le=0o777)
    size: int = Field(default=0, ge=0, le=MAX_FILE_BYTES)
    #: SHA-256 of the file's bytes (files); "" for symlinks
    digest: str = ""
    #: the link's target, relative to the link's directory (symlinks); "" for files
    target: str = ""

    @field_validator("path")
    @classmethod
    def _path(cls, value: str) -> str:
        return check_relative_path(value)

    @model_validator(mode="after")
    def _kind_fields(self) -> ManifestEntry:
        if self.kind == "file":
            check_digest(self.digest)
            if self.target:
                raise ValueError(f"{self.path}: a file has no link target")
        else:
            if self.digest or self.size:
                raise ValueError(f"{self.path}: a symlink has no digest or size")
            if not self.target or "\x00" in self.target or len(self.target) > MAX_PATH_CHARS:
                raise ValueError(f"{self.path}: a symlink needs a target")
            if self.target.startswith("/"):
                raise ValueError(
                    f"{self.path}: symlink to the absolute path {self.target!r} points out of the "
                    "snapshot"
                )
            resolved = posixpath.normpath(posixpath.join(posixpath.dirname(self.path), self.target))
            if resolved == ".." or resolved.startswith("../") or resolved == ".":
                raise ValueError(
                    f"{self.path}: symlink to {self.target!r} points out of the snapshot"
                )
        return self


_ENTRY_FIELDS = frozenset(ManifestEntry.model_fields)


def file_entry(path: str, mode: int, size: int, digest: str) -> ManifestEntry:
    """A file's entry from values already checked as :class:`ManifestEntry` would check them (a
    path of normal names within :data:`MAX_PATH_CHARS`, mode and size in range, a digest): what
    the relay makes of a tree it decoded (``protocol_specs/snapshots/trees.py``) and the CLI of the files it
    hashed, twenty thousand at a time, without validating each field again."""
    entry = ManifestEntry.__new__(ManifestEntry)
    values = {"path": path, "kind": "file", "mode": mode, "size": size, "digest": digest}
    object.__setattr__(entry, "__dict__", {**values, "target": ""})
    object.__setattr__(entry, "__pydantic_fields_set__", _ENTRY_FIELDS)
    object.__setattr__(entry, "__pydantic_extra__", None)
    object.__setattr__(entry, "__pydantic_private__", None)
    return entry


def _resolve_inside(link: str, links: dict[str, str]) -> None:
    """Follow ``link`` the way the OS would, through the manifest's own symlinks; ``ValueError``
    if it leaves the tree at any step (``a/b/k -> ../../x`` then ``m -> a/b/k/../..`` is inside
    lexically but outside physically) or loops."""
    pending = [*posixpath.dirname(link).split("/"), *links[link].split("/")]
    pending = [p for p in pending if p]
    here: list[str] = []
    hops = 0
    while pending:
        part = pending.pop(0)
        if part == ".":
            continue
        if part == "..":
            if not here:
                raise ValueError(f"{link}: symlink to {links[link]!r} points out of the snapshot")
            here.pop()
            continue
        candidate = "/".join([*here, part])
        if candidate in links:
            hops += 1
            if hops > 40:
                raise ValueError(f"{link}: too many levels of symbolic links")
            pending[:0] = [p for p in links[candidate].split("/") if p]
            continue
        here.append(part)
    if not here:
        raise ValueError(f"{link}: symlink to {links[link]!r} points at the snapshot's root")


class Manifest(BaseModel):
    """Every file and symlink of a snapshot, sorted by path."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    entries: list[ManifestEntry] = Field(default_factory=list, max_length=MAX_FILES)

    @model_validator(mode="after")
    def _consistent(self) -> Manifest:
        seen: set[str] = set()
        for entry in self.entries:
            if entry.path in seen:
                raise ValueError(f"{entry.path} is listed twice")
            seen.add(entry.path)
        for entry in self.entries:
            parent = posixpath.dirname(entry.path)
            while parent:
                if parent in seen:
                    raise ValueError(f"{entry.path} lies under the file or symlink {parent}")
                parent = posixpath.dirname(parent)
        links = {e.path: e.target for e in self.entries if e.kind == "symlink"}
        for path in links:
            _resolve_inside(path, links)
        if self.total_bytes > MAX_TOTAL_BYTES:
            raise ValueError(
                f"the snapshot holds {self.total_bytes} bytes, over the {MAX_TOTAL_BYTES} limit"
            )
        return self

    @property
    def total_bytes(self) -> int:
        return sum(e.size for e in self.entries)

    @property
    def digests(self) -> list[str]:
        """The distinct blob digests the snapshot needs, in first-use order."""
        return list(dict.fromkeys(e.digest for e in self.entries if e.kind == "file"))

    @property
    def id(self) -> str:
        """The snapshot's own content address (the digest of its canonical JSON)."""
        return digest_of(self.model_dump_json().encode())
