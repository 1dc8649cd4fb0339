"""``tether eval RUN EXPR``: one expression's value in every paused rank, side by side.

The worker evaluates it (an ``eval`` tunnel, as ``tether stacks`` reads stacks through a
``stacks`` one: ``worker_shim/program/tunnels.py`` hands it to the debug session's driver,
``worker_shim/session/rank_eval.py`` asks each paused rank's debugpy) and answers the values as
JSON; ``protocol_specs/session/rank_values.py`` renders them (equal values merged, then a
summary), as the debug console's ``@all EXPR`` does.
"""

from __future__ import annotations

import argparse
import io
import sys

import trio

from protocol_specs.runs.runs import RunRecord
from protocol_specs.session.rank_values import EvalReport, nothing_evaluated, render, summary
from protocol_specs.wire import wire
from protocol_specs.wire.tunnel_open import DidNotRun
from protocol_specs.wire.tunnels import TunnelSpec
from relay.client import Endpoint, open_control

from .errors import control_call
from .settings import resolve_relay
from .tunnel import open_tunnel_once, run_tunnel

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
    """The worker's answer: every rank's value."""
    with trio.move_on_after(ANSWER_WITHIN) as waited:
        got = await open_tunnel_once(relay, record.id, spec)
        if not isinstance(got, wire.TunnelOpened):
            why = got.why if isinstance(got, DidNotRun) else f"the relay was lost ({got.why})"
            raise SystemExit(f"tether: {spec.expression!r} was not evaluated in run {record.id}: "
                             f"{why}")  # fmt: skip
        out, err = io.BytesIO(), io.BytesIO()
        code, said = await run_tunnel(relay, got, stdin=None, out={1: out, 2: err})
    if waited.cancelled_caught:
        raise SystemExit(
            f"tether: run {record.id}'s worker did not answer within {ANSWER_WITHIN:g} s (is it "
            "an older tether?)"
        )
    if said or code:
        why = said or err.getvalue().decode(errors="replace").strip() or f"exit {code}"
        raise SystemExit(f"tether: {why}")
    try:
        return EvalReport.model_validate_json(out.getvalue())
    except ValueError:
        raise SystemExit(
            f"tether: run {record.id}'s worker answered with no values (is it an older tether?)"
        ) from None


async def _record(relay: Endpoint, run: str) -> RunRecord:
    async with open_control(relay, client="tether-eval") as control:
        return await control_call(control.get_run(run))
