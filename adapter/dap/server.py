"""The local DAP server IDEs attach to: a thin trio loop around
:class:`adapter.dap.core.AdapterCore`.

It listens on 127.0.0.1 only (the debug channel executes code; it is never exposed to a network),
holds the run's relay link in the ``ide`` role, and performs what the core decides. Decisions and their
I/O happen under one lock, so what reaches the IDE is in ``seq`` order and publishes keep the order the
IDE sent them in.

Nothing under the lock waits for an IDE: what the core sends to an IDE goes into that connection's
:class:`adapter.dap.outbox.Outbox`, and the connection's own writer task writes it. An IDE that
stops reading therefore stalls neither the relay link (deliveries keep being consumed) nor another
IDE taking over; its outbox merges and, past a bound, drops program output (saying so), and a
connection that stops reading altogether is closed.

Several IDE connections are served at once: one session per debugged process of the run (the
main one, and each child the IDE attached to; :class:`adapter.dap.processes.Processes` decides which
connection is which session's). A connection is named by its ``generation``.

The relay link reconnects by itself (``relay.client.RunLink``); while it is down, publishes wait in
its outbox and the IDE is told in its debug console. The adapter ends when the run ends, or when the
link gives up for good.
"""

from __future__ import annotations

import logging
import socket
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, Protocol

import trio

from protocol_specs.dap import framing as dap_framing
from protocol_specs.dap import models as dap
from protocol_specs.link.link import Cursor
from protocol_specs.session.processes import MAIN, ProcessMode
from protocol_specs.session.session import StatusEvent
from protocol_specs.wire import wire
from protocol_specs.wire.wire import DapEntry, IdeLink, StreamName, WireError
from relay.client import LinkPolicy, RelayError, Target, open_control, open_run_link

from . import peer
from .actions import Say
from .core import (
    Action,
    AdapterCore,
    CancelRun,
    CloseIde,
    IdePhase,
    Publish,
    ToIde,
    is_unattended_announcement,
)
from .link_news import LinkNews, Refused
from .outbox import HARD_LIMIT, Outbox
from .processes import LOCALHOST, Processes

__all__ = ["AdapterLink", "AdapterServer", "serve_adapter"]

log = logging.getLogger("tether.adapter")

#: a new connection has this long, and this many bytes, to send its ``initialize`` request
GREETING_TIMEOUT = 30.0
GREETING_MAX_BYTES = 1024 * 1024
#: how long the IDE's Stop waits for the relay to cancel the run before answering it
CANCEL_WAIT = 10.0
#: how long a connection that is closing (``disconnect``, or the IDE closed its side) may take to
#: be written what is queued for it
CLOSE_GRACE = 5.0


class AdapterLink(Protocol):
    """What the server uses of its relay link (:class:`relay.client.RunLink`; tests use a fake)."""

    @property
    def deliveries(self) -> trio.abc.ReceiveChannel[wire.Deliver]: ...

    @property
    def tails(self) -> dict[str, str]: ...

    @property
    def answered(self) -> int: ...

    @property
    def failed(self) -> Exception | None: ...

    async def publish(self, entry: wire.AnyEntry) -> int: ...

    async def flush(self) -> None: ...


@dataclass
class _Ide:
    """One IDE connection: its stream, what is queued for it, and the scope it lives in."""

    stream: trio.abc.Stream
    outbox: Outbox
    generation: int = 0
    scope: trio.CancelScope = field(default_factory=trio.CancelScope)
    wake: trio.Event = field(default_factory=trio.Event)  #: the outbox has something new
    closing: bool = False  #: nothing more it sends is handled
    gone: trio.Event = field(default_factory=trio.Event)


