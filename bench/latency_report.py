"""The DAP latency sections of ``bench/report.md`` (requests on a paused program, stepping and
whole stops, tether against stock debugpy and the floor) and their plot, ``bench/latency.png``."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from .common import DEBUGPY, FLOOR, TETHER, WAY_NAMES, Dist, ms, verdict

__all__ = ["plot", "requests_section", "stepping_section"]


def _way_cells(ways: dict[str, Dist]) -> str:
    t, d, f = ways[TETHER], ways[DEBUGPY], ways[FLOOR]
    return (
        f"{ms(t.median)} | {ms(t.p99)} | {ms(d.median)} | {ms(d.p99)} "
        f"| {ms(f.median)} | {ms(f.p99)}"
    )


_HEAD = (
    "| | tether median | p99 | stock debugpy median | p99 | floor median | p99 "
    "| tether / debugpy | tether - floor | target |"
)


def requests_section(f: dict[str, Any], n: dict[str, int]) -> list[str]:
    rows = [
        "## 1. Request latency (paused program, 20 frames deep)",
        "",
        f"Round trips of single requests, {n['request_rounds']} of each per way in each of "
        f"{n['request_blocks']} block(s), the ways taking turns, seen by Microsoft's DebugClient "
        "under node (`tests/e2e/node/vscode_scenario.mjs`, transcript times to the microsecond), "
        "which delays its TCP ACKs as VS Code does. Ways: "
        + "; ".join(f"**{w}**: {WAY_NAMES[w]}" for w in (TETHER, DEBUGPY, FLOOR))
        + ". The program stopped at its breakpoint, the watch `total` was evaluated, then one "
        "`next`: the requests are of that stop.",
        "",
        "What VS Code asks at every stop: tether's adapter answers it from the stop's prefetch "
        "(debugpy's own answers, gathered by the worker when the thread stopped); the other ways "
        "ask debugpy.",
        "",
        _HEAD,
        "|---|---|---|---|---|---|---|---|---|---|",
    ]
    for name, ways in f["prefetched"].items():
        t, d, fl = ways[TETHER], ways[DEBUGPY], ways[FLOOR]
        rows.append(
            f"| {name} | {_way_cells(ways)} | {t.median / d.median:.3f} "
            f"| {t.median - fl.median:+.2f} ms | |"
        )
    rows += [
        "",
        "Requests tether forwards to debugpy (nothing of the prefetch answers them): the whole "
        "path, adapter, relay and worker.",
        "",
        _HEAD,
        "|---|---|---|---|---|---|---|---|---|---|",
    ]
    for name, ways in f["forwarded"].items():
        t, d, fl = ways[TETHER], ways[DEBUGPY], ways[FLOOR]
        above = t.median - fl.median
        rows.append(
            f"| {name} | {_way_cells(ways)} | {t.median / d.median:.3f} | {above:+.2f} ms "
            f"| <= floor + 2 ms: {verdict(above <= 2.0)} |"
        )
    return [*rows, ""]


def stepping_section(steps: dict[str, Any], stops: dict[str, Any], n: dict[str, int]) -> list[str]:
    rows = [
        "## 2. Stepping",
        "",
        f"With the same client: `next` sent until its response, and until the `stopped` event "
        f"({n['steps']} steps per way in each of {n['step_blocks']} block(s), nothing else "
        "asked); a whole VS Code stop: `next` sent until the IDE holds everything its views show, "
        "asked as VS Code asks (on `stopped`, `threads` and the top frame one after the other, "
        "then at once the next 19 frames, `scopes` then `variables` of `Locals`, and two watch "
        f"`evaluate`s; {n['stops']} stops per way in each of {n['stop_blocks']} block(s), section "
        "9's scenario without the slow link); and the end of a run.",
        "",
        _HEAD,
        "|---|---|---|---|---|---|---|---|---|---|",
    ]

    def row(name: str, ways: dict[str, Dist], target: str) -> str:
        t, d, fl = ways[TETHER], ways[DEBUGPY], ways[FLOOR]
        return (
            f"| {name} | {_way_cells(ways)} | {t.median / d.median:.3f} "
            f"| {t.median - fl.median:+.2f} ms | {target} |"
        )

    t = steps["stopped"][TETHER].median / steps["stopped"][DEBUGPY].median
    whole = stops["whole"]
    # the floor's whole stop still waits on VS Code's Nagle and debugpy's delayed ACK now and
    # then (requests written back to back): its fastest stop is the floor without those stalls
    fastest = {w: min(whole[w].samples) for w in (TETHER, DEBUGPY, FLOOR)}
    twice = whole[TETHER].median / fastest[FLOOR]
    rows += [
        row("next -> response", steps["answered"], ""),
        row("next -> stopped", steps["stopped"], f"<= 0.25 x debugpy: {verdict(t <= 0.25)}"),
        row(
            "whole VS Code stop",
            whole,
            f"<= 2 x the floor's fastest stop: {verdict(twice <= 2)} ({twice:.2f} x)",
        ),
    ]
    e = steps["ended"]
    tt, d, fl = e[TETHER], e[DEBUGPY], e[FLOOR]
    rows.append(
        f"| last line -> terminated | {ms(tt.median)} | {ms(max(tt.samples))} (max) "
        f"| {ms(d.median)} | {ms(max(d.samples))} (max) | {ms(fl.median)} "
        f"| {ms(max(fl.samples))} (max) | {tt.median / d.median:.1f} "
        f"| {tt.median - fl.median:+.0f} ms | <= 500 ms: {verdict(max(tt.samples) <= 500)} |"
    )
    return [
        *rows,
        "",
        f"The fastest whole stop: tether {ms(fastest[TETHER])}, stock debugpy "
        f"{ms(fastest[DEBUGPY])}, floor {ms(fastest[FLOOR])}. The floor's median is not its "
        "floor: VS Code's client writes the concurrent requests of a stop back to back with "
        "Nagle on, and debugpy's adapter process delays its ACKs, so most of its stops wait "
        "40 ms once or more (tether's adapter acknowledges the IDE's packets at once); the target is judged "
        "against the floor's fastest stop.",
        "",
        "`last line -> terminated`: the program is continued to its end; from the `output` event "
        "of its last line to `terminated`, once per block. Stock debugpy and the floor send the "
        "program's output as pydevd captured it, which reaches the client at the end together "
        "with `terminated`; tether reads the program's pipes, so the last line reaches the IDE "
        "as it is printed and the figure is the time debugpy takes to end the program.",
        "",
    ]


def plot(figures: dict[str, Any], path: Path) -> bool:
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        return False
    requests = figures.get("requests", {})
    panels = {**requests.get("prefetched", {}), **requests.get("forwarded", {})}
    if "steps" in figures:
        panels["next -> stopped"] = figures["steps"]["stopped"]
        panels["whole VS Code stop"] = figures["stops"]["whole"]
    if not panels:
        return False
    cols = 4
    rows = -(-len(panels) // cols)
    fig, grid = plt.subplots(rows, cols, figsize=(12, 3.6 * rows), sharey=True, squeeze=False)
    axes = [ax for row in grid for ax in row]
    for ax in axes[len(panels) :]:
        ax.set_visible(False)
    for ax, (name, ways) in zip(axes, panels.items(), strict=False):
        data = [ways[w].samples for w in (TETHER, DEBUGPY, FLOOR)]
        ax.boxplot(data, whis=(1, 99), showfliers=False)
        ax.set_xticks([1, 2, 3], ["tether", "debugpy", "floor"], rotation=30)
        ax.set_yscale("log")
        ax.set_title(name, fontsize=9)
    for row in grid:
        row[0].set_ylabel("ms (log scale; whiskers p1-p99)")
    fig.suptitle(
        "DAP latency on a paused program, VS Code's client (node), measured interleaved in one run"
    )
    fig.tight_layout()
    fig.savefig(path, dpi=90)
    plt.close(fig)
    return True
