"""DAP framing: an incremental ``Content-Length`` codec (sans-I/O).

Theory of operation. Feed the bytes read from a peer to :meth:`DapFramer.receive_data` (``b""``
when the peer closed its side), then call :meth:`DapFramer.next_message` (or :meth:`next_raw`)
until it returns ``None``, which means "need more data". :func:`encode_message` turns a message
into bytes. The framer does no I/O and never blocks, so it is tested by feeding it bytes, one at a
time if need be; how the bytes are split into chunks never changes what comes out.

A DAP message is a header of ``Name: value`` lines, each ended by ``\\r\\n``, then an empty line,
then the body: ``Content-Length`` bytes of UTF-8 JSON
(https://microsoft.github.io/debug-adapter-protocol/overview#base-protocol: "Currently only the
Content-Length header is supported"). The header is parsed strictly where the framing depends on
it and leniently elsewhere: ``Content-Length`` is matched case-insensitively, must be a decimal
number, may be repeated only with the same value, and other header lines are ignored.

Errors (:class:`DapFramingError`) say precisely what was wrong. A *fatal* one (a header that
cannot be parsed, is too long or announces a body over the limit, or a connection closed in the
middle of a message) means the stream can no longer be split into messages: the framer stays
broken, raising the same error again, and the connection should be closed. A body that has a
valid ``Content-Length`` but is not a JSON object with a DAP ``type`` is consumed whole, so the
error is not fatal and the next call goes on with the next message.
"""

from __future__ import annotations

from typing import Any, NoReturn

import orjson

__all__ = [
    "MAX_BODY_BYTES",
    "MAX_HEADER_BYTES",
    "DapFramer",
    "DapFramingError",
    "DapProtocolError",
    "encode_message",
    "json_kind",
]

#: Longest header accepted (bytes before the blank line). debugpy and VS Code send only
#: ``Content-Length: N``, about 20 bytes.
MAX_HEADER_BYTES = 4096
#: Largest body accepted. Big ``variables``/``evaluate`` answers are well under 1 MiB.
MAX_BODY_BYTES = 16 * 1024 * 1024

_SEPARATOR = b"\r\n\r\n"
_MESSAGE_TYPES = ("request", "response", "event")
# Longer numbers are refused before int() is called: it would raise ValueError past 4300 digits.
_MAX_LENGTH_DIGITS = 18


class DapProtocolError(Exception):
    """Base of DAP protocol errors.

    ``hint`` is the ready DAP error response to send back to the peer, or ``None`` when there is
    nothing to answer (as for garbage that has no request ``seq``).
    """

    def __init__(self, message: str, *, hint: dict[str, Any] | None = None) -> None:
        super().__init__(message)
        self.hint = hint


class DapFramingError(DapProtocolError):
    """The peer sent bytes that are not a valid DAP message.

    ``fatal`` is true when the byte stream cannot be resynchronised and must be closed.
    """

    def __init__(self, message: str, *, fatal: bool, hint: dict[str, Any] | None = None) -> None:
        super().__init__(message, hint=hint)
        self.fatal = fatal


def encode_message(message: dict[str, Any] | bytes) -> bytes:
    """Frame one message: a dict is serialised with orjson; bytes are taken as the JSON body."""
    body = message if isinstance(message, bytes) else orjson.dumps(message)
    return b"Content-Length: %d\r\n\r\n" % len(body) + body


