"""The DAP codec fed whole, byte by byte, with trailing data, and with every kind of garbage."""

from __future__ import annotations

from typing import Any

import orjson
import pytest
from hypothesis import given
from hypothesis import strategies as st

from protocol_specs.dap_framing import DapFramer, DapFramingError, encode_message

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


def test_whole_message() -> None:
    framer = DapFramer()
    framer.receive_data(encode_message(MSG))
    assert drain(framer) == [MSG]
    assert framer.trailing == b""


def test_byte_by_byte_and_trailing_data() -> None:
    data = encode_message(MSG) + encode_message({**MSG, "seq": 2}) + b"Content-Len"
    framer = DapFramer()
    got = []
    for i in range(len(data)):
        framer.receive_data(data[i : i + 1])
        got += drain(framer)
    assert [m["seq"] for m in got] == [1, 2]
    assert framer.trailing == b"Content-Len"


def test_raw_body_is_the_exact_bytes() -> None:
    body = b'{"type":"event","event":"output","seq":3}'
    framer = DapFramer()
    framer.receive_data(encode_message(body))
    assert framer.next_raw() == body


def test_other_headers_are_tolerated_and_case_ignored() -> None:
    body = orjson.dumps(MSG)
    framer = DapFramer()
    framer.receive_data(b"content-length: %d\r\nX-Other: 1\r\n\r\n" % len(body) + body)
    assert drain(framer) == [MSG]


@pytest.mark.parametrize(
    ("data", "needle"),
    [
        (b"Content-Length: banana\r\n\r\n", "non-negative integer"),
        (b"Content-Length: -5\r\n\r\n", "non-negative integer"),
        (b"Content-Type: json\r\n\r\n", "no Content-Length"),
        (b"garbage line\r\n\r\n", "malformed DAP header"),
        (b"Content-Length: 2\r\nContent-Length: 3\r\n\r\n", "conflicting"),
        (b"Content-Length: 99999999999\r\n\r\n", "exceeds the limit"),
        (b"X" * 5000, "header exceeds 4096 bytes"),
    ],
)
def test_fatal_errors_say_what_was_wrong(data: bytes, needle: str) -> None:
    framer = DapFramer()
    framer.receive_data(data)
    with pytest.raises(DapFramingError, match=needle) as info:
        framer.next_message()
    assert info.value.fatal
    with pytest.raises(DapFramingError):  # stays broken: the stream cannot be resynchronised
        framer.next_message()


@pytest.mark.parametrize(
    ("body", "needle"),
    [
        (b"not json", "not valid UTF-8 JSON"),
        (b"[1, 2]", "JSON object"),
        (b'{"seq": 1}', '"type"'),
        (b"\xff\xfe", "JSON"),
    ],
)
def test_bad_bodies_are_skipped_and_the_stream_goes_on(body: bytes, needle: str) -> None:
    framer = DapFramer()
    framer.receive_data(encode_message(body) + encode_message(MSG))
    with pytest.raises(DapFramingError, match=needle) as info:
        framer.next_message()
    assert not info.value.fatal
    assert drain(framer) == [MSG]


def test_eof_in_the_middle_is_reported() -> None:
    framer = DapFramer()
    framer.receive_data(encode_message(MSG)[:-3])
    assert framer.next_message() is None
    framer.receive_data(b"")
    with pytest.raises(DapFramingError, match="closed after"):
        framer.next_message()


def test_body_limit_is_configurable() -> None:
    framer = DapFramer(max_body_bytes=10)
    framer.receive_data(encode_message(MSG))
    with pytest.raises(DapFramingError, match="exceeds the limit of 10"):
        framer.next_message()


@given(st.binary(max_size=300))
def test_arbitrary_bytes_raise_only_framing_errors(data: bytes) -> None:
    framer = DapFramer()
    framer.receive_data(data)
    try:
        drain(framer)
    except DapFramingError:
        pass


json_values = st.recursive(
    st.none() | st.booleans() | st.integers(-(2**53), 2**53) | st.text(max_size=20),
    lambda children: (
        st.lists(children, max_size=4) | st.dictionaries(st.text(max_size=8), children, max_size=4)
    ),
    max_leaves=20,
)


@given(
    st.dictionaries(st.text(max_size=10), json_values, max_size=5),
    st.sampled_from(["request", "response", "event"]),
)
def test_round_trip_of_arbitrary_messages(extra: dict[str, Any], kind: str) -> None:
    msg = {**extra, "type": kind}
    framer = DapFramer()
    framer.receive_data(encode_message(msg) * 2)
    assert drain(framer) == [msg, msg]
