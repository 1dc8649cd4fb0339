"""The web view's live WebSocket: what changed, pushed to an open page as it happens.

A page opens ``/ui/live`` (accepted by :meth:`relay.web.server.Web.process_request`, which checked
the session and the origin) naming what it shows and the cursors it was rendered at. This module
then follows, through the relay's :class:`~relay.links.fanout.Fanout` (one Redis subscription per
relay process, notices carrying the entry: no reads per viewer while it keeps up):

- ``tether:changes``, every run record as written: a list page gets the row of each run it may
  see (``{"t": "row", "id", "match", "html"}``: ``match`` false means the run left its filter), a
  run's page the new summary of its run (``{"t": "summary", "html"}``);
- on a run's page, the run's logs stream: ``{"t": "log", "text"}``.

The page sends nothing that matters (whatever it sends is read and dropped). The session is looked
at again every ``recheck`` s: once it is over (logged out, its token revoked) the socket closes.
Messages are built by the same functions that rendered the page.
"""

from __future__ import annotations

import logging

import orjson
import trio
from pydantic import ValidationError
from websockets.exceptions import ConnectionClosed
from websockets.trio.server import ServerConnection

from protocol_specs.runs.runs import RunRecord
from protocol_specs.wire.wire import StreamName

from ..links.fanout import Fanout
from ..store import StoreError, keys
from .debug_view import stopped_key
from .log_text import LogText
from .pages import debug_section, run_row, run_summary
from .server import LiveView, Web

__all__ = ["serve_live"]

log = logging.getLogger("tether.relay.web")


async def serve_live(web: Web, fanout: Fanout, ws: ServerConnection, *, recheck: float) -> None:
    view = web.live.pop(ws, None)
    if view is None:
        await ws.aclose(1008, "not accepted")
        return
    web.viewers[view.who.user] += 1
    try:
        async with trio.open_nursery() as nursery:
            nursery.start_soon(_drain, ws, nursery.cancel_scope)
            nursery.start_soon(_recheck, web, ws, view, recheck, nursery.cancel_scope)
            nursery.start_soon(_changes, web, fanout, ws, view)
            if view.run is not None:
                nursery.start_soon(_logs, fanout, ws, view)
    except* ConnectionClosed:
        pass
    except* StoreError as group:
        # the page reloads in a while (and sees what the relay can say then)
        log.warning("closing a live page of %s: %s", view.who, group.exceptions[0])
        with trio.move_on_after(1):
            await ws.aclose(1011, "the relay lost its store")
    finally:
        web.viewers[view.who.user] -= 1
        if not web.viewers[view.who.user]:
            del web.viewers[view.who.user]
    await ws.aclose()


async def _drain(ws: ServerConnection, done: trio.CancelScope) -> None:
    try:
        while True:
            await ws.recv()
    except ConnectionClosed:
        done.cancel()


async def _recheck(
    web: Web, ws: ServerConnection, view: LiveView, every: float, done: trio.CancelScope
) -> None:
    while True:
        await trio.sleep(every)
        if await web.sessions.get(view.session) is None:
            log.info("closing a live page of %s: its session is over", view.who)
            await ws.aclose(1008, "the session is over")
            done.cancel()
            return


async def _changes(web: Web, fanout: Fanout, ws: ServerConnection, view: LiveView) -> None:
    who, clock = view.who, web.clock
    #: what the debugger section was drawn for: drawn again when the run pauses or goes on
    drawn = stopped_key(view.run) if view.run is not None else None
    async with fanout.subscribe(keys.CHANGES, view.changes_cursor) as changes:
        while True:
            for item in await changes.next_batch():
                if item.payload is None or not _may_concern(view, item.payload):
                    continue
                try:
                    record = RunRecord.model_validate_json(item.payload)
                except ValidationError:  # a newer relay's record this one cannot read
                    continue
                if view.run is not None:
                    if record.id == view.run.id:
                        html = run_summary(record, clock())
                        await ws.send(orjson.dumps({"t": "summary", "html": html}).decode())
                        if stopped_key(record) != drawn:
                            drawn = stopped_key(record)
                            debug = await web.debug_view(record)
                            html = debug_section(debug, record)
                            await ws.send(orjson.dumps({"t": "debug", "html": html}).decode())
                    continue
                query = view.query
                if not (who.admin or record.owner == who.user) or query is None:
                    continue
                if query.owner and record.owner != query.owner:
                    continue
                message = {
                    "t": "row",
                    "id": record.id,
                    "match": query.matches(record.state, record.spec.tags, record.owner),
                    "html": run_row(record, clock()),
                }
                await ws.send(orjson.dumps(message).decode())


def _may_concern(view: LiveView, payload: bytes) -> bool:
    """Whether a change (a stored record's JSON) may be shown on ``view``'s page: its run, or a
    run its user may see (read without making a model of every other user's records)."""
    try:
        raw = orjson.loads(payload)
        run, owner = raw["id"], raw.get("owner", "")
    except (ValueError, KeyError, TypeError):
        return False
    if view.run is not None:
        return bool(run == view.run.id)
    return bool(view.who.admin or owner == view.who.user)


async def _logs(fanout: Fanout, ws: ServerConnection, view: LiveView) -> None:
    assert view.run is not None
    log_text = LogText()
    log_text.at_line_start = view.logs_at_line_start
    stream = keys.stream(view.run.id, StreamName.LOGS)
    async with fanout.subscribe(stream, view.logs_cursor) as logs:
        while True:
            items = await logs.next_batch()
            text = "".join(log_text(item.payload) for item in items if item.payload is not None)
            if text:
                await ws.send(orjson.dumps({"t": "log", "text": text}).decode())