class DapFramer:
    """Splits a byte stream into DAP messages. See the module docstring."""

    def __init__(
        self, *, max_header_bytes: int = MAX_HEADER_BYTES, max_body_bytes: int = MAX_BODY_BYTES
    ) -> None:
        if max_header_bytes < 1 or max_body_bytes < 0:
            raise ValueError("max_header_bytes must be positive and max_body_bytes non-negative")
        self.max_header_bytes = max_header_bytes
        self.max_body_bytes = max_body_bytes
        self._buffer = bytearray()  # unconsumed bytes, starting at a message's header
        self._scanned = 0  # how much of the buffer is known not to contain the separator
        self._body_start: int | None = None  # set once the current header is parsed
        self._body_length = 0
        self._eof = False
        self._broken: DapFramingError | None = None

    def __repr__(self) -> str:
        if self._broken is not None:
            state = "broken"
        elif self._body_start is None:
            state = "header"
        else:
            state = f"body({self._body_length})"
        return (
            f"<DapFramer state={state} buffered={len(self._buffer)} eof={self._eof}"
            f" limits=({self.max_header_bytes}, {self.max_body_bytes})>"
        )

    def receive_data(self, data: bytes | bytearray | memoryview) -> None:
        """Add bytes from the peer; ``b""`` means the peer closed its side (EOF)."""
        if not data:
            self._eof = True
        elif self._eof:
            raise RuntimeError("DapFramer.receive_data() got data after EOF")
        else:
            self._buffer += data

    @property
    def trailing(self) -> bytes:
        """Bytes received but not (yet) returned as a message, header included."""
        return bytes(self._buffer)

    @property
    def at_eof(self) -> bool:
        """The peer closed its side and every message it sent was taken."""
        return self._eof and not self._buffer

    def next_message(self) -> dict[str, Any] | None:
        """The next message, or ``None`` if more data is needed. Raises DapFramingError."""
        found = self._next()
        return None if found is None else found[1]

    def next_raw(self) -> bytes | None:
        """Like :meth:`next_message`, but the exact JSON body bytes (checked like a message)."""
        found = self._next()
        return None if found is None else found[0]

    def _next(self) -> tuple[bytes, dict[str, Any]] | None:
        if self._broken is not None:
            raise self._broken.with_traceback(None)
        buffer = self._buffer
        if self._body_start is None:
            end = buffer.find(_SEPARATOR, self._scanned)
            if end < 0:
                # The separator may still start in the last 3 bytes; decide the header is too long
                # only when it must be, so that the result never depends on how data was chunked.
                self._scanned = max(0, len(buffer) - len(_SEPARATOR) + 1)
                if self._scanned > self.max_header_bytes:
                    self._header_too_long()
                if self._eof and buffer:
                    self._fail(
                        f"connection closed in the middle of a DAP header: {bytes(buffer[:80])!r}"
                    )
                return None
            if end > self.max_header_bytes:
                self._header_too_long()
            self._body_length = self._parse_header(bytes(buffer[:end]))
            self._body_start = end + len(_SEPARATOR)
        start, length = self._body_start, self._body_length
        if len(buffer) - start < length:
            if self._eof:
                self._fail(
                    f"connection closed after {len(buffer) - start} of the {length} body bytes"
                    " announced by Content-Length"
                )
            return None
        body = bytes(buffer[start : start + length])
        del buffer[: start + length]
        self._body_start = None
        self._scanned = 0
        return body, self._decode(body)

    def _parse_header(self, header: bytes) -> int:
        length: int | None = None
        for line in header.split(b"\r\n") if header else ():
            name, colon, value = line.partition(b":")
            if not colon or not name.strip():
                self._fail(f"malformed DAP header line {line[:80]!r}: expected 'Name: value'")
            if name.strip().lower() != b"content-length":
                continue  # DAP defines only Content-Length; unknown headers are ignored
            text = value.strip(b" \t")
            if not text.isdigit():  # bytes.isdigit(): ASCII digits only, so no sign, no space
                self._fail(
                    f"Content-Length must be a non-negative decimal integer, got {text[:40]!r}"
                )
            digits = text.lstrip(b"0") or b"0"
            if len(digits) > _MAX_LENGTH_DIGITS:
                self._fail(
                    f"DAP body of {digits[:20].decode()}... ({len(digits)} digits) bytes exceeds"
                    f" the limit of {self.max_body_bytes} bytes"
                )
            parsed = int(digits)
            if length is not None and parsed != length:
                self._fail(f"conflicting Content-Length headers: {length} and {parsed}")
            length = parsed
        if length is None:
            self._fail(f"DAP header has no Content-Length: {header[:80]!r}")
        if length > self.max_body_bytes:
            self._fail(
                f"DAP body of {length} bytes exceeds the limit of {self.max_body_bytes} bytes"
            )
        return length

    @staticmethod
    def _decode(body: bytes) -> dict[str, Any]:
        # The body is already consumed: these errors are not fatal.
        try:
            msg = orjson.loads(body)
        except orjson.JSONDecodeError as exc:
            raise DapFramingError(
                f"DAP body of {len(body)} bytes is not valid UTF-8 JSON: {exc}", fatal=False
            ) from None
        if not isinstance(msg, dict):
            raise DapFramingError(
                f"DAP body must be a JSON object, got a JSON {json_kind(msg)}", fatal=False
            )
        kind = msg.get("type")
        if kind not in _MESSAGE_TYPES:
            if "type" not in msg:
                got = "no type"
            elif isinstance(kind, str):
                got = f"type {kind[:40]!r}"
            else:
                got = f"a JSON {json_kind(kind)} as type"
            raise DapFramingError(
                f'DAP message needs "type" "request", "response" or "event", got {got}',
                fatal=False,
            )
        return msg

    def _header_too_long(self) -> NoReturn:
        # The same words whether or not the blank line has arrived yet: chunking must not matter.
        self._fail(
            f"DAP header is longer than the limit of {self.max_header_bytes} bytes:"
            f" {bytes(self._buffer[:40])!r}..."
        )

    def _fail(self, message: str) -> NoReturn:
        self._broken = DapFramingError(message, fatal=True)
        raise self._broken


def json_kind(value: object) -> str:
    """The JSON type of a decoded value, as an error message names it ("array", "string", ...)."""
    if isinstance(value, dict):
        return "object"
    if isinstance(value, list):
        return "array"
    if isinstance(value, str):
        return "string"
    if isinstance(value, bool):
        return "boolean"
    if value is None:
        return "null"
    return "number"
