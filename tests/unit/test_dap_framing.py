"""The DAP codec fed whole, byte by byte, with trailing data, and with every kind of garbage."""

from __future__ import annotations

import re
from typing import Any

import orjson
import pytest
from hypothesis import given
from hypothesis import strategies as st

from protocol_specs.dap.framing import (
    MAX_BODY_BYTES,
    MAX_HEADER_BYTES,
    DapFramer,
    DapFramingError,
    DapProtocolError,
    encode_message,
)

MSG = {
    "seq": 1,
    "type": "request",
    "command": "initialize",
    "arguments": {"adapterID": "debugpy", "é": "ü"},
}


def drain(framer: DapFramer) -> list[dict[str, Any]]:
    out = []
    while (msg := framer.next_message()) is not None:
        out.append(msg)
    return out


def framed(body: bytes, header: bytes | None = None) -> bytes:
    if header is None:
        header = b"Content-Length: %d" % len(body)
    return header + b"\r\n\r\n" + body


# -- well-formed input ------------------------------------------------------------------------


def test_encode_message_frames_the_utf8_body() -> None:
    data = encode_message(MSG)
    body = orjson.dumps(MSG)
    assert data == b"Content-Length: %d\r\n\r\n" % len(body) + body
    assert len(body) > len(body.decode())  # the length counts bytes, not characters
    assert encode_message(b'{"seq":1,"type":"event","event":"x"}') == (
        b'Content-Length: 36\r\n\r\n{"seq":1,"type":"event","event":"x"}'
    )


def test_whole_message() -> None:
    framer = DapFramer()
    framer.receive_data(encode_message(MSG))
    assert framer.next_message() == MSG
    assert framer.next_message() is None
    assert framer.trailing == b""
    assert not framer.at_eof


def test_byte_by_byte_needs_data_until_the_last_byte() -> None:
    data = encode_message(MSG)
    framer = DapFramer()
    for i in range(len(data) - 1):
        framer.receive_data(data[i : i + 1])
        assert framer.next_message() is None
        assert framer.trailing == data[: i + 1]
    framer.receive_data(data[-1:])
    assert framer.next_message() == MSG
    assert framer.trailing == b""


def test_several_messages_in_one_chunk() -> None:
    messages = [{**MSG, "seq": n} for n in range(1, 6)]
    framer = DapFramer()
    framer.receive_data(b"".join(encode_message(m) for m in messages))
    assert drain(framer) == messages


@pytest.mark.parametrize("cut", [3, 17, 25, 40])
def test_trailing_data_stays_buffered_header_included(cut: int) -> None:
    second = encode_message({**MSG, "seq": 2})
    framer = DapFramer()
    framer.receive_data(encode_message(MSG) + second[:cut])
    assert drain(framer) == [MSG]
    assert framer.trailing == second[:cut]
    framer.receive_data(second[cut:])
    assert drain(framer) == [{**MSG, "seq": 2}]


def test_raw_body_is_the_exact_bytes() -> None:
    body = b'{ "type" : "event",  "seq":3, "event":"output", "body": {"output": "\\u00e9"} }'
    framer = DapFramer()
    framer.receive_data(encode_message(body) + encode_message(MSG))
    assert framer.next_raw() == body
    assert framer.next_raw() == orjson.dumps(MSG)
    assert framer.next_raw() is None


@pytest.mark.parametrize(
    "header",
    [
        b"content-length: %d",
        b"CONTENT-LENGTH:%d",
        b"Content-Length: \t%d \t",
        b"Content-Length: 000%d",
        b"X-Other: 1\r\nContent-Length: %d\r\nContent-Type: application/vscode-jsonrpc",
        b"Content-Length: %d\r\nContent-Length: %d",  # repeated with the same value
        b"Content-Length: %d\r\nx-\xff\xfe: binary name and value \x00\x80",
    ],
)
def test_header_is_lenient_where_framing_does_not_depend_on_it(header: bytes) -> None:
    body = orjson.dumps(MSG)
    framer = DapFramer()
    framer.receive_data(framed(body, header.replace(b"%d", str(len(body)).encode())))
    assert drain(framer) == [MSG]


def test_header_of_exactly_the_limit_is_accepted() -> None:
    body = orjson.dumps(MSG)
    length = b"Content-Length: %d" % len(body)
    header = length + b"\r\nX: " + b"a" * (MAX_HEADER_BYTES - len(length) - 5)
    assert len(header) == MAX_HEADER_BYTES
    for chunk in (1, 7, len(header) + 4 + len(body)):  # however it arrives
        framer = DapFramer()
        data = framed(body, header)
        for i in range(0, len(data), chunk):
            framer.receive_data(data[i : i + chunk])
            if i + chunk < len(data):
                assert framer.next_message() is None
        assert drain(framer) == [MSG]


