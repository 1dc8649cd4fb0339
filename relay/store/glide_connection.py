"""Reaching the server through valkey-glide: the URL as a client configuration, glide's errors
as :class:`StoreError`, stream replies as entries, and the blocking reader's own connection.

A blocking read (``XREAD BLOCK``) holds its connection for its whole wait, so each reader owns a
glide client of its own; plain commands share :class:`~relay.store.glide.GlideStore`'s client.
"""

from __future__ import annotations

import copy
import logging
from collections.abc import Awaitable, Callable, Iterator, Mapping
from contextlib import contextmanager
from typing import TYPE_CHECKING, TypeAlias, TypeVar
from urllib.parse import parse_qs, unquote, urlsplit, urlunsplit

import trio

from .base import (
    NUMBER_FIELD,
    PAYLOAD_FIELD,
    PRODUCER_FIELD,
    Entry,
    Numbered,
    StoreError,
    check_read_args,
)

if TYPE_CHECKING:
    from glide import (
        GlideClient,
        GlideClientConfiguration,
        GlideClusterClient,
        GlideClusterClientConfiguration,
    )

    #: a single server's or a cluster's (``relay/store/__init__.py``)
    Client: TypeAlias = GlideClient | GlideClusterClient
    Config: TypeAlias = GlideClientConfiguration | GlideClusterClientConfiguration

__all__ = [
    "GlideReader",
    "as_text",
    "create_client",
    "glide_config",
    "glide_errors",
    "numbered_entries",
    "open_client",
    "quiet_glide",
    "redact",
    "stream_entries",
]

_T = TypeVar("_T")
log = logging.getLogger("tether.store")

_PAYLOAD_FIELD_BYTES = PAYLOAD_FIELD.encode()
_PRODUCER_FIELD_BYTES = PRODUCER_FIELD.encode()
_NUMBER_FIELD_BYTES = NUMBER_FIELD.encode()

_glide_logging_configured = False


def quiet_glide() -> None:
    """glide's core logs warnings (e.g. ``timeout_watchdog``) to stderr; keep only errors."""
    global _glide_logging_configured
    if not _glide_logging_configured:
        import glide

        glide.Logger.set_logger_config(glide.LogLevel.ERROR)
        _glide_logging_configured = True


def redact(url: str) -> str:
    parts = urlsplit(url)
    if parts.password is None:
        return url
    hosts = parts.netloc.rpartition("@")[2]
    return urlunsplit(parts._replace(netloc=f"{parts.username or ''}:***@{hosts}"))


def _database(text: str, url: str) -> int | None:
    if not text:
        return None
    if not (text.isascii() and text.isdigit()):
        raise ValueError(f"database number must be a non-negative integer in {redact(url)!r}")
    return int(text)


def _hosts(netloc: str, url: str) -> list[tuple[str, int]]:
    """``host[:port][,host[:port]...]`` after any ``user:password@`` (a cluster's seed nodes)."""
    hosts = []
    for one in netloc.rpartition("@")[2].split(","):
        parts = urlsplit(f"//{one}")
        try:
            port = parts.port or 6379
        except ValueError:
            raise ValueError(f"bad port in store URL {redact(url)!r}") from None
        hosts.append((parts.hostname or "localhost", port))
    return hosts


