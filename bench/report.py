"""``bench/report.md`` and ``bench/latency.png`` from the figures of one run."""

from __future__ import annotations

import statistics
from pathlib import Path
from typing import Any

from .checkpoints import section as checkpoints_section
from .common import DEBUGPY, TETHER, Dist, ms, verdict
from .latency_report import plot, requests_section, stepping_section
from .metrics import section as metrics_section
from .nodes import section as nodes_section
from .ranks import section as ranks_section
from .scale_out import section as scale_out_section
from .tunnels import section as tunnels_section
from .web import section as web_section


def _mib(kib: float) -> str:
    return f"{kib / 1024:.0f} MiB"


def _flood(f: dict[str, Any], _n: dict[str, int]) -> list[str]:
    t, d = f["lines_per_s"]["tether"], f["lines_per_s"]["debugpy"]
    ratio = min(t) / max(d) if d else 0
    best = max(t) / min(d) if d else 0
    roles = sorted(f["peaks"][0]["peak_kib"])
    rows = [
        "## 3. Output flood",
        "",
        f"A program printing {f['lines']:,} short lines under the debugger; lines per second "
        "reaching the DAP client as `output` events (runs alternating).",
        "",
        "| | runs (lines/s) |",
        "|---|---|",
        f"| through tether | {', '.join(f'{x:,.0f}' for x in t)} |",
        f"| stock debugpy | {', '.join(f'{x:,.0f}' for x in d)} |",
        f"| ratio (worst / best pairing) | {ratio:.2f} / {best:.2f}: target >= 0.9 "
        f"{verdict(ratio >= 0.9)} |",
        "",
        "Peak resident memory (VmHWM) of each tether process after each run (the adapter is a new "
        "process per run; the others serve every run). Bounded if the full runs' peaks stay at "
        "the quarter runs'.",
        "",
        "| run (lines) | " + " | ".join(roles) + " |",
        "|---" * (len(roles) + 1) + "|",
    ]
    for p in f["peaks"]:
        rows.append(
            f"| {p['lines']:,} | " + " | ".join(_mib(p["peak_kib"].get(r, 0)) for r in roles) + " |"
        )
    if "responsiveness" in f:
        rows += ["", *_responsiveness(f["responsiveness"], f["lines"])]
    return [*rows, ""]


def _responsiveness(r: dict[str, dict[str, Any]], lines: int) -> list[str]:
    def ms_or_none(x: float | None) -> str:
        return "-" if x is None else ms(x)

    rows = [
        f"Responsiveness during a flood of {lines:,} lines, seen by VS Code's own client "
        "(Microsoft's DebugClient, `bench/flood_probe.mjs`) attaching with VS Code's arguments "
        "(`RedirectOutput`): a `threads` request every 0.1 s, one `pause` "
        f"{r['tether'].get('pause_after_output_s', 1.0):g} s after the first output arrived "
        f"(each run ends {r['tether'].get('window_s', 60)} s after `configurationDone` at the "
        "latest). The `threads` figures are of the requests sent between the first output and "
        "`stopped`.",
        "",
        "| | `threads` answered | median | max | unanswered, longest wait | `pause` -> `stopped` "
        "| program at the stop (line) | lines the client had at `stopped` |",
        "|---|---|---|---|---|---|---|---|",
    ]

    def count(x: int | None) -> str:
        return "-" if x is None else f"{x:,}"

    for way, name in (("tether", "through tether"), ("debugpy", "stock debugpy")):
        x = r[way]
        waited = x["unanswered_longest_s"]
        stop = x["pause_to_stopped_ms"]
        rows.append(
            f"| {name} | {x['threads_answered']} of {x['threads_sent']} "
            f"| {ms_or_none(x['threads_median_ms'])} | {ms_or_none(x['threads_max_ms'])} "
            f"| {'-' if waited is None else f'{waited:.1f} s'} "
            f"| {'none within the window' if stop is None else ms_or_none(stop)} "
            f"| {count(x['printed_at_stop'])} | {count(x['lines_before_stopped'])} |"
        )
    return rows


