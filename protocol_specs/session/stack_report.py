"""From what a worker's ``stacks`` tunnel printed to the report every view shows.

The worker samples the run's processes (``worker_shim/program/sampler.py``) and prints
``{"program": PID, "processes": [ProcessStack...]}``; the run's record says which processes the
debugger holds paused, where and why. :func:`report_of` joins both and merges them
(:func:`~protocol_specs.session.stacks.merge`): what ``tether stacks`` prints, and what the web
view's run page and the editors' Ranks view show. Sans-I/O: bytes and a record in, a report out.
"""

from __future__ import annotations

import json

from protocol_specs.runs.runs import ProcessRow, RunRecord

from .processes import MAIN
from .stacks import ProcessStack, StackReport, merge

__all__ = ["NoStacks", "header", "report_of", "with_states"]


class NoStacks(ValueError):
    """The worker's answer is not the stacks (an older worker, a broken answer)."""


def report_of(sampled: bytes, record: RunRecord) -> StackReport:
    """The merged report of a ``stacks`` tunnel's output for ``record``'s run (its record read
    after the stacks: the states as fresh as they are). :class:`NoStacks` if it is not one."""
    try:
        data = json.loads(sampled)
        program = int(data["program"])
        processes = [ProcessStack.model_validate(p) for p in data["processes"]]
    except (ValueError, KeyError, TypeError):
        raise NoStacks(f"run {record.id}'s worker answered with no stacks") from None
    return merge(with_states(processes, record.processes, program), run=record.id)


def with_states(
    processes: list[ProcessStack], rows: dict[str, ProcessRow], program: int
) -> list[ProcessStack]:
    """The sampled ``processes`` with what the run's record says of them (by pid; the main
    process's row by ``program``): tether's name for each, and which are paused, where and why."""
    by_pid = {row.pid: row for key, row in rows.items() if key != MAIN and row.pid}
    if MAIN in rows:
        by_pid[program] = rows[MAIN]
    out = []
    for p in processes:
        row = by_pid.get(p.pid)
        if row is None or row.state == "exited":
            out.append(p)
            continue
        update: dict[str, object] = {}
        if row.title and row.title != "main process":
            update["name"] = row.title
        if row.state == "paused":
            update.update(state="paused", why=row.reason, where=row.where)
        out.append(p.model_copy(update=update))
    return out


def header(report: StackReport) -> str:
    """``run R: 5 Python processes, 1 paused, in 4 places (main threads, outermost call first)``"""
    paused = sum(p.state == "paused" for p in report.processes)
    n = len(report.processes)
    places = len(report.classes)
    held = f", {paused} paused" if paused else ""
    return (
        f"run {report.run}: {n} Python process{'es' if n != 1 else ''}{held}, in "
        f"{places} place{'s' if places != 1 else ''} (main threads, outermost call first)"
    )
