"""The two ways tether tells a user about an unattended stop beyond the terminal."""

from __future__ import annotations

import json
import time
from typing import Any

import pytest
import trio
from credentials import user_endpoint

from adapter.show.notify import desktop_notification_command
from protocol_specs.runs.runs import RunRecord
from protocol_specs.runs.spec import RunSpec
from protocol_specs.session.session import StatusEvent
from protocol_specs.wire import wire
from protocol_specs.wire.wire import WorkerLink
from relay.client import open_control, open_run_link
from relay.runs.webhook import (
    MAX_CLOCK_SKEW,
    WebhookError,
    post_json,
    unattended_stop_notice,
    validate_webhook_url,
)
from relay.server import serve_relay, server_port
from relay.store import MemoryStore


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


async def serve_hooks(nursery: trio.Nursery, got: trio.MemorySendChannel[dict[str, Any]]) -> int:
    """A webhook receiver answering 204 to each POST and passing its JSON body on."""

    async def handler(stream: trio.SocketStream) -> None:
        data = b""
        while b"\r\n\r\n" not in data:
            data += await stream.receive_some(4096)
        head, _, body = data.partition(b"\r\n\r\n")
        length = int(
            dict(line.split(": ", 1) for line in head.decode().split("\r\n")[1:])["Content-Length"]
        )
        while len(body) < length:
            body += await stream.receive_some(4096)
        await stream.send_all(b"HTTP/1.1 204 No Content\r\n\r\n")
        await stream.aclose()
        await got.send(json.loads(body))

    listeners = await nursery.start(trio.serve_tcp, handler, 0)
    return int(listeners[0].socket.getsockname()[1])


async def test_the_relay_posts_an_unattended_stop_with_a_wall_clock_time() -> None:
    """Through a real relay (in-memory store, WebSockets on loopback): the worker's stamp is
    posted as it is when it is wall-clock time; a stamp from a monotonic clock (what workers
    used to send) is replaced by the time the relay received the notice."""
    store = MemoryStore()
    hooks_in, hooks = trio.open_memory_channel[dict[str, Any]](10)
    async with trio.open_nursery() as nursery:
        hook_port = await serve_hooks(nursery, hooks_in)
        server = await nursery.start(
            lambda task_status: serve_relay(store, port=0, task_status=task_status)
        )
        url = await user_endpoint(store, f"ws://127.0.0.1:{server_port(server)}")
        spec = RunSpec(
            command=["python", "app.py"], workdir="/w", webhook=f"http://127.0.0.1:{hook_port}/t"
        )
        with trio.fail_after(20):
            async with open_control(url) as control:
                run = (await control.submit(spec)).id
                token = (await control.claim("w-0")).token
            async with open_run_link(url.with_token(token), link=WorkerLink(), run=run) as worker:
                data = {"policy": "continue", "where": "app.py:3 in main"}
                stamped = time.time()
                await worker.publish(
                    wire.StatusEntry(
                        event=StatusEvent.UNATTENDED_STOP, detail="paused", at=stamped, data=data
                    )
                )
                posted = await hooks.receive()
                before = time.time()
                monotonic = trio.current_time()  # seconds since some arbitrary point: not a date
                await worker.publish(
                    wire.StatusEntry(event=StatusEvent.UNATTENDED_STOP, at=monotonic, data=data)
                )
                fixed = await hooks.receive()
                after = time.time()
        nursery.cancel_scope.cancel()
    assert posted["event"] == "unattended_stop" and posted["run"] == run
    assert (posted["detail"], posted["data"], posted["at"]) == ("paused", data, stamped)
    assert before <= fixed["at"] <= after


def test_a_worker_stamp_far_from_the_relay_clock_is_not_posted() -> None:
    record = RunRecord(id="r1", spec=RunSpec(command=["x"], workdir="/w"))
    entry = wire.StatusEntry(event=StatusEvent.UNATTENDED_STOP, at=1_000.0)
    now = 1_800_000_000.0
    assert unattended_stop_notice(record, entry, now)["at"] == now
    close = entry.model_copy(update={"at": now - MAX_CLOCK_SKEW + 1})
    assert unattended_stop_notice(record, close, now)["at"] == now - MAX_CLOCK_SKEW + 1
