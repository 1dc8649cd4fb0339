"""Sending a stream to a peer: live from a cursor on (woken by ``relay/links/fanout.py``), with
early entries and their commits, or a run's history as it is now; and which stream a published entry
is stored in."""

from __future__ import annotations

import trio

from protocol_specs.link.relay import Commits
from protocol_specs.wire import wire
from protocol_specs.wire.wire import StreamName

from ..config import RelayConfig
from ..gate import Peer
from ..store import Diversion, Store, keys
from .fanout import Fanout

__all__ = ["deliver", "deliver_history", "diversion"]


async def deliver_history(
    peer: Peer, store: Store, run_id: str, name: StreamName, after: str
) -> None:
    """Send the peer the run's stream ``name`` after ``after``, as it is now (an IDE's
    ``history``)."""
    key = keys.stream(run_id, name)
    cursor = after
    while batch := await store.read_after(key, cursor, count=500):
        for entry_id, payload in batch:
            frame = wire.Deliver(stream=name, cursor=entry_id, entry=payload)
            await peer.ws.send(wire.encode_frame(frame))
            cursor = entry_id


async def deliver(
    peer: Peer,
    fanout: Fanout,
    stream: str,
    name: StreamName,
    cursor: str,
    early: bool = False,
) -> None:
    """Send the peer the stream ``name`` (key ``stream``) from ``cursor`` on, live. The
    commits of early entries wait a little, and only the latest of a producer goes
    (:class:`protocol_specs.link.relay.Commits`)."""
    commits = Commits(name)
    async with fanout.subscribe(stream, cursor, early=early) as subscription:
        while True:
            batch = []
            if commits:
                with trio.move_on_at(commits.due):
                    batch = await subscription.next_batch(200)
            else:  # no cancel scope held by every idle connection
                batch = await subscription.next_batch(200)
            for item in batch:
                if item.payload is None:
                    commits.owe(item.cursor, item.producer, item.n, trio.current_time())
                    continue
                if early:
                    frame = wire.Deliver(
                        stream=name,
                        cursor=item.cursor,
                        entry=item.payload,
                        producer=item.producer,
                        n=item.n,
                    )
                else:
                    frame = wire.Deliver(stream=name, cursor=item.cursor, entry=item.payload)
                await peer.ws.send(wire.encode_frame(frame))
            for commit in commits.take(trio.current_time()):
                await peer.ws.send(wire.encode_frame(commit))


def diversion(run_id: str, entry: wire.AnyEntry, config: RelayConfig) -> Diversion | None:
    """Where a published entry goes instead of its link's outbound stream: logs and metrics to
    streams of their own, the newest so many kept; a worker's rank group entry to the run's
    ``to_worker`` (untrimmed: the IDEs' requests are there), where every node's worker reads it
    in order with them."""
    if isinstance(entry, wire.LogEntry):
        return Diversion(keys.stream(run_id, StreamName.LOGS), config.log_entries)
    if isinstance(entry, wire.MetricEntry):
        return Diversion(keys.stream(run_id, StreamName.METRICS), config.metric_entries)
    if isinstance(entry, wire.GroupEntry):
        return Diversion(keys.stream(run_id, StreamName.TO_WORKER))
    return None
