"""``tether stacks RUN``: the Python stacks of every process of a run, merged into classes.

The worker reads them (a ``stacks`` tunnel: ``worker_shim/program/sampler.py`` runs py-spy on
the program's processes without stopping them) and sends them as JSON; the run's record says
which processes the debugger holds paused, and why (the worker's ``paused`` statuses, as
``tether status`` shows them); ``protocol_specs/session/stacks.py`` merges both into the classes
and the tree this prints (``--json``: the report as data, ``docs/cli.md``).
"""

from __future__ import annotations

import argparse
import io
import json
import sys

from protocol_specs.runs.runs import ProcessRow, RunRecord
from protocol_specs.session.processes import MAIN
from protocol_specs.session.stacks import ProcessStack, StackReport, merge, render_tree
from protocol_specs.wire import wire
from protocol_specs.wire.tunnel_open import DidNotRun
from protocol_specs.wire.tunnels import TunnelSpec
from relay.client import Endpoint, open_control

from .errors import control_call
from .settings import resolve_relay
from .tunnel import open_tunnel_once, run_tunnel

__all__ = ["cmd_stacks", "with_states"]


async def cmd_stacks(args: argparse.Namespace) -> int:
    relay = resolve_relay(args.relay, args)
    record = await _record(relay, args.run)
    if record.finished or record.state.value not in ("running", "paused"):
        raise SystemExit(
            f"tether: run {record.id} is {record.state.value}: its stacks can be read while it "
            "runs (or is paused)"
        )
    got = await open_tunnel_once(relay, record.id, TunnelSpec(kind="stacks"))
    if not isinstance(got, wire.TunnelOpened):
        why = got.why if isinstance(got, DidNotRun) else f"the relay was lost ({got.why})"
        raise SystemExit(f"tether: the stacks of run {record.id} were not read: {why}")
    out, err = io.BytesIO(), io.BytesIO()
    code, said = await run_tunnel(relay, got, stdin=None, out={1: out, 2: err})
    if said or code:
        why = said or err.getvalue().decode(errors="replace").strip() or f"exit {code}"
        raise SystemExit(f"tether: the stacks of run {record.id} were not read: {why}")
    try:
        sampled = json.loads(out.getvalue())
        program = int(sampled["program"])
        processes = [ProcessStack.model_validate(p) for p in sampled["processes"]]
    except (ValueError, KeyError, TypeError):
        raise SystemExit(
            f"tether: run {record.id}'s worker answered with no stacks (is it an older tether?)"
        ) from None
    record = await _record(relay, record.id)  # paused now: the states as fresh as the stacks
    report = merge(with_states(processes, record.processes, program), run=record.id)
    if args.json:
        print(report.model_dump_json())
        return 0
    print(_header(report))
    for line in render_tree(report):
        print(line)
    sys.stdout.flush()
    return 0


async def _record(relay: Endpoint, run: str) -> RunRecord:
    async with open_control(relay, client="tether-stacks") as control:
        return await control_call(control.get_run(run))


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


def _header(report: StackReport) -> str:
    paused = sum(p.state == "paused" for p in report.processes)
    n = len(report.processes)
    places = len(report.classes)
    held = f", {paused} paused" if paused else ""
    return (
        f"run {report.run}: {n} Python process{'es' if n != 1 else ''}{held}, in "
        f"{places} place{'s' if places != 1 else ''} (main threads, outermost call first)"
    )
