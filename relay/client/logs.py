"""The ``logs`` role: a run's output and status markers, followed across reconnects."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, Literal

import trio
from websockets.exceptions import ConnectionClosed

from protocol_specs.link.link import Cursor
from protocol_specs.wire import wire
from protocol_specs.wire.wire import ErrorCode, Role, StreamName

from .connect import RelayError, Target, open_connection
from .link import LinkPolicy

__all__ = ["follow_logs"]

#: how long the relay may stay away before following gives up
GIVE_UP_AFTER = 60.0
#: what a relay that went away, or lost its store for a moment, answers: followed again
_AGAIN = frozenset({ErrorCode.UNREACHABLE, ErrorCode.INTERNAL})


async def follow_logs(
    target: Target,
    run: str,
    on_entry: Callable[[Any], None],
    *,
    stream: StreamName = StreamName.LOGS,
    cursor: str = "0",
    follow: bool = True,
    from_end: bool = False,
    policy: LinkPolicy | None = None,
) -> str:
    """Hand a run's logs stream (or ``stream``: its metrics) after ``cursor`` to ``on_entry``:
    output chunks (metric points) and status markers (``wire.StatusEntry``), in order; returns the cursor of the last entry handed over. ``from_end``: only what
    comes after the stream's end as it is at the first connection.

    Without ``follow``, ends once the stream's current end is reached; with it, ends after the
    run's ``finished`` marker. Reconnects after a drop (or a relay's restart of its store) and
    resumes after the last entry handed over.
    """
    policy = policy or LinkPolicy()
    attempt = 0
    down_since: float | None = None
    while True:
        try:
            async with open_connection(
                target,
                wire.Hello(role=Role.LOGS, run=run, cursor=cursor, stream=_stream_name(stream)),
            ) as (
                ws,
                welcome,
            ):
                attempt, down_since = 0, None
                tail = welcome.tails.get(stream.value, "0")
                if from_end:
                    cursor, from_end = tail, False
                    continue  # reconnect, naming the end as the cursor
                finished = welcome.run is not None and welcome.run.finished
                while True:
                    if (not follow or finished) and Cursor.parse(tail) <= Cursor.parse(cursor):
                        return cursor  # caught up with the end as it was when we asked
                    frame = wire.decode_frame(await ws.recv())
                    if isinstance(frame, wire.Error):
                        raise RelayError(frame.code, frame.message)
                    if not isinstance(frame, wire.Deliver):
                        continue
                    cursor = frame.cursor
                    entry = wire.decode_entry(frame.entry)
                    if isinstance(entry, wire.LogEntry | wire.StatusEntry | wire.MetricEntry):
                        on_entry(entry)
                        if isinstance(entry, wire.StatusEntry) and entry.event == "finished":
                            finished = True
                            if follow:
                                return cursor
        except (ConnectionClosed, RelayError) as exc:
            # a relay that lost its store for a moment (restarting) says so and asks to reconnect
            if isinstance(exc, RelayError) and exc.code not in _AGAIN:
                raise
            down_since = trio.current_time() if down_since is None else down_since
            if trio.current_time() - down_since > GIVE_UP_AFTER:
                raise RelayError(
                    ErrorCode.UNREACHABLE, f"lost the relay at {target}: {exc}"
                ) from exc
            await trio.sleep(policy.backoff(attempt))
            attempt += 1


def _stream_name(stream: StreamName) -> Literal["logs", "metrics"]:
    if stream is StreamName.METRICS:
        return "metrics"
    if stream is StreamName.LOGS:
        return "logs"
    raise ValueError(f"a logs connection reads logs or metrics, not {stream.value}")
