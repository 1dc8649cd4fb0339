"""The run page's Ranks section (``relay/web/stacks.py``) against a real relay and the real worker
shim running a real program: ``POST /ui/runs/RUN/stacks`` makes the relay open a ``stacks``
tunnel into the run itself, the worker samples the program with py-spy, and the page gets the
merged classes as ``tether stacks`` prints them. Who may not see the run gets a 404 and opens
nothing; a run that has ended says so in one line; each read is in the run's audit trail."""

from __future__ import annotations

import re
from pathlib import Path

import httpx
import pytest
import trio
from credentials import user_endpoint
from test_tunnels import running

from protocol_specs.access.auth import Scope
from protocol_specs.web import web
from relay.client import open_control
from worker_shim.program.identity import Runtime

pytestmark = pytest.mark.timeout(60)

SPINS = """\
import time


def spin():
    print("up", flush=True)
    while True:
        time.sleep(0.05)  # line 7: where the stacks find it


spin()
"""


class Page:
    """A browser's session on the relay's web view: its cookie, the page's CSRF token."""

    def __init__(self, base: str) -> None:
        self.base = base
        self.cookie = ""
        self.csrf = ""

    def headers(self, **extra: str) -> dict[str, str]:
        sent = {"Origin": self.base, "Sec-Fetch-Site": "same-origin"}
        if self.cookie:
            sent["Cookie"] = f"{web.COOKIE}={self.cookie}"
        return {**sent, **extra}

    async def request(self, method: str, path: str, **headers: str) -> httpx.Response:
        async with httpx.AsyncClient(base_url=self.base, timeout=30) as client:
            return await client.request(method, path, headers=self.headers(**headers))

    async def log_in(self, token: str) -> Page:
        got = await self.request("POST", "/ui/login", Authorization=f"Bearer {token}")
        assert got.status_code == 200, got.text
        self.cookie = got.cookies[web.COOKIE]
        return self

    async def open(self, path: str) -> httpx.Response:
        got = await self.request("GET", path)
        if found := re.search(r'name="tether-csrf" content="([^"]+)"', got.text):
            self.csrf = found.group(1)
        return got

    async def stacks(self, run: str) -> httpx.Response:
        return await self.request("POST", f"/ui/runs/{run}/stacks", **{web.CSRF_HEADER: self.csrf})


async def test_the_run_page_reads_the_merged_stacks_for_who_may_see_the_run(
    tmp_path: Path,
) -> None:
    assert Runtime.installed().pyspy is not None  # a dependency of tether's
    async with running(tmp_path, program=SPINS) as stack:
        base = stack.url.url.replace("ws://", "http://")
        run = stack.run.id
        me = await Page(base).log_in(stack.url.token or "")
        page = await me.open(f"/ui/runs/{run}")
        assert page.status_code == 200
        assert f'data-stacks="/ui/runs/{run}/stacks"' in page.text and "<h2>Ranks</h2>" in page.text
        got = await me.stacks(run)
        assert got.status_code == 200, got.text
        body = got.json()
        assert body["header"].startswith(f"run {run}: 1 Python process, in 1 place"), body
        [line] = body["lines"]
        assert line.startswith("main process") and "(running): " in line
        assert line.endswith("waits.py:10 <module> > waits.py:7 spin"), line
        assert body["report"]["classes"][0]["state"] == "running"

        # the CSRF token is needed, as for every action; another user sees nothing
        assert (await me.request("POST", f"/ui/runs/{run}/stacks")).status_code == 403
        bob = await user_endpoint(stack.store, stack.url.url, "bob", [Scope.RUNS])
        other = await Page(base).log_in(bob.token or "")
        await other.open("/ui")
        refused = await other.stacks(run)
        assert refused.status_code == 404 and "not yours" in refused.json()["error"]
        # a scheduler backend's scope sees every run's page, but opens no tunnel into it
        ops = await user_endpoint(stack.store, stack.url.url, "ops", [Scope.RUNS, Scope.BACKEND])
        backend = await Page(base).log_in(ops.token or "")
        assert (await backend.open(f"/ui/runs/{run}")).status_code == 200
        refused = await backend.stacks(run)
        assert refused.status_code == 404 and "not yours" in refused.json()["error"]
        async with open_control(stack.url) as control:
            trail = await control.audit(run)
        reads = [e for e in trail if e.event == "tunnel" and e.detail.endswith(": stacks")]
        assert [(e.user, e.role) for e in reads] == [("me", "web")], trail

        async with open_control(stack.url) as control:
            await control.cancel(run)
        with trio.fail_after(30):
            await stack.ended.wait()
        ended = await me.stacks(run)
        assert ended.status_code == 409
        assert ended.json()["error"] == (
            f"run {run} is cancelled: its stacks can be read while it runs (or is paused)"
        )
        assert "<h2>Ranks</h2>" not in (await me.open(f"/ui/runs/{run}")).text
