"""The relay's side of tunnels (``protocol_specs/tunnels.py``): opening one, knowing it, ending it.

A tunnel is opened on a ``control`` connection (:meth:`Tunnels.open`): the run must be the
caller's and have a worker now, and have fewer than :data:`~protocol_specs.tunnels.MAX_TUNNELS`
open. Its id goes into the attempt's zset of tunnels and, with what to run, into ``to_worker`` as
a ``control`` entry the worker acts on. Its two links are ordinary run links
(``relay/links.py``) on the tunnel's own streams; the worker's ``exit`` entry closes it
(:meth:`Tunnels.closed`): it stops counting, and its keys expire
:data:`~protocol_specs.tunnels.LINGER` s later.
"""

from __future__ import annotations

import logging
import secrets
import time
from collections.abc import Callable

from protocol_specs import wire
from protocol_specs.runs import RunRecord, RunState
from protocol_specs.tunnels import LINGER, MAX_TUNNELS, TunnelSpec
from protocol_specs.wire import ErrorCode, StreamName

from . import keys
from .store import Store

__all__ = ["Tunnels", "expire_tunnels"]

log = logging.getLogger("tether.relay")

#: how long a worker's word that it keeps an ended attempt's directory lasts (its ``after``
#: link's heartbeats, every 10 s at most, renew it)
HOLD_TTL = 35.0

#: the states in which a worker runs the run's program (a tunnel has somewhere to go)
_LIVE = (RunState.RUNNING, RunState.PAUSED)


class Tunnels:
    def __init__(self, store: Store, *, clock: Callable[[], float] = time.time) -> None:
        self.store = store
        self.clock = clock

    async def open(self, record: RunRecord, spec: TunnelSpec, rid: int) -> wire.AnyFrame:
        """Open a tunnel into ``record``'s worker (the caller may: checked before); the answer.
        An ended run's tunnels go to the worker that still keeps its last attempt's directory
        (:meth:`hold`), if one does."""
        if record.finished and not await self.store.get_bytes(keys.held(record.id)):
            return _error(
                ErrorCode.RUN_FINISHED,
                f"run {record.id} has ended ({record.state.value}) and no worker keeps its "
                "directory any more (a pool keeps its newest runs'; a scheduler's job ends "
                "with its run)",
                rid,
            )
        if record.state not in _LIVE and not record.finished:
            return _error(
                ErrorCode.NOT_ALLOWED,
                f"run {record.id} is {record.state.value}: nothing runs it yet; a tunnel goes to "
                "the worker that runs it (see tether ls)",
                rid,
            )
        key = keys.tunnels(record.id, record.attempt)
        if len(await self.store.zrange_by_score(key, keys.CLOSED / 2, MAX_TUNNELS)) >= MAX_TUNNELS:
            return _error(
                ErrorCode.TOO_MANY_CONNECTIONS,
                f"run {record.id} has {MAX_TUNNELS} tunnels open, the most it may; end one first",
                rid,
            )
        tunnel = secrets.token_hex(6)
        await self.store.zadd(key, tunnel, self.clock())
        control = wire.ControlEntry(
            action="tunnel", detail=tunnel, attempt=record.attempt, data=spec.model_dump()
        )
        await self.store.append(
            keys.stream(record.id, StreamName.TO_WORKER), wire.encode_entry(control)
        )
        log.info("run %s: tunnel %s opened (%s)", record.id, tunnel, spec.describe())
        return wire.TunnelOpened(rid=rid, run=record.id, tunnel=tunnel)

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


def _error(code: ErrorCode, message: str, rid: int) -> wire.Error:
    return wire.Error(code=code, message=message, rid=rid)
