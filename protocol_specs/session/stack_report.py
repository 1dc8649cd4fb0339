"""From what a worker's ``stacks`` tunnel printed to the report every view shows.

The worker samples the run's processes (``worker_shim/program/sampler.py``) and prints
``{"program": PID, "processes": [ProcessStack...]}``; the run's record says which processes the
debugger holds paused, where and why. :func:`report_of` joins both and merges them
(:func:`~protocol_specs.session.stacks.merge`): what ``tether stacks`` prints, and what the web
view's run page and the editors' Ranks view show. A run that spans nodes has one such answer per
node (a ``stacks`` tunnel per node's worker: ``TunnelSpec.node``); :func:`report_of_nodes` joins
each with its node's rows of the record (``nK``, ``nK:PID``) and merges them all, by rank.
Sans-I/O: bytes and a record in, a report out.
"""

from __future__ import annotations

import json

from protocol_specs.runs.runs import ProcessRow, RunRecord

from .processes import node_main, node_of
from .stacks import ProcessStack, StackReport, merge

__all__ = ["NoStacks", "header", "node_stacks", "report_of", "report_of_nodes", "with_states"]


class NoStacks(ValueError):
    """The worker's answer is not the stacks (an older worker, a broken answer)."""


def report_of(sampled: bytes, record: RunRecord) -> StackReport:
    """The merged report of a ``stacks`` tunnel's output for ``record``'s run (its record read
    after the stacks: the states as fresh as they are). :class:`NoStacks` if it is not one."""
    return merge(node_stacks(sampled, record, 0), run=record.id)


def report_of_nodes(sampled: dict[int, bytes], record: RunRecord) -> StackReport:
    """The merged report of the ``stacks`` tunnels of a run's nodes (by node: what each node's
    printed); :class:`NoStacks` if one of them is not stacks."""
    processes = [p for node in sorted(sampled) for p in node_stacks(sampled[node], record, node)]
    return merge(processes, run=record.id)


def node_stacks(sampled: bytes, record: RunRecord, node: int) -> list[ProcessStack]:
    """The processes node ``node``'s worker sampled, with its rows' states and names."""
    try:
        data = json.loads(sampled)
        program = int(data["program"])
        processes = [ProcessStack.model_validate(p) for p in data["processes"]]
    except (ValueError, KeyError, TypeError):
        of = f"node {node}'s worker" if node else "worker"
        raise NoStacks(f"run {record.id}'s {of} answered with no stacks") from None
    return with_states(processes, record.processes, program, node)


def with_states(
    processes: list[ProcessStack], rows: dict[str, ProcessRow], program: int, node: int = 0
) -> list[ProcessStack]:
    """The sampled ``processes`` (of node ``node``'s worker) with what the run's record says of
    them (by pid, among that node's rows; its main process's row by ``program``): tether's name
    for each, and which are paused, where and why."""
    main = node_main(node)
    mine = {key: row for key, row in rows.items() if node_of(key) == node}
    by_pid = {row.pid: row for key, row in mine.items() if key != main and row.pid}
    if main in mine:
        by_pid[program] = mine[main]
    out = []
    for p in processes:
        row = by_pid.get(p.pid)
        if node:
            p = p.model_copy(update={"node": node})
        if row is None or row.state == "exited":
            if node:  # a process tether did not name (not debugged): where it runs, still
                p = p.model_copy(update={"name": f"{p.name} on node {node}"})
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
    missing = f"; not read: {'; '.join(report.missing)}" if report.missing else ""
    return (
        f"run {report.run}: {n} Python process{'es' if n != 1 else ''}{held}, in "
        f"{places} place{'s' if places != 1 else ''} (main threads, outermost call first)" + missing
    )
