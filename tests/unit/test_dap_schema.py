"""The vendored official schema, and the validator every test uses on what tether sends."""

from __future__ import annotations

import hashlib
import json
from pathlib import Path

import pytest

from adapter.core import ADAPTER_CAPABILITIES
from protocol_specs.dap_schema import SCHEMA_PATH, SchemaViolation, definition_for, validate_message

RESEARCH = Path(__file__).resolve().parents[3] / "shared" / "research"


def test_schema_is_vendored_unchanged_with_its_notice() -> None:
    digest = hashlib.sha256(SCHEMA_PATH.read_bytes()).hexdigest()
    assert digest == "ff8ae4c6cfd588a050e9346c35fd104748a27ef4518d1c3268529ca6f8ff5818"  # v1.71.0
    assert (SCHEMA_PATH.parent / "NOTICE.md").exists()


@pytest.mark.parametrize(
    ("message", "definition"),
    [
        (
            {
                "seq": 1,
                "type": "response",
                "request_seq": 1,
                "success": True,
                "command": "initialize",
                "body": ADAPTER_CAPABILITIES,
            },
            "InitializeResponse",
        ),
        (
            {
                "seq": 2,
                "type": "event",
                "event": "stopped",
                "body": {"reason": "breakpoint", "threadId": 1},
            },
            "StoppedEvent",
        ),
        ({"seq": 3, "type": "event", "event": "debugpySockets", "body": {"sockets": []}}, "Event"),
        (
            {
                "seq": 4,
                "type": "response",
                "request_seq": 9,
                "success": False,
                "command": "evaluate",
                "message": "no",
                "body": {"error": {"id": 1, "format": "no"}},
            },
            "ErrorResponse",
        ),
    ],
)
def test_valid_messages(message: dict[str, object], definition: str) -> None:
    assert definition_for(message) == definition
    validate_message(message)


@pytest.mark.parametrize(
    ("message", "needle"),
    [
        ({"seq": 2, "type": "event", "event": "stopped", "body": {"threadId": 1}}, "reason"),
        (
            {
                "seq": 1,
                "type": "response",
                "success": True,
                "command": "threads",
                "body": {"threads": []},
            },
            "request_seq",
        ),
        (
            {
                "seq": 1,
                "type": "response",
                "request_seq": 1,
                "success": True,
                "command": "setBreakpoints",
                "body": {"breakpoints": [{"id": 1}]},
            },
            "verified",
        ),
        ({"seq": 0, "type": "event", "event": "initialized"}, "minimum"),
    ],
)
def test_invalid_messages_are_caught(message: dict[str, object], needle: str) -> None:
    with pytest.raises(SchemaViolation, match=needle):
        validate_message(message)


@pytest.mark.skipif(
    not RESEARCH.is_dir(), reason="shared/research is beside the repository in development and CI"
)
def test_every_message_debugpy_sent_in_the_recorded_session_validates() -> None:
    lines = (RESEARCH / "debugpy_transcript.jsonl").read_text().splitlines()
    sent = [
        json.loads(line)["msg"] for line in lines if json.loads(line)["dir"] == "adapter->client"
    ]
    assert len(sent) > 20
    for message in sent:
        validate_message(message)
