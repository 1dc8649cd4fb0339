"""The relay's door: the ``hello`` handshake, authentication, per-user connection caps, and closing
the connections whose token was revoked or expired meanwhile.

Nothing is served before a connection's token is checked (``protocol_specs/access/auth.py``); what the
holder may then do is decided by ``protocol_specs/access/permissions.py``. Failed authentications are
answered slowly (:class:`~protocol_specs.access.auth.AuthThrottle`); tokens are never logged.
"""

from __future__ import annotations

import logging
import time
from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager
from dataclasses import dataclass, field
from typing import Any

import trio
from websockets.exceptions import ConnectionClosed
from websockets.protocol import State
from websockets.trio.server import ServerConnection

from protocol_specs.access.audit import AuditRole
from protocol_specs.access.auth import AuthThrottle, Principal, Refusal, check_token
from protocol_specs.wire import wire
from protocol_specs.wire.tunnels import MAX_TUNNELS
from protocol_specs.wire.wire import ErrorCode, Role, WireError

from .auth import TokenStore
from .config import RelayConfig
from .runs.audit import AuditTrail
from .runs.registry import Registry
from .store import StoreError

__all__ = ["HANDSHAKE_TIMEOUT", "Gate", "Peer"]

log = logging.getLogger("tether.relay")

HANDSHAKE_TIMEOUT = 10.0
#: the shortest pause between two looks at the open connections' tokens
MIN_RECHECK = 0.2


@dataclass(eq=False)
class Peer:
    """One WebSocket connection, with the address it came from (read once: a closed socket has
    none) and the errors it may be sent."""

    ws: ServerConnection
    source: str = field(init=False)

    def __post_init__(self) -> None:
        address = self.ws.remote_address
        try:
            self.source = f"{address[0]}:{address[1]}"
        except (TypeError, IndexError):
            self.source = str(address)

    @property
    def open(self) -> bool:
        return self.ws.state is State.OPEN

    async def fatal(self, code: ErrorCode, message: str) -> None:
        """An error frame marked fatal, then the close."""
        log.info("closing connection from %s: %s: %s", self.source, code.value, message)
        await self.ws.send(wire.encode_frame(wire.Error(code=code, message=message, fatal=True)))
        await self.ws.aclose(1008, message[:120])

    async def error(self, code: ErrorCode, message: str, **ref: Any) -> None:
        log.info("error to %s: %s: %s", self.source, code.value, message)
        await self.ws.send(wire.encode_frame(wire.Error(code=code, message=message, **ref)))

    async def refuse(self, refusal: Refusal) -> None:
        await self.fatal(ErrorCode(refusal.code), refusal.message)


