"""The web view's HTTP side as plain data: routes, the session cookie, CSRF and origin checks, the
headers every answer carries, and what a runs list asks for.

Theory of operation
-------------------
The relay answers plain HTTP on its own port (``relay/web/``): pages under ``/ui``, and a WebSocket
at ``/ui/live`` that pushes what changed. Everything a request is decided on is here, with no I/O:

- :func:`route` maps a method and path to a :class:`Match` (or says why not: 404, 405).
- A browser proves who it is with a session cookie (:data:`COOKIE`; ``HttpOnly``,
  ``SameSite=Strict``, ``Secure`` over TLS). A session is made by a body-less ``POST /ui/login``
  carrying the user's token in ``Authorization: Bearer``, or a one-time code from ``tether ui``
  in :data:`CODE_HEADER` (the code travels in the link's fragment: never in a server log or a
  ``Referer``). The relay keeps sessions under a hash of their id, as it keeps tokens.
- Every request that changes something (login, logout, cancel, rerun) is a ``POST`` with no body
  that must come from the relay's own origin (:func:`origin_refusal`: ``Origin`` and
  ``Sec-Fetch-Site``); once logged in it must also carry the session's CSRF token in
  :data:`CSRF_HEADER` (:func:`csrf_ok`, constant time). A custom header cannot be set by a
  cross-site form, and a cross-site ``fetch`` with one needs a CORS preflight the relay never grants.
- The live WebSocket checks the same cookie and ``Origin`` before the upgrade (a cross-site page
  cannot open it with the user's cookie: cross-site WebSocket hijacking).
- Every answer carries :func:`security_headers`: a Content-Security-Policy allowing only the
  relay's own scripts, styles and WebSocket, no framing, no sniffing, no referrer, no caching.
"""

from __future__ import annotations

import hashlib
import hmac
import re
import secrets
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from enum import StrEnum
from urllib.parse import parse_qsl, quote, unquote, urlencode, urlsplit

from ..runs.runs import RunState
from ..runs.spec import TAG_PATTERN

__all__ = [
    "ACTIONS",
    "CODE_HEADER",
    "CODE_TTL",
    "COOKIE",
    "CSRF_HEADER",
    "MAX_SCAN",
    "PAGE_SIZE",
    "PUBLIC",
    "SECURE_COOKIE",
    "SESSION_TTL",
    "STREAM_ID",
    "BadQuery",
    "HttpRequest",
    "ListQuery",
    "Match",
    "Route",
    "clear_cookie",
    "csrf_ok",
    "digest",
    "file_path",
    "new_secret",
    "origin_of",
    "origin_refusal",
    "output_path",
    "route",
    "run_path",
    "security_headers",
    "session_cookie",
    "session_of",
    "sweep_path",
]

#: the session cookie over plain HTTP (loopback), and over TLS (a ``__Host-`` cookie: Secure,
#: Path=/, no Domain, so no other host or path can set or shadow it)
COOKIE = "tether_session"
SECURE_COOKIE = "__Host-tether_session"
#: the header an action carries with its session's CSRF token
CSRF_HEADER = "X-Tether-CSRF"
#: the header a one-time login code from ``tether ui`` is sent in
CODE_HEADER = "X-Tether-Login-Code"
#: how long a session lasts from its login (its token's revocation or expiry ends it sooner)
SESSION_TTL = 12 * 3600.0
#: how long a ``tether ui`` code may wait to be used (once)
CODE_TTL = 120.0
#: runs on one page of the list
PAGE_SIZE = 50
#: run ids one list request looks at, at most, to fill a filtered page (the next page goes on)
MAX_SCAN = 5000

