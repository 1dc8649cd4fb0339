"""Benchmark 13: the web view's runs list over many runs.

``tether up`` holds ``runs`` runs of one user (submitted through the relay, eight control
connections at once): one in a hundred cancelled, one in a thousand tagged ``rare``. Each page is
asked for ``rounds`` times over HTTP (a session cookie, as a browser has) and timed from request
to the last byte of the page: the newest page, the last page (``start`` 50 before the end), a
state filter matching 1 % (the list reads records until its page is full), and a tag matching
0.1 % (it reads its :data:`~protocol_specs.web.web.MAX_SCAN` at most, then offers "older"). Baseline,
in the same run: ``tether ls``'s request for as many runs (``list_runs`` on a control connection,
answered as records, no HTML). With Chromium at hand, the newest page is also loaded in a real
browser (``tests/e2e/node/web_scenario.mjs``): the navigation's duration, HTML to ``load``.
"""

from __future__ import annotations

import json
import os
import shutil
import time
from pathlib import Path
from typing import Any

import httpx
import trio

from protocol_specs.runs.spec import RunSpec
from protocol_specs.web import web
from relay.client import open_control

from .common import ROOT, Dist, Stack, ms, verdict

SCENARIO = ROOT / "tests" / "e2e" / "node" / "web_scenario.mjs"
#: connections submitting at once
_SUBMITTERS = 8


async def run(stack: Stack, runs: int, rounds: int, tmp: Path) -> dict[str, Any]:
    endpoint = stack.endpoint()
    base = stack.relay.replace("ws://", "http://")
    t0 = time.perf_counter()
    cancelled = await _fill(stack, runs)
    filled_s = time.perf_counter() - t0
    async with httpx.AsyncClient(base_url=base, timeout=60) as client:
        got = await client.post(
            "/ui/login",
            headers={"Authorization": f"Bearer {endpoint.token}", "Origin": base},
        )
        got.raise_for_status()
        cookie = {"Cookie": f"{web.COOKIE}={got.cookies[web.COOKIE]}"}
        cases = {
            "newest page": "/ui",
            "last page": f"/ui?start={max(runs - web.PAGE_SIZE, 0)}",
            "state filter (1 %)": "/ui?state=cancelled",
            "tag filter (0.1 %)": "/ui?tag=rare",
        }
        pages: dict[str, Dist] = {name: Dist([]) for name in cases}
        shown: dict[str, int] = {}
        baseline = Dist([])
        async with open_control(endpoint, client="bench") as control:
            for _ in range(rounds):  # interleaved: each round asks each page and the baseline
                for name, path in cases.items():
                    t = time.perf_counter()
                    page = await client.get(path, headers=cookie)
                    pages[name].samples.append((time.perf_counter() - t) * 1000)
                    assert page.status_code == 200, (path, page.status_code)
                    shown[name] = page.text.count('<tr id="run-')
                t = time.perf_counter()
                listed = await control.list_runs(web.PAGE_SIZE)
                baseline.samples.append((time.perf_counter() - t) * 1000)
                assert len(listed) == min(runs, web.PAGE_SIZE)
    return {
        "runs": runs,
        "rounds": rounds,
        "cancelled": cancelled,
        "fill_s": filled_s,
        "pages": pages,
        "rows": shown,
        "baseline": baseline,
        "browser": await _browser(base, endpoint.token, tmp, rounds),
    }


async def _fill(stack: Stack, runs: int) -> int:
    endpoint = stack.endpoint()
    cancelled = 0

    async def submitter(k: int) -> None:
        nonlocal cancelled
        async with open_control(endpoint, client="bench") as control:
            for i in range(k, runs, _SUBMITTERS):
                tags = ["rare"] if i % 1000 == 999 else []
                spec = RunSpec(
                    command=["python", "train.py", f"--seed={i}"],
                    workdir="/bench",
                    name=f"run-{i}",
                    backend="bench-idle",  # nobody takes them: they stay queued
                    tags=tags,
                )
                record = await control.submit(spec)
                if i % 100 == 50:
                    await control.cancel(record.id)
                    cancelled += 1

    async with trio.open_nursery() as nursery:
        for k in range(_SUBMITTERS):
            nursery.start_soon(submitter, k)
    return cancelled


async def _browser(base: str, token: str, tmp: Path, rounds: int) -> dict[str, Any]:
    """The newest page's load in Chromium (navigation start to ``load``), if it is here."""
    chromium = os.environ.get("CHROMIUM") or shutil.which("chromium") or ""
    installed = (SCENARIO.parent / "node_modules" / "playwright-core").exists()
    if not (chromium and shutil.which("node") and installed):
        return {"skipped": "no Chromium, node or playwright-core here"}
    steps: list[dict[str, Any]] = [
        {"do": "goto", "path": "/ui/login"},
        {"do": "fill", "selector": "#token", "value": token},
        {"do": "click", "selector": "#login button[type=submit]"},
        {"do": "wait_url", "path": "/ui"},
    ]
    for i in range(rounds):
        steps += [{"do": "goto", "path": "/ui"}, {"do": "timing", "as": f"load{i}"}]
    spec = tmp / "web-bench.json"
    spec.write_text(json.dumps({"base": base, "shots": str(tmp), "steps": steps}))
    done = await trio.run_process(
        ["node", str(SCENARIO), str(spec)],
        cwd=SCENARIO.parent,
        capture_stdout=True,
        capture_stderr=True,
        check=False,
        env={**os.environ, "CHROMIUM": chromium},
    )
    result = json.loads(done.stdout.decode().strip().splitlines()[-1])
    if not result.get("ok"):
        return {"skipped": f"the browser failed: {result.get('failed')}"}
    loads = [float(v) for k, v in result["values"].items() if k.startswith("load")]
    return {"load": Dist(loads)}


def section(f: dict[str, Any], _n: dict[str, int]) -> list[str]:
    """Section 13 of ``bench/report.md``."""
    base = f["baseline"]
    rows = [
        "## 13. The web view's runs list",
        "",
        f"{f['runs']:,} runs of one user in the relay ({f['cancelled']} cancelled, one in a "
        f"thousand tagged `rare`; submitting them took {f['fill_s']:.0f} s), each page asked "
        f"{f['rounds']} times over HTTP with a session cookie, timed to its last byte, "
        f"interleaved with the baseline: `tether ls`'s `list_runs` of {web.PAGE_SIZE} runs on a "
        "control connection. Target: every page under a second.",
        "",
        "| page | rows | median | p99 | ratio to baseline (medians) | target |",
        "|---|---|---|---|---|---|",
    ]
    for name, dist in f["pages"].items():
        rows.append(
            f"| {name} | {f['rows'][name]} | {ms(dist.median)} | {ms(dist.p99)} "
            f"| {dist.median / base.median:.2f} | < 1 s: {verdict(dist.p99 < 1000)} |"
        )
    rows.append(f"| baseline: `list_runs` ({web.PAGE_SIZE}) | - | {ms(base.median)} "
                f"| {ms(base.p99)} | 1 | |")  # fmt: skip
    browser = f.get("browser", {})
    if "load" in browser:
        load: Dist = browser["load"]
        rows += [
            "",
            f"In Chromium (headless, this machine), the newest page from navigation to `load`: "
            f"median {ms(load.median)}, slowest {ms(max(load.samples))} "
            f"({len(load.samples)} loads): {verdict(max(load.samples) < 1000)}.",
        ]
    elif browser:
        rows += ["", f"The browser's figure was not taken: {browser['skipped']}."]
    return [*rows, ""]
