"""What a validation error says to a user: the setting by the name they gave it (``--gpus``, a
config key, a sweep file's key), what it must be in plain words, and what they gave. pydantic's own
words ("Input should be less than or equal to 64") name neither the setting nor the value, and
read as a library's, not tether's."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from pydantic import ValidationError
from pydantic_core import ErrorDetails

__all__ = ["field_name", "invalid", "must_be"]

#: pydantic's error type -> what the value must be (``ctx`` fills the braces)
_MUST_BE = {
    "less_than_equal": "at most {le}",
    "less_than": "less than {lt}",
    "greater_than_equal": "at least {ge}",
    "greater_than": "more than {gt}",
    "int_type": "a whole number",
    "int_parsing": "a whole number",
    "int_from_float": "a whole number",
    "float_type": "a number",
    "float_parsing": "a number",
    "bool_type": "true or false",
    "bool_parsing": "true or false",
    "string_type": "text",
    "list_type": "a list",
    "dict_type": "a table of names and values",
    "literal_error": "{expected}",
    "enum": "{expected}",
    "string_too_long": "at most {max_length} characters long",
    "string_too_short": "at least {min_length} characters long",
    "too_long": "at most {max_length} items",
    "too_short": "at least {min_length} items",
    "missing": "given",
    "extra_forbidden": "a known setting (this one is not)",
}


def must_be(err: ErrorDetails) -> str:
    """What the value must be ("at most 64"), or a validator's own sentence."""
    kind = err["type"]
    if kind == "value_error":
        return str(err["msg"]).removeprefix("Value error, ")
    template = _MUST_BE.get(kind)
    if template is None:
        return str(err["msg"]).removeprefix("Input should be ").removeprefix("Value error, ")
    ctx = {k: _number(v) for k, v in (err.get("ctx") or {}).items()}
    try:
        return "must be " + template.format(**ctx)
    except (KeyError, IndexError):
        return str(err["msg"])


def field_name(loc: tuple[int | str, ...], names: Mapping[str, str]) -> str:
    """A field's user-facing name: ``names`` maps a dotted path (``resources.gpus``) or its last
    part to it; list indexes and dict keys after a known path stay with it (``--tag`` for
    ``tags.3``)."""
    parts = [str(p) for p in loc]
    for end in range(len(parts), 0, -1):
        dotted = ".".join(parts[:end])
        if dotted in names:
            return names[dotted]
    return ".".join(parts)


def _number(value: Any) -> Any:
    """``30.0`` as ``30``: a limit reads as the user wrote it."""
    return int(value) if isinstance(value, float) and value.is_integer() else value


def _shown(value: Any) -> str:
    text = repr(value) if isinstance(value, str) else str(_number(value))
    return text if len(text) <= 60 else text[:57] + "..."


def invalid(exc: ValidationError, names: Mapping[str, str] | None = None) -> str:
    """The first problem in ``exc`` on one line: ``--gpus 100: must be at most 64``."""
    err = exc.errors()[0]
    name = field_name(err["loc"], names or {})
    said = must_be(err)
    if err["type"] in ("missing", "extra_forbidden") or isinstance(err["input"], dict | list):
        value = ""
    else:
        value = f" {_shown(err['input'])}"
    if err["type"] == "value_error":
        return f"{name}: {said}" if name else said
    return f"{name}{value}: {said}" if name else f"{_shown(err['input'])}: {said}"
