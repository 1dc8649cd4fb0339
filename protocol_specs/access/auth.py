"""Credentials and who may do what: tokens, scopes, and the relay's refusals, as plain data.

Theory of operation
-------------------
Whoever can send DAP to a worker runs code on it (``evaluate``, ``setVariable``), so every relay
connection names a token in its ``hello`` and the relay decides, per role and per run, whether the
token's holder may have it. Three kinds of token:

- **user tokens** (``tthu_...``) belong to a user name and carry scopes: ``runs`` (submit runs,
  attach an IDE to them, read their logs, cancel them: one's own runs only), ``admin`` (every user's
  runs and tokens) and ``backend`` (a worker pool or scheduler backend: take queued runs, report on
  them). ``tether up`` creates one for the local user; ``tether token create`` others.
- **worker tokens** (``tthw_...``) are minted by the relay when a run's attempt is handed to a worker
  (``claim``) or to a scheduler backend (``dispatch``). One is good for that run and that attempt
  only: once the run moved on to a later attempt, a worker of the earlier one (a zombie a scheduler
  failed to kill) is refused (``stale_attempt``) and can no longer inject anything.
- **tickets** (``ttht_...``) stand in for a worker token where a scheduler shows what a job carries
  to everyone who can see the job (Ray's job list shows each job's runtime environment). A ticket
  is good for one thing: claiming its run's attempt, once its backend saw the job running
  (``report running``) and until the attempt started. The claim's answer carries a worker token,
  which then lives only in the worker's memory; once the attempt started, or ended, the ticket is
  worth nothing (a run over nodes: its nodes K >= 1 join the attempt with it while it runs, each
  answered with a worker token of its own).

A token is ``tth<kind>_<id>_<secret>``. The relay stores the id with a SHA-256 hash of the secret
(256 random bits: a slow password hash adds nothing against guessing, and a stolen hash is useless
for connecting) and compares hashes in constant time. Tokens never appear in logs or error
messages; :func:`describe` is what may be shown.

:func:`check_token` decides who a presented token's holder is; what they may then do is one table,
``protocol_specs/access/permissions.py``. Both are pure functions: the relay performs them, tests step
them directly.
:class:`AuthThrottle` slows down failed authentications per source address.
"""

from __future__ import annotations

import hashlib
import hmac
import re
import secrets
from collections import deque
from dataclasses import dataclass, field
from enum import StrEnum
from typing import Literal

from pydantic import BaseModel, ConfigDict, Field

__all__ = [
    "TOKEN_PATTERN",
    "AuthThrottle",
    "Principal",
    "Refusal",
    "Scope",
    "TokenInfo",
    "TokenKind",
    "TokenRecord",
    "check_token",
    "describe",
    "hash_secret",
    "new_token",
    "parse_token",
]

#: what a token looks like; anything matching this in a log line is a leaked secret
TOKEN_PATTERN = re.compile(r"tth[uwt]_[0-9a-f]{16}_[A-Za-z0-9_-]{43}")
_TOKEN = re.compile(r"^tth([uwt])_([0-9a-f]{16})_([A-Za-z0-9_-]{43})$")


#: what a token is: a user's, a worker's (one attempt), or a ticket (claims one attempt)
TokenKind = Literal["user", "worker", "ticket"]


class Scope(StrEnum):
    RUNS = "runs"  #: submit runs; attach to, read, cancel one's own runs
    ADMIN = "admin"  #: every user's runs and tokens
    BACKEND = "backend"  #: take queued runs (worker pools, scheduler backends), report on them


class TokenInfo(BaseModel):
    """A token as ``tether token list`` shows it: no hash, no secret."""

    model_config = ConfigDict(frozen=True, extra="ignore")

    id: str
    kind: TokenKind
    user: str = Field(min_length=1, max_length=64)
    scopes: list[Scope] = Field(default_factory=list)
    label: str = Field(default="", max_length=200)
    created_at: float = 0.0
    #: 0: never
    expires_at: float = 0.0
    revoked_at: float = 0.0
    created_by: str = ""
    #: worker tokens and tickets: the run and attempt they are good for
    run: str = ""
    attempt: int = 0


class TokenRecord(TokenInfo):
    """What the relay keeps of a token: its public part and the hash of its secret, never the
    token itself."""

    hash: str

    def info(self) -> TokenInfo:
        return TokenInfo.model_validate(self.model_dump(exclude={"hash"}))