class AdapterServer:
    def __init__(
        self,
        relay_url: Target,
        link: AdapterLink,
        core: AdapterCore,
        *,
        news: LinkNews | None = None,
        on_event: Callable[[str], None] | None = None,
        on_unattended: Callable[[str], None] | None = None,
        processes: ProcessMode | str = ProcessMode.STOPPED,
        port: int = 0,
        focus: list[int] | None = None,
    ) -> None:
        """``link`` is the run's relay link, whose callbacks go to ``news`` (a new one if None:
        a link that tells nothing); ``port`` the one child sessions are offered to connect to;
        ``focus`` the ranks the IDE is offered (``tether attach --ranks``)."""
        self.relay_url = relay_url
        self.link = link
        self.core = core
        self.news = news or LinkNews(on_event)
        #: every session of the run's processes: ``core`` (the main one) and the children's
        self.processes = Processes(core, mode=processes, port=port, focus=focus)
        self.on_event = on_event or (lambda _text: None)
        self.on_unattended = on_unattended or self.on_event
        self._lock = trio.Lock()
        self._conns: dict[int, _Ide] = {}  #: every IDE connection, by generation
        self.finished = trio.Event()
        self._wake_timer = trio.Event()
        self._timer_at: float | None = None  #: the deadline the timer sleeps until

    @property
    def _ide(self) -> _Ide | None:
        """The main session's IDE connection, if one is attached."""
        if self.core.phase is IdePhase.NONE:
            return None
        return self._conns.get(self.core.generation)

    async def _link_news_loop(self) -> None:
        """The link's news (:mod:`adapter.dap.link_news`), in order with everything else."""
        async for news in self.news.received:
            async with self._lock:
                if isinstance(news, Refused):
                    refused = self.processes.publish_refused(
                        news.process, news.origin_seq, news.message
                    )
                    await self._perform(refused)
                else:
                    up, detail = news
                    await self._perform(self.processes.relay_link_changed(up, detail))

    async def catch_up(self) -> None:
        """Fold the run's history (``to_worker`` then ``to_ide``) before serving any IDE."""
        tails = self.link.tails
        streams = (StreamName.TO_WORKER, StreamName.TO_IDE)
        need = {name: Cursor.parse(tails.get(name.value, "0")) for name in streams}
        seen = {name: (0, 0) for name in streams}
        while any(seen[n] < need[n] for n in streams):
            delivery = await self.link.deliveries.receive()
            if delivery.cursor:  # an early one (no cursor yet) comes only after the history
                seen[delivery.stream] = Cursor.parse(delivery.cursor)
            self._fold(delivery, replaying=True)
        if self.core.session.finished:
            self.finished.set()

    def _fold(self, delivery: wire.Deliver, *, replaying: bool) -> list[Action]:
        try:
            entry = wire.decode_entry(delivery.entry)
        except WireError as exc:
            log.warning("skipping a malformed entry %s: %s", delivery.cursor, exc.message)
            return []
        return self.processes.on_delivery(delivery.stream, entry, replaying=replaying)

    async def run(self, listeners: list[trio.SocketListener]) -> None:
        async with trio.open_nursery() as nursery:
            nursery.start_soon(self._deliveries)
            nursery.start_soon(self._timer)
            nursery.start_soon(self._link_news_loop)
            if listeners:
                nursery.start_soon(trio.serve_listeners, self._handle_ide, listeners)
            await self.finished.wait()
            # give the IDEs a moment to see ``terminated`` and disconnect on their own
            with trio.move_on_after(5):
                for ide in list(self._conns.values()):
                    await ide.gone.wait()
            nursery.cancel_scope.cancel()

    async def _deliveries(self) -> None:
        async for delivery in self.link.deliveries:
            async with self._lock:
                before = self.core.status_text()
                notice = self.core.session.notice
                await self._perform(self._fold(delivery, replaying=False))
                if self.core.status_text() != before:  # ``started``, ``waiting_for_ide``: once
                    self.on_event(self.core.status_text())
                news = self.core.session.notice
                if news is not notice and news is not None:
                    if news.event != StatusEvent.UNATTENDED_STOP:
                        self.on_event(news.detail)
                    elif not self.core.shared.attached():  # no IDE on any session
                        self.on_unattended(news.detail)
                    elif is_unattended_announcement(news):  # stale: a link blip hid the IDE
                        self.on_event(
                            "the worker briefly saw no IDE attached; an IDE is attached here "
                            f"(its report: {news.detail})"
                        )
                    else:
                        self.on_event(news.detail)
                if self.core.session.finished:
                    self.finished.set()
            self._deadline_moved()
        self.on_event(f"gave up on the relay: {self.link.failed}")
        self.finished.set()

    def _deadline_moved(self) -> None:
        """Wake the timer if the cores now have a deadline before the one it sleeps until."""
        deadline = self.processes.next_deadline
        if deadline is not None and (self._timer_at is None or deadline < self._timer_at):
            self._wake_timer.set()

    async def _timer(self) -> None:
        while True:
            deadline = self._timer_at = self.processes.next_deadline
            self._wake_timer = trio.Event()
            if deadline is None:
                await self._wake_timer.wait()
                continue
            with trio.move_on_at(deadline):
                await self._wake_timer.wait()
            if trio.current_time() >= deadline:
                async with self._lock:
                    await self._perform(self.processes.on_tick())

    async def _handle_ide(self, stream: trio.SocketStream) -> None:
        why = await trio.to_thread.run_sync(
            peer.refusal, stream.socket.getsockname(), stream.socket.getpeername()
        )
        if why is not None:
            self._refuse(why)
            with trio.CancelScope(shield=True):
                await stream.aclose()
            return
        await self.serve_connection(stream)

    async def serve_connection(self, stream: trio.abc.Stream) -> None:
        """Serve one IDE connection on ``stream`` (any byte stream; closed when this returns).

        A connection that starts with ``initialize`` is served; its ``attach`` says which session
        it is for (:mod:`adapter.dap.processes`), taking that session over from the IDE attached to
        it now. It lives in its own cancel scope: a reader (this task) and a writer draining its
        outbox.
        """
        framer = dap_framing.DapFramer()
        try:
            first = await self._greeting(stream, framer)
        except (trio.BrokenResourceError, trio.ClosedResourceError):
            first = None
        if first is None:
            with trio.CancelScope(shield=True):
                await stream.aclose()
            return
        ide = _Ide(stream, Outbox(self.core.run_id))
        try:
            with ide.scope:
                async with trio.open_nursery() as nursery:
                    async with self._lock:
                        ide.generation = self.processes.connected()
                        self._conns[ide.generation] = ide
                    self.on_event("an IDE connected")
                    nursery.start_soon(self._writer, ide)
                    await self._reader(ide, framer, first)
        finally:
            with trio.CancelScope(shield=True):
                async with self._lock:
                    await self._perform(self.processes.ide_disconnected(ide.generation))
                    if self._conns.get(ide.generation) is ide:
                        del self._conns[ide.generation]
                await stream.aclose()
            ide.gone.set()
            self.on_event("the IDE disconnected")

    async def _reader(
        self, ide: _Ide, framer: dap_framing.DapFramer, first: dict[str, Any]
    ) -> None:
        """Handle what the IDE sends until it closes its side; then detach, and let the writer
        finish (for :data:`CLOSE_GRACE` at most)."""
        try:
            await self._handle(ide, first)
            while await self._ide_messages(ide, framer):
                data = await ide.stream.receive_some(65536)
                if not data:
                    break
                _quickack(ide.stream)
                framer.receive_data(data)
        except (trio.BrokenResourceError, trio.ClosedResourceError):
            pass
        async with self._lock:
            await self._perform(self.processes.ide_disconnected(ide.generation))
        self._close(ide, flush=True)
        await trio.sleep_forever()  # the writer cancels the connection's scope when done

    async def _writer(self, ide: _Ide) -> None:
        """The only task writing to the IDE: drains its outbox, closes the connection when the
        outbox is done (closed and empty, or stuck) or the IDE is gone."""
        try:
            while True:
                ide.wake = trio.Event()  # a push from here on wakes the wait below
                data = ide.outbox.take()
                if data is None:
                    if ide.outbox.done:
                        break
                    await ide.wake.wait()
                    continue
                await ide.stream.send_all(data)
        except (trio.BrokenResourceError, trio.ClosedResourceError):
            pass
        ide.scope.cancel()

    def _close(self, ide: _Ide, *, flush: bool) -> None:
        """Close an IDE connection now, or once what is queued is written (``flush``; within
        :data:`CLOSE_GRACE`). Nothing it sends from now on is handled. Never waits."""
        ide.closing = True
        if not flush:
            ide.scope.cancel()
            return
        ide.outbox.close()
        ide.wake.set()
        ide.scope.deadline = min(ide.scope.deadline, trio.current_time() + CLOSE_GRACE)

    async def _handle(self, ide: _Ide, msg: dict[str, Any]) -> None:
        async with self._lock:
            if self._conns.get(ide.generation) is ide and not ide.closing:
                await self._perform(self.processes.on_ide_message(ide.generation, msg))
                self._deadline_moved()

    async def _ide_messages(self, ide: _Ide, framer: dap_framing.DapFramer) -> bool:
        """Handle what the IDE sent so far; False if the connection must close."""
        while True:
            if ide.closing or self._conns.get(ide.generation) is not ide:
                return False
            try:
                msg = framer.next_message()
            except dap_framing.DapFramingError as exc:
                log.warning("bad DAP input from the IDE: %s", exc)
                if exc.fatal:
                    self.on_event(f"closed the IDE connection: {exc}")
                    return False
                async with self._lock:
                    if self._conns.get(ide.generation) is ide and not ide.closing:
                        garbage = self.processes.on_ide_garbage(ide.generation, str(exc))
                        await self._perform(garbage)
                continue
            if msg is None:
                return True
            await self._handle(ide, msg)

    async def _greeting(
        self, stream: trio.abc.Stream, framer: dap_framing.DapFramer
    ) -> dict[str, Any] | None:
        """A new connection's first message, if it is an ``initialize`` request (what every DAP
        client sends first). Only then is the connection served (and its ``attach`` may take a
        session over: an IDE restarting); a port scanner, a stray or broken client, or anything
        sending something else first is closed without touching any session."""
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
                    # seq 1, as the schema asks (not 0): the lobby numbers this connection's
                    # messages from 1 again once it is served; no client checks an event's seq
                    note = dap.event("output", {"category": "important", "output": text}, seq=1)
                    with trio.move_on_after(1):
                        await stream.send_all(dap_framing.encode_message(note))
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

    async def _refuse_first(self, stream: trio.abc.Stream, msg: dict[str, Any]) -> None:
        what = msg.get("command") or msg.get("event") or msg.get("type")
        self._refuse(f"its first message was {str(what)[:50]!r}, not an initialize request")
        if msg.get("type") == "request" and isinstance(msg.get("seq"), int):
            request = {"seq": msg["seq"], "command": str(msg.get("command", ""))[:100]}
            text = "a DAP session starts with an 'initialize' request"
            answer = dap.error_response(request, text, seq=1)
            with trio.move_on_after(1):
                await stream.send_all(dap_framing.encode_message(answer))

    async def _perform(self, actions: list[Action]) -> None:
        for action in actions:
            if isinstance(action, ToIde):
                ide = self._conns.get(action.generation)
                if ide is not None:
                    ide.outbox.push(action.message)
                    ide.wake.set()
                    if ide.outbox.stuck and not ide.closing:
                        self.on_event(
                            "closed the IDE connection: it stopped reading (over "
                            f"{HARD_LIMIT // 2**20} MiB of responses and events were waiting)"
                        )
                        self._close(ide, flush=False)
            elif isinstance(action, Publish):
                n = await self.link.publish(action.entry)
                entry = action.entry
                process = entry.process if isinstance(entry, DapEntry) else MAIN
                self.news.published(n, process, action.origin_seq, self.link.answered)
                if isinstance(entry, DapEntry) and entry.local and not entry.transient:
                    # what the adapter answers itself must be stored before it answers: the user
                    # may close the laptop right after setting a breakpoint (a transient one, a
                    # watch answered from a stop's prefetch, is only a note for the worker)
                    await self.link.flush()
            elif isinstance(action, Say):
                self.on_event(action.text)
            elif isinstance(action, CancelRun):
                # before anything that follows it (the IDE's answer, its departure): a Ctrl-C
                # right after the IDE's Stop must not lose the cancel, and the worker must not
                # hear "no IDE attached" before it hears "cancelled"
                with trio.CancelScope(shield=True), trio.move_on_after(CANCEL_WAIT):
                    await self._cancel(action.detail)
            elif isinstance(action, CloseIde):
                ide = self._conns.get(action.generation)
                if ide is not None:
                    self._close(ide, flush=action.flush)

    async def _cancel(self, detail: str) -> None:
        try:
            async with open_control(self.relay_url, client="tether-adapter") as control:
                await control.cancel(self.core.run_id, detail)
        except RelayError as exc:
            self.on_event(
                f"could not cancel the run ({exc.message}); `tether cancel {self.core.run_id}` "
                "does it"
            )
            return
        self.on_event(f"cancelled the run ({detail})")


