"""Typed views of the DAP messages tether creates or inspects.

Everything else passes through untouched as a dict (or as raw bytes on the relay). Models allow extra
fields so a message tether inspects is still forwarded whole. Constructors for the messages tether
itself sends live here too, so every one of them has a single, schema-checked shape.
"""

from __future__ import annotations

from typing import Any, Literal

import orjson
from pydantic import BaseModel, ConfigDict, TypeAdapter, ValidationError

__all__ = [
    "BAD_ARGUMENTS",
    "ExceptionBreakpointsArguments",
    "FunctionBreakpoint",
    "FunctionBreakpointsArguments",
    "Message",
    "SetBreakpointsArguments",
    "Source",
    "SourceBreakpoint",
    "coalesce_output",
    "error_response",
    "event",
    "parse_arguments",
    "plain_output",
    "request",
    "response",
    "source_key",
]


class _Open(BaseModel):
    model_config = ConfigDict(extra="allow", frozen=True)


class Message(_Open):
    """The envelope every DAP message shares (schema ``ProtocolMessage``)."""

    seq: int = 0
    type: Literal["request", "response", "event"]
    command: str | None = None
    event: str | None = None
    request_seq: int | None = None


class Source(_Open):
    name: str | None = None
    path: str | None = None
    sourceReference: int | None = None


class SourceBreakpoint(_Open):
    line: int
    column: int | None = None
    condition: str | None = None
    hitCondition: str | None = None
    logMessage: str | None = None


class SetBreakpointsArguments(_Open):
    source: Source
    breakpoints: list[SourceBreakpoint] | None = None
    lines: list[int] | None = None
    sourceModified: bool | None = None

    def lines_in_order(self) -> list[int]:
        if self.breakpoints is not None:
            return [bp.line for bp in self.breakpoints]
        return list(self.lines or [])


class FunctionBreakpoint(_Open):
    name: str
    condition: str | None = None
    hitCondition: str | None = None


class FunctionBreakpointsArguments(_Open):
    breakpoints: list[FunctionBreakpoint]


class ExceptionBreakpointsArguments(_Open):
    filters: list[str]
    filterOptions: list[dict[str, Any]] | None = None
    exceptionOptions: list[dict[str, Any]] | None = None


_ARGUMENTS: dict[str, TypeAdapter[Any]] = {
    "setBreakpoints": TypeAdapter(SetBreakpointsArguments),
    "setFunctionBreakpoints": TypeAdapter(FunctionBreakpointsArguments),
    "setExceptionBreakpoints": TypeAdapter(ExceptionBreakpointsArguments),
}

BAD_ARGUMENTS = "Invalid arguments"


def parse_arguments(command: str, arguments: Any) -> Any:
    """Validate the arguments of a request tether inspects; raises ``ValueError`` with a reason."""
    adapter = _ARGUMENTS.get(command)
    if adapter is None:
        return arguments
    try:
        return adapter.validate_python(arguments if arguments is not None else {})
    except ValidationError as exc:
        first = exc.errors()[0]
        where = ".".join(str(p) for p in first["loc"]) or "arguments"
        raise ValueError(f"{BAD_ARGUMENTS} for {command!r}: {where}: {first['msg']}") from None


def source_key(source: Source | dict[str, Any]) -> str:
    """The identity of a breakpoint source: its path, else its reference, else its name."""
    if isinstance(source, dict):
        source = Source.model_validate(source)
    if source.path:
        return source.path
    if source.sourceReference:
        return f"<ref:{source.sourceReference}>"
    return f"<name:{source.name or ''}>"


def request(command: str, arguments: Any = None, *, seq: int = 0) -> dict[str, Any]:
    """A request; ``arguments`` left out when None (the schema has requests without any)."""
    msg: dict[str, Any] = {"seq": seq, "type": "request", "command": command}
    if arguments is not None:
        msg["arguments"] = arguments
    return msg


def response(
    request: dict[str, Any], body: dict[str, Any] | None = None, *, seq: int = 0
) -> dict[str, Any]:
    msg: dict[str, Any] = {
        "seq": seq,
        "type": "response",
        "request_seq": request.get("seq", 0),
        "success": True,
        "command": request.get("command", ""),
    }
    if body is not None:
        msg["body"] = body
    return msg


def error_response(
    request: dict[str, Any], message: str, *, seq: int = 0, show_user: bool = False
) -> dict[str, Any]:
    """An error response; ``body.error`` carries the text so clients that show it can."""
    error: dict[str, Any] = {"id": 1, "format": message}
    if show_user:
        error["showUser"] = True
    return {
        "seq": seq,
        "type": "response",
        "request_seq": request.get("seq", 0) if isinstance(request.get("seq"), int) else 0,
        "success": False,
        "command": str(request.get("command", "")),
        "message": message,
        "body": {"error": error},
    }


def event(name: str, body: dict[str, Any] | None = None, *, seq: int = 0) -> dict[str, Any]:
    msg: dict[str, Any] = {"seq": seq, "type": "event", "event": name}
    if body is not None:
        msg["body"] = body
    return msg


#: the most output text one merged event carries
MAX_MERGED_OUTPUT = 64 * 1024


def plain_output(raw: bytes) -> tuple[str, str] | None:
    """(category, text) of an ``output`` event carrying nothing else (no source, no variables;
    debugpy sends an empty ``source``)."""
    if b'"output"' not in raw:
        return None
    try:
        msg = orjson.loads(raw)
    except orjson.JSONDecodeError:
        return None
    body = msg.get("body") if isinstance(msg, dict) else None
    if msg.get("type") != "event" or msg.get("event") != "output" or not isinstance(body, dict):
        return None
    category, text = body.get("category", "console"), body.get("output")
    if any(body[k] for k in set(body) - {"category", "output"}) or not isinstance(text, str):
        return None
    if not isinstance(category, str) or category == "telemetry":
        return None
    return category, text


def coalesce_output(messages: list[bytes]) -> list[bytes]:
    """Merge runs of consecutive plain ``output`` events of one category into one event each.

    pydevd sends an event per ``write()`` (``print("a", 1)`` is four). Merged, the IDE shows the same
    text in the same order; every other message, and its place among the output, is kept. A merged
    event holds at most :data:`MAX_MERGED_OUTPUT` characters (a longer single event stays whole).
    """
    out: list[bytes] = []
    run: tuple[str, list[str], int, bytes] | None = None  # category, texts, size, first raw

    def close() -> None:
        if run is None:
            return
        category, texts, _size, first = run
        if len(texts) == 1:
            out.append(first)
        else:
            seq = orjson.loads(first).get("seq", 0)
            body = {"category": category, "output": "".join(texts)}
            out.append(orjson.dumps(event("output", body, seq=seq)))

    for raw in messages:
        plain = plain_output(raw)
        if plain is None:
            close()
            run = None
            out.append(raw)
            continue
        category, text = plain
        if run is not None and run[0] == category and run[2] + len(text) <= MAX_MERGED_OUTPUT:
            run[1].append(text)
            run = (category, run[1], run[2] + len(text), run[3])
        else:
            close()
            run = (category, [text], len(text), raw)
    close()
    return out
