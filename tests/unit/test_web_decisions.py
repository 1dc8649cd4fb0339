"""The web view's decisions (``protocol_specs/web/web.py``) and its HTML (``relay/web/pages.py``),
without sockets."""

from __future__ import annotations

import re

import pytest
from hypothesis import given
from hypothesis import strategies as st

from protocol_specs.access.auth import Principal, Scope
from protocol_specs.runs.runs import Attempt, ProcessRow, RunRecord, RunState
from protocol_specs.runs.spec import RunSpec
from protocol_specs.web import web
from relay.web.listing import Page
from relay.web.log_text import LogText
from relay.web.pages import run_page, run_row, runs_page

ORIGIN = "http://127.0.0.1:8765"


def request(method: str = "GET", target: str = "/ui", **headers: str) -> web.HttpRequest:
    return web.HttpRequest.of(
        method, target, [(k.replace("_", "-"), v) for k, v in headers.items()]
    )


@pytest.mark.parametrize(
    ("method", "path", "want"),
    [
        ("GET", "/", web.Match(web.Route.ROOT)),
        ("GET", "/ui", web.Match(web.Route.LIST)),
        ("HEAD", "/ui/", web.Match(web.Route.LIST)),
        ("GET", "/ui/login", web.Match(web.Route.LOGIN_PAGE)),
        ("POST", "/ui/login", web.Match(web.Route.LOGIN)),
        ("POST", "/ui/logout", web.Match(web.Route.LOGOUT)),
        ("GET", "/ui/runs/6b07ab", web.Match(web.Route.RUN, run="6b07ab")),
        ("POST", "/ui/runs/6b07ab/cancel", web.Match(web.Route.CANCEL, run="6b07ab")),
        ("POST", "/ui/runs/6b07ab/stacks", web.Match(web.Route.STACKS, run="6b07ab")),
        ("GET", "/ui/runs/6b07ab/stacks", 405),
        ("POST", "/ui/runs/6b07ab/rerun", web.Match(web.Route.RERUN, run="6b07ab")),
        ("GET", "/ui/static/app.js", web.Match(web.Route.STATIC, name="app.js")),
        ("GET", "/ui/live", web.Match(web.Route.LIVE)),
        ("GET", "/ui/sweeps", web.Match(web.Route.SWEEPS)),
        ("GET", "/ui/sweeps/", web.Match(web.Route.SWEEPS)),
        ("GET", "/ui/sweeps/s6b08a1", web.Match(web.Route.SWEEP, run="s6b08a1")),
        ("POST", "/ui/sweeps", 405),
        ("GET", "/ui/logout", 405),
        ("GET", "/ui/runs/6b07ab/cancel", 405),
        ("POST", "/ui/runs/6b07ab", 405),
        ("DELETE", "/ui", 405),
        ("GET", "/ui/runs/../etc", 404),
        ("GET", "/ui/static/../server.py", 404),
        ("GET", "/ui/runs/a b", 404),
        ("GET", "/api", 404),
    ],
)
def test_routes(method: str, path: str, want: web.Match | int) -> None:
    assert web.route(method, path) == want


def test_every_action_is_a_post_and_nothing_else_is_public() -> None:
    for route in web.ACTIONS:
        assert route in {
            web.Route.LOGIN, web.Route.LOGOUT, web.Route.CANCEL, web.Route.RERUN, web.Route.STACKS
        }  # fmt: skip
    assert web.PUBLIC == {web.Route.LOGIN_PAGE, web.Route.LOGIN, web.Route.STATIC}


def test_the_session_cookie_is_http_only_strict_and_secure_over_tls() -> None:
    plain = web.session_cookie("abc", secure=False)
    assert plain.startswith(f"{web.COOKIE}=abc;")
    assert "HttpOnly" in plain and "SameSite=Strict" in plain and "Secure" not in plain
    tls = web.session_cookie("abc", secure=True)
    assert tls.startswith("__Host-") and "; Secure" in tls and "Domain" not in tls
    assert "Max-Age=0" in web.clear_cookie(secure=False)


def test_the_session_id_is_read_from_the_right_cookie_only() -> None:
    sid = web.new_secret()
    req = request(cookie=f"other=1; {web.COOKIE}={sid}")
    assert web.session_of(req, secure=False) == sid
    assert web.session_of(req, secure=True) == ""
    assert web.session_of(request(cookie=f"{web.COOKIE}=short"), secure=False) == ""
    assert web.session_of(request(cookie='bad"cookie'), secure=False) == ""
    # another application's malformed cookie on the same host hides nothing
    odd = request(cookie=f'x={{"a":1}}; {web.COOKIE}={sid}; y=2')
    assert web.session_of(odd, secure=False) == sid


