"""How a command's failure reaches the user: a relay's refusal becomes one line (``SystemExit``),
and the exception groups trio raises are flattened to the errors inside them."""

from __future__ import annotations

from collections.abc import Awaitable
from typing import TypeVar

from relay.client import RelayError

__all__ = ["control_call", "leaves", "relay_error"]

_T = TypeVar("_T")


async def control_call(call: Awaitable[_T]) -> _T:
    """``call``'s result; a relay's refusal ends the command with its message."""
    try:
        return await call
    except RelayError as exc:
        raise SystemExit(f"tether: {exc.message}") from None


def leaves(exc: BaseException) -> list[BaseException]:
    """The errors in ``exc``, exception groups opened all the way down."""
    if isinstance(exc, BaseExceptionGroup):
        return [leaf for e in exc.exceptions for leaf in leaves(e)]
    return [exc]


def relay_error(exc: BaseException) -> RelayError | None:
    """The relay error a command failed with, if that is all it failed with (no traceback then)."""
    if isinstance(exc, RelayError):
        return exc
    if isinstance(exc, BaseExceptionGroup):
        found = [relay_error(e) for e in exc.exceptions]
        if found and all(found):
            return found[0]
    return None
