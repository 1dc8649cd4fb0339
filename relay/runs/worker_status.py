"""What a worker's status entries do to its run: the record moves along the table in
``protocol_specs/runs/runs.py`` (``relay/runs/registry.py`` performs it), a process of the run is listed
or paused, an unattended stop is posted to the run's webhook and marked in its logs (as is an
attempt's start).
Only the events below may come from a worker; the relay writes the others itself.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable

from protocol_specs.runs import nodes
from protocol_specs.runs.runs import RunEvent, RunRecord, RunState
from protocol_specs.session.processes import PROCESS_EVENTS, fold_into_record
from protocol_specs.session.session import StatusEvent
from protocol_specs.wire import wire

from .registry import Registry

__all__ = ["WORKER_EVENTS", "WorkerStatus", "worker_may_publish"]

log = logging.getLogger("tether.relay")

#: the events whose meaning for a run that spans nodes depends on the node
_NODE_EVENTS = frozenset(
    {
        StatusEvent.STARTED,
        StatusEvent.EXITED,
        StatusEvent.START_FAILED,
        StatusEvent.WORKER_STOPPED,
    }
)

#: status events a worker may publish, and the run transition each one makes
WORKER_EVENTS: dict[str, RunEvent | None] = {
    StatusEvent.STARTED: RunEvent.START,
    StatusEvent.WAITING_FOR_IDE: None,
    StatusEvent.DEBUGGER_LIVE: None,
    StatusEvent.EXITED: None,  # EXIT_OK or EXIT_ERROR by exit code
    StatusEvent.START_FAILED: RunEvent.START_FAILED,
    StatusEvent.UNATTENDED_STOP: None,
    StatusEvent.BUFFER_FULL: None,
    StatusEvent.WORKER_STOPPED: None,  # the attempt is lost: retried, or the run ends
}


def worker_may_publish(event: str) -> bool:
    """Whether a worker may publish a status entry of ``event``."""
    return event in WORKER_EVENTS or event in PROCESS_EVENTS


class WorkerStatus:
    """Applies the status entries workers publish (once stored) to their runs."""

    def __init__(
        self,
        registry: Registry,
        *,
        on_unattended: Callable[[RunRecord, wire.StatusEntry], None] = lambda _r, _e: None,
        clock: Callable[[], float] = time.time,
    ) -> None:
        self.registry = registry
        self.on_unattended = on_unattended
        self.clock = clock

    async def apply(
        self, run_id: str, entry: wire.StatusEntry, attempt: int, node: int = 0
    ) -> None:
        """Move the run record along with a status the worker of ``attempt`` published (of its
        node ``node``, for a run that spans nodes: :meth:`_apply_node`)."""
        registry = self.registry
        if entry.event == StatusEvent.UNATTENDED_STOP:
            record = await registry.load(run_id)
            if record is not None and record.spec.webhook:
                self.on_unattended(record, entry)
            # the logs too: ``tether run -f`` and ``tether logs -f`` are a plain run's terminal
            await registry.log_marker(run_id, wire.encode_entry(entry))
            return
        if entry.event in PROCESS_EVENTS:  # the run is paused while any of its processes is
            now = registry.clock()
            await registry.update(
                run_id, lambda record: fold_into_record(record, entry, about=attempt, at=now)
            )
            return
        if entry.event in _NODE_EVENTS:
            record = await registry.load(run_id)
            if record is not None and nodes.multi(record):
                await self._apply_node(record, entry, attempt, node)
                return
        if entry.event in (StatusEvent.WAITING_FOR_IDE, StatusEvent.DEBUGGER_LIVE):
            waiting = entry.event == StatusEvent.WAITING_FOR_IDE
            await registry.update(run_id, lambda record: record.waiting(attempt, waiting))
            return
        if entry.event == StatusEvent.WORKER_STOPPED:
            detail = entry.detail or "the worker stopped"
            ended = await registry.attempt_ended(
                run_id, RunEvent.JOB_LOST, about=attempt, detail=detail
            )
            if ended is not None and ended.finished:
                await registry.append_status(run_id, StatusEvent.WORKER_LOST, ended, detail=detail)
            return
        if entry.event == StatusEvent.EXITED:
            if entry.exit_code != 0:
                await registry.attempt_ended(
                    run_id,
                    RunEvent.EXIT_ERROR,
                    about=attempt,
                    exit_code=entry.exit_code,
                    detail=entry.detail,
                )
                return
            event = RunEvent.EXIT_OK
        else:
            maybe = WORKER_EVENTS.get(entry.event)
            if maybe is None:
                return
            event = maybe
        run_dir = entry.data.get("run_dir") if event is RunEvent.START else None
        record = await registry.transition(
            run_id,
            event,
            about=attempt,
            attempt_fields={"run_dir": run_dir[:1000]} if isinstance(run_dir, str) else None,
            exit_code=entry.exit_code,
            detail=entry.detail,
        )
        if record is not None and event is RunEvent.START:
            await self._started(record, record.worker)

    async def _started(self, record: RunRecord, worker: str, node: int | None = None) -> None:
        """The log marker of an attempt's start (of its node ``node``'s)."""
        where = worker if node is None else f"{worker} (node {node})"
        marker = wire.StatusEntry(
            event=StatusEvent.STARTED,
            state=record.state.value,
            at=self.clock(),
            detail=f"attempt {record.attempt} started on {where}",
            data={"attempt": record.attempt, "worker": record.worker},
        )
        await self.registry.log_marker(record.id, wire.encode_entry(marker))

    async def _apply_node(
        self, record: RunRecord, entry: wire.StatusEntry, attempt: int, node: int
    ) -> None:
        """A lifecycle status of node ``node`` of a run that spans nodes
        (``protocol_specs/runs/nodes.py``): node 0's ``started`` starts the run and tells the
        other nodes its rendezvous; any node's exit, failed start or stopped worker may end the
        attempt; when it ends, ``Registry.settle`` (or the retry) tells every node to stop."""
        registry, run_id = self.registry, record.id
        if entry.event == StatusEvent.STARTED:
            if node:
                await registry.update(
                    run_id, lambda record: nodes.started(record, node, about=attempt)
                )
                return
            run_dir = entry.data.get("run_dir")
            started = await registry.transition(
                run_id,
                RunEvent.START,
                about=attempt,
                attempt_fields={"run_dir": run_dir[:1000]} if isinstance(run_dir, str) else None,
                mark=lambda record: nodes.started(record, 0, about=attempt),
                detail=entry.detail,
            )
            if started is None:
                return
            rendezvous = nodes.rendezvous(entry.data)
            if rendezvous is None:
                log.warning("run %s: node 0 started without a valid rendezvous", run_id)
            else:
                await registry.tell_rendezvous(run_id, attempt, rendezvous)
            await self._started(started, started.worker, 0)
        elif entry.event == StatusEvent.EXITED:
            await self._node_exited(run_id, entry, attempt, node)
        elif entry.event == StatusEvent.START_FAILED:
            detail = f"node {node} could not start" + (f": {entry.detail}" if entry.detail else "")
            # not retried, as for one node; a run already running ends failed
            event = (
                RunEvent.START_FAILED if record.state is RunState.STARTING else RunEvent.EXIT_ERROR
            )
            failed = await registry.transition(
                run_id,
                event,
                about=attempt,
                mark=lambda record: nodes.lost(record, node),
                exit_code=entry.exit_code,
                detail=detail,
            )
            if failed is not None and event is RunEvent.EXIT_ERROR:
                await registry.append_status(
                    run_id, StatusEvent.START_FAILED, failed, logs=True, detail=detail
                )
        else:  # worker_stopped
            detail = f"node {node}'s worker stopped" + (f": {entry.detail}" if entry.detail else "")
            ended = await registry.attempt_ended(
                run_id,
                RunEvent.JOB_LOST,
                about=attempt,
                detail=detail,
                mark=lambda record: nodes.lost(record, node),
            )
            if ended is not None and ended.finished:
                await registry.append_status(run_id, StatusEvent.WORKER_LOST, ended, detail=detail)

    async def _node_exited(
        self, run_id: str, entry: wire.StatusEntry, attempt: int, node: int
    ) -> None:
        """Node ``node`` exited: non-zero ends the attempt (retried, or the run failed); 0 ends
        it once every node exited 0. A node's exit is news of that node to the IDE
        (``is_node_exit``): the run's own ``exited`` is told here, when the run ends with it."""
        registry = self.registry
        if entry.exit_code != 0:
            ended = await registry.attempt_ended(
                run_id,
                RunEvent.EXIT_ERROR,
                about=attempt,
                exit_code=entry.exit_code,
                detail=f"node {node} exited with code {entry.exit_code}",
                mark=lambda record: nodes.exited(record, node, entry.exit_code, about=attempt)[0],
            )
            if ended is not None and ended.finished:
                await self._run_exited(ended)
            return
        now = registry.clock()

        def decide(record: RunRecord) -> RunRecord:
            verdict = nodes.exited(record, node, 0, about=attempt)
            if verdict.event is None:
                return verdict.record
            return verdict.record.advance(
                verdict.event, at=now, about=attempt, exit_code=0, detail=verdict.detail
            )

        change = await registry.update(run_id, decide)
        if change is not None and change.after.finished and not change.before.finished:
            await registry.settle(change.before, change.after)
            await self._run_exited(change.after)

    async def _run_exited(self, record: RunRecord) -> None:
        """The IDE's ``exited`` of a run that spans nodes, which ended with a node's exit."""
        await self.registry.append_status(
            record.id,
            StatusEvent.EXITED,
            record,
            exit_code=record.exit_code,
            detail=record.detail,
            data={"final": True},
        )
