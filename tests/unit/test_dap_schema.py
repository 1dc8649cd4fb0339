"""The vendored official schema, and the validator every test uses on what tether sends."""

from __future__ import annotations

import hashlib
import json
import re
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from protocol_specs.dap.capabilities import DEBUGPY_CAPABILITIES
from protocol_specs.dap.schema import SCHEMA_PATH, SchemaViolation, definition_for, validate_message

RESEARCH = Path(__file__).resolve().parents[3] / "shared" / "research"
TRANSCRIPTS = [
    "debugpy_transcript",
    "debugpy_reconnect_transcript",
    "debugpy_subprocess_transcript",
]
needs_research = pytest.mark.skipif(
    not RESEARCH.is_dir(), reason="shared/research is beside the repository in development and CI"
)


def test_schema_is_vendored_unchanged_with_its_notice() -> None:
    digest = hashlib.sha256(SCHEMA_PATH.read_bytes()).hexdigest()
    assert digest == "ff8ae4c6cfd588a050e9346c35fd104748a27ef4518d1c3268529ca6f8ff5818"  # v1.71.0
    assert (SCHEMA_PATH.parent / "NOTICE.md").exists()


def test_module_imports_and_picks_definitions_without_jsonschema() -> None:
    code = (
        "import sys\n"
        "sys.modules['jsonschema'] = sys.modules['referencing'] = None  # import would fail\n"
        "from protocol_specs.dap.schema import definition_for\n"
        "print(definition_for({'seq': 1, 'type': 'event', 'event': 'stopped'}))\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "StoppedEvent"


@pytest.mark.parametrize(
    ("message", "definition"),
    [
        ({"type": "request", "command": "configurationDone"}, "ConfigurationDoneRequest"),
        ({"type": "response", "command": "stackTrace", "success": True}, "StackTraceResponse"),
        ({"type": "event", "event": "stopped"}, "StoppedEvent"),
        ({"type": "event", "event": "debugpySockets"}, "Event"),
        ({"type": "event", "event": "debugpyWaitingForServer"}, "Event"),
        ({"type": "event", "event": ""}, "Event"),
        ({"type": "event"}, "Event"),
        ({"type": "request", "command": "pydevdSystemInfo"}, "Request"),
        ({"type": "request", "command": "initializeRequestArguments"}, "Request"),
        ({"type": "request", "command": 5}, "Request"),
        ({"type": "response", "command": "error", "success": True}, "Response"),
        ({"type": "response", "command": "evaluate", "success": False}, "Response"),
        (
            {"type": "response", "command": "evaluate", "success": False, "body": {}},
            "ErrorResponse",
        ),
        ({"type": "notification"}, "ProtocolMessage"),
        ({}, "ProtocolMessage"),
    ],
)
def test_definition_for(message: dict[str, Any], definition: str) -> None:
    assert definition_for(message) == definition


VALID = [
    {
        "seq": 1,
        "type": "response",
        "request_seq": 1,
        "success": True,
        "command": "initialize",
        "body": DEBUGPY_CAPABILITIES,
    },
    {
        "seq": 2,
        "type": "event",
        "event": "stopped",
        "body": {"reason": "breakpoint", "threadId": 1, "hitBreakpointIds": [0]},
    },
    {"seq": 2, "type": "event", "event": "stopped", "body": {"reason": "a reason DAP never named"}},
    {"seq": 3, "type": "event", "event": "debugpySockets", "body": {"sockets": []}},
    {"seq": 4, "type": "event", "event": "initialized"},
    {
        "seq": 5,
        "type": "request",
        "command": "attach",
        "arguments": {"connect": {"port": 5678}, "pathMappings": [], "__sessionId": "x"},
    },
    {"seq": 6, "type": "request", "command": "pydevdSystemInfo", "arguments": {}},
    {
        "seq": 7,
        "type": "response",
        "request_seq": 9,
        "success": False,
        "command": "evaluate",
        "message": "no",
        "body": {"error": {"id": 1, "format": "no"}},
    },
    # debugpy's adapter answers errors with a message and no body (ErrorResponse requires one)
    {
        "seq": 8,
        "type": "response",
        "request_seq": 9,
        "success": False,
        "command": "initialize",
        "message": "Session is already initialized",
    },
    {"seq": 9, "type": "response", "request_seq": 2, "success": True, "command": "attach"},
]


@pytest.mark.parametrize("message", VALID, ids=lambda m: definition_for(m))
def test_valid_messages(message: dict[str, Any]) -> None:
    validate_message(message)


@pytest.mark.parametrize(
    ("message", "error", "path"),
    [
        (
            {"seq": 2, "type": "event", "event": "stopped", "body": {"threadId": 1}},
            "event 'stopped' (seq 2) violates StoppedEvent at body: 'reason' is a required property",
            "body",
        ),
        (
            {"seq": 2, "type": "event", "event": "stopped"},
            "event 'stopped' (seq 2) violates StoppedEvent at (message): 'body' is a required"
            " property",
            "",
        ),
        (
            {
                "seq": 1,
                "type": "response",
                "success": True,
                "command": "threads",
                "body": {"threads": []},
            },
            "response 'threads' (seq 1) violates ThreadsResponse at (message): 'request_seq' is a"
            " required property",
            "",
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
            "response 'setBreakpoints' (seq 1) violates SetBreakpointsResponse at"
            " body/breakpoints/0: 'verified' is a required property",
            "body/breakpoints/0",
        ),
        (
            {"seq": 0, "type": "event", "event": "initialized"},
            "event 'initialized' (seq 0) violates InitializedEvent at seq: 0 is less than the"
            " minimum of 1",
            "seq",
        ),
        (
            {"type": "event", "event": "initialized"},
            "event 'initialized' (seq None) violates InitializedEvent at (message): 'seq' is a"
            " required property",
            "",
        ),
        (
            {"seq": 3, "type": "request", "command": "initialize"},
            "request 'initialize' (seq 3) violates InitializeRequest at (message): 'arguments' is a"
            " required property",
            "",
        ),
        (
            {"seq": 3, "type": "request", "command": 5},
            "request (seq 3) violates Request at command: 5 is not of type 'string'",
            "command",
        ),
        (
            {"seq": 3, "type": "response", "request_seq": 2, "success": "yes", "command": "next"},
            "response 'next' (seq 3) violates NextResponse at success: 'yes' is not of type"
            " 'boolean'",
            "success",
        ),
        (
            {
                "seq": 3,
                "type": "response",
                "request_seq": 2,
                "success": False,
                "command": "stackTrace",
                "body": {"error": {"id": "x"}},
            },
            "response 'stackTrace' (seq 3) violates ErrorResponse at body/error:",
            "body/error",
        ),
        (
            {"seq": 3, "type": "event", "event": ["debugpySockets"]},
            "event (seq 3) violates Event at event: ['debugpySockets'] is not of type 'string'",
            "event",
        ),
        (
            {"seq": 3, "type": "notification"},
            'DAP message "type" must be "request", "response" or "event", got \'notification\'',
            "type",
        ),
    ],
)
def test_invalid_messages_are_caught_and_explained(
    message: dict[str, Any], error: str, path: str
) -> None:
    with pytest.raises(SchemaViolation, match=f"^{re.escape(error)}") as info:
        validate_message(message)
    assert info.value.path == path
    assert isinstance(info.value, ValueError)


def test_a_message_that_is_not_an_object_is_a_violation() -> None:
    with pytest.raises(SchemaViolation, match="is a JSON object, got list"):
        validate_message([])  # type: ignore[arg-type]


@needs_research
@pytest.mark.parametrize("name", TRANSCRIPTS)
def test_every_message_of_the_recorded_debugpy_sessions_validates(name: str) -> None:
    records = [json.loads(line) for line in (RESEARCH / f"{name}.jsonl").read_text().splitlines()]
    messages = [r for r in records if r["dir"] in ("adapter->client", "client->adapter")]
    from_debugpy = [r["msg"] for r in messages if r["dir"] == "adapter->client"]
    assert len(from_debugpy) > 20
    assert any(definition_for(m) == "Event" for m in from_debugpy)  # debugpy's own events
    for record in messages:
        validate_message(record["msg"])
