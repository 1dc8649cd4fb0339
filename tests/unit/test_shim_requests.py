"""What the worker shim forwards to debugpy from the run's ``to_worker`` stream: well-formed
requests only (anyone holding the user's token can write there; junk must not end the session)."""

from __future__ import annotations

import orjson
import pytest

from protocol_specs.wire.wire import DapEntry
from worker_shim.session.core import request_of


@pytest.mark.parametrize(
    "body",
    [
        b"not json",
        b"[1, 2]",
        b'"a string"',
        orjson.dumps({"type": "event", "event": "output"}),
        orjson.dumps({"type": "request", "seq": 1}),
        orjson.dumps({"type": "request", "seq": "1", "command": "threads"}),
        orjson.dumps({"type": "request", "seq": True, "command": "threads"}),
        orjson.dumps({"type": "request", "seq": 1, "command": 5}),
        orjson.dumps({"type": "request", "seq": 1, "command": "evaluate", "arguments": [1]}),
        orjson.dumps({"type": "request", "seq": 1, "command": "evaluate", "arguments": "x"}),
    ],
)
def test_junk_is_not_forwarded(body: bytes) -> None:
    assert request_of(DapEntry(origin="a", body=body)) is None


def test_well_formed_requests_are() -> None:
    for arguments in ({}, None, {"expression": "1"}):
        msg = {"type": "request", "seq": 3, "command": "evaluate", "arguments": arguments}
        assert request_of(DapEntry(origin="a", body=orjson.dumps(msg))) == msg
    bare = {"type": "request", "seq": 4, "command": "threads"}
    assert request_of(DapEntry(origin="a", body=orjson.dumps(bare))) == bare
