"""The embedded default, in-process: the bundled Redis-compatible server, the relay, a worker pool.

One assembly for ``tether up`` and ``tether demo``.
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

from .errors import store_at

if TYPE_CHECKING:
    from protocol_specs.runs.runs import RunRecord
    from relay.client import Endpoint
    from worker_shim.program.identity import Isolation

__all__ = ["LocalStack", "open_local_stack", "pool_name", "stopping_text"]

#: how long stopping the stack waits for its worker pool to end its programs
POOL_STOP = 20.0


@dataclass(frozen=True)
class LocalStack:
    relay: str  #: ``ws://127.0.0.1:PORT``
    redis: str  #: the store's URL
    user: str  #: the local user, who owns the stack
    #: the local user's token (``runs``, ``admin``, ``backend``): the one passed in if still good
    token: str = field(repr=False)
    #: whether ``token`` was created now (and should be saved)
    minted: bool = False
    #: as whom the pool runs programs (``None``: no pool)
    isolation: Isolation | None = None

    @property
    def endpoint(self) -> Endpoint:
        """The relay, with the local user's token."""
        from relay.client import Endpoint

        return Endpoint(self.relay, token=self.token)


def pool_name() -> str:
    """The name the stack's pool gives its slots (``NAME-0``, ``NAME-1``...)."""
    import socket

    return f"{socket.gethostname()}-pool"


def stopping_text(records: list[RunRecord], pool: str, since: float) -> str:
    """What stopping the stack does to the runs its pool (slots ``pool-N``) held, in one line:
    those it still runs, and those whose attempt it already ended lost (a Ctrl-C reaches the
    pool's tasks too) since the stack started at ``since``, end lost, or go back to the queue
    where they have a retry left; those it preempted as it stopped are queued again; queued runs
    wait for the next start."""
    from protocol_specs.runs.runs import RunState

    lost: list[str] = []
    again: list[str] = []
    preempted: list[str] = []
    for r in records:
        for a in r.attempts:
            if not a.worker.startswith(pool + "-"):
                continue
            held = a.ended_at is None and a.n == r.attempt and not r.finished
            if held and r.state is not RunState.QUEUED:
                (lost if r.failures >= r.spec.max_retries else again).append(r.id)
                break
            if a.ended_at is not None and a.ended_at >= since and a.outcome == "lost":
                (lost if r.finished else again).append(r.id)
                break
            if a.ended_at is not None and a.ended_at >= since and a.outcome == "preempted":
                preempted.append(r.id)  # the pool preempted it as it stopped
                break
    queued = sum(1 for r in records if r.state is RunState.QUEUED) + sum(
        1 for r in records if r.id in again and r.state is not RunState.QUEUED
    )
    said = []
    if len(lost) == 1:
        said.append(f"run {lost[0]} ends lost (`tether rerun {lost[0]}` runs it again)")
    elif lost:
        said.append(f"runs {', '.join(lost)} end lost (`tether rerun RUN` runs one again)")
    if again:
        said.append(f"run{'s' * (len(again) > 1)} {', '.join(again)}: back to the queue (a retry)")
    if preempted:
        said.append(
            f"run{'s' * (len(preempted) > 1)} {', '.join(preempted)}: preempted, back to the "
            "queue (no retry used)"
        )
    if not (lost or again or preempted):
        said.append("no run was running")
    if queued:
        said.append(
            f"{queued} queued run{'s' * (queued > 1)} start{'s' * (queued == 1)} at the next "
            "`tether up`"
        )
    return "; ".join(said)


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
    pool_bounds: tuple[int, int] | None = None,
    allow_tunnels: bool = True,
    isolation: Isolation | None = None,
    nodes: int = 1,
    node_via: list[list[str]] | None = None,
) -> AsyncIterator[LocalStack]:
    """Run the stack until the block exits; the server's data lives in ``data_dir/redis`` (unless
    ``redis`` names an existing server), snapshot blobs in ``data_dir/blobs``, run directories in
    ``data_dir/worker``.

    ``token`` is the local user's token from an earlier start (kept if the store still knows it);
    otherwise one is created. The worker pool gets a ``backend`` token of its own, deleted when the
    stack stops: it lives in this process's memory only."""
    from protocol_specs.access.auth import Principal, Scope, check_token
    from relay.auth import TokenStore
    from relay.client import Endpoint
    from relay.embedded.server import run_embedded_server
    from relay.server import serve_relay, server_port
    from relay.snapshots.blobs import FileBlobStore
    from worker_shim.backends.housekeeping import CACHE_MAX_BYTES, KEEP_RUNS
    from worker_shim.backends.pool import run_pool

    keep_runs, cache_max = pool_bounds or (KEEP_RUNS, CACHE_MAX_BYTES)

    server_cm = (
        run_embedded_server(data_dir / "redis") if redis is None else contextlib.nullcontext(redis)
    )
    user = user or getpass.getuser()
    async with server_cm as redis_url, store_at(redis_url) as store:
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
            # shielded: when the stack is stopped (Ctrl-C, SIGTERM), the relay serves on until
            # the pool has told it what became of its runs; then it is cancelled
            relay_scope = trio.CancelScope(shield=True)

            async def serve(task_status: trio.TaskStatus[Any]) -> None:
                with relay_scope:
                    await serve_relay(
                        store,
                        host="127.0.0.1",
                        port=relay_port,
                        config=relay_config,
                        blobs=FileBlobStore(data_dir / "blobs"),
                        task_status=task_status,
                    )

            server = await nursery.start(serve)
            relay = f"ws://127.0.0.1:{server_port(server)}"
            pool_scope, pool_done = trio.CancelScope(), trio.Event()

            async def pool(task_status: trio.TaskStatus[None]) -> None:
                try:
                    with pool_scope:
                        await run_pool(
                            Endpoint(relay, token=pool_token),
                            slots=workers,
                            name=pool_name(),
                            start_delay=start_delay,
                            work_dir=data_dir / "worker",
                            gpus=gpus,
                            on_event=on_worker_event,
                            keep_runs=keep_runs,
                            cache_max=cache_max,
                            allow_tunnels=allow_tunnels,
                            isolation=isolation,
                            nodes=nodes,
                            node_via=node_via,
                            task_status=task_status,
                        )
                finally:
                    pool_done.set()

            if workers > 0:
                await nursery.start(pool)
            else:
                pool_done.set()
            try:
                yield LocalStack(
                    relay=relay, redis=redis_url, user=user, token=token, minted=minted,
                    isolation=isolation if workers > 0 else None,
                )  # fmt: skip
            finally:
                # the pool first, while the relay still serves: its workers end their programs
                # and tell the relay their attempts are over (no run is left "running")
                pool_scope.cancel()
                with trio.CancelScope(shield=True), trio.move_on_after(POOL_STOP):
                    await pool_done.wait()
                relay_scope.shield = False
                relay_scope.cancel()
                nursery.cancel_scope.cancel()
                with trio.CancelScope(shield=True), trio.move_on_after(2):
                    with contextlib.suppress(Exception):
                        await tokens.delete(pool_record.id)