async def serve_adapter(
    relay_url: Target,
    run_id: str,
    *,
    port: int = 5678,
    request_timeout: float = 30.0,
    policy: LinkPolicy | None = None,
    on_event: Callable[[str], None] | None = None,
    on_unattended: Callable[[str], None] | None = None,
    focus: list[int] | None = None,
    task_status: trio.TaskStatus[int] = trio.TASK_STATUS_IGNORED,
) -> AdapterCore:
    """Serve the run's DAP adapter on 127.0.0.1:``port`` until the run ends.

    ``task_status.started`` receives the bound port once the run's history is folded and the
    listener accepts connections. Returns the core (its ``session`` holds the run's end state).
    """
    core = AdapterCore(run_id, request_timeout=request_timeout, clock=trio.current_time)
    news = LinkNews(on_event)  # the link tells it, the server reads it: neither needs the other
    async with open_run_link(
        relay_url,
        link=IdeLink(history=True, early=True),
        run=run_id,
        producer=core.origin,
        client="tether-adapter",
        policy=policy or LinkPolicy.from_env(),
        on_refused=news.refused,
        on_state=news.state,
    ) as link:
        # bound first: its port is what child sessions are offered to connect to; an IDE that
        # connects meanwhile waits until the history is folded
        listeners = await trio.open_tcp_listeners(port, host=LOCALHOST)
        try:
            bound = listeners[0].socket.getsockname()[1]
            server = AdapterServer(
                relay_url,
                link,
                core,
                news=news,
                on_event=on_event,
                on_unattended=on_unattended,
                # which child processes the IDE is offered: the run's choice (``--processes``)
                processes=link.run.spec.processes,
                port=bound,
                focus=focus,
            )
            await server.catch_up()
            task_status.started(bound)
            await server.run(listeners)
        finally:
            with trio.CancelScope(shield=True):
                for listener in listeners:
                    await listener.aclose()
        return core


def _quickack(stream: trio.abc.Stream) -> None:
    """Acknowledge what the IDE sent at once (Linux's ``TCP_QUICKACK``, which lapses: set after
    every read). VS Code's socket leaves Nagle's algorithm on, so a request it writes while an
    earlier one is unacknowledged waits for our ACK, which Linux may delay by up to 200 ms:
    measured, VS Code's parallel requests after a stop (watches, variables) stalled that long."""
    setsockopt = getattr(stream, "setsockopt", None)
    if setsockopt is not None and hasattr(socket, "TCP_QUICKACK"):
        try:
            setsockopt(socket.IPPROTO_TCP, socket.TCP_QUICKACK, 1)
        except OSError:
            pass
