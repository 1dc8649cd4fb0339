"""What the worker shim's sans-I/O parts ask the trio loop (:mod:`worker_shim.shim`) to do.

:class:`worker_shim.session.core.ShimCore` and :class:`worker_shim.session.watch.Watch` decide; they
return lists of these, and the loop performs them in order.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from protocol_specs.wire.wire import ControlEntry, DapEntry, GroupEntry, StatusEntry, StatusEvent

__all__ = [
    "BARRIER_EVENTS",
    "Action",
    "CloseChild",
    "EvalAnswered",
    "OpenChild",
    "OpenTunnel",
    "PipeOutputToIde",
    "Publish",
    "ReplayFailed",
    "Say",
    "Settle",
    "SuspendRun",
    "Terminate",
    "ToDebugpy",
    "status_entry",
]


@dataclass(frozen=True)
class ToDebugpy:
    """Send this DAP message to debugpy (its ``seq`` is already the shim's own)."""

    message: dict[str, Any]
    #: on the connection of this process (``""``: the main one's)
    process: str = ""
    #: one of a stop's prefetch requests (``protocol_specs.session.prefetch``): its answer stays here
    prefetch: bool = False


@dataclass(frozen=True)
class OpenChild:
    """Open a new connection to debugpy's adapter for the child ``process``: its ``ToDebugpy``
    follow. If it cannot be opened, tell
    :meth:`worker_shim.session.processes.DebuggedProcesses.closed`."""

    process: str


@dataclass(frozen=True)
class OpenTunnel:
    """Serve the tunnel this ``tunnel`` control entry asks for
    (``worker_shim/program/tunnels.py``)."""

    entry: ControlEntry


@dataclass(frozen=True)
class CloseChild:
    """Close the child ``process``'s connection (its session ended). ``retired``: the session
    knows it is over (its process was replaced by an ``exec``): the close is not reported back,
    and a connection opened for the same ``process`` after it is another's."""

    process: str
    retired: bool = False


@dataclass(frozen=True)
class Publish:
    """Publish this entry on the run link."""

    entry: DapEntry | StatusEntry | GroupEntry
    #: a debugpy ``output`` event: report its publish number with
    #: :meth:`worker_shim.session.core.ShimCore.output_published` (held output waits for its answer)
    output: bool = False


#: debugger events published only after the program's output so far (:class:`Settle` first)
BARRIER_EVENTS = frozenset({"stopped", "exited", "terminated"})


@dataclass(frozen=True)
class Settle:
    """The output barrier: publish what the program wrote to its pipes before going on."""


@dataclass(frozen=True)
class PipeOutputToIde:
    """From now on, the program's pipes also go to the IDE as ``output`` events."""


@dataclass(frozen=True)
class Say:
    """A line for the worker's own log."""

    text: str


@dataclass(frozen=True)
class Terminate:
    """End the program (its process group)."""


@dataclass(frozen=True)
class SuspendRun:
    """The unattended-stop policy ``suspend``: call the program's ``tether.on_suspend`` in every
    paused process, then suspend the run (:mod:`worker_shim.session.suspend`); the outcome goes
    back with :meth:`~worker_shim.session.processes.DebuggedProcesses.suspend_outcome`."""

    waited: float  #: seconds the stop was unattended


@dataclass(frozen=True)
class ReplayFailed:
    """The configuration replay cannot go on; the attempt fails to start."""

    detail: str
    #: debugpy did not answer in time (rather than refusing)
    timed_out: bool = False


@dataclass(frozen=True)
class MovedAlone:
    """The worker continued child ``process`` on its own (the unattended-stop policy's
    ``continue``): its rank group moves with it (``RankGroup.on_request``), as for an IDE's
    ``continue``, or the other ranks would stay paused and the next late pause stop it again.
    Not for the driver: :class:`~worker_shim.session.processes.DebuggedProcesses` takes it."""

    process: str
    command: str
    arguments: dict[str, Any]


@dataclass(frozen=True)
class EvalAnswered:
    """A cross-rank evaluation the driver asked for (``tether eval``) is complete
    (:mod:`worker_shim.session.rank_eval`): hand ``values`` to whoever waits for ``ask``."""

    ask: Any
    values: list[Any]


Action = (
    ToDebugpy
    | Publish
    | Settle
    | PipeOutputToIde
    | Say
    | Terminate
    | SuspendRun
    | ReplayFailed
    | OpenChild
    | CloseChild
    | OpenTunnel
    | EvalAnswered
    | MovedAlone
)


def status_entry(
    event: StatusEvent, wall: Callable[[], float] = time.time, **fields: Any
) -> StatusEntry:
    """A status entry of the worker, stamped with the wall clock (``at``: seconds since the epoch):
    the relay stores it and shows it to people (the unattended-stop webhook), so never a monotonic
    time. Every status the shim publishes is made here."""
    return StatusEntry(event=event, at=wall(), **fields)