def glide_config(
    url: str, request_timeout_ms: int, *, cluster: bool = False, host: int = 0
) -> Config:
    """``redis://[user:password@]host[:port][,host[:port]...][/db]``, ``rediss://`` (TLS),
    ``unix:///path[?db=N]``. ``cluster``: a Redis Cluster's configuration (every host a seed node;
    database 0 only); else a single server's, on the ``host``-th host."""
    import glide

    parts = urlsplit(url)
    if parts.scheme == "unix":
        if parts.netloc or not parts.path.startswith("/"):
            raise ValueError(
                f"unix socket URL needs an absolute path (unix:///...): {redact(url)!r}"
            )
        addresses = [glide.NodeAddress(unix_socket_path=unquote(parts.path))]
        database = _database(parse_qs(parts.query).get("db", [""])[0], url)
    elif parts.scheme in ("redis", "rediss", "valkey", "valkeys"):
        addresses = [glide.NodeAddress(h, p) for h, p in _hosts(parts.netloc, url)]
        database = _database(parts.path.strip("/"), url)
    else:
        raise ValueError(
            f"unsupported store URL {redact(url)!r}: "
            "use redis://host:port[/db], rediss://..., unix:///path/to.sock or memory://"
        )
    credentials = None
    if parts.password is not None:
        credentials = glide.ServerCredentials(
            password=unquote(parts.password), username=unquote(parts.username or "") or None
        )
    tls = parts.scheme in ("rediss", "valkeys")
    if cluster:
        if database:
            raise ValueError(
                f"a Redis Cluster has database 0 only, not {database}: {redact(url)!r}"
            )
        return glide.GlideClusterClientConfiguration(
            addresses, use_tls=tls, credentials=credentials, request_timeout=request_timeout_ms
        )
    return glide.GlideClientConfiguration(
        [addresses[host]],
        use_tls=tls,
        credentials=credentials,
        database_id=database,
        request_timeout=request_timeout_ms,
    )


def seed_count(url: str) -> int:
    """How many hosts ``url`` names (a cluster's seed nodes; 1 for a unix socket)."""
    parts = urlsplit(url)
    return 1 if parts.scheme == "unix" else len(_hosts(parts.netloc, url))


async def create_client(config: Config) -> Client:
    """A client for ``config``: a cluster client for a cluster's configuration."""
    import glide

    if isinstance(config, glide.GlideClusterClientConfiguration):
        return await glide.GlideClusterClient.create(config)
    return await glide.GlideClient.create(config)


async def open_client(url: str, request_timeout_ms: int) -> tuple[Client, Config]:
    """Connect to the server(s) at ``url``. A Redis Cluster is recognised by asking the first of
    its hosts that answers (``INFO cluster``); it is then reached with every host as a seed."""
    import glide

    if urlsplit(url).scheme == "unix":
        config = glide_config(url, request_timeout_ms)
        with glide_errors(f"cannot connect to {redact(url)}"):
            return await glide.GlideClient.create(config), config
    failure = StoreError(f"cannot connect to {redact(url)}")
    for host in range(seed_count(url)):
        config = glide_config(url, request_timeout_ms, host=host)
        probe = copy.copy(config)
        probe.database_id = None  # a cluster refuses SELECT: ask it first
        try:
            with glide_errors(f"cannot connect to {redact(url)}"):
                client = await glide.GlideClient.create(probe)
        except StoreError as exc:
            failure = exc
            continue
        try:
            with glide_errors(f"INFO cluster on {redact(url)}"):
                info = await client.info([glide.InfoSection.CLUSTER])
        except BaseException:
            await _close(client)
            raise
        if b"cluster_enabled:1" not in info and seed_count(url) == 1:
            if not config.database_id:
                return client, config
            await _close(client)
            with glide_errors(f"cannot connect to {redact(url)}"):
                return await glide.GlideClient.create(config), config
        await _close(client)
        if b"cluster_enabled:1" not in info:
            raise StoreError(
                f"{redact(url)} names several hosts, but they are not the nodes of a Redis"
                " Cluster: name the one host of a single server"
            )
        cluster = glide_config(url, request_timeout_ms, cluster=True)
        with glide_errors(f"cannot connect to the Redis Cluster at {redact(url)}"):
            return await create_client(cluster), cluster
    raise failure


async def _close(client: Client) -> None:
    with trio.CancelScope(shield=True):
        await client.close()


@contextmanager
def glide_errors(what: str) -> Iterator[None]:
    import glide

    try:
        yield
    except glide.GlideError as exc:
        raise StoreError(f"{what}: {exc}".strip()) from exc


def as_text(value: bytes | str) -> str:
    return value.decode() if isinstance(value, bytes) else value


