"""The local DAP server IDEs attach to: a thin trio loop around :class:`adapter.core.AdapterCore`.

It listens on 127.0.0.1 only (the debug channel executes code; it is never exposed to a network),
holds the run's relay link in the ``ide`` role, and performs what the core decides. Decisions and their
I/O happen under one lock, so what reaches the IDE is in ``seq`` order and publishes keep the order the
IDE sent them in.

The relay link reconnects by itself (``relay.client.RunLink``); while it is down, publishes wait in
its outbox and the IDE is told in its debug console. The adapter ends when the run ends, or when the
link gives up for good.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import trio

from protocol_specs import dap_framing, wire
from protocol_specs.wire import DapEntry, PresenceEntry, Role, StreamName, WireError
from relay.client import LinkPolicy, RunLink, Target, open_control, open_run_link

from . import peer
from .core import Action, AdapterCore, CancelRun, CloseIde, Publish, ToIde

__all__ = ["AdapterServer", "serve_adapter"]

log = logging.getLogger("tether.adapter")

LOCALHOST = "127.0.0.1"
#: a new connection has this long, and this many bytes, to send its ``initialize`` request
GREETING_TIMEOUT = 30.0
GREETING_MAX_BYTES = 1024 * 1024


def _id_tuple(cursor: str) -> tuple[int, int]:
    ms, _, seq = cursor.partition("-")
    return int(ms or 0), int(seq or 0)


@dataclass
class _Ide:
    stream: trio.SocketStream
    generation: int
    gone: trio.Event = field(default_factory=trio.Event)


class AdapterServer:
    def __init__(
        self,
        relay_url: Target,
        link: RunLink,
        core: AdapterCore,
        *,
        on_event: Callable[[str], None] | None = None,
        on_unattended: Callable[[str], None] | None = None,
    ) -> None:
        self.relay_url = relay_url
        self.on_unattended = on_unattended or (lambda _text: None)
        self.link = link
        self.core = core
        self.on_event = on_event or (lambda _text: None)
        if on_unattended is None:
            self.on_unattended = self.on_event
        self._lock = trio.Lock()
        self._ide: _Ide | None = None
        self._nursery: trio.Nursery | None = None
        self.finished = trio.Event()
        self._wake_timer = trio.Event()
        self._published: dict[int, DapEntry | PresenceEntry] = {}
        self._link_news_in, self._link_news = trio.open_memory_channel[
            tuple[int, wire.Error] | tuple[bool, str]
        ](1000)

    def link_refused(self, n: int, error: wire.Error) -> None:
        """``RunLink.on_refused``: handled in order with everything else, under the lock."""
        self._link_news_in.send_nowait((n, error))

    def link_state(self, up: bool, detail: str) -> None:
        """``RunLink.on_state``."""
        self.on_event(f"relay link {'up' if up else 'down'}: {detail}")
        self._link_news_in.send_nowait((up, detail))

    async def _link_news_loop(self) -> None:
        async for news in self._link_news:
            async with self._lock:
                if isinstance(news[1], wire.Error):
                    n, error = news
                    entry = self._published.pop(int(n), None)
                    if entry is not None:
                        await self._perform(self.core.publish_refused(entry, error.message))
                else:
                    up, detail = news
                    await self._perform(self.core.relay_link_changed(bool(up), str(detail)))

    async def catch_up(self) -> None:
        """Fold the run's history (``to_worker`` then ``to_ide``) before serving any IDE."""
        tails = self.link.tails
        streams = (StreamName.TO_WORKER, StreamName.TO_IDE)
        need = {name: _id_tuple(tails.get(name.value, "0")) for name in streams}
        seen = {name: (0, 0) for name in streams}
        while any(seen[n] < need[n] for n in streams):
            delivery = await self.link.deliveries.receive()
            seen[delivery.stream] = _id_tuple(delivery.cursor)
            self._fold(delivery, replaying=True)
        if self.core.session.finished:
            self.finished.set()

    def _fold(self, delivery: wire.Deliver, *, replaying: bool) -> list[Action]:
        try:
            entry = wire.decode_entry(delivery.entry)
        except WireError as exc:
            log.warning("skipping a malformed entry %s: %s", delivery.cursor, exc.message)
            return []
        return self.core.on_delivery(delivery.stream, entry, replaying=replaying)

    async def run(self, listeners: list[trio.SocketListener]) -> None:
        async with trio.open_nursery() as nursery:
            self._nursery = nursery
            nursery.start_soon(self._deliveries)
            nursery.start_soon(self._timer)
            nursery.start_soon(self._link_news_loop)
            nursery.start_soon(trio.serve_listeners, self._handle_ide, listeners)
            await self.finished.wait()
            ide = self._ide
            if ide is not None:
                # give the IDE a moment to see ``terminated`` and disconnect on its own
                with trio.move_on_after(5):
                    await ide.gone.wait()
            nursery.cancel_scope.cancel()

    async def _deliveries(self) -> None:
        async for delivery in self.link.deliveries:
            async with self._lock:
                before = self.core.session.status
                notice = self.core.session.notice
                await self._perform(self._fold(delivery, replaying=False))
                if self.core.session.status != before:
                    self.on_event(self.core.status_text())
                news = self.core.session.notice
                if news is not notice and news is not None:
                    if news.event == "unattended_stop" and self._ide is None:
                        self.on_unattended(news.detail)
                    else:
                        self.on_event(news.detail)
                if self.core.session.finished:
                    self.finished.set()
            self._wake_timer.set()
        self.on_event(f"gave up on the relay: {self.link.failed}")
        self.finished.set()

    async def _timer(self) -> None:
        while True:
            deadline = self.core.next_deadline
            self._wake_timer = trio.Event()
            if deadline is None:
                await self._wake_timer.wait()
                continue
            with trio.move_on_at(deadline):
                await self._wake_timer.wait()
            if trio.current_time() >= deadline:
                async with self._lock:
                    await self._perform(self.core.on_tick())

    async def _handle_ide(self, stream: trio.SocketStream) -> None:
        why = await trio.to_thread.run_sync(
            peer.refusal, stream.socket.getsockname(), stream.socket.getpeername()
        )
        if why is not None:
            self._refuse(why)
            with trio.CancelScope(shield=True):
                await stream.aclose()
            return
        framer = dap_framing.DapFramer()
        try:
            first = await self._greeting(stream, framer)
        except (trio.BrokenResourceError, trio.ClosedResourceError):
            first = None
        if first is None:
            with trio.CancelScope(shield=True):
                await stream.aclose()
            return
        async with self._lock:
            actions = self.core.ide_connected()
            ide = _Ide(stream, self.core.generation)
            await self._perform(actions)
            self._ide = ide
        self.on_event("an IDE connected")
        try:
            async with self._lock:
                await self._perform(self.core.on_ide_message(first))
                self._wake_timer.set()
            while await self._ide_messages(framer):
                data = await stream.receive_some(65536)
                if not data:
                    break
                framer.receive_data(data)
        except (trio.BrokenResourceError, trio.ClosedResourceError):
            pass
        finally:
            with trio.CancelScope(shield=True):
                async with self._lock:
                    await self._perform(self.core.ide_disconnected(ide.generation))
                    if self._ide is ide:
                        self._ide = None
                await stream.aclose()
            ide.gone.set()
            self.on_event("the IDE disconnected")

    async def _ide_messages(self, framer: dap_framing.DapFramer) -> bool:
        """Handle what the IDE sent so far; False if the connection must close."""
        while True:
            try:
                msg = framer.next_message()
            except dap_framing.DapFramingError as exc:
                log.warning("bad DAP input from the IDE: %s", exc)
                if exc.fatal:
                    self.on_event(f"closed the IDE connection: {exc}")
                    return False
                async with self._lock:
                    await self._perform(self.core.on_ide_garbage(str(exc)))
                continue
            if msg is None:
                return True
            async with self._lock:
                await self._perform(self.core.on_ide_message(msg))
                self._wake_timer.set()

    async def _greeting(
        self, stream: trio.SocketStream, framer: dap_framing.DapFramer
    ) -> dict[str, Any] | None:
        """A new connection's first message, if it is an ``initialize`` request (what every DAP
        client sends first). Only then does the connection take over from the IDE attached now
        (an IDE restarting); a port scanner, a stray or broken client, or anything sending
        something else first is closed without touching the session."""
        received = 0
        with trio.move_on_after(GREETING_TIMEOUT):
            while True:
                try:
                    msg = framer.next_message()
                except dap_framing.DapFramingError as exc:
                    if exc.fatal:
                        self._refuse(f"not DAP: {exc}")
                        return None
                    # a malformed message in a well-framed stream: said, skipped, as later on
                    log.warning("bad DAP input from a new connection: %s", exc)
                    text = f"tether: ignored a malformed DAP message from the IDE: {exc}\n"
                    note = {"category": "important", "output": text}
                    event = {"seq": 0, "type": "event", "event": "output", "body": note}
                    with trio.move_on_after(1):
                        await stream.send_all(dap_framing.encode_message(event))
                    continue
                if msg is not None:
                    if msg.get("type") == "request" and msg.get("command") == "initialize":
                        return msg
                    await self._refuse_first(stream, msg)
                    return None
                data = await stream.receive_some(65536)
                if not data:
                    return None
                received += len(data)
                if received > GREETING_MAX_BYTES:
                    self._refuse(f"over {GREETING_MAX_BYTES} bytes before an initialize request")
                    return None
                framer.receive_data(data)
        self._refuse(f"no initialize request within {GREETING_TIMEOUT:g} s")
        return None

    def _refuse(self, why: str) -> None:
        log.warning("refused a connection: %s", why)
        self.on_event(f"refused a connection: {why}")

    async def _refuse_first(self, stream: trio.SocketStream, msg: dict[str, Any]) -> None:
        what = msg.get("command") or msg.get("event") or msg.get("type")
        self._refuse(f"its first message was {str(what)[:50]!r}, not an initialize request")
        if msg.get("type") == "request" and isinstance(msg.get("seq"), int):
            answer = {
                "seq": 1,
                "type": "response",
                "request_seq": msg["seq"],
                "success": False,
                "command": str(msg.get("command", ""))[:100],
                "message": "a DAP session starts with an 'initialize' request",
            }
            with trio.move_on_after(1):
                await stream.send_all(dap_framing.encode_message(answer))

    async def _perform(self, actions: list[Action]) -> None:
        for action in actions:
            if isinstance(action, ToIde):
                ide = self._ide
                if ide is not None and ide.generation == action.generation:
                    try:
                        await ide.stream.send_all(dap_framing.encode_message(action.message))
                    except (trio.BrokenResourceError, trio.ClosedResourceError):
                        pass
            elif isinstance(action, Publish):
                n = await self.link.publish(action.entry)
                self._published[n] = action.entry
                if len(self._published) > 10_000:  # answered long ago: forget the oldest
                    del self._published[next(iter(self._published))]
                if isinstance(action.entry, DapEntry) and action.entry.local:
                    # what the adapter answers itself must be stored before it answers: the user
                    # may close the laptop right after setting a breakpoint
                    await self.link.flush()
            elif isinstance(action, CancelRun):
                assert self._nursery is not None
                self._nursery.start_soon(self._cancel, action.detail)
            elif isinstance(action, CloseIde):
                ide = self._ide
                if ide is not None and ide.generation == action.generation:
                    await ide.stream.aclose()

    async def _cancel(self, detail: str) -> None:
        async with open_control(self.relay_url, client="tether-adapter") as control:
            await control.cancel(self.core.run_id, detail)
        self.on_event(f"asked the relay to cancel the run ({detail})")


