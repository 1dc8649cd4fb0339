"""The web view's sessions and one-time login codes, in the store (``relay/store/keys.py``).

A session names the user token it was opened with, never the token itself: each request looks the
token's record up again, so revoking the token (or its expiry) ends its sessions at once. Sessions
and codes are stored under a SHA-256 of their secret, as tokens are: whoever reads Redis learns no
cookie. A code is taken once (compare-and-set), then deleted.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass

from pydantic import BaseModel, ConfigDict, ValidationError

from protocol_specs.access.auth import Principal, Scope, TokenRecord
from protocol_specs.web.web import CODE_TTL, SESSION_TTL, digest, new_secret

from ..auth import TokenStore
from ..store import Store, keys

__all__ = ["Opened", "Session", "WebSessions", "may_log_in"]

_FIELD = "session"


class Session(BaseModel):
    model_config = ConfigDict(frozen=True, extra="ignore")

    user: str
    token: str  #: the id of the user token it was opened with
    csrf: str
    created_at: float
    expires_at: float


@dataclass(frozen=True)
class Opened:
    """A session just made: its id (the cookie's value, shown nowhere else) and record."""

    id: str
    session: Session


def may_log_in(record: TokenRecord) -> str:
    """Why the holder of this (checked) token may not open a session; ``""``: they may."""
    if record.kind != "user":
        return "only a user's token opens the web view"
    if not {Scope.RUNS, Scope.ADMIN} & set(record.scopes):
        return "this token cannot see runs (it has neither the runs nor the admin scope)"
    return ""


class WebSessions:
    def __init__(
        self, store: Store, tokens: TokenStore, *, clock: Callable[[], float] = time.time
    ) -> None:
        self.store = store
        self.tokens = tokens
        self.clock = clock

    async def open(self, record: TokenRecord) -> Opened:
        session_id = new_secret()
        now = self.clock()
        session = Session(
            user=record.user,
            token=record.id,
            csrf=new_secret(),
            created_at=now,
            expires_at=now + SESSION_TTL,
        )
        key = keys.web_session(digest(session_id))
        await self.store.hset(key, {_FIELD: session.model_dump_json()})
        await self.store.expire(key, SESSION_TTL)
        return Opened(session_id, session)

    async def get(self, session_id: str) -> tuple[Session, Principal] | None:
        """The session and who is on it, if it is still good (its token too)."""
        if not session_id:
            return None
        raw = (await self.store.hgetall(keys.web_session(digest(session_id)))).get(_FIELD)
        if not raw:
            return None
        try:
            session = Session.model_validate_json(raw)
        except ValidationError:  # written by another version: log in again
            return None
        now = self.clock()
        if now >= session.expires_at:
            return None
        record = await self.tokens.get(session.token)
        if record is None or record.revoked_at or (record.expires_at and now >= record.expires_at):
            return None
        if may_log_in(record):
            return None
        return session, Principal.of(record)

    async def close(self, session_id: str) -> None:
        await self.store.delete(keys.web_session(digest(session_id)))

    async def new_code(self, record: TokenRecord) -> str:
        """A code that opens one session as ``record``'s holder, once, within :data:`CODE_TTL`."""
        code = new_secret()
        key = keys.web_code(digest(code))
        until = self.clock() + CODE_TTL
        await self.store.set_versioned(key, _FIELD, f"{record.id} {until}".encode(), 0)
        await self.store.expire(key, CODE_TTL)
        return code

    async def take_code(self, code: str) -> TokenRecord | None:
        """The token record a code was made for, if the code is good and nobody took it before."""
        if not code or len(code) > 100:
            return None
        key = keys.web_code(digest(code))
        raw, version = await self.store.get_versioned(key, _FIELD)
        if not raw or not await self.store.set_versioned(key, _FIELD, b"", version):
            return None
        await self.store.delete(key)
        token_id, _, until = raw.decode().partition(" ")
        try:
            if self.clock() >= float(until):  # the store's expiry, in case it was not applied
                return None
        except ValueError:
            return None
        return await self.tokens.get(token_id)
