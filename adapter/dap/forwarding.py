"""The hop between the IDE and the worker: the entry that carries a request across the relay, the
requests that wait for the worker's answer, and what the worker's messages become for the IDE;
decided synchronously.

A request the core does not answer itself is published in a :class:`~protocol_specs.wire.wire.DapEntry`
under the adapter's ``seq`` space (:func:`request_entry`) and waits in :class:`PendingRequests`,
keyed by that ``seq``, until the worker's response names it in ``request_seq`` (debugpy's map of
pending requests, which rewrites ``request_seq`` on the way back). Each waits at most until its
deadline: a request nobody answers gets an error response then (debugpy ignores requests it does
not know), so every request is answered exactly once. Which IDE connection asked is kept with it
(``generation``): an answer for a connection that is gone is dropped.

On the way back, what debugpy's answers and events name in its own terms is put in the IDE's:
breakpoint ids are the adapter's (:mod:`protocol_specs.session.session`), and the program's process is
not a local one.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import orjson

from protocol_specs.dap import models as dap
from protocol_specs.session.session import DebugSession, is_transient
from protocol_specs.wire.wire import MAX_DAP_BODY_BYTES, DapEntry

from .status import remote_process, stopped_body

__all__ = ["Pending", "PendingRequests", "answer_for_ide", "event_for_ide", "request_entry"]


def request_entry(
    msg: dict[str, Any],
    origin_seq: int,
    *,
    origin: str,
    process: str,
    local: bool,
    bp_ids: list[int] | None = None,
) -> DapEntry:
    """The entry carrying ``msg`` as request ``origin_seq`` of ``origin``; raises ``ValueError``
    if it cannot be one: nested deeper than JSON encoders go, or over the size of a stream entry.

    ``local``: the core answered it already (the worker replays it to debugpy when it starts)."""
    try:
        body = orjson.dumps({**msg, "seq": origin_seq})
    except orjson.JSONEncodeError as exc:
        raise ValueError(f"{dap.BAD_ARGUMENTS} for {msg.get('command')!r}: {exc}.") from None
    if len(body) > MAX_DAP_BODY_BYTES:
        raise ValueError(
            f"The request is too large ({len(body):,} bytes; at most "
            f"{MAX_DAP_BODY_BYTES:,} bytes cross the relay)."
        )
    return DapEntry(
        origin=origin,
        body=body,
        local=local,
        bp_ids=bp_ids,
        transient=is_transient(msg),
        process=process,
    )


@dataclass
class Pending:
    """A forwarded request that waits for the worker's response."""

    generation: int  #: the IDE connection that asked
    ide_seq: int  #: its ``seq`` there: the answer's ``request_seq``
    command: str
    deadline: float  #: when it is answered with an error if the worker has not answered
    #: the adapter's ids of the breakpoints it sets (their verification answers it)
    bp_ids: list[int] | None


class PendingRequests:
    """The forwarded requests waiting for the worker's answer, by the ``seq`` they were published
    under."""

    def __init__(self) -> None:
        self._by_seq: dict[int, Pending] = {}

    def __len__(self) -> int:
        return len(self._by_seq)

    def add(self, origin_seq: int, pending: Pending) -> None:
        self._by_seq[origin_seq] = pending

    def answered(self, origin_seq: int | None) -> Pending | None:
        """The request ``origin_seq`` names, which waits no more (None: not one of ours)."""
        return self._by_seq.pop(origin_seq, None) if origin_seq is not None else None

    @property
    def next_deadline(self) -> float | None:
        return min((p.deadline for p in self._by_seq.values()), default=None)

    def due(self, now: float) -> list[Pending]:
        """The requests whose deadline has passed, which wait no more."""
        return [self._by_seq.pop(seq) for seq, p in list(self._by_seq.items()) if p.deadline <= now]

    def drain(self) -> list[Pending]:
        """Every waiting request, which waits no more (nobody will answer them)."""
        pending = list(self._by_seq.values())
        self._by_seq.clear()
        return pending


def answer_for_ide(msg: dict[str, Any], pending: Pending, session: DebugSession) -> dict[str, Any]:
    """The worker's response to a forwarded request, as the IDE that asked sees it: answering its
    ``seq``, and for breakpoints set, with the adapter's ids and verification of them."""
    out = {**msg, "request_seq": pending.ide_seq}
    if pending.bp_ids is not None and msg.get("success"):
        verification = session.verification
        out["body"] = {
            **(msg.get("body") or {}),
            "breakpoints": [verification[i] for i in pending.bp_ids if i in verification],
        }
    return out


def event_for_ide(msg: dict[str, Any], session: DebugSession) -> dict[str, Any]:
    """A worker's event as the IDE sees it: breakpoints under the adapter's ids, a ``stopped``
    naming the breakpoints the IDE holds, the process a remote one; others unchanged."""
    name, body = msg.get("event"), msg.get("body")
    if not isinstance(body, dict):
        return msg
    if name == "breakpoint":
        bp = body.get("breakpoint") or {}
        if isinstance(bp.get("id"), int):
            bp = {**bp, "id": session.to_adapter_id(bp["id"])}
        return {**msg, "body": {**body, "breakpoint": bp}}
    if name == "stopped":
        return {**msg, "body": stopped_body(session, body)}
    if name == "process":
        return {**msg, "body": remote_process(body)}
    return msg