@dataclass(frozen=True)
class Principal:
    """Who is on a connection: the checked token's holder."""

    token: str  #: the token's id (safe to log)
    kind: TokenKind
    user: str
    scopes: frozenset[Scope] = frozenset()
    run: str = ""
    attempt: int = 0

    @classmethod
    def of(cls, record: TokenRecord) -> Principal:
        return cls(
            token=record.id,
            kind=record.kind,
            user=record.user,
            scopes=frozenset(record.scopes),
            run=record.run,
            attempt=record.attempt,
        )

    @property
    def admin(self) -> bool:
        return Scope.ADMIN in self.scopes

    def __str__(self) -> str:
        if self.kind != "user":
            return f"{self.kind} of {self.run} attempt {self.attempt} (token {self.token})"
        return f"{self.user} (token {self.token})"


@dataclass(frozen=True)
class Refusal:
    """Why a request is refused: ``code`` is a :class:`protocol_specs.wire.wire.ErrorCode` value."""

    code: str
    message: str


def new_token(kind: TokenKind) -> tuple[str, str, str]:
    """A fresh token: ``(token, id, hash of its secret)``; only the caller ever sees ``token``."""
    token_id = secrets.token_hex(8)
    secret = secrets.token_urlsafe(32)
    return f"tth{kind[0]}_{token_id}_{secret}", token_id, hash_secret(secret)


def hash_secret(secret: str) -> str:
    return hashlib.sha256(secret.encode()).hexdigest()


def parse_token(token: str) -> tuple[str, str] | None:
    """``(id, secret)`` of a well-formed token, else ``None``."""
    m = _TOKEN.match(token)
    return (m.group(2), m.group(3)) if m else None


def describe(token: str) -> str:
    """What may be shown of a token: its id, never its secret."""
    parsed = parse_token(token)
    return f"token {parsed[0]}" if parsed else "a malformed token"


_BAD_TOKEN = Refusal("unauthorized", "the token is not valid (unknown, malformed or mistyped)")


def check_token(token: str | None, record: TokenRecord | None, now: float) -> Principal | Refusal:
    """Whether ``token`` is the one ``record`` describes and is still good at ``now``.

    The secret is compared by hash in constant time. Only a caller who proved to hold the secret
    learns that the token expired or was revoked; anyone else hears it is not valid.
    """
    if not token:
        return Refusal(
            "unauthorized",
            "this relay needs a token: run `tether up` (local), or set TETHER_TOKEN or `token` "
            "in the config file (`tether token create`)",
        )
    parsed = parse_token(token)
    if parsed is None or record is None or record.id != parsed[0]:
        return _BAD_TOKEN
    if not hmac.compare_digest(hash_secret(parsed[1]), record.hash):
        return _BAD_TOKEN
    if record.revoked_at:
        return Refusal("unauthorized", f"token {record.id} was revoked")
    if record.expires_at and now >= record.expires_at:
        return Refusal("unauthorized", f"token {record.id} has expired")
    return Principal.of(record)


@dataclass
class AuthThrottle:
    """Failed authentications per source address, and how long to wait before refusing the next.

    The first ``free`` failures within ``window`` seconds wait ``base`` seconds each; every further
    one waits twice as long as the last, up to ``cap``: guessing gets slower, never faster, and a
    refusal never comes sooner than ``base``. Successful authentications are never delayed, so a
    noisy neighbour on the same address does not slow down a good session.
    """

    free: int = 5
    window: float = 60.0
    base: float = 0.2
    cap: float = 10.0
    #: sources remembered at most (oldest forgotten first): bounded memory under a flood
    max_sources: int = 10_000
    _failures: dict[str, deque[float]] = field(default_factory=dict)

    def failed(self, source: str, now: float) -> tuple[float, int]:
        """Record a failure; ``(seconds to wait before refusing, failures in the window)``."""
        times = self._failures.pop(source, None) or deque()
        while times and times[0] <= now - self.window:
            times.popleft()
        times.append(now)
        if len(times) > 2 * self.free + 20:
            times.popleft()  # enough to stay at the cap; bounded
        self._failures[source] = times
        while len(self._failures) > self.max_sources:
            del self._failures[next(iter(self._failures))]
        over = len(times) - self.free
        delay = self.base if over <= 0 else min(self.cap, self.base * 2.0**over)
        return delay, len(times)

    def throttled(self, count: int) -> bool:
        return count > self.free
