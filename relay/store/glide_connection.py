"""Reaching the server through valkey-glide: the URL as a client configuration, glide's errors
as :class:`StoreError`, stream replies as entries, and the blocking reader's own connection.

A blocking read (``XREAD BLOCK``) holds its connection for its whole wait, so each reader owns a
glide client of its own; plain commands share :class:`~relay.store.glide.GlideStore`'s client.
"""

from __future__ import annotations

import logging
from collections.abc import Awaitable, Callable, Iterator, Mapping
from contextlib import contextmanager
from typing import TYPE_CHECKING, TypeVar
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
    from glide import GlideClient, GlideClientConfiguration

__all__ = [
    "GlideReader",
    "as_text",
    "glide_config",
    "glide_errors",
    "numbered_entries",
    "quiet_glide",
    "redact",
    "stream_entries",
]

_T = TypeVar("_T")
log = logging.getLogger("tether.store")

_PAYLOAD_FIELD_BYTES = PAYLOAD_FIELD.encode()
_PRODUCER_FIELD_BYTES = PRODUCER_FIELD.encode()
_NUMBER_FIELD_BYTES = NUMBER_FIELD.encode()

log = logging.getLogger("tether.store")

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
    netloc = f"{parts.username or ''}:***@{parts.hostname}"
    if parts.port is not None:
        netloc += f":{parts.port}"
    return urlunsplit(parts._replace(netloc=netloc))


def _database(text: str, url: str) -> int | None:
    if not text:
        return None
    if not (text.isascii() and text.isdigit()):
        raise ValueError(f"database number must be a non-negative integer in {redact(url)!r}")
    return int(text)


def glide_config(url: str, request_timeout_ms: int) -> GlideClientConfiguration:
    """``redis://[user:password@]host[:port][/db]``, ``rediss://`` (TLS), ``unix:///path[?db=N]``."""
    import glide

    parts = urlsplit(url)
    if parts.scheme == "unix":
        if parts.netloc or not parts.path.startswith("/"):
            raise ValueError(
                f"unix socket URL needs an absolute path (unix:///...): {redact(url)!r}"
            )
        address = glide.NodeAddress(unix_socket_path=unquote(parts.path))
        database = _database(parse_qs(parts.query).get("db", [""])[0], url)
    elif parts.scheme in ("redis", "rediss", "valkey", "valkeys"):
        address = glide.NodeAddress(parts.hostname or "localhost", parts.port or 6379)
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
    return glide.GlideClientConfiguration(
        [address],
        use_tls=parts.scheme in ("rediss", "valkeys"),
        credentials=credentials,
        database_id=database,
        request_timeout=request_timeout_ms,
    )


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

    def __init__(self, config: GlideClientConfiguration) -> None:
        self._config = config
        self._client: GlideClient | None = None
        self._closed = False

    def __repr__(self) -> str:
        state = "closed" if self._closed else "connected" if self._client else "idle"
        return f"<GlideReader {state}>"

    async def connect(self) -> GlideClient:
        if self._closed:
            raise StoreError("blocking reader is closed")
        if self._client is None:
            import glide

            with glide_errors("cannot open a blocking-read connection"):
                self._client = await glide.GlideClient.create(self._config)
        return self._client

    async def aclose(self) -> None:
        self._closed = True
        await self._discard()

    async def _discard(self) -> None:
        client, self._client = self._client, None
        if client is not None:
            with trio.CancelScope(shield=True):
                await client.close()

    async def _blocking(self, what: str, command: Callable[[GlideClient], Awaitable[_T]]) -> _T:
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