def numbered_entries(reply: Mapping[bytes, list[list[bytes]] | None] | None) -> list[Numbered]:
    """As :func:`stream_entries`, with the publish that wrote each entry (``o``, ``n``)."""
    if not reply:
        return []
    out: list[Numbered] = []
    for entry_id, fields in reply.items():
        payload, producer, n = b"", "", 0
        for name, value in fields or ():
            if name == _PAYLOAD_FIELD_BYTES:
                payload = value
            elif name == _PRODUCER_FIELD_BYTES:
                producer = as_text(value)
            elif name == _NUMBER_FIELD_BYTES and value.isdigit():
                n = int(value)
        out.append(Numbered(as_text(entry_id), payload, producer, n))
    return out


def stream_entries(reply: Mapping[bytes, list[list[bytes]] | None] | None) -> list[Entry]:
    """glide's stream reply ``{id: [[field, value], ...]}`` (server order) -> ``[(id, payload)]``.

    An entry without the ``p`` field (written by someone else) gets an empty payload: the caller's
    decoder reports it, and the cursor still moves past it.
    """
    if not reply:
        return []
    out: list[Entry] = []
    for entry_id, fields in reply.items():
        payload = b""
        for name, value in fields or ():
            if name == _PAYLOAD_FIELD_BYTES:
                payload = value
                break
        out.append((as_text(entry_id), payload))
    return out


class GlideReader:
    """A :class:`BlockingReader` owning one glide client; reconnects after a discarded client."""

    def __init__(self, config: Config) -> None:
        self._config = config
        self._client: Client | None = None
        self._closed = False

    def __repr__(self) -> str:
        state = "closed" if self._closed else "connected" if self._client else "idle"
        return f"<GlideReader {state}>"

    async def connect(self) -> Client:
        if self._closed:
            raise StoreError("blocking reader is closed")
        if self._client is None:
            with glide_errors("cannot open a blocking-read connection"):
                self._client = await create_client(self._config)
        return self._client

    async def aclose(self) -> None:
        self._closed = True
        await self._discard()

    async def _discard(self) -> None:
        client, self._client = self._client, None
        if client is not None:
            with trio.CancelScope(shield=True):
                await client.close()

    async def _blocking(self, what: str, command: Callable[[Client], Awaitable[_T]]) -> _T:
        import glide

        client = await self.connect()
        try:
            return await command(client)
        except glide.RequestError as exc:
            if isinstance(exc, glide.TimeoutError | glide.ConnectionError):
                await self._discard()  # the command may still be pending on the connection
            # else the server refused it (NOGROUP, WRONGTYPE...): the connection is idle again
            raise StoreError(f"{what}: {exc}") from exc
        except glide.GlideError as exc:
            await self._discard()
            raise StoreError(f"{what}: {exc}") from exc
        except BaseException:
            # Cancelled: the server still blocks on our command and glide keeps the connection
            # busy until it answers; a fresh connection is cheaper than waiting out the block.
            await self._discard()
            raise

    async def read(
        self, stream: str, after: str, *, block_ms: int = 1000, count: int = 100
    ) -> list[Entry]:
        import glide

        check_read_args(block_ms, count)
        options = glide.StreamReadOptions(block_ms=block_ms, count=count)
        reply = await self._blocking(
            f"XREAD {stream} after {after}", lambda c: c.xread({stream: after}, options)
        )
        return stream_entries(reply.get(stream.encode())) if reply else []

    async def read_group(
        self, stream: str, group: str, consumer: str, *, block_ms: int = 1000
    ) -> Entry | None:
        import glide

        check_read_args(block_ms, 1)
        options = glide.StreamReadGroupOptions(block_ms=block_ms, count=1)
        reply = await self._blocking(
            f"XREADGROUP {group} {stream}",
            lambda c: c.xreadgroup({stream: ">"}, group, consumer, options),
        )
        entries = stream_entries(reply.get(stream.encode())) if reply else []
        return entries[0] if entries else None
