"""The processes of a run: which Python processes are debugged, what they are called, and their state.

Theory of operation
-------------------
A training run is many processes: ``torchrun`` starts one rank per GPU, a DataLoader with
``num_workers > 0`` and any ``multiprocessing`` pool start children of their own. With subprocess
debugging on, debugpy's adapter on the worker hears of every new Python process of the program
(``startDebugging`` / ``debugpyAttach``, with the child's pid as ``subProcessId``); the worker shim
opens one debug session per process, configures it at once with the run's latest configuration
and ``configurationDone`` (so no child ever waits for an IDE), and names it.

Every DAP entry says which process it belongs to (:attr:`DapEntry.process
<protocol_specs.wire.stream_entries.DapEntry>`): :data:`MAIN` (``""``) is the program tether started,
any other key is :func:`process_key` of the process's pid. A run that spans nodes has one worker per
node: node 0's keys are as above; node K's program is :func:`node_main` (``"nK"``) and its children
``"nK:PID"``, so a key says whose worker answers it (:func:`node_of`); each worker ignores the
others' keys. The IDE is offered node K's program like a child of the main process. The worker announces each process with
a ``process_started`` status entry whose ``data`` is a :class:`ProcessInfo`, and its end with
``process_exited``; ``paused`` / ``resumed`` / ``unattended_stop`` statuses carry the process in
:attr:`StatusEntry.process <protocol_specs.wire.stream_entries.StatusEntry>`. :class:`ProcessTable` is the
fold of those statuses: what the adapter offers the IDE and what ``tether status`` shows.

The IDE sees one debug session per process, as with debugpy locally: the adapter sends the IDE the
standard ``startDebugging`` reverse request (or debugpy's ``debugpyAttach`` event for a client
without it) naming the same adapter port and the process's key as ``subProcessId``. Which processes
it offers is the run's :class:`ProcessMode`: ``stopped`` (the default) offers a child when it first
stops, so 8 ranks hitting one line do not flood the IDE with 8 sessions before anything happened;
``all`` offers every child as it starts; ``main`` debugs the main process only (subprocess debugging
off: children run undebugged, as before multi-process support). ``RunSpec.ranks`` limits
breakpoints to some ranks of a ``torch.distributed`` job: the other ranks are configured without
breakpoints and run free.

Sans-I/O: plain data and a fold.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from enum import StrEnum
from typing import Any

from pydantic import BaseModel, ConfigDict, Field, ValidationError

from ..runs.runs import ProcessRow, RunEvent, RunRecord, RunState
from ..wire.stream_entries import StatusEntry, StatusEvent

__all__ = [
    "COLLECTIVE_TIMEOUT_ENV",
    "COLLECTIVE_TIMEOUT_FLOOR",
    "COLLECTIVE_TIMEOUT_HINT",
    "MAIN",
    "MAX_ROWS",
    "PROCESS_EVENTS",
    "ProcessInfo",
    "ProcessMode",
    "ProcessState",
    "ProcessTable",
    "fold_into_record",
    "node_main",
    "node_of",
    "process_key",
]

#: the key of the program tether started
MAIN = ""
#: most processes a run record lists (a run with more still works; ``tether status`` says so)
MAX_ROWS = 256
#: the statuses :func:`fold_into_record` takes
PROCESS_EVENTS = frozenset(
    {
        StatusEvent.PROCESS_STARTED,
        StatusEvent.PROCESS_EXITED,
        StatusEvent.PAUSED,
        StatusEvent.RESUMED,
    }
)

#: the variable that sets the least timeout of a debug run's ``torch.distributed`` process groups
COLLECTIVE_TIMEOUT_ENV = "TETHER_COLLECTIVE_TIMEOUT"
#: its default: a pause shorter than this does not end the job (``_tether_collectives.py``)
COLLECTIVE_TIMEOUT_FLOOR = "24h"

#: said (IDE and terminal) when a rank of a ``torch.distributed`` job pauses
COLLECTIVE_TIMEOUT_HINT = (
    "while this rank is paused, its peers wait in their next collective (all_reduce, barrier); "
    f"tether gave every process group of this debug run a timeout of at least "
    f"{COLLECTIVE_TIMEOUT_FLOOR} when it was created ({COLLECTIVE_TIMEOUT_ENV}), so the job "
    "survives a shorter pause; a longer one, a timeout given to one call (monitored_barrier, "
    "work.wait), or a rank whose output said tether could not raise its timeouts still makes "
    "their collectives time out, which ends the job"
)


def process_key(pid: int, node: int = 0) -> str:
    """A child process's key in the run's streams: its pid, in decimal (``"nK:PID"`` on node K
    of a run that spans nodes: pids of different hosts may be the same)."""
    return str(pid) if node == 0 else f"n{node}:{pid}"


def node_main(node: int) -> str:
    """The key of the program node ``node``'s worker started: :data:`MAIN` on node 0, ``"nK"``
    on node K."""
    return MAIN if node == 0 else f"n{node}"


def node_of(key: str) -> int:
    """The node whose worker debugs process ``key`` (0 for :data:`MAIN` and plain pids); -1 for
    a key no worker makes (``"nx"``): nobody's."""
    if not key.startswith("n"):
        return 0
    number = key[1:].split(":", 1)[0]
    return int(number) if number.isdigit() and number == str(int(number)) else -1


