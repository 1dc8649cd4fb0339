"""A live relay for the security tests (``test_security_*.py``): on a real Redis-compatible
server, two users (alice and bob) with ``runs`` tokens and a worker pool with a ``backend``
token; ``refusal`` opens a connection the relay must refuse."""

from __future__ import annotations

from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from dataclasses import dataclass

import trio

from protocol_specs.access.auth import Scope
from protocol_specs.runs.spec import RunSpec
from protocol_specs.wire import wire
from protocol_specs.wire.wire import IdeLink, Role, WorkerLink
from relay.auth import TokenStore
from relay.client import Endpoint, RelayError, open_connection, open_control, open_run_link
from relay.server import RelayConfig, serve_relay, server_port
from relay.snapshots.blobs import BlobStore
from relay.store import Store

SPEC = RunSpec(command=["python", "app.py"], workdir="/home/me/project")


@dataclass
class Relay:
    url: str
    store: Store
    alice: Endpoint
    bob: Endpoint
    pool: Endpoint

    def bare(self, token: str = "") -> Endpoint:
        return Endpoint(self.url, token=token)


@asynccontextmanager
async def live_relay(
    store: Store, config: RelayConfig | None = None, blobs: BlobStore | None = None
) -> AsyncIterator[Relay]:
    """A relay on ``store``; ``blobs``: its blob store (else one in memory)."""
    tokens = TokenStore(store)
    async with trio.open_nursery() as nursery:
        server = await nursery.start(
            lambda task_status: serve_relay(
                store, port=0, config=config, blobs=blobs, task_status=task_status
            )
        )
        url = f"ws://127.0.0.1:{server_port(server)}"

        async def user(name: str, *scopes: Scope) -> Endpoint:
            token, _ = await tokens.create(name, scopes=list(scopes))
            return Endpoint(url, token=token)

        yield Relay(
            url,
            store,
            alice=await user("alice", Scope.RUNS),
            bob=await user("bob", Scope.RUNS),
            pool=await user("pool", Scope.BACKEND),
        )
        nursery.cancel_scope.cancel()


async def refusal(target: Endpoint, role: Role = Role.CONTROL, run: str = "") -> RelayError:
    """Open a connection in ``role``; the relay must refuse it."""
    caught: list[RelayError] = []
    with trio.fail_after(20):
        try:
            if role is Role.CONTROL:
                async with open_control(target):
                    pass
            elif role is Role.LOGS:
                async with open_connection(target, wire.Hello(role=role, run=run)):
                    pass
            else:
                link = IdeLink() if role is Role.IDE else WorkerLink()
                async with open_run_link(target, link=link, run=run):
                    pass
        except* RelayError as group:
            caught += _leaves(group)
    assert caught, f"the relay let a {role.value} connection in"
    return caught[0]


def _leaves(group: BaseExceptionGroup[RelayError]) -> list[RelayError]:
    out: list[RelayError] = []
    for exc in group.exceptions:
        out += _leaves(exc) if isinstance(exc, BaseExceptionGroup) else [exc]
    return out


async def submitted(who: Endpoint, spec: RunSpec = SPEC) -> str:
    async with open_control(who) as control:
        return (await control.submit(spec)).id
