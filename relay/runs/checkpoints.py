"""Where a run's checkpoints and outputs are kept: their books in Redis, their file sets in the
blob store.

A run's :class:`~protocol_specs.checkpoints.book.CheckpointBook` is one JSON value
(``keys.checkpoints``), its outputs the digest of one merged file set blob (``keys.outputs``);
both are written compare-and-set, so two nodes (or two relays) putting at once both land. The
decisions are the book's (``protocol_specs/checkpoints/book.py``); this module reads and writes.
Both keys are among the run's keys (``keys.run_keys``) and expire with it; one written after the
run finished gets the record's remaining lifetime.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable

from protocol_specs.checkpoints.book import CheckpointBook
from protocol_specs.checkpoints.files import FileSet, merge

from ..snapshots.blobs import BlobError, BlobStore
from ..store import Store, StoreError, keys

__all__ = ["FILES_FIELD", "RunFiles", "SetError", "read_book"]

#: the field of ``keys.checkpoints`` / ``keys.outputs`` that holds the value (``v``: its version)
FILES_FIELD = "value"
#: the most bytes a file set blob may have (20,000 files of 64 GiB: a few MiB)
_MAX_SET_BLOB = 64 * 1024 * 1024
#: writers that may win in a row against one compare-and-set before it gives up
_CONFLICTS = 100


class SetError(Exception):
    """A file set blob the relay lacks (``missing``) or that is no file set; one line."""

    def __init__(self, message: str, *, missing: bool) -> None:
        super().__init__(message)
        self.missing = missing


async def read_book(store: Store, run_id: str) -> CheckpointBook:
    """The run's checkpoint book (empty if it has none)."""
    raw, _ = await store.get_versioned(keys.checkpoints(run_id), FILES_FIELD)
    return CheckpointBook.model_validate_json(raw) if raw else CheckpointBook()


class RunFiles:
    """A run's checkpoint book and outputs, on one store and one blob store."""

    def __init__(self, store: Store, blobs: BlobStore) -> None:
        self.store = store
        self.blobs = blobs

    # --- file sets --------------------------------------------------------------------------------

    async def read_set(self, digest: str) -> FileSet:
        """The file set stored as blob ``digest`` (:class:`SetError` if none, or not one)."""
        try:
            size, data = await self.blobs.read(digest, 0, _MAX_SET_BLOB)
        except BlobError:
            raise SetError(f"the file set blob {digest[:12]} is not stored", missing=True) from None
        if size > len(data):
            raise SetError(f"blob {digest[:12]} is too large for a file set", missing=False)
        try:
            return FileSet.decode(data)
        except ValueError as exc:
            raise SetError(f"blob {digest[:12]}: {exc}", missing=False) from None

    async def put_set(self, files: FileSet) -> str:
        """Store ``files`` as a blob; its digest."""
        digest = files.digest()
        if await self.blobs.missing([digest]):
            await self.blobs.put(digest, files.encode())
        return digest

    # --- checkpoints ------------------------------------------------------------------------------

    async def book(self, run_id: str) -> CheckpointBook:
        return await read_book(self.store, run_id)

    async def update_book(
        self, run_id: str, decide: Callable[[CheckpointBook], CheckpointBook]
    ) -> CheckpointBook:
        """Apply the pure ``decide`` to the run's book atomically; the book written."""
        key = keys.checkpoints(run_id)
        for _ in range(_CONFLICTS):
            raw, version = await self.store.get_versioned(key, FILES_FIELD)
            book = CheckpointBook.model_validate_json(raw) if raw else CheckpointBook()
            new = decide(book)
            if await self.store.set_versioned(
                key, FILES_FIELD, new.model_dump_json().encode(), version
            ):
                await self._expire_with_run(run_id, key, created=version == 0)
                return new
        raise StoreError(f"run {run_id}'s checkpoints: {_CONFLICTS} other writers came first")

    # --- outputs ----------------------------------------------------------------------------------

    async def outputs(self, run_id: str) -> FileSet:
        raw, _ = await self.store.get_versioned(keys.outputs(run_id), FILES_FIELD)
        return await self.read_set(raw.decode()) if raw else FileSet()

    async def add_outputs(self, run_id: str, new: FileSet) -> FileSet:
        """Merge ``new`` into the run's outputs (a path stored again replaces the earlier)."""
        key = keys.outputs(run_id)
        for _ in range(_CONFLICTS):
            raw, version = await self.store.get_versioned(key, FILES_FIELD)
            current = await self.read_set(raw.decode()) if raw else FileSet()
            merged = merge([current, new])
            digest = await self.put_set(merged)
            if await self.store.set_versioned(key, FILES_FIELD, digest.encode(), version):
                await self._expire_with_run(run_id, key, created=version == 0)
                return merged
        raise StoreError(f"run {run_id}'s outputs: {_CONFLICTS} other writers came first")

    # --- what they name ---------------------------------------------------------------------------

    async def named(self, run_ids: Iterable[str]) -> set[str]:
        """Every blob the runs' checkpoints (kept, and parts not yet complete) and outputs name:
        their file set blobs and the chunks these list. A set the relay lost names nothing."""
        sets: set[str] = set()
        for run_id in run_ids:
            sets |= (await self.book(run_id)).set_digests
            raw, _ = await self.store.get_versioned(keys.outputs(run_id), FILES_FIELD)
            if raw:
                sets.add(raw.decode())
        named = set(sets)
        for digest in sets:
            try:
                named |= (await self.read_set(digest)).digests
            except SetError:
                continue
        return named

    async def _expire_with_run(self, run_id: str, key: str, *, created: bool) -> None:
        """A key created once the run's keys expire (it finished) expires with them."""
        if not created:
            return
        left = await self.store.ttl(keys.record(run_id))
        if left is not None and left > 0:
            await self.store.expire(key, left)
