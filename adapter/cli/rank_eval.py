"""``tether eval RUN EXPR``: one expression's value in every paused rank, side by side.

The worker evaluates it (an ``eval`` tunnel, as ``tether stacks`` reads stacks through a
``stacks`` one: ``worker_shim/program/tunnels.py`` hands it to the debug session's driver,
``worker_shim/session/rank_eval.py`` asks each paused rank's debugpy) and answers the values as
JSON; ``protocol_specs/session/rank_values.py`` renders them (equal values merged, then a
summary), as the debug console's ``@all EXPR`` does. A run that spans nodes is asked on every
node at once (a tunnel per node's worker: ``each_node.py``); the values of all its ranks are
merged (``merge_values``) and compared as one node's are; a node that did not answer is said, on
stderr.
"""

from __future__ import annotations

import argparse
import sys

import trio

from protocol_specs.runs.runs import RunRecord
from protocol_specs.session.rank_values import (
    EvalReport,
    merge_values,
    nothing_evaluated,
    render,
    summary,
)
from protocol_specs.wire.tunnels import TunnelSpec
from relay.client import Endpoint, open_control

from .each_node import read_each_node
from .errors import control_call
from .settings import resolve_relay

__all__ = ["ANSWER_WITHIN", "cmd_eval"]

#: seconds the worker has to answer (it gives each rank 20: ``rank_eval.EVAL_WAIT``)
ANSWER_WITHIN = 90.0


async def cmd_eval(args: argparse.Namespace) -> int:
    relay = resolve_relay(args.relay, args)
    expression = args.expression.strip()
    if not expression:
        raise SystemExit("tether: eval needs an expression, e.g. tether eval RUN 'loss.item()'")
    record = await _record(relay, args.run)
    if not record.spec.debug:
        raise SystemExit(
            f"tether: run {record.id} is not a debug run: its ranks are not debugged (start it "
            "with tether debug)"
        )
    if record.finished or record.state.value not in ("running", "paused"):
        raise SystemExit(
            f"tether: run {record.id} is {record.state.value}: expressions are evaluated in the "
            "paused ranks of a run that runs"
        )
    spec = TunnelSpec(kind="eval", expression=expression, ranks=args.ranks or [])
    report = await _ask(relay, record, spec)
    report = report.model_copy(update={"run": record.id, "summary": summary(report.values)})
    why = nothing_evaluated(report.values)
    if why:
        raise SystemExit(f"tether: run {record.id}: {why}")
    if args.json:
        print(report.model_dump_json())
        return 0
    evaluated = sum(v.state in ("value", "error") for v in report.values)
    print(f"run {record.id}: {expression}  ({evaluated} of {len(report.values)} ranks evaluated)")
    for line in render(report.values, by_value=args.by_value):
        print(line)
    sys.stdout.flush()
    return 0


async def _ask(relay: Endpoint, record: RunRecord, spec: TunnelSpec) -> EvalReport:
    """The workers' answers (one per node): every rank's value."""
    got: dict[int, bytes | str] = {}
    with trio.move_on_after(ANSWER_WITHIN) as waited:
        got = await read_each_node(relay, record, spec)
    if waited.cancelled_caught:
        raise SystemExit(
            f"tether: run {record.id}'s worker did not answer within {ANSWER_WITHIN:g} s (is it "
            "an older tether?)"
        )
    reports: dict[int, EvalReport] = {}
    failed: dict[int, str] = {}
    for node, out in got.items():
        if isinstance(out, str):
            failed[node] = out
            continue
        try:
            reports[node] = EvalReport.model_validate_json(out)
        except ValueError:
            failed[node] = "it answered with no values (is it an older tether?)"
    of = {node: f"node {node}'s worker" if len(got) > 1 else "its worker" for node in got}
    if not reports:
        node = min(failed)
        raise SystemExit(f"tether: {spec.expression!r} was not evaluated in run {record.id} "
                         f"({of[node]}): {failed[node]}")  # fmt: skip
    for node, why in failed.items():  # the other nodes' ranks are shown
        print(f"tether: node {node}'s ranks were not evaluated: {why}", file=sys.stderr)
    values = merge_values(r.values for r in reports.values())
    return next(iter(reports.values())).model_copy(update={"values": values})


async def _record(relay: Endpoint, run: str) -> RunRecord:
    async with open_control(relay, client="tether-eval") as control:
        return await control_call(control.get_run(run))
