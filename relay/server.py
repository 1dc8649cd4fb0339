"""The relay: a trio WebSocket server that keeps runs and their DAP traffic in Redis.

Each connection starts with a ``hello`` frame naming its role (see ``protocol_specs/wire/wire.py`` and
``protocol_specs/relay-protocol.md``), and goes through these rooms:

- ``relay/gate.py``: the handshake, the token check, per-user connection caps, revocation;
- ``relay/links/links.py``: ``ide`` and ``worker`` links to one run (publish exactly once, deliver
  from a cursor, woken by ``relay/links/fanout.py``), and ``relay/links/readers.py``: ``logs``
  readers;
- ``relay/control/``: ``control`` requests (submit, cancel, inspect, tokens, blobs) and the
  worker pools' and scheduler backends' ``claim``/``dispatch``, which wait in
  ``relay/runs/claims.py``;
- ``relay/runs/registry.py``: run records and their transitions, each atomic in the store, with
  leases, retries and the queue.

What each credential may do is one table, ``protocol_specs/access/permissions.py``.

The relay keeps no state of its own beyond Redis, so any number of relay processes can serve one
Redis and a relay can be killed at any moment: publishes are stored exactly once per producer,
deliveries are read from Redis after the cursor the peer names, every run record is written by
compare-and-set, and leases and orphaned queue entries are swept by every relay (one wins each).

A malformed frame gets an ``error`` frame and the connection goes on; only a failed handshake
closes it. If Redis fails under a connection, the peer gets ``internal`` and the connection closes
(the peer reconnects and resends). One connection's failure never reaches another's handler
(each runs in its own task under ``websockets``' server nursery).
"""

from __future__ import annotations

import logging
import socket
import time
from collections.abc import Callable
from functools import partial
from ssl import SSLContext

import trio
from websockets.exceptions import ConnectionClosed
from websockets.trio.server import Server, ServerConnection, serve

from protocol_specs.runs.runs import RunRecord
from protocol_specs.web.web import run_path
from protocol_specs.wire import wire
from protocol_specs.wire.wire import ErrorCode, Role

from .auth import TokenStore
from .client import ws_flow
from .config import SERVER_NAME, RelayConfig
from .control import Control, Rooms
from .gate import Gate, Peer
from .gc_policy import keep_heap
from .links.fanout import Fanout
from .links.links import Links
from .links.readers import serve_logs
from .runs.audit import AuditTrail
from .runs.checkpoints import RunFiles
from .runs.claims import Claims
from .runs.registry import Registry
from .runs.webhook import notify_unattended_stop
from .snapshots.blobs import BlobStore, MemoryBlobStore
from .snapshots.trees import CheckedTrees, expand_tree
from .store import Store, StoreError, keys
from .sweeps import Sweeps
from .web.live import serve_live
from .web.server import Web
from .web.sessions import WebSessions

__all__ = ["SERVER_NAME", "Relay", "RelayConfig", "serve_relay", "server_port"]

log = logging.getLogger("tether.relay")

#: the largest message each role may send once it is authenticated (before: ``MAX_HELLO_BYTES``)
_MAX_MESSAGE = {
    Role.CONTROL: wire.MAX_FRAME_BYTES,
    Role.IDE: wire.MAX_RUN_FRAME_BYTES,
    Role.WORKER: wire.MAX_RUN_FRAME_BYTES,
    Role.LOGS: wire.MAX_HELLO_BYTES,
    Role.TUNNEL: wire.MAX_RUN_FRAME_BYTES,
}