class Gate:
    """Admits connections and keeps count of them."""

    def __init__(
        self,
        tokens: TokenStore,
        registry: Registry,
        audit: AuditTrail,
        config: RelayConfig,
        *,
        clock: Callable[[], float] = time.time,
    ) -> None:
        self.tokens = tokens
        self.registry = registry
        self.audit = audit
        self.config = config
        self.clock = clock
        self.throttle = AuthThrottle(free=config.auth_free, base=config.auth_delay)
        #: open connections per slot (a user's control connections, a user's run and logs
        #: connections, a worker token's connections) on this relay process
        self.connections: dict[str, int] = {}
        #: open connections by the token they presented (looked at again by ``recheck_forever``)
        self.holders: dict[str, set[Peer]] = {}

    async def admit(self, peer: Peer) -> tuple[wire.Hello, Principal] | None:
        """The connection's ``hello`` and its checked holder; ``None`` once it was refused."""
        hello = await self._handshake(peer)
        if hello is None:
            return None
        who = await self._authenticate(peer, hello)
        return None if who is None else (hello, who)

    @asynccontextmanager
    async def held(self, peer: Peer, hello: wire.Hello, who: Principal) -> AsyncIterator[bool]:
        """Count the connection in its slot while it lasts; ``False`` (after refusing it) if the
        slot is full. Control connections of a user are counted apart from their IDE and logs
        links, so idle links never lock the user's CLI out."""
        tunnel = hello.link.tunnel if hello.link else ""
        if who.kind == "worker" and tunnel:  # a run's tunnels are counted apart
            slot, cap, what = f"tunnels:{who.token}", 2 * MAX_TUNNELS, "tunnel "
        elif who.kind != "user":  # a worker token's or a ticket's
            slot, cap, what = f"worker:{who.token}", self.config.max_worker_connections, ""
        elif hello.role is Role.CONTROL:
            slot, cap, what = f"control:{who.user}", self.config.max_control_connections, "control "
        else:
            slot, cap, what = f"links:{who.user}", self.config.max_connections, "IDE and logs "
        if self.connections.get(slot, 0) >= cap:
            holder = f"this {who.kind} token" if who.kind != "user" else str(who)
            await peer.fatal(
                ErrorCode.TOO_MANY_CONNECTIONS,
                f"{holder} has {cap} {what}connections open to this relay already, the most it "
                "allows; close some (another tether process?)",
            )
            yield False
            return
        self.connections[slot] = self.connections.get(slot, 0) + 1
        token = hello.token or ""
        self.holders.setdefault(token, set()).add(peer)
        try:
            yield True
        finally:
            self.connections[slot] -= 1
            if not self.connections[slot]:
                del self.connections[slot]
            holding = self.holders[token]
            holding.discard(peer)
            if not holding:
                del self.holders[token]

    async def _handshake(self, peer: Peer) -> wire.Hello | None:
        with trio.move_on_after(HANDSHAKE_TIMEOUT):
            data = await peer.ws.recv()
            try:
                frame = wire.decode_frame(data)
            except WireError as exc:  # ``unsupported_version`` too: another version's hello
                await peer.fatal(exc.code, exc.message)
                return None
            if not isinstance(frame, wire.Hello):
                await peer.fatal(ErrorCode.HANDSHAKE_REQUIRED, "the first frame must be 'hello'")
                return None
            return frame
        await peer.fatal(
            ErrorCode.HANDSHAKE_REQUIRED, "no 'hello' frame within the handshake timeout"
        )
        return None

    async def _authenticate(self, peer: Peer, hello: wire.Hello) -> Principal | None:
        """The token's holder, or ``None`` after refusing the connection (slowly: see
        :class:`~protocol_specs.access.auth.AuthThrottle`). The token itself is never logged."""
        got = check_token(hello.token, await self.tokens.lookup(hello.token), self.clock())
        if isinstance(got, Principal):
            return got
        source = peer.source.rpartition(":")[0]
        delay, count = self.throttle.failed(source, trio.current_time())
        code, message = ErrorCode(got.code), got.message
        if self.throttle.throttled(count):
            code = ErrorCode.TOO_MANY_FAILURES
            message = (
                f"{message}; {count} failed authentications from {source} in the last minute, "
                f"so each refusal now waits {delay:g} s"
            )
        await trio.sleep(delay)
        record = await self.registry.load(hello.run) if hello.run else None
        if record is not None:
            await self.audit.refused(
                record,
                None,
                request=f"open {hello.role.value}",
                code=code.value,
                message=message,
                source=peer.source,
                role=AuditRole(hello.role),
                client=hello.client,
            )
        await peer.fatal(code, message)
        return None

    async def recheck_forever(self) -> None:
        """Every ``config.recheck`` seconds, look again at each token an open connection presented
        (once per token, however many connections hold it) and close the connections of one that
        was revoked or expired meanwhile. Idle connections send nothing that could trigger it."""
        while True:
            await trio.sleep(max(self.config.recheck, MIN_RECHECK))
            for token, holding in list(self.holders.items()):
                try:
                    got = check_token(token, await self.tokens.lookup(token), self.clock())
                except StoreError as exc:
                    log.warning("cannot look at open connections' tokens again: %s", exc)
                    break
                if isinstance(got, Principal):
                    continue
                async with trio.open_nursery() as closing:
                    for peer in list(holding):
                        closing.start_soon(_close_refused, peer, got)


async def _close_refused(peer: Peer, refusal: Refusal) -> None:
    with trio.move_on_after(HANDSHAKE_TIMEOUT):
        try:
            await peer.refuse(refusal)
        except ConnectionClosed:
            pass
