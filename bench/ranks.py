"""Benchmark 14: a rank group (issue 42): every rank paused and told, every rank running again.

The torchrun-style launcher without PyTorch (``tests/e2e/programs/ranks_launcher.py``) starts N
ranks of ``programs/ranks_bench.py``; rank 0 stops at a breakpoint once all N are up, the others
wait in a Python loop. ``tether debug --stop all --processes all``: each rank is offered (and its
session opened by the client) as it starts, so the group's figures hold no session set-up. The
client is Microsoft's DebugClient (``tests/e2e/node/vscode_scenario.mjs``), as in VS Code; every
time is a timestamp of its transcript (``performance.now()``, one clock), that is, when the IDE
was told:

- **group stop**: from the first rank's ``stopped`` received (rank 0's breakpoint) to the last
  rank's ``stopped`` received, each in its own session: every rank paused by the worker, and each
  session told. The worker-side instants (each rank's stop at debugpy) are not timed: the runner's
  clock is the only one every figure shares.
- **group continue**: from the client sending ``continue`` in rank 0's session to the last rank's
  ``continued`` received in its session.

Baselines, measured in the same bench, interleaved with the group runs: a run of one rank (a group
of one), where rank 0 stops at the same breakpoint; **one stop** is a ``next`` there, from the
request sent to its ``stopped`` received (one stop, through the whole stack, told to one session);
**one continue** is its ``continue`` to its ``continued``.

The third figure, :func:`cross_rank_eval`: ``@all rank`` in rank 0's debug console (every paused
rank's value, answered by the worker) against ``rank`` evaluated in rank 0 alone, in one run.
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path
from typing import Any

from tests.e2e.harness import debug_run, open_vscode_session, scenario, worker

from .common import PROGRAMS, Dist, break_line, ms, verdict

__all__ = ["PROGRAM", "cross_rank_eval", "rank_counts", "run", "section"]

PROGRAM = "ranks_bench.py"
LAUNCHER = Path(__file__).resolve().parents[1] / "tests" / "e2e" / "programs" / "ranks_launcher.py"
_TIMEOUT_S = 300
#: what the cross-rank eval evaluates (a local of the program's ``main``, in every rank)
EXPR = "rank"
#: pairs of evaluations (every rank's, one rank's) in each eval run
EVAL_PAIRS = 10


def rank_counts(largest: int) -> list[int]:
    """2, 4, 8, ... up to ``largest``."""
    counts, n = [], 2
    while n <= largest:
        counts.append(n)
        n *= 2
    return counts


def _steps(n: int, evals: int = 0) -> list[dict[str, Any]]:
    """The scenario of a run of ``n`` ranks; ``evals``: that many pairs of evaluations in rank 0's
    session once every rank is paused (``@all rank``, then ``rank`` in rank 0's top frame)."""
    zeros = ", ".join(["0"] * n)
    steps: list[dict[str, Any]] = [
        {"op": "mark", "name": "configured", "wait": True},
        *[
            {"op": "wait_session", "label": f"r{r}", "name": rf"^rank {r} \(pid \d+\)"}
            for r in range(n)
        ],
        # with evaluations: rank 0's stack is read (its top frame, where ``rank`` is evaluated)
        {"op": "wait_stopped", "session": "r0", "inspect": evals > 0, "reason": "breakpoint"},
        *[
            {"op": "wait_stopped", "session": f"r{r}", "inspect": False, "reason": "pause"}
            for r in range(1, n)
        ],
    ]
    if n == 1:  # the baseline: one stop
        steps += [
            {"op": "next", "session": "r0"},
            {"op": "wait_stopped", "session": "r0", "inspect": False, "reason": "step"},
        ]
    for i in range(evals):
        steps += [
            {"op": "evaluate", "session": "r0", "label": f"all{i}", "expression": f"@all {EXPR}"},
            {"op": "evaluate", "session": "r0", "label": f"one{i}", "expression": EXPR},
        ]
    return [
        *steps,
        {"op": "continue", "session": "r0"},
        {"op": "wait_output", "contains": f"launcher done, rank exit codes [{zeros}]"},
        {"op": "wait_terminated"},
        {"op": "disconnect"},
    ]


def _first(entries: list[dict[str, Any]], session: int, after: float, **match: str) -> float:
    """The transcript time of the first message of ``session`` after ``after`` matching."""
    return next(
        e["t"]
        for e in entries
        if e["session"] == session
        and e["t"] >= after
        and all(e["msg"].get(k) == v for k, v in match.items())
    )


def _figures(n: int, result: dict[str, Any], transcript: Path) -> dict[str, float]:
    entries = [json.loads(line) for line in transcript.read_text().splitlines() if line.strip()]
    sessions = [result["labels"][f"r{r}"]["session"] for r in range(n)]
    told = {"type": "event"}
    stops = [_first(entries, s, 0, event="stopped", **told) for s in sessions]
    figures: dict[str, float] = {}
    if n == 1:
        sent = _first(entries, sessions[0], stops[0], command="next", type="request")
        figures["stop"] = _first(entries, sessions[0], sent, event="stopped", **told) - sent
    else:
        figures["stop"] = max(stops) - min(stops)
    go = _first(entries, sessions[0], max(stops), command="continue", type="request")
    figures["continue"] = max(_first(entries, s, go, event="continued", **told) for s in sessions)
    figures["continue"] -= go
    return figures


def _eval_figures(result: dict[str, Any], transcript: Path) -> dict[str, list[float]]:
    """Each evaluation's request sent to its response received in rank 0's session, ms: the
    ``@all`` ones (``cross``) and the plain ones (``one``)."""
    entries = [json.loads(line) for line in transcript.read_text().splitlines() if line.strip()]
    session = result["labels"]["r0"]["session"]
    sent = {
        e["msg"]["seq"]: (e["t"], e["msg"]["arguments"]["expression"])
        for e in entries
        if e["session"] == session and e["msg"].get("type") == "request"
        and e["msg"].get("command") == "evaluate"
    }  # fmt: skip
    times: dict[str, list[float]] = {"cross": [], "one": []}
    for e in entries:
        msg = e["msg"]
        if e["session"] != session or msg.get("type") != "response":
            continue
        if msg.get("command") == "evaluate" and msg.get("request_seq") in sent:
            t, expression = sent[msg["request_seq"]]
            if not msg.get("success"):
                raise RuntimeError(f"evaluate {expression!r} failed: {msg.get('message')}")
            times["cross" if expression.startswith("@all") else "one"].append(e["t"] - t)
    return times


async def _group_run(
    home: Path, relay: str, tmp: Path, name: str, n: int, evals: int = 0
) -> dict[str, Any]:
    """One run of ``n`` ranks (1: the baseline); its figures, ms (with ``evals``: the
    evaluations' times, :func:`_eval_figures`)."""
    workdir = tmp / name
    workdir.mkdir(parents=True)
    workdir.chmod(0o777)  # the ranks' marker files: a root worker's programs run as other uids
    shutil.copyfile(PROGRAMS / PROGRAM, workdir / PROGRAM)
    shutil.copyfile(LAUNCHER, workdir / LAUNCHER.name)
    transcript = tmp / f"{name}.transcript.jsonl"
    argv = ["python", LAUNCHER.name, str(n), PROGRAM]
    extra = ("--stop", "all", "--processes", "all")
    async with debug_run(home, relay, workdir, *argv, extra=extra) as (debug, _run, port):
        spec = scenario(port, workdir, _steps(n, evals), breakpoints={PROGRAM: [break_line(PROGRAM)]},
                        timeout_ms=_TIMEOUT_S * 1000)  # fmt: skip
        spec["transcript"] = str(transcript)
        async with open_vscode_session(spec, timeout=_TIMEOUT_S) as session:
            await session.wait_mark("configured", timeout=_TIMEOUT_S)
            await session.release("configured")
            async with worker(home, relay):
                result, _messages = await session.result()
                await debug.wait_line(r"run \S+ ended", timeout=60)  # the worker is free again
    if evals:
        return _eval_figures(result, transcript)
    return _figures(n, result, transcript)


async def cross_rank_eval(home: Path, relay: str, tmp: Path, n: int) -> dict[str, Dist] | None:
    """A cross-rank eval against one eval, in one run of ``n`` ranks, every rank paused: in rank
    0's debug console, :data:`EVAL_PAIRS` times, ``@all rank`` (the worker evaluates it in the
    paused frame of every rank, :mod:`worker_shim.session.rank_eval`, as ``tether eval RUN
    rank`` does) then ``rank`` (an ordinary ``evaluate`` in rank 0's top frame); each from its
    request sent to its response received. ``{"cross": Dist, "one": Dist}`` in ms. Target: the
    16-rank eval within 2x of one rank's."""
    times = await _group_run(home, relay, tmp, f"rk-eval-{n}", n, EVAL_PAIRS)
    return {kind: Dist(samples) for kind, samples in times.items()}


async def run(home: Path, relay: str, tmp: Path, largest: int, rounds: int) -> dict[str, Any]:
    """``rounds`` rounds; each runs the baseline, then each rank count (the order rotating)."""
    counts = rank_counts(largest)
    got: dict[int, dict[str, list[float]]] = {n: {"stop": [], "continue": []} for n in [1, *counts]}
    for i in range(rounds):
        order = counts[i % len(counts) :] + counts[: i % len(counts)]
        for n in [1, *order]:
            for kind, value in (await _group_run(home, relay, tmp, f"rk-{n}-{i}", n)).items():
                got[n][kind].append(value)
    evals = {}
    for n in counts:
        measured = await cross_rank_eval(home, relay, tmp, n)
        if measured is not None:
            evals[str(n)] = measured
    return {
        "counts": counts,
        "baseline": {kind: Dist(v) for kind, v in got[1].items()},
        "groups": {str(n): {kind: Dist(v) for kind, v in got[n].items()} for n in counts},
        "eval": evals,
    }


def section(f: dict[str, Any], _n: dict[str, int]) -> list[str]:
    """Section 15 of ``bench/report.md``."""
    base: dict[str, Dist] = f["baseline"]
    one_stop, one_go = base["stop"], base["continue"]
    runs = len(one_stop.samples)
    rows = [
        "## 15. A rank group: stop together, continue together",
        "",
        "The torchrun-style launcher without PyTorch starts N ranks (`bench/programs/"
        "ranks_bench.py`); rank 0 stops at a breakpoint 0.5 s after all N are up (every rank's "
        "session configured: a stop at start-up would time the configuration), the others wait "
        "in a Python loop. `tether debug --stop all --processes all`: every rank's session is open "
        "before the stop. The client is Microsoft's DebugClient (as VS Code); every time is its "
        "transcript's (one clock), so each is when the IDE was told. **Group stop**: from the "
        "first rank's `stopped` received to the last rank's, each in its own session (every "
        "rank paused by the worker and its session told). **Group continue**: from `continue` "
        "sent in rank 0's session to the last rank's `continued` received. Baselines, in the "
        "same bench, interleaved: a run of one rank stopped at the same line; **one stop** is a "
        "`next` there, request to `stopped` (one stop through the whole stack, one session "
        "told); **one continue** its `continue` to `continued`. The worker-side instants of "
        f"each rank's stop are not timed (no clock shared with the client). {runs} runs each.",
        "",
        "| ranks | group stop, median | p99 | / one stop | group continue, median | p99 "
        "| / one continue |",
        "|---|---|---|---|---|---|---|",
        f"| 1 (baseline) | one stop {ms(one_stop.median)} | {ms(one_stop.p99)} | 1 "
        f"| {ms(one_go.median)} | {ms(one_go.p99)} | 1 |",
    ]
    for n in f["counts"]:
        g = f["groups"][str(n)]
        stop, go = g["stop"], g["continue"]
        rows.append(
            f"| {n} | {ms(stop.median)} | {ms(stop.p99)} | {stop.median / one_stop.median:.2f} "
            f"| {ms(go.median)} | {ms(go.p99)} | {go.median / one_go.median:.2f} |"
        )
    largest = str(max(f["counts"]))
    worst = max(f["groups"][largest]["stop"].samples)
    rows += [
        "",
        "Target: every rank paused (and told) within 200 ms of the first at 16 ranks: "
        + (
            f"{verdict(worst < 200)} (slowest of the runs: {ms(worst)})."
            if largest == "16"
            else f"not measured at 16 ranks here (largest group {largest})."
        ),
        "",
    ]
    evals = f.get("eval") or {}
    if not evals:
        rows += [
            "Cross-rank eval against one eval (target: 16 ranks within 2x of one): not measured "
            "yet (`bench/ranks.py: cross_rank_eval`, the hook for `tether eval`).",
            "",
        ]
    else:
        pairs = len(next(iter(evals.values()))["cross"].samples)
        rows += [
            "**Cross-rank eval**: in one run of N ranks, every rank paused, rank 0's debug "
            f"console evaluates `@all {EXPR}` (the worker evaluates it in every paused rank, as "
            f"`tether eval RUN {EXPR}` does) then `{EXPR}` (an ordinary evaluate in rank 0's top "
            f"frame, the baseline), {pairs} times each; request sent to response received.",
            "",
            "| ranks | cross-rank eval, median | p99 | one eval, median | ratio |",
            "|---|---|---|---|---|",
        ]
        for n, e in evals.items():
            cross, one = e["cross"], e["one"]
            rows.append(
                f"| {n} | {ms(cross.median)} | {ms(cross.p99)} | {ms(one.median)} "
                f"| {cross.median / one.median:.2f} |"
            )
        if "16" in evals:
            ratio = evals["16"]["cross"].median / evals["16"]["one"].median
            rows += [
                "",
                f"Target: the 16-rank eval within 2x of one rank's: {verdict(ratio <= 2)}.",
            ]
        rows.append("")
    return rows
