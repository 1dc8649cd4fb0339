"""What a worker's status entries do to its run: the record moves along the table in
``protocol_specs/runs/runs.py`` (``relay/runs/registry.py`` performs it), a process of the run is listed
or paused, an unattended stop is posted to the run's webhook and marked in its logs (as is an
attempt's start).
Only the events below may come from a worker; the relay writes the others itself.
"""

from __future__ import annotations

import time
from collections.abc import Callable

from protocol_specs.runs.runs import RunEvent, RunRecord
from protocol_specs.session.processes import PROCESS_EVENTS, fold_into_record
from protocol_specs.session.session import StatusEvent
from protocol_specs.wire import wire

from .registry import Registry

__all__ = ["WORKER_EVENTS", "WorkerStatus", "worker_may_publish"]

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

    async def apply(self, run_id: str, entry: wire.StatusEntry, attempt: int) -> None:
        """Move the run record along with a status the worker of ``attempt`` published."""
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
            text = f"attempt {record.attempt} started on {record.worker}"
            marker = wire.StatusEntry(
                event=StatusEvent.STARTED,
                state=record.state.value,
                at=self.clock(),
                detail=text,
                data={"attempt": record.attempt, "worker": record.worker},
            )
            await registry.log_marker(run_id, wire.encode_entry(marker))
