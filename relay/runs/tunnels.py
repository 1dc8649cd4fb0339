"""The relay's side of tunnels (``protocol_specs/wire/tunnels.py``): opening one, knowing it, ending it.

A tunnel is opened on a ``control`` connection (:meth:`Tunnels.open`): the run must be the
caller's and have a worker now, and have fewer than :data:`~protocol_specs.wire.tunnels.MAX_TUNNELS`
open. Its id goes into the attempt's zset of tunnels and, with what to run, into ``to_worker`` as
a ``control`` entry the worker acts on, once however often the request is asked again
(``protocol_specs/wire/tunnel_open.py`` decides; each step here is idempotent). Its two links are
ordinary run links (``relay/links/links.py``) on the tunnel's own streams; the worker's ``exit``
entry closes it (:meth:`Tunnels.closed`): it stops counting, and its keys expire
:data:`~protocol_specs.wire.tunnels.LINGER` s later.
"""

from __future__ import annotations

import logging
import secrets
import time
from collections.abc import Awaitable, Callable

from protocol_specs.runs.runs import RunRecord
from protocol_specs.wire import wire
from protocol_specs.wire.tunnel_open import Create, Known, Refuse, Verdict, open_verdict, tunnel_id
from protocol_specs.wire.tunnels import LINGER, MAX_TUNNELS, TunnelSpec
from protocol_specs.wire.wire import StreamName

from ..store import Store, keys

__all__ = ["Tunnels", "expire_tunnels"]

log = logging.getLogger("tether.relay")

#: how long a worker's word that it keeps an ended attempt's directory lasts (its ``after``
#: link's heartbeats, every 10 s at most, renew it)
HOLD_TTL = 35.0


async def _nothing(_tunnel: str) -> None:
    pass


class Tunnels:
    def __init__(self, store: Store, *, clock: Callable[[], float] = time.time) -> None:
        self.store = store
        self.clock = clock

    async def open(
        self,
        record: RunRecord,
        spec: TunnelSpec,
        rid: int,
        *,
        user: str = "",
        key: str = "",
        noting: Callable[[str], Awaitable[None]] = _nothing,
    ) -> wire.AnyFrame:
        """Open a tunnel into ``record``'s worker (``user`` may: checked before); the answer.
        ``key``: the request's, from ``user``: asked again, the same tunnel is answered, and
        nothing is started twice (``protocol_specs/wire/tunnel_open.py``); "": a tunnel of its own.
        ``noting(tunnel)`` records a new tunnel in the audit trail before anything is stored. An
        ended run's tunnels go to the worker that still keeps its last attempt's directory
        (:meth:`hold`), if one does."""
        tunnel = tunnel_id(user, key, spec) if key else secrets.token_hex(6)
        verdict = await self._verdict(record, tunnel, spec.node)
        if isinstance(verdict, Refuse):
            return wire.Error(code=verdict.code, message=verdict.message, rid=rid)
        if isinstance(verdict, Create):
            await noting(tunnel)
            await self._start(record, tunnel, spec)
            log.info("run %s: tunnel %s opened (%s)", record.id, tunnel, spec.describe())
        else:
            if verdict.complete:  # a relay may have died before its last step
                await self._start(record, tunnel, spec)
            log.info("run %s: tunnel %s asked for again", record.id, tunnel)
        return wire.TunnelOpened(rid=rid, run=record.id, tunnel=tunnel)

    async def _verdict(self, record: RunRecord, tunnel: str, node: int) -> Verdict:
        """:func:`open_verdict` on what the store says (only what the verdict needs is read)."""
        score = await self.store.zscore(keys.tunnels(record.id, record.attempt), tunnel)
        if score is not None:
            known = Known.CLOSED if score >= keys.CLOSED / 2 else Known.OPEN
            return open_verdict(record, known=known, node=node)
        for attempt in range(record.attempt - 1, 0, -1):
            if await self.store.zscore(keys.tunnels(record.id, attempt), tunnel) is not None:
                return open_verdict(record, known=Known.NO, earlier=attempt, node=node)
        held = record.finished and bool(await self.store.get_bytes(keys.held(record.id)))
        key = keys.tunnels(record.id, record.attempt)
        open_now = len(await self.store.zrange_by_score(key, keys.CLOSED / 2, MAX_TUNNELS))
        return open_verdict(record, known=Known.NO, held=held, open_now=open_now, node=node)

    async def _start(self, record: RunRecord, tunnel: str, spec: TunnelSpec) -> None:
        """The tunnel into the attempt's set (never moved back from closed), then the worker's
        ``control`` entry into ``to_worker``, at most once: each step is a no-op done again."""
        key = keys.tunnels(record.id, record.attempt)
        await self.store.zadd(key, tunnel, self.clock(), only_new=True)
        control = wire.ControlEntry(
            action="tunnel", detail=tunnel, attempt=record.attempt, data=spec.model_dump()
        )
        await self.store.append_once(
            keys.stream(record.id, StreamName.TO_WORKER),
            keys.tunnel_producer(tunnel),
            1,
            wire.encode_entry(control),
        )

    async def hold(self, run_id: str) -> None:
        """A worker keeps ``run_id``'s ended attempt's directory (said again at every heartbeat
        of its ``after`` link; forgotten :data:`HOLD_TTL` s after the last)."""
        key = keys.held(run_id)
        await self.store.set_bytes(key, b"1")
        await self.store.expire(key, HOLD_TTL)

    async def known(self, record: RunRecord, tunnel: str) -> bool:
        """Whether ``tunnel`` was opened for ``record``'s current attempt."""
        key = keys.tunnels(record.id, record.attempt)
        return bool(tunnel) and await self.store.zscore(key, tunnel) is not None

    async def closed(self, run_id: str, attempt: int, tunnel: str) -> None:
        """The worker ended ``tunnel``: it stops counting; its keys go after :data:`LINGER`."""
        await self.store.zadd(keys.tunnels(run_id, attempt), tunnel, keys.CLOSED)
        for key in keys.tunnel_keys(run_id, tunnel):
            await self.store.expire(key, LINGER)


async def expire_tunnels(store: Store, record: RunRecord, seconds: float) -> None:
    """The keys of every tunnel of ``record``'s attempts expire with the run's."""
    for attempt in range(1, record.attempt + 1):
        key = keys.tunnels(record.id, attempt)
        # the closed ones expire already; an open one's worker went without saying
        for tunnel in await store.zrange_by_score(key, keys.CLOSED / 2, 10 * MAX_TUNNELS):
            for tunnel_key in keys.tunnel_keys(record.id, tunnel):
                await store.expire(tunnel_key, min(seconds, LINGER))
        await store.expire(key, seconds)