_RUN_ID = r"[A-Za-z0-9_-]{1,64}"
#: a Redis stream entry id (a live page's cursors)
STREAM_ID = re.compile(r"\d{1,20}-\d{1,20}|0")
_STATIC = re.compile(r"^/ui/static/([a-z0-9-]+\.(?:css|js|svg))$")
_RUN_PAGE = re.compile(rf"^/ui/runs/({_RUN_ID})$")
_RUN_ACTION = re.compile(rf"^/ui/runs/({_RUN_ID})/(cancel|rerun|stacks)$")
_RUN_FILES = re.compile(rf"^/ui/runs/({_RUN_ID})/files(?:/(.+))?$")
_RUN_OUTPUT = re.compile(rf"^/ui/runs/({_RUN_ID})/outputs/(.+)$")
_OWNER = re.compile(r"^[A-Za-z0-9_.@-]{1,64}$")
_SWEEP_PAGE = re.compile(r"^/ui/sweeps/([a-z0-9]{4,64})$")


class Route(StrEnum):
    ROOT = "root"  #: ``/``: the runs list, for a browser that asked the relay's address
    LIST = "list"
    RUN = "run"
    LOGIN_PAGE = "login_page"
    LOGIN = "login"
    LOGOUT = "logout"
    CANCEL = "cancel"
    RERUN = "rerun"
    STATIC = "static"
    FILES = "files"  #: a run's snapshot: its files
    FILE = "file"  #: one file of it (``name``: its path in the snapshot)
    OUTPUT = "output"  #: one of the run's outputs, downloaded (``name``: its path)
    LIVE = "live"  #: the WebSocket that pushes changes to an open page
    SWEEP = "sweep"  #: a sweep's page (``run``: the sweep's id)
    SWEEPS = "sweeps"  #: the sweeps list
    STACKS = "stacks"  #: a run's processes' stacks, read now (``relay/web/stacks.py``)


#: the routes that change something (stacks: a tunnel into the run): POST, same origin, and (but
#: login) the CSRF token
ACTIONS = frozenset({Route.LOGIN, Route.LOGOUT, Route.CANCEL, Route.RERUN, Route.STACKS})
#: the routes served without a session
PUBLIC = frozenset({Route.LOGIN_PAGE, Route.LOGIN, Route.STATIC})


@dataclass(frozen=True)
class Match:
    route: Route
    run: str = ""  #: the run a page or action is about
    name: str = ""  #: a static file's name


@dataclass(frozen=True)
class HttpRequest:
    """What the relay reads of a request: method, path, query and headers (names lower-cased)."""

    method: str
    path: str
    query: Mapping[str, str] = field(default_factory=dict)
    headers: Mapping[str, str] = field(default_factory=dict)

    @classmethod
    def of(cls, method: str, target: str, headers: Iterable[tuple[str, str]]) -> HttpRequest:
        parts = urlsplit(target)
        query: dict[str, str] = {}
        for name, value in parse_qsl(parts.query, keep_blank_values=True):
            query.setdefault(name, value)  # the first of a repeated parameter
        named: dict[str, str] = {}
        for name, value in headers:
            named.setdefault(name.lower(), value)
        return cls(method.upper(), parts.path or "/", query, named)

    def header(self, name: str) -> str:
        return self.headers.get(name.lower(), "")

    def cookie(self, name: str) -> str:
        """The first cookie called ``name`` (the header split by hand: one malformed cookie of
        another application on the same host must not hide ours, as it would from
        ``http.cookies``)."""
        for pair in self.header("cookie").split(";"):
            key, sep, value = pair.strip().partition("=")
            if sep and key == name:
                return value.strip().strip('"')
        return ""

    @property
    def upgrade(self) -> bool:
        """A WebSocket handshake."""
        return self.header("upgrade").lower() == "websocket"


