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
import sys

from protocol_specs.runs.runs import RunRecord
from protocol_specs.session.stack_report import NoStacks, header, report_of, with_states
from protocol_specs.session.stacks import render_tree
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
    record = await _record(relay, record.id)  # paused now: the states as fresh as the stacks
    try:
        report = report_of(out.getvalue(), record)
    except NoStacks as exc:
        raise SystemExit(f"tether: {exc} (is it an older tether?)") from None
    if args.json:
        print(report.model_dump_json())
        return 0
    print(header(report))
    for line in render_tree(report):
        print(line)
    sys.stdout.flush()
    return 0


async def _record(relay: Endpoint, run: str) -> RunRecord:
    async with open_control(relay, client="tether-stacks") as control:
        return await control_call(control.get_run(run))