def test_clean_eof() -> None:
    framer = DapFramer()
    framer.receive_data(encode_message(MSG))
    framer.receive_data(b"")
    assert not framer.at_eof  # a message is still buffered
    assert drain(framer) == [MSG]
    assert framer.at_eof
    assert framer.next_message() is None
    framer.receive_data(b"")  # EOF may be reported again
    with pytest.raises(RuntimeError, match="after EOF"):
        framer.receive_data(b"x")


def test_limits_are_configurable_and_checked() -> None:
    assert (MAX_HEADER_BYTES, MAX_BODY_BYTES) == (4096, 16 * 1024 * 1024)
    framer = DapFramer(max_header_bytes=20, max_body_bytes=len(orjson.dumps(MSG)))
    framer.receive_data(encode_message(MSG))
    assert drain(framer) == [MSG]
    with pytest.raises(ValueError, match="positive"):
        DapFramer(max_header_bytes=0)
    with pytest.raises(ValueError, match="non-negative"):
        DapFramer(max_body_bytes=-1)


def test_repr_shows_the_state() -> None:
    framer = DapFramer()
    assert "state=header buffered=0 eof=False" in repr(framer)
    framer.receive_data(encode_message(MSG)[:-1])
    framer.next_message()
    assert f"state=body({len(orjson.dumps(MSG))})" in repr(framer)
    framer.receive_data(b"")
    with pytest.raises(DapFramingError):
        framer.next_message()
    assert "state=broken" in repr(framer)


# -- fatal errors -----------------------------------------------------------------------------

FATAL_CASES = [
    (
        b"Content-Length: banana\r\n\r\n{}",
        "Content-Length must be a non-negative decimal integer, got b'banana'",
    ),
    (
        b"Content-Length: -5\r\n\r\n",
        "Content-Length must be a non-negative decimal integer, got b'-5'",
    ),
    (
        b"Content-Length: +5\r\n\r\n",
        "Content-Length must be a non-negative decimal integer, got b'+5'",
    ),
    (
        b"Content-Length: 0x1\r\n\r\n",
        "Content-Length must be a non-negative decimal integer, got b'0x1'",
    ),
    (
        b"Content-Length: 1 2\r\n\r\n",
        "Content-Length must be a non-negative decimal integer, got b'1 2'",
    ),
    (
        b"Content-Length: 1.0\r\n\r\n",
        "Content-Length must be a non-negative decimal integer, got b'1.0'",
    ),
    (b"Content-Length:\r\n\r\n", "Content-Length must be a non-negative decimal integer, got b''"),
    (
        "Content-Length: ٣\r\n\r\n".encode(),  # an Arabic-Indic digit is not a DAP length
        "Content-Length must be a non-negative decimal integer, got b'\\xd9\\xa3'",
    ),
    (b"Content-Type: json\r\n\r\n", "DAP header has no Content-Length: b'Content-Type: json'"),
    (b"\r\n\r\n{}", "DAP header has no Content-Length: b''"),
    (
        b"garbage line\r\n\r\n",
        "malformed DAP header line b'garbage line': expected 'Name: value'",
    ),
    (b": 5\r\n\r\n", "malformed DAP header line b': 5': expected 'Name: value'"),
    (
        b"\r\nContent-Length: 2\r\n\r\n{}",  # a stray line end before the header
        "malformed DAP header line b'': expected 'Name: value'",
    ),
    (
        b"Content-Length: 5\nX: 1\r\n\r\n",  # bare LF is not a line end
        "Content-Length must be a non-negative decimal integer, got b'5\\nX: 1'",
    ),
    (
        b"Content-Length: 2\r\ncontent-length: 3\r\n\r\n",
        "conflicting Content-Length headers: 2 and 3",
    ),
    (
        b"Content-Length: 16777217\r\n\r\n",
        "DAP body of 16777217 bytes exceeds the limit of 16777216 bytes",
    ),
    (
        b"Content-Length: " + b"9" * 3000 + b"\r\n\r\n",  # int() itself would refuse 4301 digits
        "DAP body of 99999999999999999999... (3000 digits) bytes exceeds the limit of 16777216 bytes",
    ),
    (
        b"X" * 5000,
        "DAP header is longer than the limit of 4096 bytes: b'XXXXXXXXXXXXXXXXXXXXXXXXXXXXXXXXXXXXXXXX'...",
    ),
    (
        b"X: " + b"y" * 4094 + b"\r\n\r\n{}",  # the blank line arrives, but too late
        "DAP header is longer than the limit of 4096 bytes: b'X: yyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyy'...",
    ),
]


