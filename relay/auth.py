"""Tokens in the store: created, looked up, listed, revoked. The decisions are in
``protocol_specs.access.auth``; this module only keeps the records (``relay/store/keys.py``:
``tether:token:<id>``).

The relay uses it, and so does ``tether up`` / ``tether token create --redis`` on the relay's host to
make the first token (whoever can write to the store is trusted with everything anyway).
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Literal

from protocol_specs.access.auth import Scope, TokenKind, TokenRecord, new_token, parse_token

from .store import Store, keys

__all__ = ["TokenStore"]


class TokenStore:
    def __init__(self, store: Store, *, clock: Callable[[], float] = time.time) -> None:
        self.store = store
        self.clock = clock

    async def create(
        self,
        user: str,
        *,
        scopes: list[Scope] | None = None,
        label: str = "",
        expires_in: float = 0.0,
        created_by: str = "",
        kind: TokenKind = "user",
        run: str = "",
        attempt: int = 0,
    ) -> tuple[str, TokenRecord]:
        """A new token: ``(token, its record)``. The token itself is stored nowhere."""
        token, token_id, digest = new_token(kind)
        now = self.clock()
        record = TokenRecord(
            id=token_id,
            kind=kind,
            user=user,
            hash=digest,
            scopes=scopes if scopes is not None else [Scope.RUNS],
            label=label,
            created_at=now,
            expires_at=now + expires_in if expires_in else 0.0,
            created_by=created_by,
            run=run,
            attempt=attempt,
        )
        await self.save(record)
        if kind == "user":
            await self.store.zadd(keys.TOKENS, token_id, now)
        else:
            await self.store.expire(keys.token(token_id), max(expires_in, 1.0))
        return token, record

    async def mint_worker(
        self,
        user: str,
        run: str,
        attempt: int,
        ttl: float,
        *,
        kind: Literal["worker", "ticket"] = "worker",
    ) -> str:
        """A worker token good for ``run``'s ``attempt`` only (expiring after ``ttl`` s), or a
        ticket, good only to claim that attempt."""
        token, _ = await self.create(
            user,
            kind=kind,
            scopes=[],
            run=run,
            attempt=attempt,
            expires_in=ttl,
            label=f"{run} attempt {attempt}",
        )
        return token

    async def save(self, record: TokenRecord) -> None:
        await self.store.hset(keys.token(record.id), {"record": record.model_dump_json()})

    async def get(self, token_id: str) -> TokenRecord | None:
        raw = (await self.store.hgetall(keys.token(token_id))).get("record")
        return TokenRecord.model_validate_json(raw) if raw else None

    async def lookup(self, token: str | None) -> TokenRecord | None:
        """The record a presented token names (not yet checked: ``protocol_specs.access.auth.check_token``)."""
        parsed = parse_token(token or "")
        return await self.get(parsed[0]) if parsed else None

    async def list(self, user: str = "") -> list[TokenRecord]:
        """User tokens, oldest first (``user``: only theirs)."""
        out = []
        for token_id in reversed(await self.store.zrange_desc(keys.TOKENS, 10_000)):
            record = await self.get(token_id)
            if record is not None and (not user or record.user == user):
                out.append(record)
        return out

    async def revoke(self, token_id: str) -> TokenRecord | None:
        record = await self.get(token_id)
        if record is None:
            return None
        if not record.revoked_at:
            record = record.model_copy(update={"revoked_at": self.clock()})
            await self.save(record)
        return record

    async def delete(self, token_id: str) -> None:
        """Forget a token entirely (a worker pool's own token when it stops)."""
        await self.store.delete(keys.token(token_id))
        await self.store.zrem(keys.TOKENS, token_id)
