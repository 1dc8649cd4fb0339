"""The :class:`Store` on a Redis-compatible server, through valkey-glide (see the package docstring:
one shared client for plain commands, one client per blocking reader, one subscriber per listener).
"""

from __future__ import annotations

import copy
import logging
from collections.abc import AsyncIterator, Mapping, Sequence
from contextlib import asynccontextmanager
from typing import TYPE_CHECKING, TypeVar

import trio

from protocol_specs.link.relay import AppendOutcome

from . import scripts
from .base import (
    DEFAULT_REQUEST_TIMEOUT_MS,
    NO_CAP,
    NOTICE_CHANNEL,
    NOTICE_PAYLOAD_BYTES,
    TICK_LATE_SECONDS,
    TICK_SECONDS,
    VERSION_FIELD,
    Appended,
    BlockingReader,
    Cap,
    Diversion,
    Entry,
    NoticeSink,
    Numbered,
    Published,
    StoreError,
    check_read_args,
    meta_key,
    notice_from,
    parse_id,
    transient_key,
    watchers_key,
)
from .glide_connection import (
    GlideReader,
    as_text,
    create_client,
    glide_errors,
    numbered_entries,
    open_client,
    quiet_glide,
    redact,
    stream_entries,
)

if TYPE_CHECKING:
    from .glide_connection import Client, Config

__all__ = ["GlideStore"]

log = logging.getLogger("tether.store")

_T = TypeVar("_T")


def _appended(reply: object) -> Appended:
    assert isinstance(reply, list) and len(reply) in (2, 3)
    outcome, value = scripts.OUTCOMES[int(reply[0])], as_text(reply[1])
    match outcome:
        case AppendOutcome.STORED:
            return Appended(outcome, cursor=value, prev=as_text(reply[2]))
        case AppendOutcome.DUPLICATE:
            return Appended(outcome, cursor=value)
        case AppendOutcome.GAP:
            return Appended(outcome, last=int(value))
        case AppendOutcome.FULL:
            return Appended(outcome, size=int(value))
    return Appended(outcome)


