"""The web view's HTTP answers, on the relay's own port (``websockets``' ``process_request``).

The relay's WebSocket server reads every request's head; :meth:`Web.process_request` answers the
ones for the web view (``protocol_specs/web/web.py`` decides) and lets every other handshake through to
the relay's WebSocket rooms, untouched. ``websockets`` reads no request body (one would end the
connection unanswered) and keeps no connection alive after an answer: the pages' actions are
body-less ``POST``\\ s, and each request is its own connection.

What a user may see or do is decided as on a control connection: the session's token is looked up
again on every request (revoked: logged out), and every page and action is authorised by
:func:`protocol_specs.access.permissions.authorize`; another user's run is a 404, as a run that does not
exist. Every action is in the run's audit trail (``role`` ``web``), and so is every page or action
refused that names a run that exists (``protocol_specs/access/audit.py``).
"""

from __future__ import annotations

import logging
import time
import weakref
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass
from functools import partial
from http import HTTPStatus
from typing import Any

from websockets.http11 import Request, Response
from websockets.trio.server import ServerConnection

from protocol_specs.access.audit import AuditRole
from protocol_specs.access.auth import Principal
from protocol_specs.access.permissions import Act, authorize
from protocol_specs.checkpoints.files import FileSet
from protocol_specs.runs.runs import RunRecord
from protocol_specs.snapshots.snapshots import Manifest
from protocol_specs.snapshots.trees import TreeError
from protocol_specs.web import web
from protocol_specs.wire.wire import AuditEntry, AuditEvent, StreamName

from ..auth import TokenStore
from ..control import Control
from ..gate import Gate
from ..runs.audit import AuditTrail
from ..runs.checkpoints import RunFiles, SetError
from ..runs.metrics import newest_points
from ..runs.registry import Registry
from ..snapshots.blobs import BlobError, BlobStore
from ..store import StoreError, keys
from ..sweeps import Sweeps
from . import assets
from .debug_view import DebugView, debug_view
from .experiments import metrics_section, sweep_page, sweeps_page
from .listing import list_page
from .log_text import LogText
from .login import Login
from .outputs import output_response, outputs_section
from .pages import error_page, file_page, files_page, login_page, run_page, runs_page
from .responses import html_page, http_response, json_answer, redirect, source_of
from .sessions import Session, WebSessions
from .stacks import read_stacks, stacks_answer, stacks_section

__all__ = ["LiveView", "Web"]

log = logging.getLogger("tether.relay.web")

#: log chunks a run's page shows at first (its live tail goes on from there), and their text
#: at most (the newest)
LOG_TAIL = 500
LOG_TAIL_CHARS = 256 * 1024
#: audit entries a run's page shows (the newest)
AUDIT_SHOWN = 200
#: manifests and debugger views kept per relay process
_KEPT = 64
#: the largest snapshot file the viewer shows
MAX_SHOWN = 1024 * 1024
#: a user looking at a run again within this many seconds adds no ``view`` to its audit trail
VIEW_AUDIT_EVERY = 600.0


@dataclass(frozen=True)
class LiveView:
    """What an accepted ``/ui/live`` WebSocket shows: who, and the list or the run it follows."""

    who: Principal
    session: str  #: the session's id (looked at again while the page is open)
    query: web.ListQuery | None = None
    run: RunRecord | None = None
    #: where its run's logs and the changes stream are followed from
    logs_cursor: str = "0"
    #: whether the page's log ends a line (a marker that follows starts a new one)
    logs_at_line_start: bool = True
    changes_cursor: str = "0"