@pytest.mark.parametrize(
    ("headers", "refused"),
    [
        ({"origin": ORIGIN, "sec_fetch_site": "same-origin"}, False),
        ({"origin": ORIGIN + "/"}, False),
        ({"sec_fetch_site": "same-origin"}, False),
        ({}, True),
        ({"origin": "http://127.0.0.1:9999"}, True),
        ({"origin": "https://127.0.0.1:8765"}, True),
        ({"origin": "null"}, True),
        ({"origin": ORIGIN, "sec_fetch_site": "same-site"}, True),
        ({"sec_fetch_site": "cross-site"}, True),
    ],
)
def test_origin_checks(headers: dict[str, str], refused: bool) -> None:
    assert bool(web.origin_refusal(request("POST", **headers), ORIGIN)) is refused


def test_the_origin_is_the_public_url_or_the_host_asked() -> None:
    req = request(host="relay.lan:8765")
    assert web.origin_of(req, tls=False) == "http://relay.lan:8765"
    assert web.origin_of(req, tls=True) == "https://relay.lan:8765"
    assert (
        web.origin_of(req, tls=False, public="https://t.example.com/x") == "https://t.example.com"
    )
    # a default port is not part of the origin a browser sends
    public = web.origin_of(req, tls=False, public="https://T.example.com:443")
    assert public == "https://t.example.com"
    assert not web.origin_refusal(request("POST", origin="https://t.example.com"), public)
    assert web.origin_of(request(host="h:80"), tls=False) == "http://h"


def test_csrf_needs_the_exact_token() -> None:
    token = web.new_secret()
    assert web.csrf_ok(request("POST", **{"X-Tether-CSRF": token}), token)
    assert not web.csrf_ok(request("POST", **{"X-Tether-CSRF": token[:-1]}), token)
    assert not web.csrf_ok(request("POST"), token)


def test_list_queries_parse_link_and_match() -> None:
    q = web.ListQuery.parse({"state": "failed,lost", "tag": "exp:1", "start": "50"})
    assert q.states == {RunState.FAILED, RunState.LOST} and q.filtered
    assert q.link() == "/ui?state=failed%2Clost&tag=exp%3A1&start=50"
    assert q.link(start=0) == "/ui?state=failed%2Clost&tag=exp%3A1"
    assert q.matches(RunState.LOST, ["exp:1"], "a")
    assert not q.matches(RunState.QUEUED, ["exp:1"], "a")
    assert not q.matches(RunState.LOST, [], "a")
    assert web.ListQuery.parse({}).link() == "/ui"
    for bad in ({"state": "napping"}, {"owner": "a b"}, {"tag": "-x"}, {"start": "-1"}):
        with pytest.raises(web.BadQuery):
            web.ListQuery.parse(bad)


@given(st.dictionaries(st.sampled_from(["state", "owner", "tag", "start"]), st.text(max_size=30)))
def test_any_query_string_parses_or_is_a_bad_query(query: dict[str, str]) -> None:
    try:
        parsed = web.ListQuery.parse(query)
    except web.BadQuery:
        return
    assert web.ListQuery.parse(dict(web.HttpRequest.of("GET", parsed.link(), []).query)) == parsed


# --- pages ----------------------------------------------------------------------------------------

ALICE = Principal(token="t1", kind="user", user="alice", scopes=frozenset({Scope.RUNS}))


def record(**changes: object) -> RunRecord:
    spec = RunSpec(command=["python", "train.py", "--lr", "3e-4"], workdir="/w", tags=["exp1"])
    base = RunRecord(
        id="6b07abcdef0123",
        spec=spec,
        owner="alice",
        created_at=1000.0,
        updated_at=1000.0,
        attempts=[Attempt(n=1, queued_at=1000.0)],
    )
    return base.model_copy(update=changes)


def test_a_row_says_state_where_attempt_and_ide() -> None:
    paused = record(
        state=RunState.PAUSED,
        paused_at="uncaught ValueError at train.py:18 in step",
        ides=["adapter-1"],
        attempts=[Attempt(n=1, queued_at=1000.0, started_at=1001.0, worker="gpu-3")],
    )
    row = run_row(paused, now=1061.0)
    assert 'id="run-6b07abcdef0123"' in row
    assert "uncaught ValueError at train.py:18 in step" in row
    assert "train.py --lr 3e-4" in row and ">exp1<" in row
    assert "1/1" in row and ">IDE<" in row and "1m" in row
    queued = run_row(record(attempts=[Attempt(n=1, queued_at=1000.0, job="4242")]), now=1001.0)
    assert "job 4242" in queued and ">IDE<" not in queued


def test_the_list_page_offers_older_pages_and_no_owner_filter_to_users() -> None:
    page = Page([record()], next_start=50, scanned=50)
    html = runs_page(page, web.ListQuery(), ALICE, "csrf-token", now=1001.0)
    assert 'rel="next" href="/ui?start=50"' in html
    assert 'name="owner"' not in html
    assert 'content="csrf-token"' in html
    assert re.search(r'data-live="/ui/live\?since=0"', html)


