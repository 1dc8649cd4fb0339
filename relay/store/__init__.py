"""The relay's storage seam: a narrow async interface over Redis streams, hashes and a sorted set.

Theory of operation
-------------------
:class:`Store` is everything the relay asks of Redis, and nothing more. Two implementations share
one conformance suite (``tests/integration/test_store_*.py``), run against both:

- :class:`GlideStore`: valkey-glide (Rust core; trio support through anyio, detected with sniffio),
  for Redis >= 6.2 and Valkey. A glide client is *one* multiplexed connection, so:

  * one shared client serves every non-blocking command;
  * every :class:`BlockingReader` owns a dedicated client for ``XREAD BLOCK`` / ``XREADGROUP
    BLOCK``: a pending blocking command would stall (and time out) anything else sent on its
    connection;
  * a blocking read that is cancelled leaves its command pending on the server until the block
    expires, and glide keeps that connection busy meanwhile. The reader therefore closes its
    client on cancellation (and on a timeout or lost connection) and reconnects on its next read.

  glide gives blocking commands ``block_ms`` plus a margin on top of ``request_timeout``, so a
  block may be longer than the request timeout (``block_ms=0``, "forever", has no timeout).
  A Redis Cluster is a store too (``GlideClusterClient``): :func:`open_store` asks the first host
  that answers whether it is a cluster's node (``INFO cluster``), and then uses every host of the
  URL as a seed. Every script's keys are in one hash slot (``relay/store/keys.py``: a run's keys
  share its ``{run id}`` tag); single-key commands go wherever their key lives. Notices are plain
  ``PUBLISH``, which a cluster forwards to every node, so one subscription hears every shard's
  appends (sharded pub/sub would not: a script may only ``SPUBLISH`` within its own slot).
- :class:`MemoryStore`: an in-process fake with the same observable semantics (entry ids, exclusive
  cursors, exact ``maxlen`` trimming, consumer groups with pending entries, ``WRONGTYPE``), blocking
  reads built on trio events. Every method is a trio checkpoint, like real I/O.

Notices: a listener (one per relay process, ``relay/links/fanout.py``) names the streams it watches
(:meth:`Store.watch`, a set per stream), and every append publishes a small notice (the stream, its
new entry's id and the id of the entry before it) from the same script to each watching listener's
own channel (``tether:appended:<listener>``), except the appender's own (it knows already). So one
subscriber connection per relay process wakes all its delivering connections, and a relay hears
only of the streams it delivers (:meth:`Store.listen`). Pub/sub is at most once: the listener
publishes its own numbered ticks on its channel and reports a gap (or a silence) as "notices may be
lost"; the listening side then re-reads from Redis. The previous id is kept in the stream's meta
hash (``last``) by every writer, so it stays right after entries are trimmed.

Stream entries carry their payload in one field, ``p``. Ids are strings ``"<ms>-<seq>"``; ``"0"`` is
the cursor before the first entry. Key names are the caller's business (``relay/store/keys.py``):
this module is generic.

Errors: anything the server refuses, and any lost connection or timeout, raises :class:`StoreError`
(the original glide exception is its ``__cause__``). Malformed arguments (negative ``block_ms``,
``count`` < 1, an unsupported URL) raise ``ValueError``.

Cancellation: a cancelled write may or may not have been applied (the bytes may already be on the
wire), so callers keep writes idempotent. A cancelled ``read_group`` may have delivered an entry to
that consumer server-side; it then sits in the group's pending list (:meth:`Store.pending`).
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from urllib.parse import urlsplit

from .base import (
    DEFAULT_REQUEST_TIMEOUT_MS,
    NO_CAP,
    PAYLOAD_FIELD,
    Appended,
    BlockingReader,
    Cap,
    Diversion,
    Entry,
    Notice,
    Numbered,
    Published,
    Store,
    StoreError,
    meta_key,
    parse_id,
    transient_key,
)
from .glide import GlideStore
from .memory import MemoryStore

__all__ = [
    "DEFAULT_REQUEST_TIMEOUT_MS",
    "NO_CAP",
    "PAYLOAD_FIELD",
    "Appended",
    "BlockingReader",
    "Cap",
    "Diversion",
    "Entry",
    "GlideStore",
    "MemoryStore",
    "Notice",
    "Numbered",
    "Published",
    "Store",
    "StoreError",
    "meta_key",
    "open_store",
    "parse_id",
    "transient_key",
]


@asynccontextmanager
async def open_store(
    url: str, *, request_timeout_ms: int = DEFAULT_REQUEST_TIMEOUT_MS
) -> AsyncIterator[Store]:
    """Open the store at ``url``; it is closed when the context exits.

    ``redis://[user:password@]host[:port][/db]``, ``rediss://`` (TLS), ``unix:///path/to.sock[?db=N]``
    or ``memory://`` (a fresh, empty :class:`MemoryStore` for each call). A Redis Cluster:
    ``redis://host[:port][,host[:port]...]``, any of its nodes (several: seeds, tried in turn). ``request_timeout_ms``
    bounds each non-blocking command (blocking reads get their ``block_ms`` on top).
    """
    store: Store
    if urlsplit(url).scheme == "memory":
        store = MemoryStore()
    else:
        store = await GlideStore.connect(url, request_timeout_ms=request_timeout_ms)
    try:
        yield store
    finally:
        await store.aclose()
