"""POST a JSON notice to a run's webhook: a minimal HTTP/1.1 client on trio (no dependencies).

Used by the relay when a run's program pauses with no IDE attached (:func:`notify_unattended_stop`,
with the notice built by :func:`unattended_stop_notice`). Non-2xx statuses are returned; anything
that prevents getting a status raises :class:`WebhookError`.

Times in a notice are wall-clock seconds since the Unix epoch (``time.time()``), like every time
the relay stores: the person or service reading it compares them with its own clock.
"""

from __future__ import annotations

import json
import logging
import ssl
from typing import Any
from urllib.parse import urlsplit

import trio

from protocol_specs.runs.runs import RunRecord
from protocol_specs.wire.wire import StatusEntry

__all__ = [
    "MAX_CLOCK_SKEW",
    "WebhookError",
    "notify_unattended_stop",
    "post_json",
    "unattended_stop_notice",
    "validate_webhook_url",
]

log = logging.getLogger("tether.relay")

#: a worker's ``StatusEntry.at`` further than this (seconds) from the relay's clock is not a
#: wall-clock time (workers of earlier versions stamped a monotonic clock with a random offset), or
#: the worker's clock is badly off: the notice then carries the time the relay received it
MAX_CLOCK_SKEW = 3600.0


class WebhookError(Exception):
    pass


def validate_webhook_url(url: str) -> str:
    parts = urlsplit(url)
    if parts.scheme not in ("http", "https") or not parts.hostname:
        raise ValueError(f"webhook must be an http:// or https:// URL with a host, not {url!r}")
    if any(c.isspace() for c in url):
        raise ValueError("webhook URL must not contain whitespace")
    return url


async def post_json(url: str, payload: dict[str, Any], *, timeout: float = 10.0) -> int:
    """POST ``payload`` as JSON; returns the HTTP status code."""
    try:
        validate_webhook_url(url)
    except ValueError as exc:
        raise WebhookError(str(exc)) from None
    parts = urlsplit(url)
    host = parts.hostname or ""
    port = parts.port or (443 if parts.scheme == "https" else 80)
    path = (parts.path or "/") + (f"?{parts.query}" if parts.query else "")
    body = json.dumps(payload).encode()
    request = (
        f"POST {path} HTTP/1.1\r\n"
        f"Host: {parts.netloc.rpartition('@')[2]}\r\n"
        "Content-Type: application/json\r\n"
        f"Content-Length: {len(body)}\r\n"
        "User-Agent: tether-relay\r\n"
        "Connection: close\r\n\r\n"
    ).encode() + body
    with trio.move_on_after(timeout) as scope:
        try:
            stream: trio.abc.Stream = await trio.open_tcp_stream(host, port)
            if parts.scheme == "https":
                stream = trio.SSLStream(stream, ssl.create_default_context(), server_hostname=host)
            async with stream:
                await stream.send_all(request)
                head = b""
                while b"\r\n" not in head and len(head) < 8192:
                    chunk = await stream.receive_some(4096)
                    if not chunk:
                        break
                    head += chunk
        except (OSError, trio.BrokenResourceError, ssl.SSLError) as exc:
            raise WebhookError(f"cannot POST to {host}:{port}: {exc}") from exc
    if scope.cancelled_caught:
        raise WebhookError(f"no answer from {host}:{port} within {timeout:g} s")
    status_line = head.split(b"\r\n", 1)[0].decode("latin-1")
    fields = status_line.split()
    if len(fields) < 2 or not fields[0].startswith("HTTP/") or not fields[1].isdigit():
        raise WebhookError(f"not an HTTP answer from {host}:{port}: {status_line[:80]!r}")
    return int(fields[1])


def unattended_stop_notice(
    record: RunRecord, entry: StatusEntry, now: float, page: str = ""
) -> dict[str, Any]:
    """The JSON body posted for the worker's ``unattended_stop`` ``entry``; ``now`` is the relay's
    wall clock when it received the entry (``at`` when the worker's own stamp is not usable);
    ``page``: the run's page in the web view, when the relay knows its address."""
    at = entry.at if abs(entry.at - now) <= MAX_CLOCK_SKEW else now
    return {
        **({"url": page} if page else {}),
        "event": entry.event,
        "run": record.id,
        "name": record.spec.name,
        "command": record.spec.command,
        "detail": entry.detail,
        "data": entry.data,
        "at": at,
    }


async def notify_unattended_stop(
    record: RunRecord, entry: StatusEntry, now: float, page: str = ""
) -> None:
    """POST the notice to the run's webhook; failures are logged (nobody waits for them)."""
    notice = unattended_stop_notice(record, entry, now, page)
    try:
        status = await post_json(record.spec.webhook, notice)
    except WebhookError as exc:
        log.warning("run %s: webhook failed: %s", record.id, exc)
        return
    if not 200 <= status < 300:
        log.warning("run %s: webhook answered HTTP %d", record.id, status)
