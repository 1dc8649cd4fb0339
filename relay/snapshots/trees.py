"""The relay's side of snapshot trees (``protocol_specs/snapshots/trees.py``, ``tree_check.py``): reading
them from the blob store, checking a submit's root, expanding a run's manifest.

A submit names its root tree. :func:`check_tree` checks it reading only the trees that changed:
the subtrees this user had checked within :attr:`CheckedTrees.fresh_for` are taken from their
summaries, unread and their files unasked. The run is recorded by its root; :func:`expand_tree`
gives the manifest when a worker claims it (and to the blob collection, which keeps what live runs
name). Trees are content-addressed, so decoded rows are kept by digest (:class:`_DecodedTrees`)
and a second submit or a claim decodes only what changed.

Why a summary may be trusted for a while: checking a subtree asks the blob store about every
tree and file in it, which marks each one used (``BlobStore.missing``), and the blob collection
spares what was used within ``blob_grace`` (``relay/server.py``). A summary kept for half of that
vouches only for blobs still spared; a relay that restarts starts with none. What a user holds
(``keys.user_blobs``) only grows.
"""

from __future__ import annotations

import hashlib
from collections import OrderedDict
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Protocol

from protocol_specs.runs.runs import RunRecord
from protocol_specs.snapshots.snapshots import Manifest
from protocol_specs.snapshots.tree_check import Summary, TreeCheck
from protocol_specs.snapshots.trees import MAX_TREE_BYTES, Expansion, Row, TreeError, decode_tree

from .blobs import BlobError, BlobStore

__all__ = ["CheckedTrees", "Expand", "Rooted", "check_tree", "expand_tree"]

Lacking = Callable[[list[str]], Awaitable[list[str]]]
#: a root tree's manifest and every tree below it (:func:`expand_tree` on the relay's blobs)
Expand = Callable[[str], Awaitable[tuple[Manifest, list[str]]]]


@dataclass(frozen=True)
class Rooted:
    """A checked snapshot as a run record names it: by its root tree (the fields of
    :class:`~protocol_specs.runs.runs.RunRecord`)."""

    tree: str
    snapshot: str
    files: int
    size: int

    @classmethod
    def checked(cls, root: str, summary: Summary) -> Rooted:
        return cls(tree=root, snapshot=root, files=summary.files, size=summary.bytes)

    @classmethod
    def of(cls, record: RunRecord) -> Rooted:
        """The snapshot a run recorded by its tree names (for a rerun)."""
        return cls(tree=record.tree, snapshot=record.snapshot, files=record.files, size=record.size)


class _DecodedTrees:
    """Trees decoded lately, by digest (content-addressed: a digest's rows never change), newest
    last, at most :data:`DECODED_ROWS` rows in all: a second submit decodes only what changed."""

    def __init__(self) -> None:
        self.trees: OrderedDict[str, list[Row]] = OrderedDict()
        self.rows = 0

    def get(self, digest: str) -> list[Row] | None:
        rows = self.trees.get(digest)
        if rows is not None:
            self.trees.move_to_end(digest)
        return rows

    def put(self, digest: str, rows: list[Row]) -> None:
        if len(rows) > DECODED_ROWS or digest in self.trees:
            return
        self.trees[digest] = rows
        self.rows += len(rows)
        while self.rows > DECODED_ROWS:
            self.rows -= len(self.trees.popitem(last=False)[1])


#: the rows a relay process keeps decoded (some 60 MB: a tree of 200,000 files and change)
DECODED_ROWS = 250_000
_DECODED = _DecodedTrees()


async def _rows(blobs: BlobStore, digest: str) -> list[Row]:
    """A tree's rows: decoded lately, or read, checked against its digest and decoded."""
    rows = _DECODED.get(digest)
    if rows is not None:
        return rows
    size, data = await blobs.read(digest, 0, MAX_TREE_BYTES + 1)
    if size > MAX_TREE_BYTES:
        raise TreeError(f"tree {digest[:12]} is {size} bytes (at most {MAX_TREE_BYTES})")
    if hashlib.sha256(data).hexdigest() != digest:
        raise TreeError(f"tree {digest[:12]}: the bytes do not match the digest")
    rows = decode_tree(data)
    _DECODED.put(digest, rows)
    return rows


class _Reader(Protocol):
    needs: list[str]

    def feed_rows(self, digest: str, rows: list[Row]) -> None: ...


async def _read(blobs: BlobStore, reader: _Reader, lacking: Lacking) -> None:
    """Feed ``reader`` the trees it needs, level by level, each level once ``lacking`` said none
    of it is missing: :class:`BlobError` for lacking trees (how many, the first),
    :class:`~protocol_specs.snapshots.trees.TreeError` for one that is malformed or too big."""
    while reader.needs:
        level = list(reader.needs)
        if missing := await lacking(level):
            raise BlobError(f"{len(missing)} of the snapshot's trees (first: {missing[0][:12]})")
        for digest in level:
            reader.feed_rows(digest, await _rows(blobs, digest))


async def expand_tree(blobs: BlobStore, root: str, lacking: Lacking) -> tuple[Manifest, list[str]]:
    """The manifest a root tree names, and every tree read (errors: :func:`_read`)."""
    expansion = Expansion(root)
    await _read(blobs, expansion, lacking)
    return expansion.manifest(), expansion.trees


class CheckedTrees:
    """The summaries of the subtrees each user had checked, for :attr:`fresh_for` seconds by
    ``clock``, at most :attr:`most` of them (the oldest forgotten first)."""

    def __init__(self, fresh_for: float, clock: Callable[[], float], most: int = 200_000) -> None:
        self.fresh_for = fresh_for
        self.clock = clock
        self.most = most
        self._kept: OrderedDict[tuple[str, str], tuple[Summary, float]] = OrderedDict()

    def __len__(self) -> int:
        return len(self._kept)

    def known(self, user: str) -> Callable[[str], Summary | None]:
        now = self.clock()

        def known(digest: str) -> Summary | None:
            got = self._kept.get((user, digest))
            if got is None or now - got[1] >= self.fresh_for:
                return None
            return got[0]

        return known

    def keep(self, user: str, summaries: dict[str, Summary]) -> None:
        now = self.clock()
        for digest, summary in summaries.items():
            self._kept[(user, digest)] = (summary, now)
            self._kept.move_to_end((user, digest))
        while len(self._kept) > self.most:
            self._kept.popitem(last=False)


async def check_tree(
    blobs: BlobStore, root: str, lacking: Lacking, checked: CheckedTrees, user: str
) -> Summary:
    """Check the root tree ``user`` submits (``protocol_specs/snapshots/tree_check.py``): every tree and
    file below present and theirs (``lacking``), the limits kept; the summaries learnt are kept.
    :class:`BlobError` names what is lacking, :class:`TreeError` what is malformed."""
    check = TreeCheck(root, checked.known(user))
    await _read(blobs, check, lacking)
    if missing := await lacking(check.files):
        raise BlobError(f"{len(missing)} of the snapshot's blobs (first: {missing[0][:12]})")
    whole = check.result()
    checked.keep(user, check.checked)
    return whole