@pytest.mark.parametrize(("data", "message"), FATAL_CASES)
def test_fatal_errors_say_what_was_wrong(data: bytes, message: str) -> None:
    framer = DapFramer()
    framer.receive_data(data)
    with pytest.raises(DapFramingError, match=f"^{re.escape(message)}$") as info:
        framer.next_message()
    assert info.value.fatal
    assert info.value.hint is None
    assert isinstance(info.value, DapProtocolError)
    # It stays broken, whatever comes next: the stream cannot be resynchronised.
    assert framer.trailing == data
    framer.receive_data(encode_message(MSG))
    with pytest.raises(DapFramingError, match=f"^{re.escape(message)}$"):
        framer.next_message()
    with pytest.raises(DapFramingError, match=f"^{re.escape(message)}$"):
        framer.next_raw()


@pytest.mark.parametrize(("data", "message"), FATAL_CASES)
def test_fatal_errors_do_not_depend_on_chunking(data: bytes, message: str) -> None:
    def feed_byte_by_byte() -> None:
        framer = DapFramer()
        for i in range(len(data)):
            framer.receive_data(data[i : i + 1])
            drain(framer)

    with pytest.raises(DapFramingError, match=f"^{re.escape(message)}$"):
        feed_byte_by_byte()


def test_header_too_long_is_reported_as_soon_as_it_is_certain() -> None:
    framer = DapFramer(max_header_bytes=10)
    framer.receive_data(b"X" * 13)  # the blank line could still start at byte 10
    assert framer.next_message() is None
    framer.receive_data(b"X")
    with pytest.raises(DapFramingError, match="longer than the limit of 10 bytes"):
        framer.next_message()


@pytest.mark.parametrize(
    ("data", "message"),
    [
        (b"Content-Len", "connection closed in the middle of a DAP header: b'Content-Len'"),
        (
            b"Content-Length: 2\r\n\r",
            "connection closed in the middle of a DAP header: b'Content-Length: 2\\r\\n\\r'",
        ),
        (
            encode_message(MSG)[:-3],
            f"connection closed after {len(orjson.dumps(MSG)) - 3} of the"
            f" {len(orjson.dumps(MSG))} body bytes announced by Content-Length",
        ),
        (
            b"Content-Length: 2\r\n\r\n",
            "connection closed after 0 of the 2 body bytes announced by Content-Length",
        ),
    ],
)
def test_eof_in_the_middle_of_a_message_is_fatal(data: bytes, message: str) -> None:
    framer = DapFramer()
    framer.receive_data(data)
    assert framer.next_message() is None
    framer.receive_data(b"")
    assert not framer.at_eof
    with pytest.raises(DapFramingError, match=f"^{re.escape(message)}$") as info:
        framer.next_message()
    assert info.value.fatal


# -- bodies that are not DAP messages: skipped, the stream goes on ----------------------------


@pytest.mark.parametrize(
    ("body", "message"),
    [
        (b"garbage", "DAP body of 7 bytes is not valid UTF-8 JSON: unexpected character"),
        (b"", "DAP body of 0 bytes is not valid UTF-8 JSON"),
        (b'"\xff\xfe"', "DAP body of 4 bytes is not valid UTF-8 JSON: str is not valid UTF-8"),
        (
            b'{"type": "event"} {}',
            "DAP body of 20 bytes is not valid UTF-8 JSON: unexpected content",
        ),
        (
            b'{"type": "event", "x": NaN}',
            "DAP body of 27 bytes is not valid UTF-8 JSON: unexpected",
        ),
        (b"[" * 2000 + b"]" * 2000, "DAP body of 4000 bytes is not valid UTF-8 JSON: depth limit"),
        (b"[1, 2]", "DAP body must be a JSON object, got a JSON array"),
        (b'"request"', "DAP body must be a JSON object, got a JSON string"),
        (b"null", "DAP body must be a JSON object, got a JSON null"),
        (b"3.5", "DAP body must be a JSON object, got a JSON number"),
        (b"true", "DAP body must be a JSON object, got a JSON boolean"),
        (b'{"seq": 1}', 'DAP message needs "type" "request", "response" or "event", got no type'),
        (
            b'{"seq": 1, "type": "Request"}',
            'DAP message needs "type" "request", "response" or "event", got type \'Request\'',
        ),
        (
            b'{"seq": 1, "type": {"a": 1}}',
            'DAP message needs "type" "request", "response" or "event", got a JSON object as type',
        ),
    ],
)
def test_bad_bodies_are_skipped_and_the_stream_goes_on(body: bytes, message: str) -> None:
    framer = DapFramer()
    framer.receive_data(encode_message(body) + encode_message(MSG))
    with pytest.raises(DapFramingError, match=f"^{re.escape(message)}") as info:
        framer.next_message()
    assert not info.value.fatal
    assert framer.trailing == encode_message(MSG)
    assert drain(framer) == [MSG]


