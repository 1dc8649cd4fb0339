"""A real headless Chromium for the web view's tests: Debian's ``/usr/bin/chromium`` (or
``$CHROMIUM``), driven by ``tests/e2e/node/web_scenario.mjs`` through playwright-core (pinned in
its package.json; it never downloads a browser). Steps are documented in that script.

Without Chromium the tests skip, saying so; with ``TETHER_REQUIRE_BROWSER=1`` (CI) they fail.
"""

from __future__ import annotations

import json
import os
import shutil
from pathlib import Path
from typing import Any

import pytest
import trio

NODE_DIR = Path(__file__).resolve().parent / "node"
SCENARIO = NODE_DIR / "web_scenario.mjs"
#: where a test run leaves its screenshots (``TETHER_SCREENSHOTS`` copies them elsewhere too:
#: ``TETHER_SCREENSHOTS=docs/images ./dev test -m web`` refreshes docs/experiments.md's)
SHOTS = Path(__file__).resolve().parents[2] / "build" / "screenshots"


def chromium() -> str:
    found = os.environ.get("CHROMIUM") or shutil.which("chromium") or "/usr/bin/chromium"
    node = shutil.which("node")
    playwright = NODE_DIR / "node_modules" / "playwright-core" / "package.json"
    missing = [
        what
        for what, ok in (
            (f"Chromium ({found})", Path(found).exists()),
            ("node", node is not None),
            (f"playwright-core ({playwright}: npm ci)", playwright.exists()),
        )
        if not ok
    ]
    if missing:
        why = f"the browser tests need {', '.join(missing)} (apt install chromium)"
        if os.environ.get("TETHER_REQUIRE_BROWSER") == "1":
            pytest.fail(why)
        pytest.skip(why)
    return found


async def run_scenario(
    base: str, steps: list[dict[str, Any]], shots: Path, *, timeout: float = 120
) -> dict[str, Any]:
    """Run ``steps`` in a fresh browser against ``base``; the result (``values`` of ``text``
    steps). A failed step fails the test with what the page showed."""
    executable = chromium()
    shots.mkdir(parents=True, exist_ok=True)
    spec = shots / "scenario.json"
    spec.write_text(json.dumps({"base": base, "shots": str(shots), "steps": steps}))
    with trio.fail_after(timeout):
        done = await trio.run_process(
            ["node", str(SCENARIO), str(spec)],
            cwd=NODE_DIR,
            capture_stdout=True,
            capture_stderr=True,
            check=False,
            env={**os.environ, "CHROMIUM": executable},
        )
    out = done.stdout.decode(errors="replace").strip().splitlines()
    try:
        result: dict[str, Any] = json.loads(out[-1])
    except (IndexError, ValueError):
        pytest.fail(f"web_scenario gave no result:\n{done.stderr.decode(errors='replace')[-3000:]}")
    if not result.get("ok"):
        log = done.stderr.decode(errors="replace")[-3000:]
        pytest.fail(f"browser step failed: {result.get('failed')}\n{log}\n{result.get('values')}")
    keep(shots)
    return result


def keep(shots: Path) -> None:
    """Copy the run's screenshots where they are kept (and to ``$TETHER_SCREENSHOTS``)."""
    for where in filter(None, (SHOTS, os.environ.get("TETHER_SCREENSHOTS"))):
        target = Path(where)
        target.mkdir(parents=True, exist_ok=True)
        for png in shots.glob("*.png"):
            if png.name != "failure.png":
                shutil.copyfile(png, target / png.name)