class ProcessMode(StrEnum):
    """Which processes of a run the IDE is offered a session for (``tether debug --processes``)."""

    STOPPED = "stopped"  #: the main process, and each child when it first stops
    ALL = "all"  #: every process, as it starts
    MAIN = "main"  #: the main process only; children are not debugged at all


class ProcessInfo(BaseModel):
    """What the worker knows of one debugged process (the ``data`` of ``process_started``)."""

    model_config = ConfigDict(frozen=True, extra="ignore")

    key: str  #: :data:`MAIN` or :func:`process_key`
    pid: int
    parent: str = MAIN  #: the key of the debugged process that started it
    host: str = ""
    #: ``RANK`` / ``LOCAL_RANK`` / ``WORLD_SIZE`` from the process's environment (torchrun,
    #: accelerate, deepspeed, Lightning set them); None when absent
    rank: int | None = None
    local_rank: int | None = None
    world_size: int | None = None
    #: the nth child of its parent to start (1-based), for a name when there is no rank
    nth: int = 0
    #: the process's command line as its user wrote it (without the debugger's), shortened
    command: str = Field(default="", max_length=512)
    #: what it runs (``train.py``, ``pkg.train``, ``python -c``); empty for a worker of its
    #: parent (a multiprocessing or DataLoader worker, a fork), which is named after the parent
    program: str = Field(default="", max_length=200)
    #: the node of a run that spans nodes whose worker debugs it (0 otherwise)
    node: int = Field(default=0, ge=0, le=63)

    def title(self, parent: ProcessInfo | None = None) -> str:
        """A name a person can place: ``rank 3 (pid 4242) on gpu-node-7``, ``worker 2 of rank 0
        (pid 4300) on gpu-node-7``, ``main process (pid 4100) on gpu-node-7``, ``eval.py (pid
        4400) on gpu-node-7``; on node K >= 1 of a run that spans nodes, ``rank 3 (pid 4242) on
        node 1 (gpu-node-8)``, ``main process (pid 4100) on node 1 (gpu-node-8)``."""
        where = f" on {self.host}" if self.host else ""
        if self.node:
            where = f" on node {self.node}" + (f" ({self.host})" if self.host else "")
        if parent is None and self.parent == MAIN and self.key != MAIN:
            parent = ProcessInfo(key=MAIN, pid=0)  # the main process is never announced
        if self.rank is not None and (parent is None or parent.rank != self.rank):
            return f"rank {self.rank} (pid {self.pid}){where}"
        if self.key == node_main(self.node):
            return f"main process (pid {self.pid}){where}"
        if self.program:
            return f"{self.program} (pid {self.pid}){where}"
        if parent is not None:
            of = f"rank {parent.rank}" if parent.rank is not None else parent.short()
            nth = f" {self.nth}" if self.nth else ""
            return f"worker{nth} of {of} (pid {self.pid}){where}"
        return f"process (pid {self.pid}){where}"

    def short(self) -> str:
        if self.rank is not None:
            return f"rank {self.rank}"
        if self.key == MAIN:
            return "the main process"
        if self.key == node_main(self.node):
            return f"the main process of node {self.node}"
        return f"process {self.pid}"


class ProcessState(StrEnum):
    RUNNING = "running"
    PAUSED = "paused"
    EXITED = "exited"


@dataclass
class _Known:
    info: ProcessInfo
    state: ProcessState = ProcessState.RUNNING
    where: str = ""  #: where it is paused (``train.py:42 in step``)
    exit_code: int | None = None


