"""Validation against the official DAP JSON schema, vendored unchanged in ``vendored/``.

:func:`validate_message` checks one message against the schema's definition for it
(:func:`definition_for`):

- a request against ``<Command>Request``, a response against ``<Command>Response`` and an event
  against ``<Event>Event`` (first letter upper-cased: ``stackTrace`` -> ``StackTraceResponse``);
- a failed response (``success: false``) against ``ErrorResponse`` when it has a body. Without a
  body, against the base ``Response``: ``ErrorResponse`` requires a body, but debugpy's adapter
  answers errors with only a ``message`` (``debugpy/common/messaging.py`` ``Request.respond``), and
  VS Code accepts that;
- anything the schema does not define, such as debugpy's own ``debugpySockets`` event or a custom
  request, against the base ``Request``/``Response``/``Event``.

The schema is draft-04; its ``"$ref": "#/definitions/..."`` pointers resolve within the vendored
document through a ``referencing`` registry. ``jsonschema`` is imported only when a message is
validated: it is a test dependency, and importing this module must not need it. One validator is
built per definition and cached.
"""

from __future__ import annotations

import functools
import json
from pathlib import Path
from typing import Any

__all__ = ["SCHEMA_PATH", "SchemaViolation", "definition_for", "validate_message"]

SCHEMA_PATH = Path(__file__).resolve().parent / "vendored" / "debugAdapterProtocol.json"
# Base URI the vendored document is registered under (it declares no "id" of its own).
_SCHEMA_URI = "https://microsoft.github.io/debug-adapter-protocol/debugAdapterProtocol.json"
_BASES = {"request": "Request", "response": "Response", "event": "Event"}


class SchemaViolation(ValueError):
    """A message does not match its definition in the DAP schema.

    ``definition`` is the schema definition checked and ``path`` the JSON path of the first
    problem inside the message (``"body/reason"``; ``""`` for the message itself).
    """

    def __init__(self, message: str, *, definition: str = "", path: str = "") -> None:
        super().__init__(message)
        self.definition = definition
        self.path = path


@functools.cache
def _definitions() -> dict[str, Any]:
    schema = json.loads(SCHEMA_PATH.read_text(encoding="utf-8"))
    definitions: dict[str, Any] = schema["definitions"]
    return definitions


def _extends(name: str, base: str) -> bool:
    """Whether definition ``name`` is ``allOf [{"$ref": base}, ...]``, as the schema's messages are."""
    all_of = _definitions()[name].get("allOf") or [{}]
    return bool(all_of[0].get("$ref") == f"#/definitions/{base}")


def definition_for(message: dict[str, Any]) -> str:
    """The name of the schema definition ``message`` is validated against (see the module doc).

    A message whose ``type`` is not ``request``, ``response`` or ``event`` gets the base
    ``ProtocolMessage``, which :func:`validate_message` then reports as a violation.
    """
    kind = message.get("type")
    if not isinstance(kind, str) or kind not in _BASES:
        return "ProtocolMessage"
    base = _BASES[kind]
    if kind == "response" and message.get("success") is False:
        return "ErrorResponse" if "body" in message else base
    name = message.get("event" if kind == "event" else "command")
    if not isinstance(name, str) or not name:
        return base
    candidate = name[:1].upper() + name[1:] + base
    # Only a definition built on the right base counts, so that no name picks an unrelated one
    # (a successful response to a command named "error" is not an ErrorResponse).
    if candidate != "ErrorResponse" and candidate in _definitions() and _extends(candidate, base):
        return candidate
    return base


@functools.cache
def _registry() -> Any:
    from referencing import Registry
    from referencing.jsonschema import DRAFT4

    document = json.loads(SCHEMA_PATH.read_text(encoding="utf-8"))
    return Registry().with_resource(_SCHEMA_URI, DRAFT4.create_resource(document))


@functools.cache
def _validator(definition: str) -> Any:
    import jsonschema

    return jsonschema.Draft4Validator(
        {"$ref": f"{_SCHEMA_URI}#/definitions/{definition}"}, registry=_registry()
    )


def _describe(message: dict[str, Any]) -> str:
    kind = message.get("type")
    name = message.get("event" if kind == "event" else "command")
    what = f"{kind} {name!r}" if isinstance(name, str) else str(kind)
    return f"{what} (seq {message.get('seq')!r})"


def validate_message(message: dict[str, Any]) -> None:
    """Raise :class:`SchemaViolation` naming the message, the definition and the first problem."""
    if not isinstance(message, dict):
        raise SchemaViolation(f"a DAP message is a JSON object, got {type(message).__name__}")
    definition = definition_for(message)
    if definition == "ProtocolMessage":
        raise SchemaViolation(
            f'DAP message "type" must be "request", "response" or "event", got'
            f" {message.get('type')!r}",
            definition=definition,
            path="type",
        )
    from jsonschema.exceptions import best_match

    error = best_match(_validator(definition).iter_errors(message))
    if error is not None:
        path = "/".join(str(p) for p in error.absolute_path)
        raise SchemaViolation(
            f"{_describe(message)} violates {definition} at {path or '(message)'}: {error.message}",
            definition=definition,
            path=path,
        )
