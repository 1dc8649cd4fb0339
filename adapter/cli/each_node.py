"""A read-only tunnel (``stacks``, ``eval``) into every node of a run at once: what each node's
worker printed, or why it did not (``tether stacks``, ``tether eval``).

A run that spans nodes has one worker per node, and each serves the tunnels that name its node
(``TunnelSpec.node``): the ranks of node K are read by node K's worker. The tunnels are opened
and read side by side, so the whole takes as long as the slowest node; one node's failure is its
own entry, said beside the others' answers.
"""

from __future__ import annotations

import io

import trio

from protocol_specs.runs.runs import RunRecord
from protocol_specs.wire import wire
from protocol_specs.wire.tunnel_open import DidNotRun
from protocol_specs.wire.tunnels import TunnelSpec
from relay.client import Endpoint

from .tunnel import open_tunnel_once, run_tunnel

__all__ = ["read_each_node", "read_tunnel"]


async def read_each_node(
    relay: Endpoint, record: RunRecord, spec: TunnelSpec
) -> dict[int, bytes | str]:
    """``spec`` on every node of ``record``'s run (one on a run of one node), by node: its stdout,
    or why it was not read (a ``str``)."""
    got: dict[int, bytes | str] = {}

    async def one(node: int) -> None:
        got[node] = await read_tunnel(relay, record.id, spec.model_copy(update={"node": node}))

    async with trio.open_nursery() as nursery:
        for node in range(record.spec.resources.nodes):
            nursery.start_soon(one, node)
    return dict(sorted(got.items()))


async def read_tunnel(relay: Endpoint, run: str, spec: TunnelSpec) -> bytes | str:
    """What the tunnel ``spec`` printed on its stdout, or why it did not run to its end."""
    got = await open_tunnel_once(relay, run, spec)
    if not isinstance(got, wire.TunnelOpened):
        return got.why if isinstance(got, DidNotRun) else f"the relay was lost ({got.why})"
    out, err = io.BytesIO(), io.BytesIO()
    code, said = await run_tunnel(relay, got, stdin=None, out={1: out, 2: err})
    if said or code:
        return said or err.getvalue().decode(errors="replace").strip() or f"exit {code}"
    return out.getvalue()
