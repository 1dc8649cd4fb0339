"""An ended attempt's directory, kept by its pool: the run's tunnels are served there.

When an attempt ends on a pool, its directory stays (the pool keeps its newest runs'), and so does
what a user may want to look at: checkpoints, logs, the state the program left. The pool keeps a
``worker`` link to the run of kind ``after`` (the relay then opens the run's tunnels to this
worker: ``relay/runs/tunnels.py``), reads the run's ``to_worker`` from its end on, and serves each
tunnel asked for (``worker_shim/program/tunnels.py``) in that directory, with the run's environment.
It stops when the pool deletes the directory (:meth:`Afterlives.tidied`), when the run is retried
(its worker token is an earlier attempt's then: the relay refuses it), or when the pool stops.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from pathlib import Path

import trio

from protocol_specs.runs.runs import RunRecord
from protocol_specs.wire.wire import AfterLink
from relay.client import Endpoint, RelayError, open_run_link

from ..program.quarters import Housing, open_quarters, program_env
from ..program.tunnels import open_tunnels
from ..session.core import parse_delivery
from ..shim import worker_link_policy

__all__ = ["Afterlives"]

log = logging.getLogger("tether.worker")


class Afterlives:
    """The ended attempts whose directories a pool keeps, each served by a task of its own."""

    def __init__(
        self, nursery: trio.Nursery, say: Callable[[str], None], housing: Housing | None = None
    ) -> None:
        self.nursery = nursery
        self.say = say
        self.housing = housing or Housing()
        self.serving: dict[Path, trio.CancelScope] = {}

    def start(
        self, relay: Endpoint, record: RunRecord, run_dir: Path, env: dict[str, str] | None
    ) -> None:
        """Serve ``record``'s tunnels in ``run_dir`` (its attempt ended here) until it goes, with
        the run's environment plus ``env`` (what the worker added), as the directory's uid."""
        if run_dir.is_dir() and run_dir not in self.serving:
            scope = self.serving[run_dir] = trio.CancelScope()
            self.nursery.start_soon(self._serve, relay, record, run_dir, env, scope)

    def tidied(self) -> None:
        """The pool deleted some run directories: their tunnels are no longer served."""
        for run_dir, scope in list(self.serving.items()):
            if not run_dir.is_dir():
                scope.cancel()

    async def _serve(
        self,
        relay: Endpoint,
        record: RunRecord,
        run_dir: Path,
        env: dict[str, str] | None,
        scope: trio.CancelScope,
    ) -> None:
        housing = self.housing
        user = await trio.to_thread.run_sync(housing.owner, run_dir)
        if housing.leases is not None and user is None:
            return  # its uid's lease is gone: nobody may run anything there any more
        mark = housing.attempt_mark(record.id, record.attempt) + "-after"
        try:
            with scope:
                async with open_run_link(
                    relay,
                    link=AfterLink(),
                    run=record.id,
                    attempt=record.attempt,
                    client="tether-worker",
                    policy=worker_link_policy(),
                ) as link:
                    self.say(f"run {record.id}: its directory stays here, for tether exec/shell")
                    ending = f"run {record.id}'s directory on this worker was deleted"
                    async with (
                        open_quarters(
                            run_dir, user=user, runtime=housing.runtime, mark=mark
                        ) as quarters,
                        open_tunnels(
                            relay, record, run_dir, program_env(record, env, quarters),
                            say=self.say, ending=ending, quarters=quarters,
                        ) as tunnels,
                    ):  # fmt: skip
                        async for delivery in link.deliveries:
                            tunnels.open(parse_delivery(delivery)[1])
        except* RelayError as group:  # retried (this token is an earlier attempt's), or gone
            why = group.exceptions[0]
            log.info("run %s: no longer serving its ended attempt's tunnels: %s", record.id, why)
        finally:
            self.serving.pop(run_dir, None)
