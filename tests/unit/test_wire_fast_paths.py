"""The hand-checked fast paths for live-traffic frames and DAP entries agree with the models."""

from __future__ import annotations

from typing import Any

import msgpack
import pytest

from protocol_specs.wire import stream_entries, wire
from protocol_specs.wire.wire import MAX_DAP_BODY_BYTES, StreamName, WireError

FRAMES: list[wire.AnyFrame] = [
    wire.Deliver(stream=StreamName.TO_IDE, cursor="1-2", entry=b"\x81\xa1k\xa3dap"),
    wire.Deliver(stream=StreamName.TO_IDE, cursor="", entry=b"x", producer="ide-a", n=3),
    wire.Deliver(stream=StreamName.TO_WORKER, cursor="1-2", entry=b"x", producer="w", n=9),
    wire.Commit(stream=StreamName.TO_WORKER, cursor="1-3", producer="ide-a", n=4),
    wire.Publish(n=7, entry=b"x" * 300),
    wire.Ack(n=3, cursor="5-0", duplicate=True),
    wire.Received(stream=StreamName.LOGS, cursor="9-9"),
]


def _dumped(frame: wire.AnyFrame) -> dict[str, Any]:
    """The model's own dump, as a peer without ``early`` reads it (no publisher named)."""
    fields = frame.model_dump(mode="python")
    if isinstance(frame, wire.Deliver) and not frame.producer and not frame.n:
        del fields["producer"], fields["n"]
    return fields


@pytest.mark.parametrize("frame", FRAMES, ids=lambda f: f"{f.t}-{getattr(f, 'n', '')}")
def test_live_frames_round_trip_as_the_models_do(frame: wire.AnyFrame) -> None:
    data = wire.encode_frame(frame)
    assert msgpack.unpackb(data) == msgpack.unpackb(
        msgpack.packb(_dumped(frame), use_bin_type=True)
    )
    decoded = wire.decode_frame(data)
    assert decoded == frame
    assert type(decoded.t) is wire.FrameType and decoded.model_dump() == frame.model_dump()


def _frame(**raw: Any) -> bytes:
    return msgpack.packb(raw, use_bin_type=True)  # type: ignore[no-any-return]


@pytest.mark.parametrize(
    "raw",
    [
        {"t": "publish", "n": 0, "entry": b"x"},
        {"t": "publish", "n": True, "entry": b"x"},
        {"t": "publish", "n": 1, "entry": "text"},
        {"t": "publish", "n": 1, "entry": b"x", "extra": 1},
        {"t": "deliver", "stream": "elsewhere", "cursor": "1-1", "entry": b"x"},
        {"t": "deliver", "stream": "to_ide", "cursor": 5, "entry": b"x"},
        {"t": "deliver", "stream": ["to_ide"], "cursor": "1-1", "entry": b"x"},
        {"t": "publish", "n": [1], "entry": b"x"},
        {"t": "deliver", "stream": "to_ide", "cursor": "", "entry": b"x", "producer": 1, "n": 1},
        {"t": "deliver", "stream": "to_ide", "cursor": "", "entry": b"x", "producer": "p", "n": -1},
        {"t": "deliver", "stream": "to_ide", "cursor": "1-1", "entry": b"x", "n": 2},
        {"t": "commit", "stream": "to_ide", "cursor": "1-1", "producer": "p", "n": 0},
        {"t": "commit", "stream": "to_ide", "cursor": "1-1", "producer": "p"},
        {"t": "commit", "stream": "logz", "cursor": "1-1", "producer": "p", "n": 1},
        {"t": "commit", "stream": "to_ide", "cursor": 7, "producer": "p", "n": 1},
        {"t": "ack", "n": 1, "cursor": "1-1"},
        {"t": "ack", "n": "1", "cursor": "1-1", "duplicate": False},
    ],
)
def test_odd_live_frames_get_the_models_verdict(raw: dict[str, Any]) -> None:
    """Whatever the fast path does not take, pydantic decides, as it always did (lax: it takes
    ``n=True`` as 1 and a text entry as bytes, and refuses the rest)."""
    try:
        expected: object = wire._FRAME.validate_python(raw)
    except Exception:
        expected = WireError
    try:
        got: object = wire.decode_frame(_frame(**raw))
    except WireError as exc:
        got = WireError if exc.code is wire.ErrorCode.BAD_FRAME else exc
    assert got == expected


def test_plain_dap_entries_decode_as_the_model_does() -> None:
    for entry in (
        wire.DapEntry(body=b'{"seq":1}'),
        wire.DapEntry(origin="a1", body=b"{}", local=True, transient=True),
        wire.DapEntry(body=b"{}", bp_ids=[1, 2]),  # the model's own path
    ):
        decoded = wire.decode_entry(wire.encode_entry(entry))
        assert decoded == entry and decoded.model_dump() == entry.model_dump()


@pytest.mark.parametrize(
    "raw",
    [
        {"k": "dap", "body": b"x" * (MAX_DAP_BODY_BYTES + 1)},
        {"k": "dap", "body": "text"},
        {"k": "dap", "body": b"{}", "origin": 3},
        {"k": "dap", "body": b"{}", "local": 1},
        {"k": "dap", "body": b"{}", "unknown": True},
        {"k": "dap", "body": b"{}", "bp_ids": ["a"]},
        {"k": "dap"},
        {"k": "dap", "body": b"{}", "origin": "", "local": False, "transient": False},
    ],
)
def test_odd_dap_entries_get_the_models_verdict(raw: dict[str, Any]) -> None:
    try:
        expected: object = stream_entries._ENTRY.validate_python(raw)
    except Exception:
        expected = WireError
    try:
        got: object = wire.decode_entry(msgpack.packb(raw, use_bin_type=True))
    except WireError as exc:
        got = WireError if exc.code is wire.ErrorCode.BAD_ENTRY else exc
    assert got == expected
