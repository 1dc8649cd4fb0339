"""The pinned debugpy capabilities match debugpy's own code and what it was seen to send."""

from __future__ import annotations

import ast
import copy
import json
import re
from pathlib import Path
from typing import Any

import debugpy
import pytest
from hypothesis import given
from hypothesis import strategies as st

from protocol_specs.dap.capabilities import (
    DEBUGPY_CAPABILITIES,
    DEBUGPY_REQUESTS,
    DEBUGPY_VERSION,
    capabilities_delta,
    debugpy_answers,
)
from protocol_specs.dap.schema import validate_message

RESEARCH = Path(__file__).resolve().parents[3] / "shared" / "research"
DEBUGPY_DIR = Path(debugpy.__file__).resolve().parent


def test_the_installed_debugpy_is_the_pinned_one() -> None:
    assert debugpy.__version__ == DEBUGPY_VERSION == "1.8.22"


def _initialize_body_in_debugpy_source() -> dict[str, Any]:
    """The dict literal ``Client.initialize_request`` returns, in debugpy/adapter/clients.py."""
    tree = ast.parse((DEBUGPY_DIR / "adapter" / "clients.py").read_text(encoding="utf-8"))
    handler = next(
        node
        for node in ast.walk(tree)
        if isinstance(node, ast.FunctionDef) and node.name == "initialize_request"
    )
    names: dict[str, Any] = {}
    body: dict[str, Any] | None = None
    for node in ast.walk(handler):
        if isinstance(node, ast.Assign) and isinstance(node.value, ast.List):
            (target,) = node.targets
            assert isinstance(target, ast.Name)
            names[target.id] = ast.literal_eval(node.value)
        if isinstance(node, ast.Return) and isinstance(node.value, ast.Dict):
            body = {
                ast.literal_eval(k): names[v.id] if isinstance(v, ast.Name) else ast.literal_eval(v)
                for k, v in zip(node.value.keys, node.value.values, strict=True)
                if k is not None
            }
    assert body is not None
    return body


def test_capabilities_are_those_in_debugpy_source() -> None:
    body = _initialize_body_in_debugpy_source()
    assert body == DEBUGPY_CAPABILITIES
    assert list(body) == list(DEBUGPY_CAPABILITIES)  # same order, so the same bytes on the wire


@pytest.mark.skipif(not RESEARCH.is_dir(), reason="shared/research is beside the repository")
def test_capabilities_are_those_debugpy_was_seen_to_send() -> None:
    lines = (RESEARCH / "debugpy_transcript.jsonl").read_text().splitlines()
    (observed,) = [
        record["msg"]["body"]
        for record in map(json.loads, lines)
        if record["dir"] == "adapter->client" and record["msg"].get("command") == "initialize"
    ]
    assert observed == DEBUGPY_CAPABILITIES


def test_capabilities_are_a_valid_initialize_response_body() -> None:
    validate_message(
        {
            "seq": 4,
            "type": "response",
            "request_seq": 1,
            "success": True,
            "command": "initialize",
            "body": DEBUGPY_CAPABILITIES,
        }
    )
    # The misspelling is debugpy's (research/dap.md section 2.5); the pin keeps it as debugpy sends it.
    assert DEBUGPY_CAPABILITIES["supportsTerminateDebuggee"] is True
    assert "supportTerminateDebuggee" not in DEBUGPY_CAPABILITIES


def test_requests_debugpy_answers_are_its_handlers() -> None:
    pydevd = (
        DEBUGPY_DIR
        / "_vendored"
        / "pydevd"
        / "_pydevd_bundle"
        / "pydevd_process_net_command_json.py"
    ).read_text(encoding="utf-8")
    adapter = (DEBUGPY_DIR / "adapter" / "clients.py").read_text(encoding="utf-8")
    handlers = set(re.findall(r"def on_(\w+)_request\(", pydevd))
    handlers |= {name.lower() for name in re.findall(r"def (\w+)_request\(", adapter)}
    assert handlers == DEBUGPY_REQUESTS


@pytest.mark.parametrize(
    ("command", "answered"),
    [
        ("stackTrace", True),
        ("configurationDone", True),
        ("STACKTRACE", True),
        ("debugpySystemInfo", True),
        ("loadedSources", False),
        ("cancel", False),
        ("restart", False),
        ("", False),
    ],
)
def test_debugpy_answers(command: str, answered: bool) -> None:
    assert debugpy_answers(command) is answered


def test_capabilities_delta_cases() -> None:
    pinned = copy.deepcopy(DEBUGPY_CAPABILITIES)
    assert capabilities_delta(pinned, copy.deepcopy(pinned)) == {}
    actual = copy.deepcopy(pinned)
    actual["supportsLogPoints"] = False
    actual["supportsANSIStyling"] = True
    del actual["supportsGotoTargetsRequest"]
    del actual["exceptionBreakpointFilters"]
    actual["completionTriggerCharacters"] = ["."]
    assert capabilities_delta(pinned, actual) == {
        "supportsLogPoints": False,
        "supportsANSIStyling": True,
        "completionTriggerCharacters": ["."],
        "supportsGotoTargetsRequest": False,
        "exceptionBreakpointFilters": [],
    }
    assert pinned == DEBUGPY_CAPABILITIES  # inputs untouched
    # A change inside a list sends the whole new list.
    actual = copy.deepcopy(pinned)
    actual["exceptionBreakpointFilters"][1]["default"] = False
    assert capabilities_delta(pinned, actual) == {
        "exceptionBreakpointFilters": actual["exceptionBreakpointFilters"]
    }
    assert capabilities_delta({"pydevd": {"processId": 1}}, {}) == {"pydevd": {}}
    assert capabilities_delta({}, {"x": None}) == {"x": None}


capability_values = st.one_of(
    st.booleans(),
    st.lists(
        st.dictionaries(st.sampled_from(["filter", "label"]), st.text(max_size=3)), max_size=2
    ),
    st.dictionaries(st.sampled_from(["processId"]), st.integers()),
)
capability_sets = st.dictionaries(
    st.sampled_from([*DEBUGPY_CAPABILITIES, "supportsANSIStyling", "pydevd"]),
    capability_values,
)


@given(capability_sets, capability_sets)
def test_merging_the_delta_as_vscode_does_gives_the_actual_capabilities(
    pinned: dict[str, Any], actual: dict[str, Any]
) -> None:
    before = copy.deepcopy((pinned, actual))
    delta = capabilities_delta(pinned, actual)
    assert (pinned, actual) == before
    merged = {**pinned, **delta}  # VS Code's mergeCapabilities: Object.assign
    for key, value in merged.items():
        if key in actual:
            assert value == actual[key]
        else:
            assert not value  # an empty value of the same kind: false, [] or {}
            assert type(value) is type(pinned[key])
    assert (delta == {}) == (pinned == actual)
