"""What the adapter's sans-I/O cores ask :mod:`adapter.dap.server` to do, and what they share.

The cores (:class:`adapter.dap.core.AdapterCore` for the main process,
:class:`adapter.dap.children.ChildCore` per child process, both driven by
:class:`adapter.dap.processes.Processes`) return lists of these actions; the server performs them
in order. An action for an IDE names the connection by its
``generation``: a number unique among all the adapter's IDE connections, so it reaches the
connection it was decided for or, if that one is gone or was taken over, nobody.

:class:`Origin` is what every core of one adapter shares: the name the run's streams know the
adapter by, the ``seq`` space of the requests it publishes (one for all its sessions, so an
``(origin, seq)`` pair names one request whatever process it is for), its presence epochs and its
connection numbers.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from enum import Enum
from typing import Any

from protocol_specs.wire.wire import DapEntry, PresenceEntry

__all__ = [
    "Action",
    "CancelRun",
    "CloseIde",
    "IdePhase",
    "Origin",
    "Publish",
    "Say",
    "ToIde",
]


@dataclass(frozen=True)
class ToIde:
    message: dict[str, Any]
    generation: int


@dataclass(frozen=True)
class Publish:
    entry: DapEntry | PresenceEntry
    #: the ``seq`` the request carries on this hop (None for presence): what
    #: :meth:`AdapterCore.publish_refused` is given back if the relay refuses the entry
    origin_seq: int | None = None


@dataclass(frozen=True)
class CancelRun:
    detail: str


@dataclass(frozen=True)
class CloseIde:
    generation: int
    reason: str
    #: write what was sent to that IDE before closing (a ``disconnect`` response); a connection
    #: another one took over from is closed at once
    flush: bool = False


@dataclass(frozen=True)
class Say:
    """A line for the person at the terminal (``tether debug``), not for an IDE."""

    text: str


Action = ToIde | Publish | CancelRun | CloseIde | Say


class IdePhase(Enum):
    NONE = "none"  #: no IDE connected
    CONNECTED = "connected"  #: connected, handshake not done
    CONFIGURED = "configured"  #: configurationDone answered: events flow to the IDE


def _never() -> bool:
    return False


@dataclass
class Origin:
    """One adapter instance as the run's streams see it (shared by all its cores)."""

    name: str
    #: the ``seq`` of the latest request published under this origin
    seq: int = 0
    #: presence entries published so far
    epoch: int = 0
    #: IDE connections numbered so far
    generation: int = 0
    #: whether an IDE is attached to any session of this adapter: what presence reports (the
    #: worker's unattended-stop policy is about the person, not about one process's session)
    attached: Callable[[], bool] = _never

    def next_generation(self) -> int:
        self.generation += 1
        return self.generation