def route(method: str, path: str) -> Match | int:
    """The route of ``method`` on ``path``, or the HTTP status refusing it (404, 405)."""
    get, post = method in ("GET", "HEAD"), method == "POST"
    if path == "/":
        return Match(Route.ROOT) if get else 405
    if path in ("/ui", "/ui/"):
        return Match(Route.LIST) if get else 405
    if path == "/ui/login":
        return Match(Route.LOGIN_PAGE) if get else Match(Route.LOGIN) if post else 405
    if path == "/ui/logout":
        return Match(Route.LOGOUT) if post else 405
    if path == "/ui/live":
        return Match(Route.LIVE) if method == "GET" else 405
    if found := _STATIC.match(path):
        return Match(Route.STATIC, name=found.group(1)) if get else 405
    if found := _RUN_PAGE.match(path):
        return Match(Route.RUN, run=found.group(1)) if get else 405
    if path in ("/ui/sweeps", "/ui/sweeps/"):
        return Match(Route.SWEEPS) if get else 405
    if found := _SWEEP_PAGE.match(path):
        return Match(Route.SWEEP, run=found.group(1)) if get else 405
    if found := _RUN_FILES.match(path):
        if not get:
            return 405
        if found.group(2) is None:
            return Match(Route.FILES, run=found.group(1))
        name = unquote(found.group(2))
        if "\x00" in name or len(name) > 4096:
            return 404
        return Match(Route.FILE, run=found.group(1), name=name)
    if found := _RUN_OUTPUT.match(path):
        if not get:
            return 405
        name = unquote(found.group(2))
        if "\x00" in name or len(name) > 4096:
            return 404
        return Match(Route.OUTPUT, run=found.group(1), name=name)
    if found := _RUN_ACTION.match(path):
        action = Route(found.group(2))
        return Match(action, run=found.group(1)) if post else 405
    return 404


def run_path(run_id: str) -> str:
    return f"/ui/runs/{run_id}"


def sweep_path(sweep_id: str) -> str:
    return f"/ui/sweeps/{sweep_id}"


def output_path(run_id: str, path: str) -> str:
    """Where one of the run's outputs downloads from."""
    return f"/ui/runs/{run_id}/outputs/{quote(path)}"


def file_path(run_id: str, path: str, line: int = 0) -> str:
    """The viewer of a snapshot file (at ``line``)."""
    return f"/ui/runs/{run_id}/files/{quote(path)}" + (f"#L{line}" if line > 0 else "")


# --- sessions ------------------------------------------------------------------------------------


def new_secret() -> str:
    """A session id, CSRF token or login code: 256 random bits."""
    return secrets.token_urlsafe(32)


def digest(secret: str) -> str:
    """What the relay stores a session id or a login code under (a stolen key is useless)."""
    return hashlib.sha256(secret.encode()).hexdigest()


def session_cookie(session_id: str, *, secure: bool, max_age: float = SESSION_TTL) -> str:
    name = SECURE_COOKIE if secure else COOKIE
    flags = "; Secure" if secure else ""
    return f"{name}={session_id}; Path=/; Max-Age={int(max_age)}; HttpOnly; SameSite=Strict{flags}"


def clear_cookie(*, secure: bool) -> str:
    return session_cookie("", secure=secure, max_age=0)


def session_of(request: HttpRequest, *, secure: bool) -> str:
    """The session id the request's cookie names (``""``: none)."""
    value = request.cookie(SECURE_COOKIE if secure else COOKIE)
    return value if re.fullmatch(r"[A-Za-z0-9_-]{20,100}", value) else ""


def origin_refusal(request: HttpRequest, origin: str) -> str:
    """Why ``request`` (an action or a live WebSocket) is refused as not from the relay's own pages
    at ``origin`` (``scheme://host[:port]``); ``""``: it is from them.

    Browsers send ``Origin`` on every POST and WebSocket handshake, and ``Sec-Fetch-Site`` on every
    request; a request with neither comes from no browser (a script with the cookie already has
    the session), yet is refused all the same: nothing legitimate sends one."""
    sent = request.header("origin")
    site = request.header("sec-fetch-site")
    if not sent and not site:
        return "the request names no origin"
    if sent and _normal(sent.rstrip("/")) != _normal(origin):
        return f"the request comes from another origin ({sent[:100]})"
    if site and site not in ("same-origin", "none"):
        return f"the request comes from another site (Sec-Fetch-Site: {site[:40]})"
    return ""