def test_a_run_page_shows_attach_snippets_only_while_it_can_be_debugged() -> None:
    live = run_page(record(), "hello\n", [], ALICE, "c", 1001.0, logs_cursor="5-0")
    assert (
        "tether attach 6b07abcdef0123" in live and "&quot;request&quot;: &quot;attach&quot;" in live
    )
    assert "logs=5-0" in live and "nl=1" in live and ">Cancel<" in live
    done = record(state=RunState.SUCCEEDED, exit_code=0)
    finished = run_page(done, "partial", [], ALICE, "c", 1001.0, logs_cursor="5-0")
    assert "tether attach" not in finished and ">Cancel<" not in finished and ">Rerun<" in finished
    assert "nl=0" in finished


def test_processes_are_listed_with_where_each_is_paused() -> None:
    rows = {
        "": ProcessRow(title="main process", state="paused", where="train.py:3 in main"),
        "c1": ProcessRow(title="rank 1 (pid 7)", pid=7, state="exited", exit_code=1),
    }
    html = run_page(record(processes=rows), "", [], ALICE, "c", 1001.0, logs_cursor="0")
    assert "train.py:3 in main" in html and "rank 1 (pid 7)" in html and "exit 1" in html


def test_log_markers_start_a_line_of_their_own() -> None:
    from protocol_specs.wire.wire import LogEntry, StatusEntry, encode_entry

    text = LogText()
    parts = [
        text(encode_entry(StatusEntry(event="queued", detail="queued on local"))),
        text(encode_entry(LogEntry(stream="stdout", data=b"no newline"))),
        text(encode_entry(StatusEntry(event="finished", detail="finished"))),
        text(b"\xff not an entry"),
    ]
    assert "".join(parts) == "── queued on local ──\nno newline\n── finished ──\n"


def test_the_debug_view_folds_breakpoints_their_verification_and_stops() -> None:
    import orjson

    from protocol_specs.wire.wire import DapEntry, StatusEntry
    from relay.web.debug_view import fold
    from relay.web.pages import debug_section

    def dap(msg: dict[str, object], **fields: object) -> DapEntry:
        return DapEntry(body=orjson.dumps(msg), **fields)  # type: ignore[arg-type]

    set_bps = {
        "type": "request",
        "seq": 7,
        "command": "setBreakpoints",
        "arguments": {
            "source": {"path": "/w/train.py"},
            "breakpoints": [{"line": 18}, {"line": 40, "condition": "loss != loss"}],
        },
    }
    to_worker = [
        dap(set_bps, origin="a1", bp_ids=[1, 2], local=True),
        dap(
            {
                "type": "request",
                "seq": 8,
                "command": "setExceptionBreakpoints",
                "arguments": {"filters": ["uncaught"]},
            },
            origin="a1",
        ),
        # a child process's configuration is its own
        dap(set_bps, origin="a1", bp_ids=[9, 10], process="c1"),
    ]
    record_ = record()
    pending = fold(record_, to_worker, [])
    assert [(b.where, b.state) for b in pending.breakpoints] == [
        ("train.py:18", "pending"),
        ("train.py:40", "pending"),
    ]
    assert pending.breakpoints[1].condition == "loss != loss"
    assert pending.exceptions == ["uncaught"]
    answer = {
        "type": "response",
        "request_seq": 7,
        "success": True,
        "command": "setBreakpoints",
        "body": {"breakpoints": [{"id": 31, "verified": True, "line": 18},
                                 {"id": 32, "verified": False, "message": "no code"}]},
    }  # fmt: skip
    stack = [{"name": "step", "path": "train.py", "line": 18}, {"name": "<module>",
             "path": "train.py", "line": 50}]  # fmt: skip
    to_ide = [
        dap(answer, origin="a1"),
        dap(
            {
                "type": "event",
                "event": "breakpoint",
                "body": {
                    "reason": "changed",
                    "breakpoint": {"id": 32, "verified": True, "line": 41},
                },
            }
        ),
        StatusEntry(
            event="paused",
            data={"where": "train.py:18 in step", "reason": "breakpoint", "stack": stack},
        ),
        StatusEntry(event="paused", process="c1", data={"where": "x.py:1 in f"}),
        StatusEntry(event="resumed", process="c1"),
    ]
    view = fold(record_, to_worker, to_ide)
    assert [(b.where, b.state) for b in view.breakpoints] == [
        ("train.py:18", "verified"),
        ("train.py:40 (now 41)", "verified"),
    ]
    assert list(view.stops) == [""]
    assert view.stops[""].stack == stack and view.stops[""].reason == "breakpoint"
    html = debug_section(view, record_)
    assert "main process stopped" in html and "&lt;module&gt;" in html and "bp-verified" in html
    gone = fold(record_, to_worker, [*to_ide, StatusEntry(event="retrying")])
    assert gone.stops == {}
