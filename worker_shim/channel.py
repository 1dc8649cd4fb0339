"""What every debug session the shim holds with debugpy shares, the main one's (:class:`ShimCore
<worker_shim.core.ShimCore>`) and each child's (:class:`ChildCore <worker_shim.child.ChildCore>`).

Each connection to debugpy has its own ``seq`` space (debugpy's adapter numbers per client); a
request is remembered by that seq with who asked it (``origin``: the adapter instance whose IDE
sent it, and the seq that IDE gave it; ``None``: the shim's own request), so the answer goes back
under the asker's seq. Sans-I/O: the methods return actions.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from protocol_specs import dap_models as dap
from protocol_specs.processes import MAIN
from protocol_specs.session import StatusEvent
from protocol_specs.wire import StatusEntry

from .actions import Action, Terminate, ToDebugpy, status_entry
from .replay import ReplayPhase, next_phase
from .watch import Continue, LookUp, Watch

__all__ = ["DebugpyChannel", "Sent"]


@dataclass
class Sent:
    command: str
    origin: str | None  #: None: the shim's own request, answered to the core only
    seq: int = 0  #: the seq its origin gave it


class DebugpyChannel:
    """The seq numbering, the map of sent requests, the replay phase and the status stamp of one
    connection to debugpy (``key``: the process it debugs, :data:`~protocol_specs.processes.MAIN`
    for the program tether started)."""

    key: str = MAIN
    phase: ReplayPhase
    wall: Callable[[], float]
    clock: Callable[[], float]
    watch: Watch

    def _open_channel(self, wall: Callable[[], float]) -> None:
        self.wall = wall
        self.phase = ReplayPhase.FOLDING
        self.closed = False
        self._seq = 0
        self._sent: dict[int, Sent] = {}
        self._lookup_seq: int | None = None  #: the pause report's ``stackTrace`` in flight

    @property
    def live(self) -> bool:
        return self.phase is ReplayPhase.LIVE

    def answer(self, request: dict[str, Any], error: str = "") -> list[Action]:
        """Answer a reverse request of debugpy on this connection: success, or the ``error``."""
        self._seq += 1
        if error:
            return [ToDebugpy(dap.error_response(request, error, seq=self._seq), self.key)]
        return [ToDebugpy(dap.response(request, {}, seq=self._seq), self.key)]

    def _send(
        self, command: str, arguments: Any, *, origin: str | None = None, seq: int = 0
    ) -> list[Action]:
        if self.closed:
            return []
        self._seq += 1
        self._sent[self._seq] = Sent(command, origin, seq)
        return [ToDebugpy(dap.request(command, arguments, seq=self._seq), self.key)]

    def _watch_step(self) -> list[Action]:
        """Perform what the unattended-stop watch decided: look up where a thread stopped,
        continue it, or end the run (:meth:`_terminated_by_watch`)."""
        actions: list[Action] = []
        while True:
            again = False
            for step in self.watch.step(self.clock()):
                if isinstance(step, LookUp):
                    if self.closed:
                        self.watch.found([])  # debugpy is gone: it says nothing
                        again = True
                    else:
                        actions += self._send(
                            "stackTrace", {"threadId": step.thread_id, "levels": 1}
                        )
                        self._lookup_seq = self._seq
                elif isinstance(step, Continue):
                    actions += self._send("continue", {"threadId": step.thread_id})
                elif isinstance(step, Terminate):
                    actions += self._terminated_by_watch(step)
                else:
                    actions.append(step)
            if not again:
                return actions

    def _terminated_by_watch(self, step: Terminate) -> list[Action]:
        raise NotImplementedError

    def _enter(self, phase: ReplayPhase, why: str) -> None:
        self.phase = next_phase(self.phase, phase, why)

    def _status(self, event: StatusEvent, **fields: Any) -> StatusEntry:
        if self.key != MAIN:
            fields["process"] = self.key
        return status_entry(event, self.wall, **fields)
