"""The two ways tether tells a user about an unattended stop beyond the terminal."""

from __future__ import annotations

import json
from typing import Any

import pytest
import trio

from adapter.notify import desktop_notification_command
from relay.webhook import WebhookError, post_json, validate_webhook_url


def test_desktop_command_per_platform() -> None:
    found = {"notify-send": "/usr/bin/notify-send", "osascript": "/usr/bin/osascript"}
    assert desktop_notification_command("t", "b", platform="linux", which=found.get) == [
        "/usr/bin/notify-send",
        "--app-name=tether",
        "t",
        "b",
    ]
    assert desktop_notification_command("t", "b", platform="linux", which=lambda _: None) is None
    mac = desktop_notification_command('a "q"', "back\\slash", platform="darwin", which=found.get)
    assert mac == [
        "/usr/bin/osascript",
        "-e",
        'display notification "back\\\\slash" with title "a \\"q\\""',
    ]
    assert desktop_notification_command("t", "b", platform="win32", which=found.get) is None


async def serve_once(status: int, got: dict[str, Any], nursery: trio.Nursery) -> int:
    async def handler(stream: trio.SocketStream) -> None:
        data = b""
        while b"\r\n\r\n" not in data:
            data += await stream.receive_some(4096)
        head, _, body = data.partition(b"\r\n\r\n")
        lines = head.decode().split("\r\n")
        headers = dict(line.split(": ", 1) for line in lines[1:])
        while len(body) < int(headers["Content-Length"]):
            body += await stream.receive_some(4096)
        got.update(request=lines[0], headers=headers, body=json.loads(body))
        await stream.send_all(f"HTTP/1.1 {status} X\r\nContent-Length: 0\r\n\r\n".encode())
        await stream.aclose()

    listeners = await nursery.start(trio.serve_tcp, handler, 0)
    return int(listeners[0].socket.getsockname()[1])


async def test_post_json_sends_the_notice_and_returns_the_status() -> None:
    got: dict[str, Any] = {}
    async with trio.open_nursery() as nursery:
        port = await serve_once(500, got, nursery)
        with trio.fail_after(10):
            status = await post_json(f"http://127.0.0.1:{port}/hook?x=1", {"run": "r1"})
        nursery.cancel_scope.cancel()
    assert status == 500  # returned, not raised: the relay logs it
    assert got["request"] == "POST /hook?x=1 HTTP/1.1"
    assert got["headers"]["Content-Type"] == "application/json"
    assert got["body"] == {"run": "r1"}


async def test_post_json_reports_what_went_wrong() -> None:
    listeners = await trio.open_tcp_listeners(0, host="127.0.0.1")
    port = listeners[0].socket.getsockname()[1]
    await listeners[0].aclose()  # nothing listens there now
    with pytest.raises(WebhookError, match="cannot POST"):
        await post_json(f"http://127.0.0.1:{port}/", {})
    with pytest.raises(WebhookError, match="http"):
        await post_json("ftp://example.com/", {})


def test_webhook_urls_are_validated() -> None:
    assert validate_webhook_url("https://hooks.example.com/x") == "https://hooks.example.com/x"
    for bad in ("hooks.example.com", "ftp://x/", "http:///path", "http://x/a b"):
        with pytest.raises(ValueError, match="webhook"):
            validate_webhook_url(bad)
