"""Logging in to the web view: a one-time code from ``tether ui`` (a control connection's
``web_login``) or a bearer token opens a session (a cookie); failures are throttled per address as
the relay's connections are (``relay/gate.py``), waiting at most :data:`LOGIN_DELAY`."""

from __future__ import annotations

import logging
from collections.abc import Callable

import trio
from websockets.http11 import Response

from protocol_specs.access.auth import AuthThrottle, Principal, TokenRecord, check_token
from protocol_specs.web import web

from ..auth import TokenStore
from .responses import json_answer
from .sessions import WebSessions, may_log_in

__all__ = ["LOGIN_DELAY", "Login"]

log = logging.getLogger("tether.relay.web")

#: the longest a refused login waits (the back-off of failed connections goes higher; a request
#: must be answered within ``websockets``' handshake timeout)
LOGIN_DELAY = 2.0


class Login:
    """Answers the web view's login requests."""

    def __init__(
        self,
        sessions: WebSessions,
        tokens: TokenStore,
        throttle: AuthThrottle,
        clock: Callable[[], float],
    ) -> None:
        self.sessions = sessions
        self.tokens = tokens
        self.throttle = throttle
        self.clock = clock

    async def answer(
        self, req: web.HttpRequest, source: str, *, origin: str, secure: bool
    ) -> Response:
        """The answer to a login request from ``source``: a session cookie, or why not."""
        refusal = web.origin_refusal(req, origin)
        if refusal:
            return json_answer(403, {"error": refusal})
        code = req.header(web.CODE_HEADER)
        bearer = req.header("authorization")
        record = None
        if code:
            record = await self.sessions.take_code(code)
            why = "the link is used up or expired: run `tether ui` again"
            if record is not None:
                why = _record_refusal(record, self.clock())
        elif bearer.lower().startswith("bearer "):
            token = bearer[7:].strip()
            got = check_token(token, await self.tokens.lookup(token), self.clock())
            if isinstance(got, Principal):
                record = await self.tokens.get(got.token)
                why = "" if record is not None else "the token is not valid"
            else:
                why = got.message
        else:
            why = "give a token"
        if record is not None and not why:
            why = may_log_in(record)
        if why or record is None:
            delay, count = self.throttle.failed(source, trio.current_time())
            log.info("web login refused from %s: %s", source, why)
            if self.throttle.throttled(count):
                # no waiting the full back-off here: the handshake's own timeout would drop it
                await trio.sleep(LOGIN_DELAY)
                message = f"{count} failed logins from {source} in the last minute: wait a minute"
                return json_answer(429, {"error": message})
            await trio.sleep(min(delay, LOGIN_DELAY))
            return json_answer(401, {"error": why or "the token is not valid"})
        if previous := web.session_of(req, secure=secure):
            await self.sessions.close(previous)  # replaced: the browser forgets its cookie now
        opened = await self.sessions.open(record)
        log.info("web session opened for %s (token %s) from %s", record.user, record.id, source)
        cookie = web.session_cookie(opened.id, secure=secure)
        return json_answer(200, {"ok": True, "user": record.user}, cookie=cookie)


def _record_refusal(record: TokenRecord, now: float) -> str:
    if record.revoked_at:
        return f"token {record.id} was revoked"
    if record.expires_at and now >= record.expires_at:
        return f"token {record.id} has expired"
    return ""
