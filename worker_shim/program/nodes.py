"""A run that spans nodes, as one node's worker sees it: which node it runs, where the nodes meet.

Theory of operation
-------------------
A run with ``resources.nodes`` N > 1 has one worker per node, each joined to the same attempt over
its own link (``WorkerLink.node``). Node 0's worker claimed the attempt; before its program starts
it picks the *rendezvous*: the address the other nodes reach this host at (the local address of
the route to the relay, as the other nodes reach the relay too; ``TETHER_NODE_ADDR`` overrides
it) and a free TCP port there, and publishes both in its ``started`` status
(``data["rendezvous"]``). The relay hands them to the other nodes as a ``rendezvous`` control
entry of the attempt (``to_worker``); node K >= 1's worker waits for it (:func:`await_rendezvous`)
before starting its program. Every node's program then gets the facts a distributed launcher
expects (:meth:`NodeRole.env`): ``NNODES``, ``NODE_RANK``, ``MASTER_ADDR``, ``MASTER_PORT``, and
torchrun's own option variables (``PET_*``), so a plain ``torchrun --nproc-per-node 2 train.py``
runs across the nodes with a c10d (or static) rendezvous at node 0.

:func:`rendezvous_of` and :meth:`NodeRole.env` are plain decisions; :func:`pick_rendezvous` and
:func:`await_rendezvous` the I/O around them.
"""

from __future__ import annotations

import os
import socket
from collections.abc import AsyncGenerator, AsyncIterable, Awaitable, Callable, Mapping, Sequence
from dataclasses import dataclass, replace
from typing import Any
from urllib.parse import urlsplit

import trio

from protocol_specs.runs.runs import RunRecord
from protocol_specs.session.processes import node_main
from protocol_specs.wire import wire
from protocol_specs.wire.wire import WireError
from relay.client import RunLink

__all__ = [
    "NODE_ADDR_ENV",
    "ONE_NODE",
    "NodeRole",
    "Rendezvous",
    "await_rendezvous",
    "meet",
    "pick_rendezvous",
    "rendezvous_of",
    "taken_first",
]

#: names the address node 0's program is reached at by the other nodes (default: the local
#: address of the route to the relay)
NODE_ADDR_ENV = "TETHER_NODE_ADDR"


@dataclass(frozen=True)
class Rendezvous:
    """Where the nodes of an attempt meet: node 0's address and a port free there."""

    addr: str
    port: int

    def data(self) -> dict[str, Any]:
        return {"addr": self.addr, "port": self.port}

    @property
    def endpoint(self) -> str:
        host = f"[{self.addr}]" if ":" in self.addr else self.addr
        return f"{host}:{self.port}"

    @classmethod
    def of(cls, data: Mapping[str, Any]) -> Rendezvous | None:
        """The rendezvous ``data`` names (None unless it holds a usable address and port)."""
        addr, port = data.get("addr"), data.get("port")
        if not isinstance(addr, str) or not addr or len(addr) > 255:
            return None
        if not isinstance(port, int) or isinstance(port, bool) or not 0 < port < 65536:
            return None
        return cls(addr, port)


@dataclass(frozen=True)
class NodeRole:
    """Which node of its attempt a worker runs (``node`` of ``nodes``), and, once known, the
    rendezvous of the attempt."""

    node: int = 0
    nodes: int = 1
    rendezvous: Rendezvous | None = None
    #: this node's own address as the others reach it (node 0's: the rendezvous's)
    address: str = ""

    @classmethod
    def of(cls, record: RunRecord, node: int = 0) -> NodeRole:
        return cls(node, record.spec.resources.nodes)

    @property
    def spans(self) -> bool:
        """The run spans nodes (its program needs the rendezvous)."""
        return self.nodes > 1

    @property
    def key(self) -> str:
        """The key of the program this node's worker starts."""
        return node_main(self.node)

    def env(self, run_id: str) -> dict[str, str]:
        """What every node's program is told of the others (nothing for a run on one node)."""
        if not self.spans or self.rendezvous is None:
            return {}
        rdzv = self.rendezvous
        facts = {
            "NNODES": str(self.nodes),
            "NODE_RANK": str(self.node),
            "MASTER_ADDR": rdzv.addr,
            "MASTER_PORT": str(rdzv.port),
        }
        torchrun = {  # torchrun's options as its environment variables (``--nnodes`` -> PET_NNODES)
            "PET_NNODES": str(self.nodes),
            "PET_NODE_RANK": str(self.node),
            "PET_MASTER_ADDR": rdzv.addr,
            "PET_MASTER_PORT": str(rdzv.port),
            "PET_RDZV_ENDPOINT": rdzv.endpoint,
            "PET_RDZV_ID": run_id,
            # node 0 serves the endpoint (it picked the port on its own address): said outright,
            # since c10d's guess (the endpoint is one of this host's names) fails where a node's
            # address is not what its hostname resolves to (containers, namespaces, several NICs)
            "PET_RDZV_CONF": f"is_host={int(self.node == 0)}",
        }
        if self.address:  # c10d's workers find rank 0's node at this, not at its FQDN (which
            # may not resolve to an address the other nodes reach: containers, namespaces)
            torchrun["PET_LOCAL_ADDR"] = self.address
        return {
            **facts,
            **torchrun,
            "TETHER_NODE": str(self.node),
            "TETHER_NNODES": str(self.nodes),
        }

    def started_data(self) -> dict[str, Any]:
        """What node 0 adds to its ``started`` status: the rendezvous, for the other nodes."""
        if self.node != 0 or not self.spans or self.rendezvous is None:
            return {}
        return {"rendezvous": self.rendezvous.data()}