def csrf_ok(request: HttpRequest, expected: str) -> bool:
    sent = request.header(CSRF_HEADER)
    return bool(sent) and hmac.compare_digest(sent.encode(), expected.encode())


def origin_of(request: HttpRequest, *, tls: bool, public: str = "") -> str:
    """The relay's origin as this request reached it: ``public`` (an operator's setting: the relay
    behind a proxy), else the scheme it serves and the ``Host`` the browser named."""
    if public:
        parts = urlsplit(public)
        return _normal(f"{parts.scheme}://{parts.netloc}")
    host = request.header("host") or "localhost"
    return _normal(f"{'https' if tls else 'http'}://{host}")


def _normal(origin: str) -> str:
    """An origin as browsers send it: lower-case, without the scheme's default port."""
    origin = origin.lower()
    for scheme, port in (("https://", ":443"), ("http://", ":80")):
        if origin.startswith(scheme) and origin.endswith(port):
            return origin.removesuffix(port)
    return origin


def security_headers() -> list[tuple[str, str]]:
    policy = (
        "default-src 'none'; script-src 'self'; style-src 'self'; img-src 'self' data:; "
        "connect-src 'self'; form-action 'self'; frame-ancestors 'none'; base-uri 'none'"
    )
    return [
        ("Content-Security-Policy", policy),
        ("X-Content-Type-Options", "nosniff"),
        ("X-Frame-Options", "DENY"),
        ("Referrer-Policy", "no-referrer"),
        ("Cache-Control", "no-store"),
        ("Cross-Origin-Opener-Policy", "same-origin"),
        ("Cross-Origin-Resource-Policy", "same-origin"),
    ]


# --- the runs list -------------------------------------------------------------------------------


class BadQuery(ValueError):
    """A list filter the relay cannot use (said on the page, with what was expected)."""


@dataclass(frozen=True)
class ListQuery:
    """What a runs list page shows: runs in ``states`` (all: empty), of ``owner`` (admins only),
    tagged ``tag``, from position ``start`` of the newest-first index."""

    states: frozenset[RunState] = frozenset()
    owner: str = ""
    tag: str = ""
    start: int = 0

    @classmethod
    def parse(cls, query: Mapping[str, str]) -> ListQuery:
        states: set[RunState] = set()
        for name in filter(None, query.get("state", "").split(",")):
            try:
                states.add(RunState(name))
            except ValueError:
                known = ", ".join(s.value for s in RunState)
                raise BadQuery(f"unknown state {name[:40]!r} (one of {known})") from None
        owner, tag = query.get("owner", ""), query.get("tag", "")
        if owner and not _OWNER.match(owner):
            raise BadQuery(f"invalid owner {owner[:40]!r}")
        if tag and not TAG_PATTERN.fullmatch(tag):
            raise BadQuery(f"invalid tag {tag[:40]!r}")
        start = query.get("start", "0")
        if not start.isdigit() or int(start) > 10**9:
            raise BadQuery(f"invalid start {start[:20]!r}")
        return cls(frozenset(states), owner, tag, int(start))

    @property
    def filtered(self) -> bool:
        """Whether rows must be read to know if they belong (state, tag)."""
        return bool(self.states or self.tag)

    def matches(self, state: RunState, tags: Iterable[str], owner: str) -> bool:
        return (
            (not self.states or state in self.states)
            and (not self.tag or self.tag in tags)
            and (not self.owner or owner == self.owner)
        )

    def link(self, **changes: str | int) -> str:
        """The list's URL with ``changes`` to its parameters (``start`` 0 and empty ones left out)."""
        params: dict[str, str | int] = {
            "state": ",".join(sorted(s.value for s in self.states)),
            "owner": self.owner,
            "tag": self.tag,
            "start": self.start,
        }
        params.update(changes)
        kept = {k: v for k, v in params.items() if v not in ("", 0)}
        return "/ui" + (f"?{urlencode(kept)}" if kept else "")
