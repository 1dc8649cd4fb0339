"""How a command's failure reaches the user: a relay's refusal, or a store that cannot be reached,
becomes one line (``SystemExit``), and the exception groups trio raises are flattened to the
errors inside them."""

from __future__ import annotations

from collections.abc import AsyncIterator, Awaitable
from contextlib import AsyncExitStack, asynccontextmanager
from typing import TYPE_CHECKING, TypeVar

from relay.client import RelayError

if TYPE_CHECKING:
    from relay.store import Store

__all__ = ["control_call", "leaves", "relay_error", "store_at"]

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


@asynccontextmanager
async def store_at(url: str) -> AsyncIterator[Store]:
    """The store at ``url`` (``--redis``); a URL it cannot use or a server it cannot reach ends
    the command with why, in one line (what goes wrong later is the caller's)."""
    from relay.store import StoreError, open_store

    async with AsyncExitStack() as stack:
        try:
            store = await stack.enter_async_context(open_store(url))
        except (ValueError, StoreError) as exc:
            raise SystemExit(f"tether: --redis: {exc}") from None
        yield store
