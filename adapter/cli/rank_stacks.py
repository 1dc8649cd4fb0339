"""``tether stacks RUN``: the Python stacks of every process of a run, merged into classes.

The worker reads them (a ``stacks`` tunnel: ``worker_shim/program/sampler.py`` runs py-spy on
the program's processes without stopping them) and sends them as JSON; the run's record says
which processes the debugger holds paused, and why (the worker's ``paused`` statuses, as
``tether status`` shows them); ``protocol_specs/session/stacks.py`` merges both into the classes
and the tree this prints (``--json``: the report as data, ``docs/cli.md``). A run that spans
nodes is read on every node at once (a tunnel per node's worker: ``each_node.py``), and all its
ranks are merged as one node's are; a node whose stacks could not be read is named in the
header (``missing`` in ``--json``).
"""

from __future__ import annotations

import argparse
import sys

from protocol_specs.runs.runs import RunRecord
from protocol_specs.session.stack_report import NoStacks, header, report_of_nodes, with_states
from protocol_specs.session.stacks import render_tree
from protocol_specs.wire.tunnels import TunnelSpec
from relay.client import Endpoint, open_control

from .each_node import read_each_node
from .errors import control_call
from .settings import resolve_relay

__all__ = ["cmd_stacks", "with_states"]


async def cmd_stacks(args: argparse.Namespace) -> int:
    relay = resolve_relay(args.relay, args)
    record = await _record(relay, args.run)
    if record.finished or record.state.value not in ("running", "paused"):
        raise SystemExit(
            f"tether: run {record.id} is {record.state.value}: its stacks can be read while it "
            "runs (or is paused)"
        )
    got = await read_each_node(relay, record, TunnelSpec(kind="stacks"))
    read = {node: out for node, out in got.items() if isinstance(out, bytes)}
    failed = {node: why for node, why in got.items() if isinstance(why, str)}
    if not read:
        of = f" (node {min(failed)})" if len(got) > 1 else ""
        raise SystemExit(
            f"tether: the stacks of run {record.id} were not read{of}: {failed[min(failed)]}"
        )
    record = await _record(relay, record.id)  # paused now: the states as fresh as the stacks
    try:
        report = report_of_nodes(read, record)
    except NoStacks as exc:
        raise SystemExit(f"tether: {exc} (is it an older tether?)") from None
    # the other nodes' stacks are shown, and the header says whose are not
    report.missing = [f"node {node}: {why}" for node, why in failed.items()]
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
