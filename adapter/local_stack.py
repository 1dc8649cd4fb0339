"""The embedded default, in-process: the bundled Redis-compatible server, the relay, a worker pool.

One assembly for ``tether up``, ``tether demo`` and the benchmark.
"""

from __future__ import annotations

import contextlib
import getpass
from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

import trio

if TYPE_CHECKING:
    from relay.client import Endpoint

__all__ = ["LocalStack", "open_local_stack"]


@dataclass(frozen=True)
class LocalStack:
    relay: str  #: ``ws://127.0.0.1:PORT``
    redis: str  #: the store's URL
    user: str  #: the local user, who owns the stack
    #: the local user's token (``runs``, ``admin``, ``backend``): the one passed in if still good
    token: str = field(repr=False)
    #: whether ``token`` was created now (and should be saved)
    minted: bool = False

    @property
    def endpoint(self) -> Endpoint:
        """The relay, with the local user's token."""
        from relay.client import Endpoint

        return Endpoint(self.relay, token=self.token)


@asynccontextmanager
async def open_local_stack(
    data_dir: Path,
    *,
    redis: str | None = None,
    relay_config: Any = None,
    relay_port: int = 0,
    workers: int = 1,
    start_delay: float = 0.0,
    gpus: list[str] | None = None,
    on_worker_event: Callable[[str], None] | None = None,
    token: str = "",
    user: str | None = None,
) -> AsyncIterator[LocalStack]:
    """Run the stack until the block exits; the server's data lives in ``data_dir/redis`` (unless
    ``redis`` names an existing server), snapshot blobs in ``data_dir/blobs``, run directories in
    ``data_dir/worker``.

    ``token`` is the local user's token from an earlier start (kept if the store still knows it);
    otherwise one is created. The worker pool gets a ``backend`` token of its own, deleted when the
    stack stops: it lives in this process's memory only."""
    from protocol_specs.auth import Principal, Scope, check_token
    from relay.auth import TokenStore
    from relay.blobs import FileBlobStore
    from relay.client import Endpoint
    from relay.embedded import run_embedded_server
    from relay.server import serve_relay, server_port
    from relay.store import open_store
    from worker_shim.pool import run_pool

    server_cm = (
        run_embedded_server(data_dir / "redis") if redis is None else contextlib.nullcontext(redis)
    )
    user = user or getpass.getuser()
    async with server_cm as redis_url, open_store(redis_url) as store:
        tokens = TokenStore(store)
        held = check_token(token, await tokens.lookup(token), tokens.clock()) if token else None
        minted = not (isinstance(held, Principal) and held.user == user and held.admin)
        if minted:
            token, _ = await tokens.create(
                user, scopes=list(Scope), label="tether up (local user)", created_by="tether up"
            )
        pool_token, pool_record = await tokens.create(
            f"{user}-pool", scopes=[Scope.BACKEND], label="tether up worker pool"
        )
        async with trio.open_nursery() as nursery:
            server = await nursery.start(
                lambda task_status: serve_relay(
                    store,
                    host="127.0.0.1",
                    port=relay_port,
                    config=relay_config,
                    blobs=FileBlobStore(data_dir / "blobs"),
                    task_status=task_status,
                )
            )
            relay = f"ws://127.0.0.1:{server_port(server)}"
            if workers > 0:
                await nursery.start(
                    lambda task_status: run_pool(
                        Endpoint(relay, token=pool_token),
                        slots=workers,
                        start_delay=start_delay,
                        work_dir=data_dir / "worker",
                        gpus=gpus,
                        on_event=on_worker_event,
                        task_status=task_status,
                    )
                )
            try:
                yield LocalStack(
                    relay=relay, redis=redis_url, user=user, token=token, minted=minted
                )
            finally:
                nursery.cancel_scope.cancel()
                with trio.CancelScope(shield=True), trio.move_on_after(2):
                    with contextlib.suppress(Exception):
                        await tokens.delete(pool_record.id)
