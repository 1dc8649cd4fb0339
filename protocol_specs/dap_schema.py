"""Validation against the official DAP JSON schema, vendored unchanged in ``schema/``.

``validate_message`` checks a message against the schema's definition for it: ``<Command>Request``,
``<Command>Response`` or ``<Event>Event`` (``ErrorResponse`` for a failed response); messages the
schema does not define (debugpy's own events such as ``debugpySockets``) are checked against the base
``Request``/``Response``/``Event``. ``jsonschema`` is imported lazily: it is a test dependency.
"""

from __future__ import annotations

import functools
import json
from pathlib import Path
from typing import Any

__all__ = ["SCHEMA_PATH", "SchemaViolation", "definition_for", "validate_message"]

SCHEMA_PATH = Path(__file__).resolve().parent / "schema" / "debugAdapterProtocol.json"


class SchemaViolation(ValueError):
    pass


@functools.cache
def _schema() -> dict[str, Any]:
    return json.loads(SCHEMA_PATH.read_text())  # type: ignore[no-any-return]


def definition_for(message: dict[str, Any]) -> str:
    kind = message.get("type")
    definitions = _schema()["definitions"]
    if kind == "event":
        name = str(message.get("event", ""))
        candidate = name[:1].upper() + name[1:] + "Event"
        return candidate if candidate in definitions else "Event"
    if kind == "response" and message.get("success") is False:
        return "ErrorResponse"
    command = str(message.get("command", ""))
    suffix = "Response" if kind == "response" else "Request"
    candidate = command[:1].upper() + command[1:] + suffix
    return (
        candidate
        if candidate in definitions
        else (
            "Response"
            if kind == "response"
            else "Request"
            if kind == "request"
            else "ProtocolMessage"
        )
    )


@functools.cache
def _validator(definition: str) -> Any:
    import jsonschema

    schema = {**_schema(), "$ref": f"#/definitions/{definition}"}
    return jsonschema.Draft4Validator(schema)


def validate_message(message: dict[str, Any]) -> None:
    """Raise :class:`SchemaViolation` naming the definition and the first problem."""
    definition = definition_for(message)
    errors = sorted(_validator(definition).iter_errors(message), key=lambda e: list(e.path))
    if errors:
        first = errors[0]
        where = "/".join(str(p) for p in first.absolute_path) or "(message)"
        raise SchemaViolation(f"{definition}: {where}: {first.message}")