def _first_stop(f: dict[str, Dist], _n: dict[str, int]) -> list[str]:
    t, d = f["tether"], f["debugpy"]
    ratio = t.median / d.median
    return [
        "## 4. Time to first stop",
        "",
        "From the program's process starting to the IDE holding `stopped` at a breakpoint on an "
        "early line. tether: the IDE configured the run while it was queued, then a worker "
        "started it; stock debugpy: started directly, the client attaching as soon as it listens.",
        "",
        "| | median | p99 | runs |",
        "|---|---|---|---|",
        f"| through tether | {ms(t.median)} | {ms(t.p99)} | {len(t.samples)} |",
        f"| stock debugpy | {ms(d.median)} | {ms(d.p99)} | {len(d.samples)} |",
        f"| ratio | {ratio:.2f} (target <= 1.2: {verdict(ratio <= 1.2)}) | | |",
        "",
    ]


def _idle(f: dict[str, Any], _n: dict[str, int]) -> list[str]:
    relay, redis = f["relay_kib_per_session"], f["redis_bytes_per_session"] / 1024
    rows = [
        "## 5. Idle scale",
        "",
        f"{f['sessions']:,} queued debug sessions on one relay process, each with an adapter's "
        f"relay link and its configuration (20 breakpoints); set up in {f['setup_s']:.0f} s.",
        "",
        *([f"Opening more failed: `{f['failure']}`", ""] if f.get("failure") else []),
        "| | per idle session | target |",
        "|---|---|---|",
        f"| relay resident memory | {relay:.1f} KiB | <= 50 KB: {verdict(relay * 1024 <= 50_000)} |",
        f"| Redis used_memory | {redis:.1f} KiB | <= 10 KB: {verdict(redis * 1024 <= 10_000)} |",
        "",
        "A live session's round trips (through tether) before and after the idle sessions joined:",
        "",
        "| | before: median | p99 | after: median | p99 |",
        "|---|---|---|---|---|",
    ]
    for c, before in f["live_before"].items():
        after = f["live_after"][c]
        rows.append(
            f"| {c} | {ms(before.median)} | {ms(before.p99)} | {ms(after.median)} "
            f"| {ms(after.p99)} |"
        )
    return [*rows, ""]


def _snapshot(f: dict[str, Any], n: dict[str, int]) -> list[str]:
    rows = [
        "## 6. Snapshot",
        "",
        "A tree is submitted once; then one file changes and the tree is submitted again (tether: "
        "snapshot with the digest cache, ask the relay top-down what it lacks, upload it, submit "
        "the root tree) or synced (`rsync -a` between two local directories), alternating. "
        "tether's bytes are every frame the client sent.",
        "",
    ]
    for tree in (f, f.get("big")):
        if tree:
            rows += _snapshot_tree(tree, n)
    return rows


def _snapshot_tree(f: dict[str, Any], n: dict[str, int]) -> list[str]:
    t, r = f["rounds"]["tether"], f["rounds"]["rsync"]
    files = f.get("files", n["snapshot_files"])
    rows = [
        f"**{files:,} files, {f.get('mib', n['snapshot_mib'])} MiB**: first submit "
        f"{f['first']['ms'] / 1000:.1f} s ({f['first']['bytes']:,} bytes sent); then one file of "
        f"{f['file_bytes']:,} bytes changes.",
        "",
        "| round | tether: bytes sent (of them file bytes; trees uploaded) | wall "
        "| rsync: bytes sent | wall |",
        "|---|---|---|---|---|",
    ]
    for i, tt in enumerate(t):
        rr = r[i] if i < len(r) else {"bytes": -1, "ms": float("nan")}
        rows.append(
            f"| {i + 1} | {tt['bytes']:,} ({tt['blob_bytes']:,}; {tt.get('trees', 0)}) "
            f"| {ms(tt['ms'])} | {rr['bytes']:,} | {ms(rr['ms'])} |"
        )
    if r:
        only_changed = all(tt["blob_bytes"] == f["file_bytes"] for tt in t)
        small = all(tt["bytes"] <= f["file_bytes"] + 64 * 1024 for tt in t)
        ratio = statistics.median(x["ms"] for x in t) / statistics.median(x["ms"] for x in r)
        rows += [
            "",
            f"Only the changed file's bytes uploaded: {verdict(only_changed)}; everything sent "
            f"within the file + 64 KiB (O(changed), not O(tree)): {verdict(small)}; faster than "
            f"rsync (median): {verdict(ratio < 1)} ({ratio:.2f} x rsync's time).",
        ]
    return [*rows, ""]