@dataclass
class ProcessTable:
    """The fold of a run's process statuses: who exists, what each is called, which are paused."""

    known: dict[str, _Known] = field(default_factory=dict)

    def apply(self, entry: StatusEntry) -> bool:
        """Fold one status entry; True when it was about a process."""
        if entry.event == StatusEvent.PROCESS_STARTED:
            try:
                self.started(ProcessInfo.model_validate(entry.data))
            except ValidationError:
                return False
        elif entry.event == StatusEvent.PROCESS_EXITED:
            self.exited(entry.process, entry.exit_code)
        elif entry.event == StatusEvent.PAUSED:
            self.paused(entry.process, str(entry.data.get("where", "")))
        elif entry.event == StatusEvent.RESUMED:
            self.resumed(entry.process)
        else:
            return False
        return True

    def started(self, info: ProcessInfo) -> None:
        self.known[info.key] = _Known(info)

    def paused(self, key: str, where: str) -> None:
        if key in self.known:
            self.known[key].state, self.known[key].where = ProcessState.PAUSED, where

    def resumed(self, key: str) -> None:
        if key in self.known:
            self.known[key].state, self.known[key].where = ProcessState.RUNNING, ""

    def exited(self, key: str, exit_code: int | None) -> None:
        if key in self.known:
            self.known[key].state, self.known[key].exit_code = ProcessState.EXITED, exit_code

    def info(self, key: str) -> ProcessInfo | None:
        known = self.known.get(key)
        return known.info if known else None

    def title(self, key: str) -> str:
        known = self.known.get(key)
        if known is None:
            return _untitled(key, "the main process")
        return known.info.title(self.info(known.info.parent) if key != MAIN else None)

    def state(self, key: str) -> ProcessState | None:
        known = self.known.get(key)
        return known.state if known else None

    def rows(self) -> list[dict[str, Any]]:
        """One row per process, in the order they started (``tether status``)."""
        return [
            {
                "process": self.title(key),
                "pid": k.info.pid,
                "rank": k.info.rank,
                "state": k.state.value,
                "where": k.where,
                "exit_code": k.exit_code,
            }
            for key, k in self.known.items()
        ]


def fold_into_record(record: RunRecord, entry: StatusEntry, *, about: int, at: float) -> RunRecord:
    """The run record after a process status of attempt ``about`` (the relay's fold).

    The run is ``paused`` while any of its processes is: a child's stop pauses it (``paused_at``
    names the process), and a ``resumed`` resumes it only when no other process is still paused.
    Raises :class:`~protocol_specs.runs.runs.IllegalTransition` (``StaleAttempt``) like ``advance``.
    """
    record.check_attempt(RunEvent.PAUSE, about)
    rows = dict(record.processes)
    key = entry.process
    if entry.event == StatusEvent.PROCESS_STARTED:
        try:
            info = ProcessInfo.model_validate(entry.data)
        except ValidationError:
            return record
        if key not in rows and len(rows) >= MAX_ROWS:
            # a DataLoader starts its workers anew every epoch: the oldest ended one makes room
            gone = next((k for k, row in rows.items() if row.state == "exited"), None)
            if gone is None:
                return record
            del rows[gone]
        parent = rows.get(info.parent)
        parent_info = (
            ProcessInfo(
                key=info.parent, pid=parent.pid, rank=parent.rank, node=node_of(info.parent)
            )
            if parent
            else None
        )
        rows[key] = ProcessRow(title=info.title(parent_info), pid=info.pid, rank=info.rank)
    elif entry.event == StatusEvent.PROCESS_EXITED and key in rows:
        rows[key] = rows[key].model_copy(
            update={"state": "exited", "where": "", "exit_code": entry.exit_code}
        )
    elif entry.event == StatusEvent.PAUSED:
        where = str(entry.data.get("where") or entry.detail)[:300]
        row = rows.get(key) or ProcessRow(title=_untitled(key, "main process"))
        reason = str(entry.data.get("reason") or "")[:40]
        rows[key] = row.model_copy(update={"state": "paused", "where": where, "reason": reason})
    elif entry.event == StatusEvent.RESUMED and key in rows:
        rows[key] = rows[key].model_copy(update={"state": "running", "where": "", "reason": ""})
    updated = record.model_copy(update={"processes": rows})
    paused = [(k, row) for k, row in rows.items() if row.state == "paused"]
    if paused:
        k, row = paused[0]
        where = row.where if k == MAIN else f"{row.title}: {row.where}"
        if updated.state is RunState.RUNNING:
            return updated.advance(RunEvent.PAUSE, at=at, about=about, paused_at=where[:300])
        if updated.state is RunState.PAUSED:
            return updated.model_copy(update={"paused_at": where[:300]})
        return updated
    if updated.state is RunState.PAUSED:
        return updated.advance(RunEvent.RESUME, at=at, about=about)
    return updated


def _untitled(key: str, main: str) -> str:
    """A process not announced (yet): ``main`` for :data:`MAIN`, else named by its key."""
    if key == MAIN:
        return main
    node = node_of(key)
    if node > 0 and key == node_main(node):
        return f"main process of node {node}"
    if node > 0:
        return f"process (pid {key.split(':', 1)[-1]}) on node {node}"
    return f"process (pid {key})"
