"""Reaching a relay: where it is (:class:`Endpoint`), the handshake, and what a refusal means.

:func:`open_connection` makes one WebSocket connection, sends ``hello`` and waits for the welcome;
every way that can fail becomes a :class:`RelayError`, so callers handle one exception: a relay's
refusal or the client's own verdict (no relay answering, TLS failed, a bad URL), each an
:class:`~protocol_specs.wire.wire.ErrorCode`.
"""

from __future__ import annotations

import ssl
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from dataclasses import dataclass, field, replace
from typing import Any

import trio
from websockets.exceptions import WebSocketException
from websockets.trio.client import ClientConnection, connect

from protocol_specs.wire import wire
from protocol_specs.wire.wire import ErrorCode

from . import ws_flow

__all__ = [
    "Endpoint",
    "RelayError",
    "Target",
    "endpoint",
    "open_connection",
    "relay_error_of",
]


class RelayError(Exception):
    """The relay refused something, or could not be reached or trusted: ``code`` says which."""

    def __init__(self, code: ErrorCode, message: str) -> None:
        super().__init__(f"{message} [{code}]")
        self.code = code
        self.message = message


def relay_error_of(exc: BaseException) -> RelayError | None:
    """The relay error ``exc`` is, if that is all it is: a :class:`RelayError`, or a group (trio's
    nurseries nest them) whose every leaf is one (the first is returned); else ``None``."""
    if isinstance(exc, RelayError):
        return exc
    if isinstance(exc, BaseExceptionGroup):
        found = [relay_error_of(inner) for inner in exc.exceptions]
        if found and all(error is not None for error in found):
            return found[0]
    return None


@dataclass(frozen=True)
class Endpoint:
    """A relay and how to talk to it: its URL, the token to present, the CA file to verify a
    ``wss://`` relay with (empty: the system's CAs). The token is never shown (``repr``, ``str``)."""

    url: str
    token: str = field(default="", repr=False)
    ca_file: str = ""

    def __str__(self) -> str:
        return self.url

    def with_token(self, token: str) -> Endpoint:
        return replace(self, token=token)

    def connect_options(self) -> dict[str, Any]:
        """``websockets`` options: TLS verified against ``ca_file`` or the system CAs."""
        if not self.url.startswith("wss://"):
            return {}
        return {"ssl": ssl.create_default_context(cafile=self.ca_file or None)}


#: a relay: an :class:`Endpoint`, or just a URL (no token: only for a relay's refusals)
Target = Endpoint | str


def endpoint(target: Target) -> Endpoint:
    return target if isinstance(target, Endpoint) else Endpoint(target)


@asynccontextmanager
async def open_connection(
    target: Target, hello: wire.Hello
) -> AsyncIterator[tuple[ClientConnection, wire.Welcome]]:
    """One connection to the relay, welcomed after ``hello`` (sent with the endpoint's token).

    Raises :class:`RelayError` if the relay refuses, or cannot be reached before the welcome.
    """
    ws_flow.apply()
    ep = endpoint(target)
    url = ep.url
    hello = hello.model_copy(update={"token": ep.token or None})
    welcomed = False
    try:
        async with connect(
            url,
            compression=None,
            max_size=wire.MAX_FRAME_BYTES,
            open_timeout=10,
            **ep.connect_options(),
        ) as ws:
            await ws.send(wire.encode_frame(hello))
            frame = wire.decode_frame(await ws.recv())
            if isinstance(frame, wire.Error):
                raise RelayError(frame.code, frame.message)
            if not isinstance(frame, wire.Welcome):
                raise RelayError(ErrorCode.BAD_FRAME, f"expected 'welcome', got {frame.t!r}")
            welcomed = True
            yield ws, frame
    except WebSocketException as exc:
        if welcomed:
            raise
        # no WebSocket there (a proxy whose relay is down, a load balancer's error page) or the
        # connection closed before the welcome: as unreachable as a refused connection
        raise RelayError(ErrorCode.UNREACHABLE, f"no relay answering at {url}: {exc}") from exc
    except ssl.SSLError as exc:
        raise RelayError(ErrorCode.TLS, f"TLS with the relay at {url} failed: {exc}") from exc
    except trio.BrokenResourceError as exc:
        if isinstance(exc.__cause__, ssl.SSLError):  # trio's SSLStream wraps the handshake's
            error = f"TLS with the relay at {url} failed: {exc.__cause__}"
            raise RelayError(ErrorCode.TLS, error) from exc
        raise RelayError(ErrorCode.UNREACHABLE, f"lost the relay at {url}: {exc}") from exc
    except OSError as exc:
        raise RelayError(ErrorCode.UNREACHABLE, f"cannot reach the relay at {url}: {exc}") from exc