async def serve_adapter(
    relay_url: Target,
    run_id: str,
    *,
    port: int = 5678,
    request_timeout: float = 30.0,
    policy: LinkPolicy | None = None,
    on_event: Callable[[str], None] | None = None,
    on_unattended: Callable[[str], None] | None = None,
    task_status: trio.TaskStatus[int] = trio.TASK_STATUS_IGNORED,
) -> AdapterCore:
    """Serve the run's DAP adapter on 127.0.0.1:``port`` until the run ends.

    ``task_status.started`` receives the bound port once the run's history is folded and the
    listener accepts connections. Returns the core (its ``session`` holds the run's end state).
    """
    core = AdapterCore(run_id, request_timeout=request_timeout, clock=trio.current_time)
    server: AdapterServer | None = None

    def refused(n: int, error: wire.Error) -> None:
        if server is not None:
            server.link_refused(n, error)

    def state(up: bool, detail: str) -> None:
        if server is not None:
            server.link_state(up, detail)

    async with open_run_link(
        relay_url,
        role=Role.IDE,
        run=run_id,
        history=True,
        producer=core.origin,
        client="tether-adapter",
        policy=policy or LinkPolicy.from_env(),
        on_refused=refused,
        on_state=state,
    ) as link:
        server = AdapterServer(
            relay_url, link, core, on_event=on_event, on_unattended=on_unattended
        )
        await server.catch_up()
        listeners = await trio.open_tcp_listeners(port, host=LOCALHOST)
        bound = listeners[0].socket.getsockname()[1]
        task_status.started(bound)
        await server.run(listeners)
        return core
