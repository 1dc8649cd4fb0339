"""tether's benchmarks: ``./dev bench`` (or ``.venv/bin/python -m bench [--quick] [--only NAME]``).

Runs every benchmark on loopback and writes ``bench/report.md`` (with ``bench/latency.png``) and the
raw figures in ``bench/results/figures.json``. ``--quick`` is the tiny version the test suite runs
(``--out DIR`` to write elsewhere).
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
import time
from contextlib import AsyncExitStack
from pathlib import Path
from typing import Any

import trio

from relay.client import Endpoint

from . import (
    checkpoints,
    common,
    debuggable,
    first_stop,
    flood,
    idle,
    latency,
    metrics,
    node_latency,
    nodes,
    processes,
    ranks,
    report,
    resume,
    scale_out,
    snapshot,
    tunnels,
    wan,
    web,
)

BENCHES = (
    "latency",
    "flood",
    "first_stop",
    "idle",
    "snapshot",
    "resume",
    "processes",
    "wan",
    "debuggable",
    "tunnels",
    "scale_out",
    "web",
    "metrics",
    "ranks",
    "nodes",
    "checkpoints",
)

#: (full, quick) sizes
SIZES: dict[str, tuple[int, int]] = {
    "requests": (200, 5),  # the idle benchmark's live session (a Python client)
    "request_blocks": (3, 1),
    "request_rounds": (70, 3),
    "step_blocks": (3, 1),
    "steps": (100, 3),
    "stop_blocks": (3, 1),
    "stops": (35, 3),
    "flood_lines": (200_000, 2_000),
    "first_stops": (10, 1),
    "idle_sessions": (10_000, 20),
    "snapshot_files": (20_000, 200),
    "snapshot_mib": (500, 2),
    "snapshot_big_files": (200_000, 300),  # the second tree: many small files
    "snapshot_big_mib": (200, 1),
    "resumes": (30, 2),
    "child_stops": (10, 1),
    "process_children": (16, 2),
    "wan_blocks": (2, 1),
    "wan_stops": (25, 3),
    "debuggable_runs": (15, 2),
    "keystrokes": (200, 5),
    "forward_mib": (256, 4),
    "scale_sessions": (4_000, 20),  # idle sessions with each number of relays
    "scale_pairs": (16, 2),
    "scale_seconds": (5, 1),
    "web_runs": (10_000, 200),  # runs in the web view's list
    "web_rounds": (20, 3),
    "report_calls": (200_000, 2_000),  # tether.report calls in one run
    "report_rounds": (5, 1),
    "rank_max": (16, 2),  # rank groups of 2, 4, ... up to this many ranks
    "rank_rounds": (5, 1),
    "node_rounds": (5, 1),  # single-node and two-node runs each
    "checkpoint_mib": (1024, 64),  # the big file of the checkpoint
}

#: (full, quick) round-trip times of the slow-link benchmark, ms (``--rtt-ms`` overrides)
WAN_RTTS_MS: tuple[tuple[float, ...], tuple[float, ...]] = ((0, 20, 50, 100), (0, 50))


async def run(
    only: set[str],
    quick: bool,
    tmp: Path,
    rtts_ms: tuple[float, ...] | None = None,
    jitter_ms: float = 0.0,
) -> dict[str, Any]:
    size = {k: v[1] if quick else v[0] for k, v in SIZES.items()}
    rtts = rtts_ms or WAN_RTTS_MS[quick]
    figures: dict[str, Any] = {"machine": common.machine(), "quick": quick, "sizes": size}
    errors: dict[str, str] = {}

    async def bench_latency() -> None:
        async with common.tether_stack(tmp / "home-latency") as tether:
            figures["requests"] = await node_latency.requests(
                tether, tmp, size["request_blocks"], size["request_rounds"]
            )
            figures["steps"] = await node_latency.steps(
                tether, tmp, size["step_blocks"], size["steps"]
            )
            figures["stops"] = await node_latency.stops(
                tether, tmp, size["stop_blocks"], size["stops"]
            )

    async def bench_flood() -> None:
        async with common.tether_stack(tmp / "home-flood") as tether:
            lines, rates, peaks = size["flood_lines"], {"tether": [], "debugpy": []}, []
            for i, n in enumerate((lines // 4, lines)):  # 200k lines take minutes each way
                rate, peak = await flood.through_tether(tether, tmp, n, f"flood-t{i}")
                if n == lines:
                    rates["tether"].append(rate)
                    rates["debugpy"].append(await flood.straight(tmp, n, f"flood-d{i}"))
                peaks.append({"lines": n, "peak_kib": peak})
            responsive = {
                "tether": await flood.responsive_through_tether(
                    tether, tmp, lines, "flood-r-t", quick=quick
                ),
                "debugpy": await flood.responsive_straight(tmp, lines, "flood-r-d", quick=quick),
            }
            figures["flood"] = {
                "lines": lines,
                "lines_per_s": rates,
                "peaks": peaks,
                "responsiveness": responsive,
            }

    async def bench_first_stop() -> None:
        home = tmp / "home-first"
        async with common.relay_stack(home, workers=0) as (_up, relay):
            got: dict[str, list[float]] = {"tether": [], "debugpy": []}
            for i in range(size["first_stops"]):
                got["tether"].append(await first_stop.through_tether(home, relay, tmp, f"fs-t{i}"))
                got["debugpy"].append(await first_stop.straight(tmp, f"fs-d{i}"))
            figures["first_stop"] = {k: common.Dist(v) for k, v in got.items()}

    async def bench_idle() -> None:
        async with AsyncExitStack() as stack:
            # one user stands for all the idle sessions' users here: lift the per-user caps
            n = str(size["idle_sessions"] + 100)
            tether = await stack.enter_async_context(
                common.tether_stack(
                    tmp / "home-idle", relay_args=("--max-connections", n, "--max-runs", n)
                )
            )
            sessions = await latency.open_sessions(stack, tether, tmp, "idle", ways=("tether",))
            url = await tether.redis_url()
            figures["idle"] = await idle.run(
                tether.endpoint(),
                tether.up.process.pid,
                lambda: common.redis_used_memory(url),
                sessions["tether"],
                size["idle_sessions"],
                size["requests"],
            )

    async def bench_snapshot() -> None:
        async with common.tether_stack(tmp / "home-snapshot") as tether:
            figures["snapshot"] = await snapshot.run(
                tether.endpoint(), tmp / "tree-a", size["snapshot_files"], size["snapshot_mib"], 3
            )
            figures["snapshot"]["big"] = await snapshot.run(
                tether.endpoint(),
                tmp / "tree-b",
                size["snapshot_big_files"],
                size["snapshot_big_mib"],
                3,
            )

    async def bench_resume() -> None:
        async with common.tether_stack(tmp / "home-resume") as tether:
            figures["resume"] = await resume.run(tether.endpoint(), size["resumes"])

    async def bench_processes() -> None:
        home = tmp / "home-processes"
        async with common.relay_stack(home, workers=0) as (up, relay):
            url = (await up.wait_line(r"redis: (\S+)")).group(1)
            stops = await processes.first_stops(home, relay, tmp, size["child_stops"])
            mem = await processes.memory(
                home,
                relay,
                up.process.pid,
                lambda: common.redis_used_memory(url),
                tmp,
                size["process_children"],
            )
            figures["processes"] = {**stops, "memory": mem}

    async def bench_wan() -> None:
        async with common.tether_stack(tmp / "home-wan") as tether:
            figures["wan"] = await wan.wan(
                tether, tmp, rtts, size["wan_blocks"], size["wan_stops"], jitter_ms
            )

    async def bench_debuggable() -> None:
        figures["debuggable"] = await debuggable.run(tmp, size["debuggable_runs"], quick)

    async def bench_tunnels() -> None:
        async with common.tether_stack(tmp / "home-tunnels") as tether:
            figures["tunnels"] = await tunnels.run(
                tether, tmp, size["keystrokes"], size["forward_mib"], rtts
            )

    async def bench_scale_out() -> None:
        figures["scale_out"] = await scale_out.run(
            tmp / "home-scale",
            size["scale_sessions"],
            size["scale_pairs"],
            size["requests"],
            size["scale_seconds"],
        )

    async def bench_web() -> None:
        n = str(size["web_runs"] + 100)
        async with common.tether_stack(tmp / "home-web", relay_args=("--max-runs", n)) as tether:
            figures["web"] = await web.run(tether, size["web_runs"], size["web_rounds"], tmp)

    async def bench_metrics() -> None:
        async with common.tether_stack(tmp / "home-metrics") as tether:
            figures["metrics"] = await metrics.run(
                tether, size["report_calls"], size["report_rounds"], tmp
            )

    async def bench_ranks() -> None:
        home = tmp / "home-ranks"
        async with common.relay_stack(home, workers=0) as (_up, relay):
            figures["ranks"] = await ranks.run(
                home, relay, tmp, size["rank_max"], size["rank_rounds"]
            )

    async def bench_nodes() -> None:
        home = tmp / "home-nodes"
        async with common.relay_stack(home, workers=0) as (_up, relay):
            figures["nodes"] = await nodes.run(home, relay, tmp, size["node_rounds"])

    async def bench_checkpoints() -> None:
        home = tmp / "home-checkpoints"
        async with common.relay_stack(home, workers=0) as (_up, relay):
            token = (home / "data" / "token").read_text().strip()
            figures["checkpoints"] = await checkpoints.run(
                Endpoint(relay, token=token), tmp / "checkpoints", size["checkpoint_mib"]
            )

    stages = {
        "latency": bench_latency,
        "flood": bench_flood,
        "first_stop": bench_first_stop,
        "idle": bench_idle,
        "snapshot": bench_snapshot,
        "resume": bench_resume,
        "processes": bench_processes,
        "wan": bench_wan,
        "debuggable": bench_debuggable,
        "tunnels": bench_tunnels,
        "scale_out": bench_scale_out,
        "web": bench_web,
        "metrics": bench_metrics,
        "ranks": bench_ranks,
        "nodes": bench_nodes,
        "checkpoints": bench_checkpoints,
    }
    for name, stage in stages.items():
        if name in only:
            try:
                await stage()
            except Exception as exc:  # the other benchmarks still run; the report says
                errors[name] = f"{exc!r}"[:2000]
                print(f"bench {name} failed: {exc!r}", file=sys.stderr)
    if errors:
        figures["errors"] = errors
    return figures


#: what describes a run rather than a section of it
_RUN_KEYS = ("machine", "quick", "sizes", "wall_s", "date", "errors", "remeasured")


def _merged(path: Path, new: dict[str, Any], only: set[str]) -> dict[str, Any]:
    """The figures at ``path`` with the sections of ``new`` in place of theirs, and a note of
    which were measured again and when (the report says so)."""
    try:
        old: dict[str, Any] = _distributions(json.loads(path.read_text()))
    except (OSError, ValueError):
        return new
    if old.get("quick") != new["quick"]:
        return new
    old.update({k: v for k, v in new.items() if k not in _RUN_KEYS})
    errors = {k: v for k, v in old.get("errors", {}).items() if k not in only}
    errors.update(new.get("errors", {}))
    old["errors"] = errors
    old.setdefault("remeasured", []).append({"date": new["date"], "only": sorted(only)})
    return old


def _distributions(value: Any) -> Any:
    """Figures read back from JSON, each ``{"samples": [...]}`` a :class:`common.Dist` again."""
    if isinstance(value, dict):
        if set(value) == {"samples"} and isinstance(value["samples"], list):
            return common.Dist(value["samples"])
        return {k: _distributions(v) for k, v in value.items()}
    if isinstance(value, list):
        return [_distributions(v) for v in value]
    return value


def main() -> int:
    parser = argparse.ArgumentParser(prog="python -m bench", description=__doc__)
    parser.add_argument("--quick", action="store_true", help="tiny sizes (the test suite's)")
    parser.add_argument("--only", action="append", choices=BENCHES, help="run only these")
    parser.add_argument("--out", type=Path, default=Path(__file__).resolve().parent)
    parser.add_argument(
        "--merge",
        action="store_true",
        help="keep the other sections of the report in --out (with --only: re-measure these)",
    )
    parser.add_argument(
        "--rtt-ms",
        type=lambda s: tuple(float(x) for x in s.split(",")),
        help="round-trip times of the slow-link benchmark, comma-separated (default: 0,20,50,100; "
        "--quick: 0,50)",
    )
    parser.add_argument(
        "--jitter-ms", type=float, default=0.0, help="the slow link's jitter, uniform in [0, J]"
    )
    parser.add_argument(
        "--size",
        action="append",
        default=[],
        metavar="NAME=N",
        help="override one size (e.g. wan_stops=20)",
    )
    args = parser.parse_args()
    only = set(args.only or BENCHES)
    merge_into = args.out / "results" / "figures.json"
    if args.merge and not merge_into.is_file():
        # found out now, not after the benchmarks ran: the report would lose its other sections
        parser.error(
            f"--merge: there are no figures to merge into ({merge_into} is missing; it is not "
            "committed: run the whole benchmark once on this machine first)"
        )
    for item in args.size:
        key, _, value = item.partition("=")
        if key not in SIZES or not value.isdigit():
            parser.error(f"--size: give NAME=N with NAME one of {', '.join(SIZES)}")
        SIZES[key] = (int(value), int(value))
    started = time.time()
    with tempfile.TemporaryDirectory(prefix="tether-bench-") as tmp:
        # the programs write beside their workdirs (when a child was born...): as root, a pool
        # runs them as uids of their own, which must be let in (the stacks' own data stays 0700)
        os.chmod(tmp, 0o1777)
        figures = trio.run(run, only, args.quick, Path(tmp), args.rtt_ms, args.jitter_ms)
    figures["wall_s"] = time.time() - started
    figures["date"] = time.strftime("%Y-%m-%d %H:%M", time.localtime(started))
    out: Path = args.out
    if args.merge:
        figures = _merged(merge_into, figures, only)
    (out / "results").mkdir(parents=True, exist_ok=True)
    (out / "results" / "figures.json").write_text(json.dumps(figures, indent=2, default=vars))
    written = report.write(figures, out)
    print("\n".join(f"wrote {p}" for p in written))
    return 0


if __name__ == "__main__":
    sys.exit(main())
