"""Where the IDE's messages enter the adapter: what is a request the cores may handle.

A request whose ``arguments`` are not a JSON object (every DAP request that takes arguments
defines them as one; a missing or ``null`` value counts as ``{}``, as in debugpy) is answered
with an error response and goes no further, so nothing past this point meets arguments of another
type. Used by every session core (:class:`adapter.dap.core.AdapterCore`) and by the lobby a new
connection waits in until it says which session it is for (:mod:`adapter.dap.processes`).
"""

from __future__ import annotations

from typing import Any

from protocol_specs.dap import models as dap
from protocol_specs.dap.framing import json_kind

__all__ = ["EDITOR_KEYS", "NO_ARGUMENTS", "check_request", "editor_attach", "garbage_note"]

#: the keys of an editor extension's ``launch`` that say what to submit and how to serve it
#: (``editors/vscode``, ``editors/nvim``): the run has them already; debugpy is not told them (its
#: attach refuses ``noDebug``, and ``tetherArgs`` may hold a secret's value)
EDITOR_KEYS = frozenset(
    {"program", "module", "command", "args", "python", "workdir", "cwd", "env", "backend", "gpus",
     "cpus", "nodes", "gpusPerNode", "cpusPerNode", "mem", "time", "partition", "resources", "runName", "tags", "maxRetries", "processes",
     "keepCheckpoints", "fromCheckpoint",
     "ranks", "debugWhen", "metrics", "profile", "relay", "tetherArgs", "rerunOf", "tetherPort",
     "tetherServe", "tetherJob", "noDebug", "__configurationTarget", "__sessionId"}
)  # fmt: skip

#: requests the DAP schema defines without ``arguments`` (whatever comes is ignored, not forwarded)
NO_ARGUMENTS = frozenset({"threads"})


def check_request(msg: dict[str, Any]) -> dict[str, Any] | str:
    """A request as the handlers may take it (a missing or null ``arguments`` left out), the error
    response to answer it with (``seq`` to fill in), or why it is not a DAP request at all."""
    command = msg.get("command")
    seq = msg.get("seq")
    if not isinstance(seq, int) or isinstance(seq, bool) or seq < 1:
        return "a request without a valid 'seq'"
    if not isinstance(command, str):
        return dap.error_response({"seq": seq}, "Invalid request: 'command' must be a string")
    arguments = msg.get("arguments")
    if arguments is None or (command in NO_ARGUMENTS and not isinstance(arguments, dict)):
        # debugpy takes a missing or null ``arguments`` as {}; nothing past here sees null
        return {k: v for k, v in msg.items() if k != "arguments"}
    if not isinstance(arguments, dict):
        text = (
            f"{dap.BAD_ARGUMENTS} for {command!r}: 'arguments' must be a JSON object, "
            f"not a JSON {json_kind(arguments)}."
        )
        return dap.error_response(msg, text)
    return msg


def garbage_note(reason: str) -> dict[str, Any]:
    """What the debug console is told of a message that is not a DAP request (no ``seq``)."""
    text = f"tether: ignored a malformed DAP message from the IDE: {reason}\n"
    return dap.event("output", {"category": "important", "output": text})


def editor_attach(arguments: dict[str, Any]) -> dict[str, Any]:
    """The attach arguments of an editor extension's launch: without :data:`EDITOR_KEYS`."""
    return {k: v for k, v in arguments.items() if k not in EDITOR_KEYS}
