"""DAP framing: an incremental ``Content-Length`` codec (sans-I/O).

Feed bytes with :meth:`DapFramer.receive_data`, take messages with :meth:`DapFramer.next_message`
(``None`` means "need more data"); turn a message into bytes with :func:`encode_message`.

A DAP message is ``Content-Length: N\\r\\n\\r\\n`` followed by N bytes of UTF-8 JSON
(https://microsoft.github.io/debug-adapter-protocol/overview#base-protocol). Errors say what was
wrong; ``fatal`` ones (a header that cannot be parsed or is too big, a body over the limit) mean the
byte stream cannot be resynchronised and the connection should be closed. A body that is not a JSON
object is consumed whole, so the stream stays usable (``fatal=False``).
"""

from __future__ import annotations

from typing import Any

import orjson

__all__ = [
    "MAX_BODY_BYTES",
    "MAX_HEADER_BYTES",
    "DapFramer",
    "DapFramingError",
    "DapProtocolError",
    "encode_message",
]

MAX_HEADER_BYTES = 4096
MAX_BODY_BYTES = 16 * 1024 * 1024
_SEPARATOR = b"\r\n\r\n"


class DapProtocolError(Exception):
    """Base of DAP protocol errors. ``hint`` is a ready error response to send back, if any."""

    def __init__(self, message: str, *, hint: dict[str, Any] | None = None) -> None:
        super().__init__(message)
        self.hint = hint


class DapFramingError(DapProtocolError):
    """The peer sent bytes that are not a valid DAP message."""

    def __init__(self, message: str, *, fatal: bool) -> None:
        super().__init__(message)
        self.fatal = fatal


def encode_message(message: dict[str, Any] | bytes) -> bytes:
    body = message if isinstance(message, bytes) else orjson.dumps(message)
    return b"Content-Length: %d\r\n\r\n" % len(body) + body


class DapFramer:
    def __init__(
        self, *, max_header_bytes: int = MAX_HEADER_BYTES, max_body_bytes: int = MAX_BODY_BYTES
    ) -> None:
        self.max_header_bytes = max_header_bytes
        self.max_body_bytes = max_body_bytes
        self._buffer = bytearray()
        self._length: int | None = None  # body length once a header was parsed
        self._eof = False
        self._broken: DapFramingError | None = None

    def __repr__(self) -> str:
        return f"<DapFramer buffered={len(self._buffer)} body={self._length} eof={self._eof}>"

    def receive_data(self, data: bytes) -> None:
        """Add bytes from the peer; ``b""`` means the peer closed its side."""
        if data:
            self._buffer += data
        else:
            self._eof = True

    @property
    def trailing(self) -> bytes:
        return bytes(self._buffer)

    @property
    def at_eof(self) -> bool:
        return self._eof and not self._buffer

    def next_raw(self) -> bytes | None:
        """The next message's JSON body (checked to be a JSON object), or ``None`` for more data."""
        raw, _ = self._next()
        return raw

    def next_message(self) -> dict[str, Any] | None:
        _, msg = self._next()
        return msg

    def _next(self) -> tuple[bytes | None, dict[str, Any] | None]:
        if self._broken is not None:
            raise self._broken
        if self._length is None:
            end = self._buffer.find(_SEPARATOR)
            if end < 0:
                if len(self._buffer) > self.max_header_bytes:
                    self._fail(
                        f"DAP header exceeds {self.max_header_bytes} bytes without a blank line"
                    )
                if self._eof and self._buffer:
                    self._fail("connection closed in the middle of a DAP header")
                return None, None
            if end > self.max_header_bytes:
                self._fail(f"DAP header exceeds {self.max_header_bytes} bytes")
            header = bytes(self._buffer[:end])
            del self._buffer[: end + len(_SEPARATOR)]
            self._length = self._parse_header(header)
        if len(self._buffer) < self._length:
            if self._eof:
                self._fail(
                    f"connection closed after {len(self._buffer)} of {self._length} body bytes"
                )
            return None, None
        body = bytes(self._buffer[: self._length])
        del self._buffer[: self._length]
        self._length = None
        try:
            msg = orjson.loads(body)
        except orjson.JSONDecodeError as exc:
            raise DapFramingError(f"DAP body is not valid UTF-8 JSON: {exc}", fatal=False) from None
        if not isinstance(msg, dict):
            raise DapFramingError(
                f"DAP body must be a JSON object, got {type(msg).__name__}", fatal=False
            )
        if msg.get("type") not in ("request", "response", "event"):
            raise DapFramingError(
                'DAP message needs "type" of "request", "response" or "event"', fatal=False
            )
        return body, msg

    def _parse_header(self, header: bytes) -> int:
        length: int | None = None
        for line in header.split(b"\r\n"):
            name, sep, value = line.partition(b":")
            if not sep:
                self._fail(f"malformed DAP header line {line[:80]!r}: expected 'Name: value'")
            if name.strip().lower() != b"content-length":
                continue  # DAP defines only Content-Length; tolerate others
            text = value.strip()
            if not text.isdigit():
                self._fail(f"Content-Length must be a non-negative integer, got {text[:40]!r}")
            parsed = int(text)
            if length is not None and parsed != length:
                self._fail("conflicting Content-Length headers")
            length = parsed
        if length is None:
            self._fail("DAP header has no Content-Length")
        assert length is not None
        if length > self.max_body_bytes:
            self._fail(f"DAP body of {length} bytes exceeds the limit of {self.max_body_bytes}")
        return length

    def _fail(self, message: str) -> None:
        self._broken = DapFramingError(message, fatal=True)
        raise self._broken
