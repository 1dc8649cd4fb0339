"""The web view against a live relay on a real Redis-compatible server, over real HTTP: sessions,
CSRF, origins, who sees what, paging and filters, the live WebSocket. (The pages in a real browser:
``tests/e2e/test_web_e2e.py``.)"""

from __future__ import annotations

import re
from collections.abc import AsyncIterator
from dataclasses import dataclass

import httpx
import orjson
import pytest
import trio
from websockets.exceptions import ConnectionClosed, InvalidStatus
from websockets.trio.client import connect

from protocol_specs.access.auth import Scope
from protocol_specs.runs.spec import RunSpec
from protocol_specs.sweeps.sweeps import SweepSpec, parse_objective, parse_param
from protocol_specs.web import web
from protocol_specs.wire import wire
from protocol_specs.wire.wire import IdeLink, WorkerLink
from relay.auth import TokenStore
from relay.client import Endpoint, open_control, open_run_link
from relay.config import RelayConfig
from relay.server import serve_relay, server_port
from relay.store import Store, open_store

pytestmark = pytest.mark.redis


@dataclass
class Site:
    port: int
    store: Store
    tokens: TokenStore
    alice: str
    bob: str
    admin: str

    @property
    def base(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    @property
    def relay(self) -> str:
        return f"ws://127.0.0.1:{self.port}"

    def endpoint(self, token: str) -> Endpoint:
        return Endpoint(self.relay, token=token)


@pytest.fixture
async def site(redis_servers: object) -> AsyncIterator[Site]:
    url = redis_servers.get("bundled").url  # type: ignore[attr-defined]
    async with open_store(url) as store:
        await store.flushall()
        tokens = TokenStore(store)
        alice, _ = await tokens.create("alice", scopes=[Scope.RUNS])
        bob, _ = await tokens.create("bob", scopes=[Scope.RUNS])
        admin, _ = await tokens.create("root", scopes=[Scope.RUNS, Scope.ADMIN])
        config = RelayConfig(recheck=0.2, max_connections=3)
        async with trio.open_nursery() as nursery:
            server = await nursery.start(
                lambda task_status: serve_relay(
                    store, port=0, config=config, task_status=task_status
                )
            )
            yield Site(server_port(server), store, tokens, alice, bob, admin)
            nursery.cancel_scope.cancel()


@dataclass
class Browser:
    """What a browser on the relay's own pages sends: its session cookie, its origin."""

    site: Site
    cookie: str = ""
    csrf: str = ""

    def headers(self, **extra: str) -> dict[str, str]:
        sent = {"Origin": self.site.base, "Sec-Fetch-Site": "same-origin"}
        if self.cookie:
            sent["Cookie"] = f"{web.COOKIE}={self.cookie}"
        return {**sent, **extra}

    async def request(self, method: str, path: str, **headers: str) -> httpx.Response:
        async with httpx.AsyncClient(base_url=self.site.base) as client:
            return await client.request(method, path, headers=self.headers(**headers))

    async def page(self, path: str) -> httpx.Response:
        got = await self.request("GET", path)
        if found := re.search(r'name="tether-csrf" content="([^"]+)"', got.text):
            self.csrf = found.group(1)
        return got

    async def act(self, path: str, **headers: str) -> httpx.Response:
        return await self.request("POST", path, **{web.CSRF_HEADER: self.csrf, **headers})


async def log_in(site: Site, token: str) -> Browser:
    browser = Browser(site)
    got = await browser.request("POST", "/ui/login", Authorization=f"Bearer {token}")
    assert got.status_code == 200, got.text
    browser.cookie = got.cookies[web.COOKIE]
    await browser.page("/ui")
    return browser


async def submit(site: Site, token: str, name: str = "", **spec: object) -> str:
    async with open_control(site.endpoint(token)) as control:
        record = await control.submit(
            RunSpec(command=["python", "train.py"], workdir="/w", name=name, **spec)  # type: ignore[arg-type]
        )
    return record.id


async def state_of(site: Site, run: str) -> str:
    async with open_control(site.endpoint(site.admin)) as control:
        return (await control.get_run(run)).state.value


# --- sessions ------------------------------------------------------------------------------------


async def test_no_page_action_or_live_socket_without_a_session(site: Site) -> None:
    run = await submit(site, site.alice)
    anonymous = Browser(site)
    for path in ("/ui", "/ui?state=queued", f"/ui/runs/{run}", "/"):
        got = await anonymous.request("GET", path)
        assert got.status_code == 303, path
        assert got.headers["location"] in ("/ui/login", "/ui"), path
    for path in (f"/ui/runs/{run}/cancel", f"/ui/runs/{run}/rerun", "/ui/logout"):
        got = await anonymous.request("POST", path)
        assert got.status_code == 401, path
    with pytest.raises(InvalidStatus) as refused:
        async with connect(f"{site.relay}/ui/live", origin=site.base):  # type: ignore[arg-type]
            pass
    assert refused.value.response.status_code == 401
    # what is public: the login page and the two static files
    for path in ("/ui/login", "/ui/static/app.css", "/ui/static/app.js"):
        assert (await anonymous.request("GET", path)).status_code == 200, path
    assert await state_of(site, run) == "queued"


async def test_a_login_sets_a_strict_http_only_cookie_and_every_answer_is_locked_down(
    site: Site,
) -> None:
    browser = Browser(site)
    got = await browser.request("POST", "/ui/login", Authorization=f"Bearer {site.alice}")
    assert got.status_code == 200
    cookie = got.headers["set-cookie"]
    for flag in ("HttpOnly", "SameSite=Strict", "Path=/", "Max-Age=43200"):
        assert flag in cookie
    assert site.alice not in cookie
    for path in ("/ui/login", "/ui/nothing-here"):
        answer = await browser.request("GET", path)
        policy = answer.headers["content-security-policy"]
        assert "script-src 'self'" in policy and "frame-ancestors 'none'" in policy
        assert answer.headers["x-frame-options"] == "DENY"
        assert answer.headers["cache-control"] == "no-store"
    # the relay stores a session under a hash of its id, never the id itself
    session_id = got.cookies[web.COOKIE]
    assert await site.store.hgetall(f"tether:web:session:{session_id}") == {}
    assert await site.store.hgetall(f"tether:web:session:{web.digest(session_id)}")


async def test_bad_tokens_and_foreign_origins_open_no_session(site: Site) -> None:
    backend, _ = await site.tokens.create("pool", scopes=[Scope.BACKEND])
    browser = Browser(site)
    for header, why in (
        ("Bearer tthu_0000000000000000_" + "x" * 43, "not valid"),
        (f"Bearer {backend}", "cannot see runs"),
        ("", "give a token"),
    ):
        got = await browser.request("POST", "/ui/login", Authorization=header)
        assert got.status_code == 401 and why in got.json()["error"], header
        assert "set-cookie" not in got.headers
    evil = await browser.request(
        "POST", "/ui/login", Authorization=f"Bearer {site.alice}", Origin="https://evil.example"
    )
    assert evil.status_code == 403 and "set-cookie" not in evil.headers


async def test_revoking_the_token_ends_its_sessions_and_logging_out_ends_one(site: Site) -> None:
    token, made = await site.tokens.create("carol", scopes=[Scope.RUNS])
    first = await log_in(site, token)
    second = await log_in(site, token)
    assert (await first.page("/ui")).status_code == 200
    assert (await second.act("/ui/logout")).status_code == 200
    assert (await second.page("/ui")).status_code == 303
    assert (await first.page("/ui")).status_code == 200
    await site.tokens.revoke(made.id)
    assert (await first.page("/ui")).status_code == 303


async def test_a_login_code_from_tether_ui_opens_one_session_once(site: Site) -> None:
    async with open_control(site.endpoint(site.alice)) as control:
        got = await control.web_login()
    assert got.expires_in == web.CODE_TTL
    browser = Browser(site)
    used = await browser.request("POST", "/ui/login", **{web.CODE_HEADER: got.code})
    assert used.status_code == 200 and used.json()["user"] == "alice"
    again = await browser.request("POST", "/ui/login", **{web.CODE_HEADER: got.code})
    assert again.status_code == 401 and "used up" in again.json()["error"]
    # logging in again from a browser with a session replaces that session
    browser.cookie = used.cookies[web.COOKIE]
    assert (await browser.page("/ui")).status_code == 200
    relogin = await browser.request("POST", "/ui/login", Authorization=f"Bearer {site.bob}")
    assert relogin.status_code == 200
    assert (await browser.page("/ui")).status_code == 303  # the old cookie is worth nothing
    browser.cookie = relogin.cookies[web.COOKIE]
    assert "bob" in (await browser.page("/ui")).text


# --- actions --------------------------------------------------------------------------------------


async def test_actions_need_the_sessions_csrf_token_and_the_relays_origin(site: Site) -> None:
    run = await submit(site, site.alice, "guarded")
    alice = await log_in(site, site.alice)
    cancel = f"/ui/runs/{run}/cancel"
    for headers in (
        {web.CSRF_HEADER: ""},
        {web.CSRF_HEADER: "x" * 43},
        {"Origin": "https://evil.example"},
        {"Sec-Fetch-Site": "cross-site"},
        {"Origin": "", "Sec-Fetch-Site": ""},
    ):
        got = await alice.act(cancel, **headers)
        assert got.status_code == 403, headers
    assert await state_of(site, run) == "queued"
    # another session's CSRF token is no good either
    other = await log_in(site, site.alice)
    other.csrf, alice_csrf = alice.csrf, other.csrf
    assert (await Browser(site, alice.cookie, alice_csrf).act(cancel)).status_code == 403
    done = await alice.act(cancel)
    assert done.status_code == 200 and done.json()["state"] == "cancelled"
    assert await state_of(site, run) == "cancelled"
    rerun = await alice.act(f"/ui/runs/{run}/rerun")
    assert rerun.status_code == 200
    again = rerun.json()["run"]
    assert rerun.json()["url"] == f"/ui/runs/{again}"
    async with open_control(site.endpoint(site.alice)) as control:
        trail = await control.audit(run)
        assert (await control.get_run(again)).rerun_of == run
    web_events = [(e.event, e.role) for e in trail if e.role == "web" and e.event != "refused"]
    assert web_events == [("cancel", "web"), ("rerun", "web")]
    # the refused ones too: the first, then the other five as one entry with their count
    refused = [e for e in trail if e.event == "refused"]
    assert [(e.user, e.role, e.detail.split(": ")[0]) for e in refused] == [
        ("alice", "web", "POST cancel"),
        ("alice", "web", "POST cancel"),
    ]
    assert refused[0].detail == "POST cancel: forbidden: the CSRF token is missing or wrong"
    assert refused[1].detail.startswith("POST cancel: forbidden: the CSRF token is missing")
    assert "(the last of 5 more like it, in the " in refused[1].detail
    # looking is audited too, once for a while (a reload adds nothing)
    for _ in range(2):
        assert (await alice.page(f"/ui/runs/{run}")).status_code == 200
    async with open_control(site.endpoint(site.alice)) as control:
        trail = await control.audit(run)
    assert [(e.event, e.user, e.role) for e in trail][-1] == ("view", "alice", "web")
    assert sum(e.event == "view" for e in trail) == 1
    # a HEAD sees nothing, and says nothing
    assert (await alice.request("HEAD", f"/ui/runs/{again}")).status_code == 200
    async with open_control(site.endpoint(site.alice)) as control:
        assert not any(e.event == "view" for e in await control.audit(again))


async def test_another_users_run_is_a_404_everywhere(site: Site) -> None:
    bobs = await submit(site, site.bob, "bobs-secret-run")
    ghost = "r" + bobs[1:]  # a run nobody has
    alice = await log_in(site, site.alice)
    page = await alice.page(f"/ui/runs/{bobs}")
    assert page.status_code == 404 and "bobs-secret-run" not in page.text
    nothing = await alice.page(f"/ui/runs/{ghost}")
    assert (nothing.status_code, nothing.text.replace(ghost, bobs)) == (404, page.text)
    for what in ("/files", "/files/train.py"):
        got = await alice.page(f"/ui/runs/{bobs}{what}")
        assert got.status_code == 404, what
    for action in ("cancel", "rerun"):
        got = await alice.act(f"/ui/runs/{bobs}/{action}")
        none = await alice.act(f"/ui/runs/{ghost}/{action}")
        assert got.status_code == none.status_code == 404, action
        assert got.json()["error"].replace(bobs, ghost) == none.json()["error"]
    assert "bobs-secret-run" not in (await alice.page("/ui")).text
    assert "bobs-secret-run" not in (await alice.page("/ui?owner=bob")).text
    with pytest.raises(InvalidStatus) as refused:
        async with connect(
            f"{site.relay}/ui/live?run={bobs}",
            origin=site.base,  # type: ignore[arg-type]
            additional_headers={"Cookie": f"{web.COOKIE}={alice.cookie}"},
        ):
            pass
    assert refused.value.response.status_code == 404
    assert await state_of(site, bobs) == "queued"
    # every refusal is in bob's trail: alice's token, her address, her browser, the code
    async with open_control(site.endpoint(site.bob)) as control:
        trail = await control.audit(bobs)
    refused = [e for e in trail if e.event == "refused"]
    assert [e.detail.split(": ")[0] for e in refused] == [
        "GET run", "GET files", "GET file", "POST cancel", "POST rerun", "GET live",
    ]  # fmt: skip
    alices = site.alice.split("_")[1]
    for entry in refused:
        assert (entry.user, entry.token, entry.role, entry.source) == (
            "alice", alices, "web", "127.0.0.1",
        )  # fmt: skip
        assert ": no_such_run: no run " in entry.detail
    assert refused[0].client.startswith("python-httpx/")
    assert not await site.store.read_last(f"tether:run:{{{ghost}}}:audit", 10)
    admin = await log_in(site, site.admin)
    assert "bobs-secret-run" in (await admin.page(f"/ui/runs/{bobs}")).text
    assert "bobs-secret-run" in (await admin.page("/ui?owner=bob")).text


async def test_what_users_wrote_is_escaped(site: Site) -> None:
    run = await submit(
        site, site.alice, "<script>alert(1)</script>", env={"X": '"><img src=x onerror=alert(2)>'}
    )
    alice = await log_in(site, site.alice)
    for path in ("/ui", f"/ui/runs/{run}"):
        text = (await alice.page(path)).text
        assert "<script>alert" not in text and "&lt;script&gt;alert(1)&lt;/script&gt;" in text
    assert "<img" not in text and "&lt;img src=x onerror=alert(2)&gt;" in text


# --- the list -------------------------------------------------------------------------------------


async def test_the_list_pages_and_filters(site: Site) -> None:
    ids = [
        await submit(site, site.alice, f"r{i}", tags=["odd"] if i % 2 else []) for i in range(60)
    ]
    async with open_control(site.endpoint(site.alice)) as control:
        for run in ids[:5]:
            await control.cancel(run)
    alice = await log_in(site, site.alice)
    first = (await alice.page("/ui")).text
    shown = re.findall(r'<tr id="run-([^"]+)"', first)
    assert shown == ids[::-1][: web.PAGE_SIZE]
    older = re.search(r'rel="next" href="([^"]+)"', first)
    assert older is not None
    rest = re.findall(r'<tr id="run-([^"]+)"', (await alice.page(older.group(1))).text)
    assert rest == ids[::-1][web.PAGE_SIZE :]
    cancelled = re.findall(r'<tr id="run-([^"]+)"', (await alice.page("/ui?state=cancelled")).text)
    assert cancelled == ids[:5][::-1]
    odd = re.findall(r'<tr id="run-([^"]+)"', (await alice.page("/ui?tag=odd")).text)
    assert odd == [r for i, r in enumerate(ids) if i % 2][::-1]
    bad = await alice.page("/ui?state=sleeping")
    assert bad.status_code == 200 and "unknown state &#x27;sleeping&#x27;" in bad.text


# --- live -----------------------------------------------------------------------------------------


async def test_the_live_socket_pushes_changed_rows_only_to_who_may_see_them(site: Site) -> None:
    alice = await log_in(site, site.alice)
    since = await site.store.last_id("tether:changes") or "0"
    cookie = {"Cookie": f"{web.COOKIE}={alice.cookie}"}
    with pytest.raises(InvalidStatus) as foreign:
        async with connect(
            f"{site.relay}/ui/live",
            origin="https://evil.example",
            additional_headers=cookie,  # type: ignore[arg-type]
        ):
            pass
    assert foreign.value.response.status_code == 403
    async with connect(
        f"{site.relay}/ui/live?state=queued&since={since}",
        origin=site.base,  # type: ignore[arg-type]
        additional_headers=cookie,
    ) as live:
        await submit(site, site.bob, "not-for-alice")
        mine = await submit(site, site.alice, "alices")
        with trio.fail_after(10):
            pushed = orjson.loads(await live.recv())
        assert pushed["t"] == "row" and pushed["id"] == mine and pushed["match"] is True
        assert "alices" in pushed["html"]
        async with open_control(site.endpoint(site.alice)) as control:
            await control.cancel(mine)
        with trio.fail_after(10):
            left = orjson.loads(await live.recv())
        assert left["id"] == mine and left["match"] is False  # cancelled: out of the filter
    async with connect(
        f"{site.relay}/ui/live?run={mine}&logs=0&since={since}",
        origin=site.base,  # type: ignore[arg-type]
        additional_headers=cookie,
    ) as live:
        with trio.fail_after(10):
            got = [orjson.loads(await live.recv()) for _ in range(2)]
        kinds = {m["t"] for m in got}
        assert kinds == {"summary", "log"}
        log_text = next(m["text"] for m in got if m["t"] == "log")
        assert "queued on local" in log_text


async def test_the_relays_own_websocket_and_bad_requests_are_unaffected(site: Site) -> None:
    async with httpx.AsyncClient(base_url=site.base) as client:
        refused = await client.put("/ui")
        assert refused.status_code == 405 and refused.headers["allow"] == "GET, HEAD, POST"
        # websockets' own answer to a broken handshake is locked down as the pages are
        broken = await client.get("/", headers={"Upgrade": "websocket", "Connection": "Upgrade"})
        assert broken.status_code == 400
        assert "frame-ancestors 'none'" in broken.headers["content-security-policy"]
        assert (await client.get("/ui/runs/x/cancel")).status_code == 405
        assert (await client.get("/elsewhere")).status_code == 404
        with pytest.raises(httpx.HTTPError):  # a body: websockets drops the connection unanswered
            await client.post("/ui/login", content=b"token=x")
    run = await submit(site, site.alice)  # a control connection still works
    assert await state_of(site, run) == "queued"


async def test_a_runs_snapshot_can_be_browsed_and_its_text_files_read(site: Site) -> None:
    import hashlib

    from protocol_specs.snapshots.snapshots import Manifest, ManifestEntry

    files = {
        "train.py": b"import torch\nprint('<b>hi</b>')\n",
        "data dir/notes é.txt": "résumé\n".encode(),
        "weights.bin": b"\x00\x01\x02",
    }
    entries = []
    async with open_control(site.endpoint(site.alice)) as control:
        for path, data in files.items():
            digest = hashlib.sha256(data).hexdigest()
            await control.put_blob(digest, data)
            entries.append(ManifestEntry(path=path, size=len(data), digest=digest))
        run = (
            await control.submit(
                RunSpec(command=["python", "train.py"], workdir="/w"),
                Manifest(entries=sorted(entries, key=lambda e: e.path)),
            )
        ).id
    alice = await log_in(site, site.alice)
    listing = (await alice.page(f"/ui/runs/{run}/files")).text
    assert "/files/data%20dir/notes%20%C3%A9.txt" in listing and "weights.bin" in listing
    assert "train.py" in (await alice.page(f"/ui/runs/{run}/files?q=train")).text
    assert "weights.bin" not in (await alice.page(f"/ui/runs/{run}/files?q=train")).text
    shown = (await alice.page(f"/ui/runs/{run}/files/train.py")).text
    assert '<span class="line" id="L2">print(&#x27;&lt;b&gt;hi&lt;/b&gt;&#x27;)</span>' in shown
    assert (
        "résumé" in (await alice.page(f"/ui/runs/{run}/files/data%20dir/notes%20%C3%A9.txt")).text
    )
    assert "not text" in (await alice.page(f"/ui/runs/{run}/files/weights.bin")).text
    assert (await alice.page(f"/ui/runs/{run}/files/nothing.py")).status_code == 404
    bob = await log_in(site, site.bob)
    for path in (f"/ui/runs/{run}/files", f"/ui/runs/{run}/files/train.py"):
        got = await bob.page(path)
        assert got.status_code == 404 and "import torch" not in got.text


async def test_live_pages_are_capped_per_user_and_end_with_their_session(site: Site) -> None:
    token, made = await site.tokens.create("dora", scopes=[Scope.RUNS])
    dora = await log_in(site, token)
    cookie = {"Cookie": f"{web.COOKIE}={dora.cookie}"}
    page = f"{site.relay}/ui/live"
    async with (
        connect(page, origin=site.base, additional_headers=cookie) as first,  # type: ignore[arg-type]
        connect(page, origin=site.base, additional_headers=cookie),  # type: ignore[arg-type]
        connect(page, origin=site.base, additional_headers=cookie),  # type: ignore[arg-type]
    ):
        with pytest.raises(InvalidStatus) as refused:
            async with connect(page, origin=site.base, additional_headers=cookie):  # type: ignore[arg-type]
                pass
        assert refused.value.response.status_code == 429
        await site.tokens.revoke(made.id)
        with trio.fail_after(10), pytest.raises(ConnectionClosed) as closed:
            await first.recv()
        assert closed.value.rcvd is not None and closed.value.rcvd.code == 1008


async def test_the_list_says_while_an_ide_is_attached(site: Site) -> None:
    from protocol_specs.wire.wire import PresenceEntry
    from relay.client import open_run_link

    run = await submit(site, site.alice, "attached")
    alice = await log_in(site, site.alice)

    async def row() -> str:
        found = re.search(rf'<tr id="run-{run}".*?</tr>', (await alice.page("/ui")).text)
        assert found
        return found.group(0)

    assert ">IDE<" not in await row()
    since = await site.store.last_id("tether:changes") or "0"
    async with connect(
        f"{site.relay}/ui/live?since={since}",
        origin=site.base,  # type: ignore[arg-type]
        additional_headers={"Cookie": f"{web.COOKIE}={alice.cookie}"},
    ) as live:
        async with open_run_link(site.endpoint(site.alice), link=IdeLink(), run=run) as ide:
            await ide.publish(PresenceEntry(origin="adapter-1", epoch=1, attached=True))
            await ide.flush()  # acknowledged once the record says so
            assert ">IDE<" in await row()
        # the link closed while its IDE was attached: the relay says the IDE left
        with trio.fail_after(10):
            while True:
                pushed = orjson.loads(await live.recv())
                if pushed["id"] == run and ">IDE<" not in pushed["html"]:
                    break
    assert ">IDE<" not in await row()


# --- experiments ----------------------------------------------------------------------------------


async def test_a_runs_metrics_are_charted_and_a_sweep_has_a_page_only_its_owner_sees(
    site: Site,
) -> None:
    run = await submit(site, site.alice)
    async with open_control(site.endpoint(site.admin)) as control:  # a worker takes it
        assigned = await control.claim("w", backend="local")
    assert assigned.run.id == run
    async with open_run_link(
        Endpoint(site.relay, token=assigned.token), link=WorkerLink(), run=run, attempt=1
    ) as worker:
        points = [(step, 0.0, {"loss": 1 / (step + 1), "acc": step / 50}) for step in range(50)]
        await worker.publish(wire.MetricEntry(points=points))
        await worker.flush()
    alice = await log_in(site, site.alice)
    text = (await alice.page(f"/ui/runs/{run}")).text
    assert text.count('<svg class="chart"') == 2 and "last 0.02, 50 points" in text
    spec = SweepSpec(
        params=[parse_param("lr=1,2")],
        run=RunSpec(command=["python", "t.py", "{lr}"], workdir="/w", debug=False),
        objective=parse_objective("loss:min"),
        name="<i>lr</i> search",
    )
    async with open_control(site.endpoint(site.alice)) as control:
        sweep = (await control.submit_sweep(spec)).sweep.id
    page = await alice.page(f"/ui/sweeps/{sweep}")
    assert page.status_code == 200
    assert f'href="/ui/runs/{sweep}-0"' in page.text and "&lt;i&gt;lr&lt;/i&gt; search" in page.text
    trial = (await alice.page(f"/ui/runs/{sweep}-0")).text
    assert f'trial 0 of <a href="/ui/sweeps/{sweep}">' in trial
    bob = await log_in(site, site.bob)
    refused = await bob.page(f"/ui/sweeps/{sweep}")
    assert refused.status_code == 404 and "lr" not in refused.text.split("<main>")[1]
    assert (await (await log_in(site, site.admin)).page(f"/ui/sweeps/{sweep}")).status_code == 200
    # the sweeps list, linked from every page's header: one's own sweeps (an admin's: all)
    assert '<a href="/ui/sweeps">Sweeps</a>' in text  # the run page's header
    listed = await alice.page("/ui/sweeps")
    assert listed.status_code == 200 and f'<a href="/ui/sweeps/{sweep}">{sweep}</a>' in listed.text
    assert "&lt;i&gt;lr&lt;/i&gt; search" in listed.text and "<td>0/10</td>" in listed.text
    assert sweep not in (await bob.page("/ui/sweeps")).text
    assert "No sweeps yet" in (await bob.page("/ui/sweeps/")).text
    admin = (await (await log_in(site, site.admin)).page("/ui/sweeps")).text
    assert sweep in admin and "<th>owner</th>" in admin