class Relay:
    """One relay process's rooms, bound to one :class:`~relay.store.Store` and one blob store."""

    def __init__(
        self,
        store: Store,
        *,
        blobs: BlobStore | None = None,
        config: RelayConfig | None = None,
        clock: Callable[[], float] = time.time,
        background: trio.Nursery | None = None,
        web_base: str = "",
        tls: bool = False,
    ) -> None:
        """``background``: where background work (webhooks) runs (``None``: none is sent);
        ``web_base``: the web view's address, for the links in notices (``""``: unknown);
        ``tls``: whether browsers reach this relay over its own TLS."""
        self.store = store
        self.config = config = config or RelayConfig()
        self.blobs: BlobStore = blobs if blobs is not None else MemoryBlobStore()
        self.background = background
        self.web_base = web_base
        self.fanout = Fanout(store)
        #: connections that ended (``relay/gc_policy.py``: a population that turned over)
        self.ended = 0
        self.registry = Registry(
            store,
            config,
            clock=clock,
            expand=lambda root: expand_tree(self.blobs, root, self.blobs.missing),
        )
        self.claims = Claims(self.registry, consumer=f"relay-{self.fanout.id}")
        self.tokens = TokenStore(store, clock=clock)
        self.audit = AuditTrail(store, entries=config.audit_entries, clock=clock)
        self.gate = Gate(self.tokens, self.registry, self.audit, config, clock=clock)
        self.links = Links(
            self.registry,
            self.fanout,
            self.audit,
            config,
            on_unattended=self._unattended,
            clock=clock,
        )
        self.sweeps = Sweeps(self.registry, config, holder=f"relay-{self.fanout.id}", clock=clock)
        rooms = Rooms(
            self.registry,
            self.claims,
            self.blobs,
            self.tokens,
            self.audit,
            config,
            tunnels=self.links.tunnels,
            sweeps=self.sweeps,
            checked=CheckedTrees(config.blob_grace / 2, self.registry.clock),
            sessions=WebSessions(store, self.tokens, clock=self.registry.clock),
        )
        self.control = Control(rooms)
        self.web = Web(
            self.registry,
            self.control,
            self.sweeps,
            self.tokens,
            self.audit,
            self.gate,
            self.blobs,
            tls=tls,
            public_url=config.public_url,
            max_live=config.max_connections,
            clock=clock,
        )

    async def handle(self, ws: ServerConnection) -> None:
        keep_alive(ws, self.config)
        try:
            if ws in self.web.live:
                await serve_live(self.web, self.fanout, ws, recheck=self.config.recheck)
            else:
                await self._serve(ws)
        finally:
            self.ended += 1

    async def _serve(self, ws: ServerConnection) -> None:
        peer = Peer(ws)
        try:
            admitted = await self.gate.admit(peer)
            if admitted is None:
                return
            hello, who = admitted
            async with self.gate.held(peer, hello, who) as held:
                if not held:
                    return
                ws.protocol.max_message_size = _MAX_MESSAGE[hello.role]
                if hello.role is Role.CONTROL:
                    await self.control.serve(peer, hello, who)
                elif hello.role is Role.LOGS:
                    await serve_logs(self.links, peer, hello, who)
                else:
                    await self.links.serve_run(peer, hello, who)
        except* ConnectionClosed:
            pass  # the peer went away; its stream entries stay in Redis
        except* StoreError as group:
            # Redis is down or restarting: the peer reconnects, resends and resumes
            log.warning("closing connection from %s: %s", peer.source, group.exceptions[0])
            with trio.move_on_after(1):
                try:
                    await peer.fatal(ErrorCode.INTERNAL, "the relay lost its store; reconnect")
                except ConnectionClosed:
                    pass

    async def sweep_forever(self) -> None:
        while True:
            try:
                await self.registry.sweep()
            except StoreError as exc:
                log.warning("lease sweep failed: %s", exc)
            await trio.sleep(self.config.sweep_interval)

    async def collect_blobs(self) -> int:
        """Delete the blobs no live run's snapshot, checkpoints or outputs name (spared: recently stored or asked
        about); how many went."""
        live = await self.registry.live_digests()
        runs = await self.registry.store.zrange_desc(keys.RUNS, 10**9)
        live |= await RunFiles(self.registry.store, self.blobs).named(runs)
        older_than = self.registry.clock() - self.config.blob_grace
        gone = await self.blobs.sweep(live.__contains__, older_than)
        if gone:
            log.info("deleted %d snapshot blobs no live run names", gone)
        return gone

    async def collect_blobs_forever(self) -> None:
        while self.config.blob_gc_interval > 0:
            await trio.sleep(self.config.blob_gc_interval)
            try:
                await self.collect_blobs()
            except (StoreError, OSError) as exc:
                log.warning("blob collection failed: %s", exc)

    def _unattended(self, record: RunRecord, entry: wire.StatusEntry) -> None:
        if self.background is not None:
            # stamped now, on the relay's wall clock, in case the worker's own stamp is unusable
            now = self.registry.clock()
            page = f"{self.web_base}{run_path(record.id)}" if self.web_base else ""
            self.background.start_soon(notify_unattended_stop, record, entry, now, page)