class GlideStore:
    """A :class:`Store` on a Redis-compatible server through valkey-glide. Use :func:`open_store`."""

    def __init__(self, client: Client, config: Config, url: str) -> None:
        import glide

        self._client = client
        self._config = config
        self._url = redact(url)
        #: a Redis Cluster: the subscriber's connections are one per node
        self.cluster = isinstance(client, glide.GlideClusterClient)

    def __repr__(self) -> str:
        return f"<GlideStore {self._url}{' (cluster)' if self.cluster else ''}>"

    @classmethod
    async def connect(
        cls, url: str, *, request_timeout_ms: int = DEFAULT_REQUEST_TIMEOUT_MS
    ) -> GlideStore:
        quiet_glide()
        client, config = await open_client(url, request_timeout_ms)
        return cls(client, config, url)

    async def _script(
        self, what: str, source: str, keys: list[str], args: list[str | bytes]
    ) -> object:
        import glide

        script = _SCRIPTS.get(source)
        if script is None:
            script = _SCRIPTS[source] = glide.Script(source)  # type: ignore[no-untyped-call]
        with glide_errors(what):
            return await self._client.invoke_script(script, keys=keys, args=args)  # type: ignore[arg-type]

    async def append_once(
        self,
        stream: str,
        producer: str,
        n: int,
        payload: bytes | None,
        *,
        transient: bool = False,
        cap: Cap = NO_CAP,
        divert: Diversion | None = None,
        notify_except: str = "",
    ) -> Appended:
        reply = await self._script(
            f"append to {stream}",
            scripts.APPEND_ONCE,
            [
                stream,
                meta_key(stream),
                transient_key(stream),
                divert.stream if divert else stream,
                meta_key(divert.stream if divert else stream),
                watchers_key(divert.stream if divert else stream),
            ],
            [
                producer,
                str(n),
                payload or b"",
                "1" if transient else "0",
                str(cap.entries),
                str(cap.bytes),
                "1" if payload is None else "0",
                str(divert.maxlen if divert else 0),
                NOTICE_CHANNEL,
                notify_except,
                str(NOTICE_PAYLOAD_BYTES),
            ],
        )
        return _appended(reply)

    async def append_batch(
        self,
        stream: str,
        producer: str,
        entries: Sequence[Published],
        *,
        cap: Cap = NO_CAP,
        notify_except: str = "",
    ) -> list[Appended]:
        if not entries:
            return []
        args: list[str | bytes] = [
            producer,
            str(cap.entries),
            str(cap.bytes),
            NOTICE_CHANNEL,
            notify_except,
            str(NOTICE_PAYLOAD_BYTES),
        ]
        for entry in entries:
            args += [str(entry.n), entry.payload, "1" if entry.transient else "0"]
        reply = await self._script(
            f"append to {stream}",
            scripts.APPEND_BATCH,
            [stream, meta_key(stream), transient_key(stream), watchers_key(stream)],
            args,
        )
        assert isinstance(reply, list) and len(reply) == len(entries)
        return [_appended(one) for one in reply]

    async def trim_received(self, stream: str, cursor: str, *, limit: int = 1000) -> int:
        ms, seq = parse_id(cursor)
        reply = await self._script(
            f"trim {stream}",
            scripts.TRIM_RECEIVED,
            [stream, meta_key(stream), transient_key(stream)],
            [str(ms), str(seq), str(limit)],
        )
        assert isinstance(reply, int)
        return reply

    async def buffered_bytes(self, stream: str) -> int:
        with glide_errors(f"HGET {meta_key(stream)}"):
            value = await self._client.hget(meta_key(stream), "bytes")
        return int(value or 0)

    async def append(self, stream: str, payload: bytes, *, maxlen: int | None = None) -> str:
        reply = await self._script(
            f"XADD {stream}",
            scripts.APPEND,
            [stream, meta_key(stream), watchers_key(stream)],
            [
                payload,
                str(-1 if maxlen is None else maxlen),
                NOTICE_CHANNEL,
                str(NOTICE_PAYLOAD_BYTES),
            ],
        )
        assert isinstance(reply, bytes | str)
        return as_text(reply)

    async def read_after(self, stream: str, after: str, *, count: int = 100) -> list[Entry]:
        return stream_entries(await self._range(stream, after, count))

    async def read_numbered(self, stream: str, after: str, *, count: int = 100) -> list[Numbered]:
        return numbered_entries(await self._range(stream, after, count))

    async def _range(
        self, stream: str, after: str, count: int
    ) -> Mapping[bytes, list[list[bytes]] | None] | None:
        import glide

        check_read_args(0, count)
        with glide_errors(f"XRANGE {stream} after {after}"):
            return await self._client.xrange(
                stream, glide.ExclusiveIdBound(after), glide.MaxId(), count=count
            )

    async def last_id(self, stream: str) -> str | None:
        import glide

        with glide_errors(f"XREVRANGE {stream}"):
            reply = await self._client.xrevrange(stream, glide.MaxId(), glide.MinId(), count=1)
        return as_text(next(iter(reply))) if reply else None

    async def read_last(self, stream: str, count: int) -> list[Entry]:
        import glide

        if count < 1:
            return []
        with glide_errors(f"XREVRANGE {stream} COUNT {count}"):
            reply = await self._client.xrevrange(stream, glide.MaxId(), glide.MinId(), count=count)
        return stream_entries(reply)[::-1]

    @asynccontextmanager
    async def blocking_reader(self) -> AsyncIterator[BlockingReader]:
        reader = GlideReader(self._config)
        try:
            await reader.connect()
            yield reader
        finally:
            await reader.aclose()

    async def watch(self, stream: str, listener: str) -> None:
        with glide_errors(f"SADD {watchers_key(stream)}"):
            await self._client.sadd(watchers_key(stream), [listener])

    async def unwatch(self, stream: str, listener: str) -> None:
        with glide_errors(f"SREM {watchers_key(stream)}"):
            await self._client.srem(watchers_key(stream), [listener])

    async def listen(
        self,
        listener: str,
        sink: NoticeSink,
        *,
        task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED,
    ) -> None:
        # a cluster's PUBLISH reaches every node: one subscription on any node hears them all
        # (sharded pub/sub does not fit: an append's script may only publish to its run's slot)
        config = copy.copy(self._config)
        kind = type(config)
        config.pubsub_subscriptions = kind.PubSubSubscriptions(
            channels_and_patterns={kind.PubSubChannelModes.Exact: {NOTICE_CHANNEL + listener}},
            callback=None,
            context=None,
        )
        with glide_errors("cannot subscribe to append notices"):
            subscriber = await create_client(config)
        ticks = _Ticks(listener, sink)
        try:
            async with trio.open_nursery() as nursery:
                with glide_errors("CLIENT ID"):
                    ticks.connection(await self._connection_ids(subscriber))
                nursery.start_soon(self._tick, ticks, subscriber)
                task_status.started()
                while True:
                    message = await subscriber.get_pubsub_message()
                    data = message.message
                    ticks.received(data if isinstance(data, bytes) else data.encode())
        finally:
            with trio.CancelScope(shield=True):
                await subscriber.close()

    async def _connection_ids(self, subscriber: Client) -> object:
        """The subscriber's connection id (a cluster: its id on every node): a change means glide
        reconnected, and resubscribed, since the last look."""
        import glide

        if isinstance(subscriber, glide.GlideClusterClient):
            return await subscriber.custom_command(["CLIENT", "ID"], glide.AllNodes())
        return await subscriber.custom_command(["CLIENT", "ID"])

    async def _tick(self, ticks: _Ticks, subscriber: Client) -> None:
        """Every ``TICK_SECONDS``: has the subscriber connection been replaced (glide reconnects
        and resubscribes by itself, and whatever was published meanwhile is gone)? Then publish a
        numbered tick to ourselves, and say "maybe lost" when our own ticks are late."""
        while True:
            try:
                with glide_errors("CLIENT ID"):
                    ticks.connection(await self._connection_ids(subscriber))
                with glide_errors("PUBLISH tick"):
                    await self._client.publish(ticks.next(), NOTICE_CHANNEL + ticks.nonce)
            except StoreError as exc:
                log.debug("append notices: %s", exc)
            ticks.check_late(trio.current_time())
            await trio.sleep(TICK_SECONDS)

    async def ensure_group(self, stream: str, group: str) -> None:
        import glide

        options = glide.StreamGroupOptions(make_stream=True)
        try:
            await self._client.xgroup_create(stream, group, "0", options)
        except glide.RequestError as exc:
            if "BUSYGROUP" not in str(exc):
                raise StoreError(f"XGROUP CREATE {stream} {group}: {exc}") from exc
        except glide.GlideError as exc:
            raise StoreError(f"XGROUP CREATE {stream} {group}: {exc}") from exc

    async def ack(self, stream: str, group: str, entry_id: str) -> None:
        with glide_errors(f"XACK {stream} {group} {entry_id}"):
            await self._client.xack(stream, group, [entry_id])

    async def reclaim(
        self, stream: str, group: str, consumer: str, *, min_idle: float, count: int = 100
    ) -> list[Entry]:
        check_read_args(0, count)
        with glide_errors(f"XAUTOCLAIM {stream} {group}"):
            reply = await self._client.xautoclaim(
                stream, group, consumer, max(0, round(min_idle * 1000)), "0-0", count
            )
        claimed = reply[1] if len(reply) > 1 else {}
        assert isinstance(claimed, Mapping)
        return stream_entries(claimed)

    async def pending(self, stream: str, group: str, *, count: int = 100) -> list[tuple[str, str]]:
        import glide

        check_read_args(0, count)
        with glide_errors(f"XPENDING {stream} {group}"):
            reply = await self._client.xpending_range(
                stream, group, glide.MinId(), glide.MaxId(), count
            )
        out: list[tuple[str, str]] = []
        for row in reply:  # [entry id, consumer, idle ms, delivery count]
            entry_id, consumer = row[0], row[1]
            assert isinstance(entry_id, bytes) and isinstance(consumer, bytes)
            out.append((entry_id.decode(), consumer.decode()))
        return out

    async def get_versioned(self, key: str, field: str) -> tuple[bytes | None, int]:
        with glide_errors(f"HMGET {key}"):
            value, version = await self._client.hmget(key, [field, VERSION_FIELD])
        return value, int(version or 0)

    async def set_versioned(self, key: str, field: str, value: bytes, version: int) -> bool:
        reply = await self._script(
            f"write {key} at version {version}",
            scripts.SET_VERSIONED,
            [key],
            [field, value, str(version), VERSION_FIELD],
        )
        return reply == 1

    async def hget_many(self, keys: Sequence[str], field: str) -> list[bytes | None]:
        import glide

        if not keys:
            return []
        batch: glide.Batch | glide.ClusterBatch = (
            glide.ClusterBatch(is_atomic=False) if self.cluster else glide.Batch(is_atomic=False)
        )
        for key in keys:
            batch.hget(key, field)
        with glide_errors(f"HGET of {len(keys)} keys"):
            reply = await self._client.exec(batch, raise_on_error=True)
        assert reply is not None
        return [value if isinstance(value, bytes) else None for value in reply]

    async def hset(self, key: str, mapping: Mapping[str, bytes | str]) -> None:
        if not mapping:
            return  # HSET without fields is a syntax error; "set nothing" is a no-op
        with glide_errors(f"HSET {key}"):
            await self._client.hset(key, dict(mapping))

    async def hgetall(self, key: str) -> dict[str, bytes]:
        with glide_errors(f"HGETALL {key}"):
            reply = await self._client.hgetall(key)
        return {as_text(name): value for name, value in reply.items()}

    async def set_bytes(self, key: str, value: bytes) -> None:
        with glide_errors(f"SET {key}"):
            await self._client.set(key, value)

    async def get_bytes(self, key: str) -> bytes | None:
        with glide_errors(f"GET {key}"):
            return await self._client.get(key)

    async def sadd(self, key: str, members: list[str]) -> None:
        if members:
            with glide_errors(f"SADD {key}"):
                await self._client.sadd(key, list(members))

    async def sismember(self, key: str, members: list[str]) -> list[bool]:
        if not members:
            return []
        with glide_errors(f"SMISMEMBER {key}"):
            return list(await self._client.smismember(key, list(members)))

    async def zadd(
        self,
        key: str,
        member: str,
        score: float,
        *,
        only_existing: bool = False,
        only_new: bool = False,
    ) -> bool:
        import glide

        condition = (
            glide.ConditionalChange.ONLY_IF_EXISTS
            if only_existing
            else glide.ConditionalChange.ONLY_IF_DOES_NOT_EXIST
            if only_new
            else None
        )
        with glide_errors(f"ZADD {key}"):
            changed = await self._client.zadd(
                key, {member: float(score)}, existing_options=condition, changed=True
            )
        return changed > 0

    async def zscore(self, key: str, member: str) -> float | None:
        with glide_errors(f"ZSCORE {key}"):
            return await self._client.zscore(key, member)

    async def zrem(self, key: str, member: str) -> bool:
        with glide_errors(f"ZREM {key}"):
            return await self._client.zrem(key, [member]) > 0

    async def zrange_by_score(self, key: str, max_score: float, count: int) -> list[str]:
        import glide

        if count < 1:
            return []
        query = glide.RangeByScore(
            glide.InfBound.NEG_INF, glide.ScoreBoundary(max_score), glide.Limit(0, count)
        )
        with glide_errors(f"ZRANGE {key} BYSCORE"):
            members = await self._client.zrange(key, query)
        return [as_text(m) for m in members]

    async def expire(self, key: str, seconds: float) -> None:
        with glide_errors(f"PEXPIRE {key}"):
            await self._client.pexpire(key, max(1, round(seconds * 1000)))

    async def ttl(self, key: str) -> float | None:
        with glide_errors(f"PTTL {key}"):
            ms = await self._client.pttl(key)
        return ms / 1000 if ms >= 0 else None

    async def zrange_desc(self, key: str, count: int, *, start: int = 0) -> list[str]:
        import glide

        if count < 1:
            return []
        span = glide.RangeByIndex(start, start + count - 1)
        with glide_errors(f"ZRANGE {key} REV"):
            members = await self._client.zrange(key, span, reverse=True)
        return [as_text(m) for m in members]

    async def delete(self, *keys: str) -> None:
        if keys:
            with glide_errors(f"DEL {' '.join(keys)}"):
                await self._client.delete(list(keys))

    async def flushall(self) -> None:
        with glide_errors("FLUSHALL"):
            await self._client.flushall()

    async def aclose(self) -> None:
        with trio.CancelScope(shield=True):
            await self._client.close()


