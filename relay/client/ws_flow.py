"""A fix to ``websockets.trio`` (17.x): a connection's reader never waits behind its writer.

``Connection.recv_events`` (the task that reads the socket) calls ``send_data()`` after every
read, to write what the protocol queued in answer (a pong, a close). ``send_data()`` takes the
connection's send lock even when there is nothing to write. When both ends send a lot at once
(a tunnel carrying megabytes each way), each end's writer blocks in ``send_all`` (the other end
reads no more), holding its lock, and each end's reader waits for that lock, so neither end reads
again: a deadlock (seen: ``tether exec RUN -- cat`` of 2 MiB hung about one time in ten).

Patched ``send_data``: called by the reader, it returns at once when there is nothing to write,
and when the writer holds the lock while the connection is open it leaves what there is (a pong)
to a task of the connection's own, which writes it once the lock is free; the reader goes on
reading. Once the closing handshake began, the reader writes as it always did. Everything else (every
``send()``, which must wait for its bytes to be written) is as before.

Applied by :func:`apply`, called where connections start (the relay's :func:`~relay.server.
serve_relay`, the link client's :func:`~relay.client.connect.open_connection`), never on import;
if ``websockets`` is not as this was written against, nothing is patched.
"""

from __future__ import annotations

from typing import Any

import trio
from websockets.protocol import State
from websockets.trio.connection import Connection

__all__ = ["applied", "apply"]


def applied() -> bool:
    """Whether the fix is in place."""
    return bool(getattr(getattr(Connection, "send_data", None), "_tether", False))


def apply() -> bool:
    """Put the fix in place (idempotent); whether it is (``False``: ``websockets`` is not as
    known, and nothing was patched)."""
    original: Any = getattr(Connection, "send_data", None)
    recv_events: Any = getattr(Connection, "recv_events", None)
    if original is None or recv_events is None or getattr(original, "_tether", False):
        return bool(getattr(original, "_tether", False))
    reader_code = recv_events.__code__

    async def send_data(self: Any) -> None:
        coro = trio.lowlevel.current_task().coro
        if getattr(coro, "cr_code", None) is reader_code:  # the connection's reader
            if not self.protocol.writes:
                return
            if self.send_lock.locked() and self.protocol.state is State.OPEN:
                # open, the reader's only answer is a pong; a close it writes as ever (in order)
                self.nursery.start_soon(_flush, original, self)
                return
        await original(self)

    send_data._tether = True  # type: ignore[attr-defined]
    Connection.send_data = send_data  # type: ignore[method-assign]
    return True


async def _flush(original: Any, connection: Any) -> None:
    """Write what the reader left (a pong, a close) once the writer is done; a connection that
    broke meanwhile is the reader's to notice (as the unpatched reader would have)."""
    try:
        await original(connection)
    except Exception:  # the reader sees the broken stream and reports it
        pass