async def serve_relay(
    store: Store,
    *,
    host: str = "127.0.0.1",
    port: int = 0,
    config: RelayConfig | None = None,
    blobs: BlobStore | None = None,
    ssl: SSLContext | None = None,
    task_status: trio.TaskStatus[Server] = trio.TASK_STATUS_IGNORED,
) -> None:
    """Serve the relay until cancelled (over TLS with ``ssl``: ``wss://``);
    ``task_status.started`` gets the websockets ``Server``."""
    ws_flow.apply()
    config = config or RelayConfig()
    listeners = await trio.open_tcp_listeners(port, host=host)
    web_base = ""
    if config.web:
        web_base = config.public_url or _own_base(host, _port_of(listeners), ssl)
    async with trio.open_nursery() as nursery:
        relay = Relay(
            store, blobs=blobs, config=config, background=nursery, web_base=web_base, tls=bool(ssl)
        )
        await nursery.start(relay.fanout.listen)
        await nursery.start(relay.claims.serve)
        nursery.start_soon(relay.sweep_forever)
        nursery.start_soon(relay.gate.recheck_forever)
        nursery.start_soon(relay.collect_blobs_forever)
        nursery.start_soon(relay.sweeps.drive_forever)
        nursery.start_soon(keep_heap, relay.fanout.__len__, lambda: relay.ended)
        server = await nursery.start(
            partial(
                serve,
                relay.handle,
                listeners=listeners,
                compression=None,
                ssl=ssl,
                max_size=wire.MAX_HELLO_BYTES,  # raised per role once the token is checked
                ping_interval=None,  # the kernel's keepalive instead: see keep_alive
                process_request=relay.web.process_request if relay.config.web else None,
                process_response=relay.web.process_response if relay.config.web else None,
            )
        )
        task_status.started(server)


def keep_alive(ws: ServerConnection, config: RelayConfig) -> None:
    """Notice a peer gone without a word (a laptop closed, a network cut) by TCP keepalive: after
    ``ping_interval`` s of silence the kernel probes, and closes the connection once
    ``ping_timeout`` s of probes went unanswered. The relay sends no WebSocket pings of its own:
    with ten thousand idle links they were half its idle CPU (their clients' pings, answered,
    are the other half), while the kernel's probes cost it nothing."""
    stream = ws.stream.transport_stream if isinstance(ws.stream, trio.SSLStream) else ws.stream
    if not isinstance(stream, trio.SocketStream):
        return
    stream.setsockopt(socket.SOL_SOCKET, socket.SO_KEEPALIVE, 1)
    idle = max(1, round(config.ping_interval))
    probes = 3
    for name, value in (
        ("TCP_KEEPIDLE", idle),  # Linux
        ("TCP_KEEPALIVE", idle),  # macOS
        ("TCP_KEEPINTVL", max(1, round(config.ping_timeout / probes))),
        ("TCP_KEEPCNT", probes),
    ):
        if hasattr(socket, name):
            stream.setsockopt(socket.IPPROTO_TCP, getattr(socket, name), value)


def _own_base(host: str, port: int, ssl: SSLContext | None) -> str:
    """The web view's address as this relay listens, when that is one a browser can use (not a
    wildcard: then only ``public_url`` says)."""
    if host in ("", "0.0.0.0", "::"):
        return ""
    name = f"[{host}]" if ":" in host else host
    return f"{'https' if ssl else 'http'}://{name}:{port}"


def server_port(server: Server) -> int:
    return _port_of(server.listeners)


def _port_of(listeners: list[trio.SocketListener]) -> int:
    return int(listeners[0].socket.getsockname()[1])
