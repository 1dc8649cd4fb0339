"""``tether metrics``: a run's metric points, as they were reported (``protocol_specs/runs/metrics.py``)."""

from __future__ import annotations

import argparse
import json
import math
import sys

from protocol_specs.runs.metrics import point_line, points_of
from protocol_specs.wire import wire
from protocol_specs.wire.wire import StreamName
from relay.client import RelayError, follow_logs

from .runs import full_run_id
from .settings import resolve_relay

__all__ = ["cmd_metrics"]


async def cmd_metrics(args: argparse.Namespace) -> int:
    """Print the run's points, oldest first (``--follow``: and the new ones until it ends)."""
    relay = resolve_relay(args.relay, args)
    run_id = await full_run_id(relay, args.run)
    shown = 0

    def show(entry: wire.MetricEntry | wire.StatusEntry) -> None:
        nonlocal shown
        for point in points_of([entry]):
            shown += 1
            if args.json:
                step, at, values = point
                row = {"step": step, "at": at, **{k: _json_value(v) for k, v in values.items()}}
                print(json.dumps(row), flush=args.follow)
            else:
                print(point_line(point), flush=args.follow)

    try:
        await follow_logs(relay, run_id, show, stream=StreamName.METRICS, follow=args.follow)
    except RelayError as exc:
        raise SystemExit(f"tether: {exc.message}") from None
    if not shown and not args.json:
        print(
            f"-- tether: run {run_id} reported no metrics (tether.report() in the program, or "
            "--metric PATTERN when submitting)",
            file=sys.stderr,
        )
    return 0


def _json_value(value: float) -> float | str:
    """JSON has no NaN or infinity: those as strings (``"nan"``, ``"inf"``)."""
    return value if math.isfinite(value) else str(value)
