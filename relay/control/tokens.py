"""The control RPC's token requests: mint (``create_token``), list, revoke, and a one-time link
into the web view (``web_login``)."""

from __future__ import annotations

import logging

from protocol_specs.access.auth import Scope
from protocol_specs.access.permissions import Act
from protocol_specs.web.web import CODE_TTL
from protocol_specs.wire import wire
from protocol_specs.wire.wire import ErrorCode

from ..web.sessions import may_log_in
from .context import Conn, Rooms, allow

__all__ = ["create_token", "list_tokens", "revoke_token", "web_login"]

log = logging.getLogger("tether.relay")


async def create_token(rooms: Rooms, conn: Conn, frame: wire.CreateToken) -> wire.AnyFrame:
    """A token for oneself with the ``runs`` scope (``create_token``), or for another user or
    with more scopes (``create_any_token``)."""
    who = conn.who
    user = frame.user or who.user
    others = user != who.user or bool(set(frame.scopes) - {Scope.RUNS})
    allow(who, Act.CREATE_ANY_TOKEN if others else Act.CREATE_TOKEN)
    token, made = await rooms.tokens.create(
        user,
        scopes=sorted(set(frame.scopes)),
        label=frame.label,
        expires_in=frame.expires_in,
        created_by=who.user,
    )
    log.info("token %s for %s created by %s", made.id, user, who)
    return wire.TokenCreated(rid=frame.rid, token=token, info=made.info())


async def web_login(rooms: Rooms, conn: Conn, frame: wire.WebLogin) -> wire.AnyFrame:
    who = conn.who
    held = await rooms.tokens.get(who.token)
    why = "no such token" if held is None else may_log_in(held)
    if held is None or why:
        return wire.Error(code=ErrorCode.FORBIDDEN, message=why, rid=frame.rid)
    code = await rooms.sessions.new_code(held)
    log.info("web login code for %s (token %s)", who.user, who.token)
    return wire.WebCode(rid=frame.rid, code=code, expires_in=CODE_TTL, base=rooms.config.public_url)


async def list_tokens(rooms: Rooms, conn: Conn, frame: wire.ListTokens) -> wire.AnyFrame:
    who = conn.who
    records = await rooms.tokens.list(frame.user if who.admin else who.user)
    return wire.TokenList(rid=frame.rid, tokens=[r.info() for r in records])


async def revoke_token(rooms: Rooms, conn: Conn, frame: wire.RevokeToken) -> wire.AnyFrame:
    who = conn.who
    held = await rooms.tokens.get(frame.id)
    if held is None or held.kind != "user" or not (who.admin or held.user == who.user):
        return wire.Error(
            code=ErrorCode.NO_SUCH_TOKEN,
            message=f"no token {frame.id!r} (or not yours)",
            rid=frame.rid,
        )
    revoked = await rooms.tokens.revoke(frame.id)
    assert revoked is not None
    log.info("token %s of %s revoked by %s", frame.id, held.user, who)
    return wire.TokenList(rid=frame.rid, tokens=[revoked.info()])