def test_next_raw_checks_the_body_like_next_message() -> None:
    framer = DapFramer()
    framer.receive_data(encode_message(b"[]") + encode_message(MSG))
    with pytest.raises(DapFramingError, match="JSON object") as info:
        framer.next_raw()
    assert not info.value.fatal
    assert framer.next_raw() == orjson.dumps(MSG)


# -- properties -------------------------------------------------------------------------------

json_scalars = (
    st.none()
    | st.booleans()
    | st.integers(-(2**63), 2**64 - 1)
    | st.floats(allow_nan=False, allow_infinity=False)
    | st.text(max_size=20)
)
json_values = st.recursive(
    json_scalars,
    lambda children: (
        st.lists(children, max_size=4) | st.dictionaries(st.text(max_size=8), children, max_size=4)
    ),
    max_leaves=20,
)
messages = st.builds(
    lambda extra, kind: {**extra, "type": kind},
    st.dictionaries(st.text(max_size=10), json_values, max_size=5),
    st.sampled_from(["request", "response", "event"]),
)

# Streams that look like DAP often enough to reach every branch: valid frames, frames around
# arbitrary bodies, header fragments and raw garbage, concatenated.
stream_pieces = st.one_of(
    messages.map(encode_message),
    st.binary(max_size=30).map(encode_message),
    st.sampled_from(
        [
            b"Content-Length: ",
            b"content-length:",
            b"Content-Length: 2\r\n\r\n{}",
            b"\r\n",
            b"\r\n\r\n",
            b"\r",
            b"0",
            b"7",
            b"12",
            b"-1",
            b"X-Y: z",
            b"{",
            b'"type":"event"}',
            b":",
        ]
    ),
    st.binary(max_size=20),
)
streams = st.lists(stream_pieces, max_size=12).map(b"".join)


def outcomes(chunks: list[bytes], *, eof: bool) -> list[tuple[Any, ...]]:
    """Everything a framer with small limits makes of ``chunks``; only DapFramingError may escape."""
    framer = DapFramer(max_header_bytes=64, max_body_bytes=128)
    out: list[tuple[Any, ...]] = []
    for chunk in [*chunks, b""] if eof else chunks:
        framer.receive_data(chunk)
        while True:
            try:
                raw = framer.next_raw()
            except DapFramingError as exc:
                out.append(("error", str(exc), exc.fatal))
                if exc.fatal:
                    return out
                continue
            if raw is None:
                break
            out.append(("message", raw))
    out.append(("rest", framer.trailing, framer.at_eof))
    return out


@given(st.binary(max_size=300), st.booleans())
def test_arbitrary_bytes_raise_only_framing_errors(data: bytes, eof: bool) -> None:
    outcomes([data], eof=eof)


@given(streams, st.booleans())
def test_dap_like_streams_raise_only_framing_errors(data: bytes, eof: bool) -> None:
    outcomes([data], eof=eof)


@given(streams, st.lists(st.integers(0, 400), max_size=8), st.booleans())
def test_chunking_never_changes_the_outcome(data: bytes, cuts: list[int], eof: bool) -> None:
    points = sorted({min(c, len(data)) for c in cuts})
    chunks = [data[a:b] for a, b in zip([0, *points], [*points, len(data)], strict=True)]
    chunks = [c for c in chunks if c]  # b"" would mean EOF
    whole = outcomes([data] if data else [], eof=eof)
    assert outcomes(chunks, eof=eof) == whole
    assert outcomes([data[i : i + 1] for i in range(len(data))], eof=eof) == whole


@given(st.lists(messages, min_size=1, max_size=4))
def test_round_trip_of_arbitrary_messages(batch: list[dict[str, Any]]) -> None:
    data = b"".join(encode_message(m) for m in batch)
    framer = DapFramer()
    framer.receive_data(data)
    assert drain(framer) == batch
    framer = DapFramer()
    for i in range(len(data)):
        framer.receive_data(data[i : i + 1])
    assert drain(framer) == batch