def _resume(f: dict[str, Dist], _n: dict[str, int]) -> list[str]:
    r, b = f["reconnect"], f["first message after welcome"]
    return [
        "## 7. Resume",
        "",
        "A worker link reconnects while an entry waits for it in the relay: the reconnect itself "
        "(WebSocket handshake, `hello` to `welcome`), then the wait for the buffered entry.",
        "",
        "| | median | p99 |",
        "|---|---|---|",
        f"| reconnect | {ms(r.median)} | {ms(r.p99)} |",
        f"| first buffered message after it | {ms(b.median)} | {ms(b.p99)} |",
        f"| target: < 100 ms beyond the reconnect | {verdict(b.p99 < 100)} (p99) | |",
        "",
    ]


def _processes(f: dict[str, Any], _n: dict[str, int]) -> list[str]:
    t, d = f["child_first_stop"]["tether"], f["child_first_stop"]["debugpy"]
    mt, md = f["child_first_stop_mark"]["tether"], f["child_first_stop_mark"]["debugpy"]
    ot, od = f["child_offered"]["tether"], f["child_offered"]["debugpy"]
    m = f["memory"]
    k = m["children"]
    rows = [
        "## 8. Processes",
        "",
        "Time from a child process's start to the IDE holding that child's `stopped`: a parent "
        "starts one `multiprocessing` spawn child whose function stops at a breakpoint on its "
        "first line. tether: the IDE configured the run while it was queued, then a worker "
        "started it; the adapter offered the child with `startDebugging` when it stopped "
        "(`--processes stopped`). Stock debugpy: started with `--configure-subProcess true`, the "
        "client attached; it answers debugpy's `startDebugging` by opening the child's session, "
        "sets the breakpoint there and sends `configurationDone`. The client is Microsoft's "
        "DebugClient (`tests/e2e/node/vscode_scenario.mjs`), as in VS Code. From the child's "
        "birth (`/proc/PID/stat`, 10 ms ticks) to the client's receipt of `stopped` in the "
        "child's session, by the runner's transcript timestamp (its clock related to the "
        "bench's once per run: a request sent as the bench released a `mark`). Runs alternate.",
        "",
        "| | median | p99 | runs | to `startDebugging`, median "
        "| check: `MARK` after the stop, median |",
        "|---|---|---|---|---|---|",
        f"| through tether | {ms(t.median)} | {ms(t.p99)} | {len(t.samples)} "
        f"| {ms(ot.median)} | {ms(mt.median)} |",
        f"| stock debugpy | {ms(d.median)} | {ms(d.p99)} | {len(d.samples)} "
        f"| {ms(od.median)} | {ms(md.median)} |",
        f"| ratio | {t.median / d.median:.2f} | | | | {mt.median / md.median:.2f} |",
        "",
        "`startDebugging`: from the birth to the client receiving the offer of the child's "
        "session (tether offers a child when it first stops; debugpy as soon as the child's "
        "debugpy connects, before it runs user code). The check column is the bench's own clock "
        "on reading the `MARK` line the runner prints once the child's session is set up and its "
        "`stopped` consumed: an upper bound that needs no clock relation.",
        "",
        f"Memory per extra process session: a run whose program starts {k} spawn children that "
        f"each stop at the breakpoint, the client holding all {k} child sessions, against the "
        "same run with one child (a one-child run before both, not counted). Each figure grew "
        "from the IDE configuring the queued run to every child stopped; per process: "
        f"(growth({k}) - growth(1)) / {k - 1}.",
        "",
        "| | per extra process session | growth, 1 child | growth, " + str(k) + " children |",
        "|---|---|---|---|",
    ]
    one, many = m["runs"][-2], m["runs"][-1]

    def grew(run: dict[str, Any], key: str) -> float:
        return float(run[key][1] - run[key][0])

    for key, name, per, unit in (
        ("relay_rss_kib", "relay resident memory", m["relay_kib_per_process"], 1.0),
        ("redis_used_memory", "Redis used_memory", m["redis_bytes_per_process"], 1 / 1024),
        ("adapter_rss_kib", "adapter (`tether debug`) resident memory",
         m["adapter_kib_per_process"], 1.0),
    ):  # fmt: skip
        rows.append(
            f"| {name} | {per * unit:.1f} KiB | {grew(one, key) * unit:.1f} KiB "
            f"| {grew(many, key) * unit:.1f} KiB |"
        )
    rows += [
        "",
        f"Child sessions the client opened: {one['sessions_opened']} and "
        f"{many['sessions_opened']}. Resident memory moves in 4 KiB pages and by the allocator's "
        "arenas, so a per-process figure of a few KiB either way is within its noise.",
    ]
    return [*rows, ""]