class Web:
    def __init__(
        self,
        registry: Registry,
        control: Control,
        sweeps: Sweeps,
        tokens: TokenStore,
        audit: AuditTrail,
        gate: Gate,
        blobs: BlobStore,
        *,
        tls: bool,
        public_url: str = "",
        max_live: int = 64,
        clock: Callable[[], float] = time.time,
    ) -> None:
        self.registry = registry
        self.store = registry.store
        self.control = control
        self.sweeps = sweeps
        self.tokens = tokens
        self.audit = audit
        self.gate = gate
        self.blobs = blobs
        self.sessions = WebSessions(registry.store, tokens, clock=clock)
        self.login = Login(self.sessions, tokens, gate.throttle, clock)
        self.tls = tls
        self.public_url = public_url
        self.clock = clock
        #: accepted live WebSockets, and what each follows (read by ``relay/web/live.py``)
        self.live: weakref.WeakKeyDictionary[ServerConnection, LiveView] = (
            weakref.WeakKeyDictionary()
        )
        #: snapshots' manifests by run (a run's never changes), the newest few
        self.manifests: dict[str, Manifest] = {}
        #: debugger views by run and what they were folded for (shared by a run's live pages)
        self.debug_views: dict[tuple[str, object], DebugView] = {}
        #: live pages open on this relay process, by user (at most ``max_live`` each)
        self.viewers: Counter[str] = Counter()
        self.max_live = max_live

    def _origin(self, req: web.HttpRequest) -> str:
        return web.origin_of(req, tls=self.tls, public=self.public_url)

    @property
    def secure(self) -> bool:
        """Browsers reach the relay over TLS (its own, or a proxy's: ``public_url``)."""
        return self.tls or self.public_url.startswith("https://")

    # --- the hooks --------------------------------------------------------------------------------

    async def process_request(self, ws: ServerConnection, request: Request) -> Response | None:
        """The answer to a web view request; ``None`` lets a relay handshake through."""
        req = web.HttpRequest.of(request.method, request.path, request.headers.raw_items())
        if req.upgrade and not req.path.startswith("/ui"):
            return None  # a relay peer
        found = web.route(req.method, req.path)
        try:
            if isinstance(found, int):
                response: Response | None = html_page(
                    found, error_page(found, HTTPStatus(found).phrase)
                )
                if found == 405:
                    assert response is not None
                    response.headers["Allow"] = "GET, HEAD, POST"
            else:
                response = await self._answer(ws, req, found)
        except StoreError as exc:
            log.warning("web request %s %s: %s", req.method, req.path, exc)
            response = html_page(503, error_page(503, "the relay lost its store; try again"))
        except Exception:  # a bug: said in the relay's log, never to the browser
            log.exception("web request %s %s failed", req.method, req.path)
            response = html_page(500, error_page(500, "the relay failed to answer this"))
        if req.method == "HEAD" and response is not None:
            response = Response(response.status_code, response.reason_phrase, response.headers)
        return response

    def process_response(
        self, ws: ServerConnection, request: Request, response: Response
    ) -> Response | None:
        """``websockets``' own answers (a malformed request, a failed handshake) get the same
        locked-down headers as the web view's."""
        if response.status_code != 101 and "Content-Security-Policy" not in response.headers:
            for name, value in web.security_headers():
                response.headers[name] = value
        return None

    async def _answer(
        self, ws: ServerConnection, req: web.HttpRequest, found: web.Match
    ) -> Response | None:
        match found.route:
            case web.Route.STATIC:
                body = assets.FILES.get(found.name)
                if body is None:
                    return html_page(404, error_page(404, "no such file"))
                kind = assets.TYPES[found.name.rpartition(".")[2]]
                return http_response(200, body, kind, cache=True)
            case web.Route.LOGIN_PAGE:
                current = await self.sessions.get(web.session_of(req, secure=self.secure))
                return html_page(200, login_page(current=current[1].user if current else ""))
            case web.Route.LOGIN:
                return await self.login.answer(
                    req, source_of(ws), origin=self._origin(req), secure=self.secure
                )
        got = await self.sessions.get(web.session_of(req, secure=self.secure))
        if got is None:
            return self._unauthenticated(req, found)
        session, who = got
        if found.route in web.ACTIONS:
            refusal = web.origin_refusal(req, self._origin(req)) or (
                "" if web.csrf_ok(req, session.csrf) else "the CSRF token is missing or wrong"
            )
            if refusal:
                log.info("web action refused for %s: %s", who, refusal)
                named = await self.registry.load(found.run) if found.run else None
                if named is not None:
                    await self._refused(ws, req, found.route, named, who, "forbidden", refusal)
                return json_answer(403, {"error": refusal})
        match found.route:
            case web.Route.ROOT:
                return redirect("/ui")
            case web.Route.LIST:
                return await self._list(req, session, who)
            case web.Route.RUN:
                return await self._run_page(ws, req, found.run, session, who)
            case web.Route.SWEEP | web.Route.SWEEPS:
                return await self._sweep_page(found.run, session, who)
            case web.Route.FILES | web.Route.FILE:
                return await self._snapshot(ws, found, req, session, who)
            case web.Route.OUTPUT:
                return await self._output(ws, req, found, who)
            case web.Route.LIVE:
                return await self._live(ws, req, who)
            case web.Route.LOGOUT:
                await self.sessions.close(web.session_of(req, secure=self.secure))
                return json_answer(200, {"ok": True}, cookie=web.clear_cookie(secure=self.secure))
            case web.Route.CANCEL | web.Route.RERUN:
                return await self._action(ws, req, found, who)
            case web.Route.STACKS:
                return await self._stacks(ws, req, found.run, who)
        return html_page(404, error_page(404, "Not Found", who))

    def _unauthenticated(self, req: web.HttpRequest, found: web.Match) -> Response:
        if found.route in web.ACTIONS or found.route is web.Route.LIVE:
            return json_answer(401, {"error": "log in first"})
        return redirect("/ui/login")

    # --- pages ------------------------------------------------------------------------------------

    async def _list(self, req: web.HttpRequest, session: Session, who: Principal) -> Response:
        refusal = authorize(who, Act.LIST_RUNS)
        if refusal is not None:
            return html_page(403, error_page(403, refusal.message, who))
        try:
            query = web.ListQuery.parse(req.query)
        except web.BadQuery as exc:
            query, message = web.ListQuery(), str(exc)
        else:
            message = ""
        page = await list_page(self.registry, who, query)
        since = await self.store.last_id(keys.CHANGES) or "0"
        html = runs_page(page, query, who, session.csrf, self.clock(), message, since=since)
        return html_page(200, html)

    async def _visible(
        self,
        ws: ServerConnection,
        req: web.HttpRequest,
        route: web.Route,
        run_id: str,
        who: Principal,
        act: Act,
    ) -> RunRecord | None:
        """The run if ``who`` may do ``act`` on it (``None``: a 404, whether it does not exist or
        is another user's; the latter is in its audit trail)."""
        record = await self.registry.load(run_id)
        refusal = authorize(who, act, record, about_run=run_id)
        if refusal is not None and record is not None:
            await self._refused(ws, req, route, record, who, refusal.code, refusal.message)
        return None if refusal is not None else record

    async def _refused(
        self,
        ws: ServerConnection,
        req: web.HttpRequest,
        route: web.Route,
        record: RunRecord,
        who: Principal,
        code: str,
        message: str,
    ) -> None:
        """A page or action refused that names ``record``'s run, in its audit trail."""
        await self.audit.refused(
            record,
            who,
            request=f"{req.method} {route.value}",
            code=code,
            message=message,
            source=source_of(ws),
            role=AuditRole.WEB,
            client=req.header("user-agent"),
        )

    async def _run_page(
        self,
        ws: ServerConnection,
        req: web.HttpRequest,
        run_id: str,
        session: Session,
        who: Principal,
    ) -> Response:
        record = await self._visible(ws, req, web.Route.RUN, run_id, who, Act.GET_RUN)
        if record is None:
            return html_page(404, error_page(404, f"no run {run_id} (or not yours)", who))
        record = await self.registry.with_liveness(record)
        tail = await self.store.read_last(keys.stream(record.id, StreamName.LOGS), LOG_TAIL)
        text = LogText()
        logs = "".join(text(payload) for _, payload in tail)[-LOG_TAIL_CHARS:]
        cursor = tail[-1][0] if tail else "0"
        audit = await self._viewed(ws, req, record, who)
        if authorize(who, Act.GET_AUDIT, record) is not None:
            audit = []
        debug = await self.debug_view(record)
        points = await newest_points(self.store, record.id)
        since = await self.store.last_id(keys.CHANGES) or "0"
        html = run_page(
            record.redacted(),
            logs,
            audit,
            who,
            session.csrf,
            self.clock(),
            logs_cursor=cursor,
            since=since,
            debug=debug,
            metrics=metrics_section(points),
            ranks=stacks_section(record),
            outputs=outputs_section(record, await self._outputs_of(record)),
        )
        return html_page(200, html)

    async def _output(
        self, ws: ServerConnection, req: web.HttpRequest, found: web.Match, who: Principal
    ) -> Response:
        """One of the run's outputs, downloaded: who may see the run's page may fetch it."""
        record = await self._visible(ws, req, found.route, found.run, who, Act.GET_RUN)
        if record is None:
            return html_page(404, error_page(404, f"no run {found.run} (or not yours)", who))
        await self._viewed(ws, req, record, who, "its outputs")
        files = await self._outputs_of(record)
        if files is None:
            return html_page(404, error_page(404, f"run {record.id} has no outputs", who))
        answer = await output_response(self.blobs, record.id, files, found.name)
        if isinstance(answer, tuple):
            return html_page(answer[0], error_page(answer[0], answer[1], who))
        return answer

    async def _outputs_of(self, record: RunRecord) -> FileSet | None:
        """The run's outputs as its workers recorded them (None: it has none, or the relay
        lost their set: said in its log)."""
        if not record.outputs:
            return None
        try:
            return await RunFiles(self.store, self.blobs).outputs(record.id)
        except SetError as exc:
            log.warning("run %s: its outputs: %s", record.id, exc)
            return None

    async def _sweep_page(self, sweep_id: str, session: Session, who: Principal) -> Response:
        """A sweep's page; with no ``sweep_id``, the list of the user's sweeps (an admin's: all)."""
        if not sweep_id:
            if refusal := authorize(who, Act.LIST_SWEEPS):
                return html_page(403, error_page(403, refusal.message, who))
            sweeps = await self.sweeps.newest(web.PAGE_SIZE, "" if who.admin else who.user)
            html = sweeps_page([s.redacted() for s in sweeps], who, session.csrf, self.clock())
            return html_page(200, html)
        sweep = await self.sweeps.find(sweep_id, who)
        if sweep is None:
            return html_page(404, error_page(404, f"no sweep {sweep_id} (or not yours)", who))
        trials = await self.sweeps.trials_as_shown(sweep.id)
        html = sweep_page(sweep.redacted(), trials, who, session.csrf, self.clock())
        return html_page(200, html)

    async def _snapshot(
        self,
        ws: ServerConnection,
        found: web.Match,
        req: web.HttpRequest,
        session: Session,
        who: Principal,
    ) -> Response:
        """A run's snapshot (what its owner submitted: seeing it is seeing the run): the file
        list, or one text file."""
        record = await self._visible(ws, req, found.route, found.run, who, Act.GET_RUN)
        if record is None:
            return html_page(404, error_page(404, f"no run {found.run} (or not yours)", who))
        await self._viewed(ws, req, record, who, "its snapshot")
        manifest = await self._manifest(record)
        if manifest is None:
            return html_page(410, error_page(410, "the relay lost this snapshot", who))
        if found.route is web.Route.FILES:
            html = files_page(record, manifest, who, session.csrf, req.query.get("q", "")[:200])
            return html_page(200, html)
        entry = next((e for e in manifest.entries if e.path == found.name), None)
        if entry is None:
            return html_page(404, error_page(404, f"no file {found.name} in this snapshot", who))
        text: str | None = None
        if entry.kind == "file" and entry.size <= MAX_SHOWN:
            try:
                _size, data = await self.blobs.read(entry.digest, 0, entry.size)
            except BlobError as exc:
                log.warning("run %s: %s", record.id, exc)
                return html_page(410, error_page(410, "the relay lost this file", who))
            text = _text(data)
        return html_page(200, file_page(record, entry, text, who, session.csrf))

    async def _manifest(self, record: RunRecord) -> Manifest | None:
        """The run's snapshot's manifest (``None``: the relay lost part of it), kept for the next
        look (a run's snapshot never changes)."""
        manifest = self.manifests.get(record.id)
        if manifest is None:
            try:
                manifest = await self.registry.manifest_of(record.id)
            except (BlobError, TreeError) as exc:
                log.warning("run %s: %s", record.id, exc)
                return None
            _keep(self.manifests, record.id, manifest)
        return manifest

    async def debug_view(self, record: RunRecord) -> DebugView:
        """The run's debugger section, folded once per content of its two streams (the newest
        entry of each names it; its pages and live pages share it)."""
        tails = [
            await self.store.last_id(keys.stream(record.id, name))
            for name in (StreamName.TO_WORKER, StreamName.TO_IDE)
        ]
        key = (record.id, tuple(tails))
        view = self.debug_views.get(key)
        if view is None:
            view = await debug_view(self.store, record)
            _keep(self.debug_views, key, view)
        return view

    async def _viewed(
        self,
        ws: ServerConnection,
        req: web.HttpRequest,
        record: RunRecord,
        who: Principal,
        what: str = "",
    ) -> list[AuditEntry]:
        """Put a ``view`` in the run's audit trail (once per :data:`VIEW_AUDIT_EVERY` s per user
        and thing seen: reloads add nothing; a ``HEAD`` sees nothing); the newest of the trail,
        as it was."""
        trail = await self.audit.read_last(record.id, AUDIT_SHOWN)
        if req.method == "HEAD":
            return trail
        now = self.clock()
        for entry in reversed(trail):
            if now - entry.at > VIEW_AUDIT_EVERY:
                break
            if entry.event == AuditEvent.VIEW and entry.user == who.user and entry.detail == what:
                return trail
        await self.audit.record(
            record.id, AuditEvent.VIEW, who, source=source_of(ws), role=AuditRole.WEB, detail=what
        )
        return trail

    async def _action(
        self, ws: ServerConnection, req: web.HttpRequest, found: web.Match, who: Principal
    ) -> Response:
        act = Act.CANCEL if found.route is web.Route.CANCEL else Act.RERUN
        record = await self._visible(ws, req, found.route, found.run, who, act)
        if record is None:
            return json_answer(404, {"error": f"no run {found.run} (or not yours)"})
        source = source_of(ws)
        if act is Act.CANCEL:
            done = await self.control.cancel_run(
                record, who, source=source, role=AuditRole.WEB, detail="cancelled in the web view"
            )
            return json_answer(200, {"ok": True, "state": done.state.value})
        try:
            got = await self.control.rerun(record, who, source=source, role=AuditRole.WEB)
        except (BlobError, TreeError) as exc:
            log.warning("run %s: cannot rerun: %s", record.id, exc)
            return json_answer(410, {"error": "the relay lost part of this run's snapshot"})
        if not isinstance(got, RunRecord):
            return json_answer(409, {"error": got.message})
        return json_answer(200, {"ok": True, "run": got.id, "url": web.run_path(got.id)})

    async def _stacks(
        self, ws: ServerConnection, req: web.HttpRequest, run_id: str, who: Principal
    ) -> Response:
        """The run's processes' stacks, read now (``relay/web/stacks.py``): for whoever may open
        a tunnel into the run (as ``tether stacks`` does: its owner, an admin), not every viewer
        of its page (a backend's token sees every run)."""
        record = await self._visible(ws, req, web.Route.STACKS, run_id, who, Act.OPEN_TUNNEL)
        if record is None:
            return json_answer(404, {"error": f"no run {run_id} (or not yours)"})

        async def noting(tunnel: str) -> None:
            await self.audit.record(
                record.id, AuditEvent.TUNNEL, who, source=source_of(ws), role=AuditRole.WEB,
                client=req.header("user-agent"), detail=f"{tunnel}: stacks",
            )  # fmt: skip

        got = await read_stacks(
            self.control.rooms.tunnels, self.store, record, who.user, noting=noting,
            reload=partial(self.registry.load, record.id),
        )  # fmt: skip
        return json_answer(*stacks_answer(got))

    async def _live(
        self, ws: ServerConnection, req: web.HttpRequest, who: Principal
    ) -> Response | None:
        """Accept a live WebSocket (``relay/web/live.py`` serves it) from the relay's own pages."""
        session = web.session_of(req, secure=self.secure)
        refusal = web.origin_refusal(req, self._origin(req))
        if refusal or not req.upgrade:
            return json_answer(403, {"error": refusal or "a WebSocket handshake is expected"})
        if self.viewers[who.user] >= self.max_live:
            message = f"{who.user} has {self.max_live} live pages open here, the most allowed"
            return json_answer(429, {"error": message})
        changes = req.query.get("since", "0")
        if not web.STREAM_ID.fullmatch(changes):
            changes = "0"
        if run_id := req.query.get("run", ""):
            record = await self._visible(ws, req, web.Route.LIVE, run_id, who, Act.OPEN_LOGS)
            if record is None:
                return json_answer(404, {"error": f"no run {run_id} (or not yours)"})
            logs = req.query.get("logs", "0")
            if not web.STREAM_ID.fullmatch(logs):
                logs = "0"
            self.live[ws] = LiveView(
                who,
                session,
                run=record,
                logs_cursor=logs,
                logs_at_line_start=req.query.get("nl", "1") != "0",
                changes_cursor=changes,
            )
        else:
            try:
                query = web.ListQuery.parse(req.query)
            except web.BadQuery as exc:
                return json_answer(400, {"error": str(exc)})
            self.live[ws] = LiveView(who, session, query=query, changes_cursor=changes)
        return None


def _keep(cache: dict[Any, Any], key: Any, value: Any) -> None:
    """Put ``value`` in a small cache, dropping its oldest entry past :data:`_KEPT`."""
    cache[key] = value
    while len(cache) > _KEPT:
        del cache[next(iter(cache))]


def _text(data: bytes) -> str | None:
    """``data`` as text, or ``None`` for a binary file (a NUL byte, or not UTF-8)."""
    if b"\x00" in data:
        return None
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError:
        return None