#: a run on one node: no rendezvous, nothing added
ONE_NODE = NodeRole()


def rendezvous_of(entry: wire.AnyEntry | None, attempt: int) -> Rendezvous | None:
    """The rendezvous ``entry`` hands node K >= 1 of ``attempt`` (None if it is no such entry,
    or one of another attempt)."""
    if not isinstance(entry, wire.ControlEntry) or entry.action != "rendezvous":
        return None
    if entry.attempt != attempt:
        return None
    return Rendezvous.of(entry.data)


def _ends(entry: wire.AnyEntry | None, attempt: int) -> bool:
    return (
        isinstance(entry, wire.ControlEntry)
        and entry.action == "terminate"
        and entry.attempt in (0, attempt)
    )


def pick_rendezvous(relay_url: str, environ: Mapping[str, str] = os.environ) -> Rendezvous:
    """Node 0's rendezvous: its address as the other nodes reach it (``TETHER_NODE_ADDR``, else
    the local address of the route to the relay's host: a UDP socket connected there sends
    nothing) and a TCP port free on that address now (bound, then released for the program).
    Raises :class:`OSError` if no port can be bound there."""
    addr = environ.get(NODE_ADDR_ENV, "").strip() or _route_to(relay_url)
    family = socket.AF_INET6 if ":" in addr else socket.AF_INET
    with socket.socket(family, socket.SOCK_STREAM) as probe:
        probe.bind((addr, 0))
        port = probe.getsockname()[1]
    return Rendezvous(addr, port)


def _route_to(relay_url: str) -> str:
    """The local address this host reaches ``relay_url``'s host from (loopback if it cannot
    tell: a relay on this host)."""
    parts = urlsplit(relay_url)
    host = parts.hostname or "127.0.0.1"
    try:
        port = parts.port or (443 if parts.scheme in ("wss", "https") else 80)
        infos = socket.getaddrinfo(host, port, type=socket.SOCK_DGRAM)
        family, _type, _proto, _name, address = infos[0]
        with socket.socket(family, socket.SOCK_DGRAM) as udp:
            udp.connect(address)
            return str(udp.getsockname()[0])
    except (OSError, ValueError, IndexError):
        return "127.0.0.1"


async def await_rendezvous(
    link: RunLink, record: RunRecord, say: Callable[[str], None]
) -> tuple[Rendezvous | None, list[wire.Deliver]]:
    """Node K >= 1: wait for the ``rendezvous`` entry of ``record``'s attempt. Returns it (None if
    the attempt was ended first: a ``terminate``, or the run is over) and every delivery taken
    off the link meanwhile, for the session to fold as if it came later."""
    taken: list[wire.Deliver] = []
    if link.run.finished:
        return None, taken
    async for delivery in link.deliveries:
        taken.append(delivery)
        try:
            entry = wire.decode_entry(delivery.entry)
        except WireError:
            continue
        if _ends(entry, record.attempt):
            say(f"run {record.id}: attempt {record.attempt} ended before node 0 started it")
            return None, taken
        found = rendezvous_of(entry, record.attempt)
        if found is not None:
            return found, taken
    return None, taken


async def meet(
    link: RunLink,
    record: RunRecord,
    role: NodeRole,
    say: Callable[[str], None],
    start_failed: Callable[[str], Awaitable[None]],
) -> tuple[NodeRole | None, list[wire.Deliver]]:
    """The attempt's rendezvous, for a run that spans nodes: node 0 picks it (its ``started``
    publishes it), node K >= 1 waits for it, saying so. Returns the role with it (None: the
    attempt ended first, or node 0 cannot listen: ``start_failed(detail)`` was said) and what
    node K took off the link meanwhile (its session folds that first: :func:`taken_first`)."""
    if not role.spans:
        return role, []
    if role.node == 0:
        try:
            rdzv = await trio.to_thread.run_sync(pick_rendezvous, link.endpoint.url)
        except OSError as exc:
            detail = f"cannot pick the nodes' rendezvous port: {exc}"
            await start_failed(detail)
            say(f"run {record.id}: {detail}")
            return None, []
        say(f"run {record.id}: node 0 of {role.nodes}; the nodes meet at {rdzv.endpoint}")
        return replace(role, rendezvous=rdzv, address=rdzv.addr), []
    say(
        f"run {record.id} attempt {record.attempt} node {role.node}: waiting for node 0's "
        "rendezvous (node 0 starts its program first)"
    )
    met, taken = await await_rendezvous(link, record, say)
    if met is None:
        return None, taken
    own = os.environ.get(NODE_ADDR_ENV, "").strip()
    own = own or await trio.to_thread.run_sync(_route_to, link.endpoint.url)
    say(f"run {record.id} node {role.node} at {own}: node 0 is at {met.endpoint}; starting")
    return replace(role, rendezvous=met, address=own), taken


async def taken_first(
    taken: Sequence[wire.Deliver], rest: AsyncIterable[wire.Deliver]
) -> AsyncGenerator[wire.Deliver, None]:
    """``taken`` (deliveries a wait took off the link), then the link's own."""
    for delivery in taken:
        yield delivery
    async for delivery in rest:
        yield delivery