def _wan(f: dict[str, Any], n: dict[str, int]) -> list[str]:
    jitter = f["jitter_ms"]
    rows = [
        "## 9. Over a slow link",
        "",
        "A whole VS Code stop: `next` sent until the IDE holds everything its views show, asked as "
        "VS Code asks (its own UI timers left out): on `stopped`, `threads` and `stackTrace` of "
        "the top frame, one after the other; then at once `stackTrace` of the next 19 frames, "
        "`scopes` of the top frame followed by `variables` of `Locals`, and two watch `evaluate`s "
        f"({', '.join(f'`{w}`' for w in f['watches'])}). Measured with Microsoft's DebugClient "
        "under node (`tests/e2e/node/vscode_scenario.mjs`, its `parallel` step), from its "
        "transcript: `next` sent until the last of those responses arrived; `programs/loop.py` "
        "paused 20 frames deep. A link-delay proxy (`bench/delay_proxy.py`, RTT/2 each way"
        f"{f', jitter uniform in [0, {jitter:g}] ms' if jitter else ', no jitter'}, latency "
        "only) sits on the slow link: **tether**: between the adapter (`tether debug`, beside "
        "the IDE) and the relay; the worker and Redis stay local to the relay, as when the relay "
        "runs near the GPUs. **stock debugpy**: between the client and debugpy's port, an SSH "
        "tunnel's stand-in. At RTT 0 the proxy is still in the path, so debugpy writes to the "
        "proxy's socket as it would to sshd's (its Nagle stalls then differ from section 2's, "
        f"where node reads debugpy's socket itself). {n['wan_stops']} stops per way in each of "
        f"{n['wan_blocks']} block(s) per RTT, the ways taking turns.",
        "",
        "| RTT | tether median | p99 | stock debugpy median | p99 | tether / debugpy "
        "| target: tether <= 1.5 x RTT + 10 ms |",
        "|---|---|---|---|---|---|---|",
    ]
    for row in f["rows"]:
        rtt = row["rtt_ms"]
        t, d = row["whole"][TETHER], row["whole"][DEBUGPY]
        target = 1.5 * rtt + 10
        rows.append(
            f"| {rtt:g} ms | {ms(t.median)} | {ms(t.p99)} | {ms(d.median)} | {ms(d.p99)} "
            f"| {t.median / d.median:.2f} | {ms(target)}: {verdict(t.median <= target)} |"
        )
    rows += [
        "",
        "The parts, medians: `next` sent until `stopped` arrived, and one `threads` round trip "
        "within the stop (the link's RTT plus what lies behind it); the fastest whole stop, and "
        "how many stops took over 150 ms more than it (a stall, not the link).",
        "",
        "| RTT | tether: next -> stopped | threads | fastest stop | stalled "
        "| stock debugpy: next -> stopped | threads | fastest stop | stalled |",
        "|---|---|---|---|---|---|---|---|---|",
    ]

    def stalls(d: Dist) -> str:
        fastest = min(d.samples)
        return f"{sum(x > fastest + 150 for x in d.samples)} of {len(d.samples)}"

    for row in f["rows"]:
        s, th, w = row["stopped"], row["threads"], row["whole"]
        rows.append(
            f"| {row['rtt_ms']:g} ms | {ms(s[TETHER].median)} | {ms(th[TETHER].median)} "
            f"| {ms(min(w[TETHER].samples))} | {stalls(w[TETHER])} "
            f"| {ms(s[DEBUGPY].median)} | {ms(th[DEBUGPY].median)} "
            f"| {ms(min(w[DEBUGPY].samples))} | {stalls(w[DEBUGPY])} |"
        )
    return [*rows, ""]


