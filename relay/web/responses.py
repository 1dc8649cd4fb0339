"""The web view's HTTP answers as ``websockets`` sends them: every one with the locked-down
headers of ``protocol_specs/web/web.py``, closing its connection."""

from __future__ import annotations

import email.utils
from http import HTTPStatus

import orjson
from websockets.datastructures import Headers
from websockets.http11 import Response
from websockets.trio.server import ServerConnection

from protocol_specs.web import web

__all__ = ["html_page", "http_response", "json_answer", "redirect", "source_of"]


def http_response(
    status: int,
    body: bytes,
    kind: str,
    *,
    cookie: str = "",
    location: str = "",
    cache: bool = False,
) -> Response:
    headers = Headers(
        [
            ("Date", _http_date()),
            ("Connection", "close"),
            ("Content-Type", kind),
            ("Content-Length", str(len(body))),
            *web.security_headers(),
        ]
    )
    if cache:
        headers["Cache-Control"] = "private, max-age=3600"
    if cookie:
        headers["Set-Cookie"] = cookie
    if location:
        headers["Location"] = location
    return Response(status, HTTPStatus(status).phrase, headers, body)


def html_page(status: int, html: str) -> Response:
    return http_response(status, html.encode(), "text/html; charset=utf-8")


def json_answer(status: int, data: object, *, cookie: str = "") -> Response:
    return http_response(status, orjson.dumps(data), "application/json", cookie=cookie)


def redirect(location: str) -> Response:
    return http_response(303, b"", "text/plain", location=location)


def source_of(ws: ServerConnection) -> str:
    address = ws.remote_address
    if isinstance(address, tuple) and address:
        return str(address[0])
    return str(address or "?")


def _http_date() -> str:
    return email.utils.formatdate(usegmt=True)
