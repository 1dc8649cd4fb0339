"""Tokens for tests that talk to an in-process relay: made in its store, as `tether up` does."""

from __future__ import annotations

from protocol_specs.access.auth import Scope
from relay.auth import TokenStore
from relay.client import Endpoint, Target, endpoint
from relay.store import Store


async def user_endpoint(
    store: Store, url: Target, user: str = "me", scopes: list[Scope] | None = None
) -> Endpoint:
    """``url`` with a fresh token of ``user`` (default scopes: all, like `tether up`'s user)."""
    token, _ = await TokenStore(store).create(user, scopes=scopes or list(Scope))
    return endpoint(url).with_token(token)


async def worker_endpoint(
    store: Store, url: Target, run: str, attempt: int = 1, user: str = "me"
) -> Endpoint:
    """``url`` with a worker token for ``run``'s ``attempt``, as the relay mints at a claim."""
    token = await TokenStore(store).mint_worker(user, run, attempt, ttl=3600)
    return endpoint(url).with_token(token)
