"""The rank groups of a run's nodes acting as one: their entries in the run's ``to_worker``.

Theory of operation
-------------------
Each node's worker has its own :class:`~worker_shim.session.group.RankGroup` (its ranks). What
one group decides that the others must follow (:class:`~worker_shim.session.group.Announce`: a
rank of its own stopped on its own, an IDE moved or paused one) it publishes as a
:class:`~protocol_specs.wire.stream_entries.GroupEntry` on its worker link; the relay stores it
in ``to_worker``, which every node's worker reads, in one order, with the IDEs' requests. A
worker takes the entries of the other nodes of its attempt to its group
(:meth:`RankGroup.remote_stop <worker_shim.session.group.RankGroup.remote_stop>`, ...); its own
node's come back to it and are only counted, and other attempts' (the stream's past) are
skipped.

The stream decides who wins when two nodes decide at once. An entry of another node read while
one of this node's own is still on its way back came before it in the stream: this group already
did what follows it, so it is skipped. Every node then ends as the stream's last entry says (one
node's continue crossing another's breakpoint stop: both nodes stopped if the stop is later in
the stream, both moving if the continue is), not half the run stopped and half running.

Sans-I/O: :class:`NodeGroup` takes entries and :class:`Announce` s and returns group actions and
entries to publish; :class:`worker_shim.session.processes.DebuggedProcesses` performs them.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass

from protocol_specs.runs.runs import RunRecord
from protocol_specs.wire.wire import GroupEntry

from .group import Announce, GroupAction, RankGroup

__all__ = ["NodeGroup"]

#: the arguments of an IDE's move another node's ranks take too (not its ``threadId``: each rank
#: moves the thread it stopped on)
_SHARED_ARGUMENTS = ("granularity", "singleThread")


@dataclass
class NodeGroup:
    """Node ``node``'s side of attempt ``attempt``'s group across nodes (see the module
    docstring); ``group`` None: the ranks do not stop together (``--stop one``)."""

    group: RankGroup | None
    node: int
    attempt: int
    wall: Callable[[], float] = time.time
    #: entries this node published that have not come back in ``to_worker`` yet
    unseen: int = 0

    @classmethod
    def of(
        cls, group: RankGroup | None, record: RunRecord, node: int, wall: Callable[[], float]
    ) -> NodeGroup:
        """Node ``node``'s side of ``record``'s current attempt; ``group`` announces its stops
        and moves only when the run spans nodes (a run of one node publishes nothing new)."""
        if group is not None:
            group.spans_nodes = record.spec.resources.nodes > 1
        return cls(group, node, record.attempt, wall)

    def __repr__(self) -> str:
        return f"<NodeGroup node={self.node} attempt={self.attempt} unseen={self.unseen}>"

    def on_entry(self, entry: GroupEntry) -> list[GroupAction]:
        """A group entry read from ``to_worker``: what this node's group does for it."""
        if self.group is None or entry.attempt != self.attempt:
            return []
        if entry.node == self.node:
            self.unseen = max(0, self.unseen - 1)
            return []
        if self.unseen:  # before this node's own latest in the stream: that one decided
            return []
        if entry.op == "stop":
            return self.group.remote_stop(entry.rank)
        if entry.op == "pause":
            return self.group.remote_pause(entry.rank)
        return self.group.remote_move(entry.command, entry.arguments, entry.rank)

    def entry(self, told: Announce) -> GroupEntry:
        """The entry that tells the other nodes what ``told`` says (publish it)."""
        self.unseen += 1
        arguments = {k: v for k, v in told.arguments.items() if k in _SHARED_ARGUMENTS}
        return GroupEntry(
            op=told.op,
            node=self.node,
            attempt=self.attempt,
            rank=told.rank,
            command=told.command,  # type: ignore[arg-type]
            arguments=arguments,
            at=self.wall(),
        )