_SCRIPTS: dict[str, object] = {}


class _Ticks:
    """A listener's own ticks (``t <nonce> <k>``) and how it reads the channel's messages.

    Notices travel on a pub/sub connection that may drop and come back (glide resubscribes by
    itself); anything published meanwhile is gone. A new connection id, a tick of ours that
    arrives out of sequence, or one not back ``TICK_LATE_SECONDS`` after it was sent, means that
    may have happened: the sink gets ``None``.
    """

    def __init__(self, nonce: str, sink: NoticeSink) -> None:
        self.nonce = nonce
        self.sink = sink
        self.sent = 0
        self.seen = 0
        self.waiting_since: float | None = None  #: when the oldest tick not seen yet was sent
        self.late = False
        self.connection_id: object = None

    def connection(self, connection_id: object) -> None:
        if self.connection_id is not None and connection_id != self.connection_id:
            log.info("append notices: the subscription was reconnected; re-reading")
            self.sink(None)
        self.connection_id = connection_id

    def next(self) -> str:
        self.sent += 1
        if self.waiting_since is None:
            self.waiting_since = trio.current_time()
        return f"t {self.nonce} {self.sent}"

    def check_late(self, now: float) -> None:
        since = self.waiting_since
        if not self.late and since is not None and now - since > TICK_LATE_SECONDS:
            self.late = True
            log.warning("append notices are late; connections re-read what they deliver")
            self.sink(None)

    def received(self, message: bytes) -> None:
        notice = notice_from(message)
        if notice is not None:
            self.sink(notice)
        elif message[:2] == b"t ":
            nonce, _, k = message[2:].decode().partition(" ")
            if nonce != self.nonce:
                return  # another relay process's tick
            number = int(k)
            if number != self.seen + 1 or self.late:
                self.sink(None)
            self.seen, self.late = number, False
            if number >= self.sent:
                self.waiting_since = None