def _debuggable(f: dict[str, Any], _n: dict[str, int]) -> list[str]:
    when = (
        [
            f"_Measured separately (`./dev bench --only debuggable`, {f['measured']}, same machine)._",
            "",
        ]
        if f.get("measured")
        else []
    )
    rows = [
        "## 10. Debuggable runs",
        "",
        *when,
        "What a plain run costs while nobody is attached, when `tether run` starts it so that "
        "`tether attach` can debug it later (the default): the program against plain `python` "
        f"(Python {f['python']}), {f['runs']} runs each, alternating; the worker's side of the "
        "attach socket holds each program's connection, as a worker does. The loops time "
        "themselves; the start is the whole process, start to exit.",
        "",
        "| | plain median | min | debuggable median | min | ratio: medians | minimums "
        "| pairs (median) | target |",
        "|---|---|---|---|---|---|---|---|---|",
    ]
    for name, p in f["programs"].items():
        plain, ours = p["plain"], p["debuggable"]
        medians, minimums = ours["median"] / plain["median"], ours["min"] / plain["min"]
        paired = p.get("paired_ratio", medians)
        loop = "iterations" in p and p["iterations"] > 0
        target = f"<= 1.02 (pairs): {verdict(paired <= 1.02)}" if loop else ""
        what = f"{name} ({p['iterations']:,})" if loop else name
        rows.append(
            f"| {what} | {ms(plain['median'] * 1000)} | {ms(plain['min'] * 1000)} "
            f"| {ms(ours['median'] * 1000)} | {ms(ours['min'] * 1000)} | {medians:.3f} "
            f"| {minimums:.3f} | {paired:.3f} | {target} |"
        )
    return [
        *rows,
        "",
        "This machine's speed for one program jumps by up to a third from run to run (two cores "
        "shared with other guests: a run lands in a fast or a slow mode), which moves medians "
        "and minimums by several percent either way; the target reads the median of the ratios "
        "of the pairs run back to back.",
        "",
    ]


SECTIONS = {
    "flood": _flood,
    "first_stop": _first_stop,
    "idle": _idle,
    "snapshot": _snapshot,
    "resume": _resume,
    "processes": _processes,
    "wan": _wan,
    "debuggable": _debuggable,
    "tunnels": tunnels_section,
    "scale_out": scale_out_section,
    "web": web_section,
    "metrics": metrics_section,
    "ranks": ranks_section,
    "nodes": nodes_section,
    "checkpoints": checkpoints_section,
}


def write(figures: dict[str, Any], out: Path) -> list[Path]:
    m = figures["machine"]
    lines = [
        "# tether benchmarks",
        "",
        f"Measured {figures['date']} in {figures['wall_s']:.0f} s by `./dev bench`"
        f"{' --quick (tiny sizes: not figures to quote)' if figures['quick'] else ''}, on "
        f"{m['cpu']} ({m['cores']} cores, {m['memory_mib']} MiB), {m['os']}, Python "
        f"{m['python']}, debugpy {m['debugpy']}. Everything on loopback; each figure is tether "
        "against its baseline measured in the same run, interleaved.",
        *(
            line
            for again in figures.get("remeasured", [])
            for line in (
                "",
                f"Measured again {again['date']} (`./dev bench --merge` of "
                f"{', '.join(again['only'])}): those sections are from then.",
            )
        ),
        "",
    ]
    written = []
    if "requests" in figures:
        n = figures["sizes"]
        lines += [
            *requests_section(figures["requests"], n),
            *stepping_section(figures["steps"], figures["stops"], n),
        ]
        png = out / "latency.png"
        if plot(figures, png):
            lines += ["![latency distributions](latency.png)", ""]
            written.append(png)
    for name, section in SECTIONS.items():
        if name in figures:
            lines += section(figures[name], figures["sizes"])
    for name, error in figures.get("errors", {}).items():
        lines += [f"## {name}: failed", "", f"`{error}`", ""]
    path = out / "report.md"
    path.write_text("\n".join(lines))
    return [path, *written]
