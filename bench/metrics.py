"""Benchmark 14: what ``tether.report`` costs a training loop.

A program calls ``tether.report(step=i, loss=...)`` ``n`` times in a tight loop, as a tether run
(``tether run -f`` on the local pool: the worker reads every datagram and publishes the points),
and times its own loop: calls per second. In the same run, interleaved: the same loop printing
``step=i loss=...`` lines to stdout, the way a program reports without tether (and what
``--metric`` reads), under tether too; and the loop with ``tether.report`` outside tether (a no-op:
what the call costs a program run anywhere else). Afterwards every point is counted back with
``tether metrics --json``: none lost, none twice.
"""

from __future__ import annotations

import json
import re
import subprocess
import sys
from pathlib import Path
from typing import Any

import trio

from .common import Dist, Stack, verdict

PROGRAM = """\
import sys, time
import tether

n, how = int(sys.argv[1]), sys.argv[2]
t0 = time.perf_counter()
if how == "print":
    for i in range(n):
        print(f"step={i} loss={i * 0.001}")
else:
    for i in range(n):
        tether.report(step=i, loss=i * 0.001)
sys.stdout.flush()
print(f"RATE {n / (time.perf_counter() - t0):.0f}", file=sys.stderr, flush=True)
"""

_TETHER = str(Path(sys.executable).with_name("tether"))
#: where ``import tether`` finds the module outside a tether run
_ROOT = str(Path(__file__).resolve().parents[1])


async def run(stack: Stack, calls: int, rounds: int, tmp: Path) -> dict[str, Any]:
    workdir = tmp / "metrics-project"
    workdir.mkdir(exist_ok=True)
    (workdir / "report.py").write_text(PROGRAM)
    env = {"TETHER_HOME": str(stack.home), "TETHER_CONFIG": str(stack.home / "config.toml")}
    rates: dict[str, Dist] = {"report": Dist([]), "print": Dist([]), "outside": Dist([])}
    counted: list[int] = []
    for _ in range(rounds):
        for how in ("report", "print"):
            got = await trio.to_thread.run_sync(
                lambda how=how: _submit(workdir, env, calls, how)  # type: ignore[misc]
            )
            rates[how].samples.append(got[0])
            if how == "report":
                counted.append(await trio.to_thread.run_sync(_count, got[1], env))
        outside = await trio.run_process(
            [sys.executable, "report.py", str(calls), "report"],
            cwd=workdir,
            capture_stdout=True,
            capture_stderr=True,
            env={"PATH": "/usr/bin:/bin", "PYTHONPATH": _ROOT},
        )
        rates["outside"].samples.append(_rate(outside.stderr.decode()))
    return {"calls": calls, "rounds": rounds, "rates": rates, "counted": counted}


def _submit(workdir: Path, env: dict[str, str], calls: int, how: str) -> tuple[float, str]:
    """A run of the program; its rate and its id."""
    import os

    done = subprocess.run(
        [_TETHER, "run", "--json", "--workdir", str(workdir), "--", "python", "report.py",
         str(calls), how],
        capture_output=True, env={**os.environ, **env}, check=True, timeout=600,
    )  # fmt: skip
    run_id = json.loads(done.stdout)["id"]
    logs = subprocess.run(
        [_TETHER, "logs", "-f", run_id],
        capture_output=True, env={**os.environ, **env}, timeout=600,
    )  # fmt: skip
    return _rate(logs.stdout.decode() + logs.stderr.decode()), run_id


def _count(run_id: str, env: dict[str, str]) -> int:
    import os

    done = subprocess.run(
        [_TETHER, "metrics", "--json", run_id],
        capture_output=True, env={**os.environ, **env}, check=True, timeout=600,
    )  # fmt: skip
    steps = [json.loads(line)["step"] for line in done.stdout.decode().splitlines()]
    return len(set(steps)) if len(steps) == len(set(steps)) else -len(steps)


def _rate(text: str) -> float:
    m = re.search(r"RATE (\d+)", text)
    if m is None:
        raise RuntimeError(f"the program said no rate: {text[-500:]}")
    return float(m.group(1))


def section(f: dict[str, Any], _n: dict[str, int]) -> list[str]:
    """Section 14 of ``bench/report.md``."""
    rates: dict[str, Dist] = f["rates"]
    report, printed, outside = rates["report"], rates["print"], rates["outside"]
    exact = all(c == f["calls"] for c in f["counted"])
    return [
        "## 14. What `tether.report` costs a training loop",
        "",
        f"A loop of {f['calls']:,} `tether.report(step=i, loss=...)` calls in a tether run on the "
        f"local pool, timed by the program itself, {f['rounds']} runs, interleaved with the "
        "baselines: the same loop printing `step=i loss=...` lines (the way without tether, and "
        "what `--metric` reads), also under tether; and the loop outside tether, where the call "
        "is a no-op. Target: at least 20,000 calls a second, i.e. a report costs at most 50 µs, "
        "5 % of a 1 ms training step (real steps take longer; most programs report once a step "
        "or less).",
        "",
        "| loop | calls a second (median) | slowest run | ratio to printing |",
        "|---|---|---|---|",
        f"| `tether.report` under tether | {report.median:,.0f} | {min(report.samples):,.0f} "
        f"| {report.median / printed.median:.2f} |",
        f"| `print` under tether (baseline) | {printed.median:,.0f} | {min(printed.samples):,.0f} "
        "| 1 |",
        f"| `tether.report` outside tether (no-op) | {outside.median:,.0f} "
        f"| {min(outside.samples):,.0f} | {outside.median / printed.median:.2f} |",
        "",
        f"Target: {verdict(min(report.samples) >= 20_000)}. Every point stored once: "
        f"{verdict(exact)} (`tether metrics --json` counted {f['counted']}).",
        "",
    ]
