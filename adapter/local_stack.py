"""The embedded default, in-process: the bundled Redis-compatible server, the relay, a worker pool.

One assembly for ``tether up``, ``tether demo`` and the benchmark.
"""

from __future__ import annotations

import contextlib
from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import trio

__all__ = ["LocalStack", "open_local_stack"]


@dataclass(frozen=True)
class LocalStack:
    relay: str  #: ``ws://127.0.0.1:PORT``
    redis: str  #: the store's URL


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
) -> AsyncIterator[LocalStack]:
    """Run the stack until the block exits; the server's data lives in ``data_dir/redis`` (unless
    ``redis`` names an existing server), snapshot blobs in ``data_dir/blobs``, run directories in
    ``data_dir/worker``."""
    from relay.blobs import FileBlobStore
    from relay.embedded import run_embedded_server
    from relay.server import serve_relay, server_port
    from relay.store import open_store
    from worker_shim.pool import run_pool

    server_cm = (
        run_embedded_server(data_dir / "redis") if redis is None else contextlib.nullcontext(redis)
    )
    async with server_cm as redis_url, open_store(redis_url) as store:
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
                        relay,
                        slots=workers,
                        start_delay=start_delay,
                        work_dir=data_dir / "worker",
                        gpus=gpus,
                        on_event=on_worker_event,
                        task_status=task_status,
                    )
                )
            yield LocalStack(relay=relay, redis=redis_url)
            nursery.cancel_scope.cancel()
