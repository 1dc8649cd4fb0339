"""What one IDE connection has yet to read: a bounded queue, decided synchronously (no I/O).

Theory of operation
-------------------
Each IDE connection has a writer task that takes bytes from its :class:`Outbox` and writes them to
the socket; the adapter puts what it sends to that IDE into the outbox and never waits for the IDE.
An IDE that stops reading (a hung editor, a suspended laptop whose socket stays open) must neither
stall the adapter (its relay link, another IDE taking over) nor make it hold unbounded memory:

- ``output`` events are the only messages that may be merged or dropped. Consecutive plain ones of
  one category (text only, as :func:`protocol_specs.dap.models.plain_output` defines) are merged
  into one event of up to :data:`MERGE_LIMIT` characters, which the IDE shows as the same text.
- While the outbox holds more than ``output_limit`` bytes, new ``output`` events (other than
  tether's ``important`` notices) are dropped: one ``important`` event in their place says how many
  bytes were skipped and that ``tether logs RUN`` has all of the program's output. Never silent.
- Everything else (responses, ``stopped``, ``terminated``, ...) is never dropped, and everything
  keeps its order: what the adapter numbered ``seq`` 7 is written before ``seq`` 8. A merged event
  keeps the ``seq`` of its first part, a skip notice the ``seq`` of the first event it replaces.
- If those other messages alone exceed ``hard_limit`` bytes, the IDE is not reading at all:
  :attr:`Outbox.stuck` becomes true, the outbox takes nothing more, and the connection should be
  closed (the IDE can attach again; the session state is in the adapter, not in the connection).

:meth:`Outbox.close` asks for an orderly end: what is queued is still taken, then
:attr:`Outbox.done` is true and the writer closes the connection.
"""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass, field
from typing import Any

import orjson

from protocol_specs.dap import framing as dap_framing
from protocol_specs.dap import models as dap

__all__ = ["HARD_LIMIT", "MERGE_LIMIT", "OUTPUT_LIMIT", "Outbox"]

#: above this many queued bytes, new program output is dropped (and counted)
OUTPUT_LIMIT = 8 * 1024 * 1024
#: above this many queued bytes of messages that are never dropped, the IDE is stuck
HARD_LIMIT = 64 * 1024 * 1024
#: the most text one merged ``output`` event carries
MERGE_LIMIT = dap.MAX_MERGED_OUTPUT
#: how much :meth:`Outbox.take` hands the writer at once (one item may be larger)
TAKE_BYTES = 256 * 1024
#: what framing and the event envelope add to an output event's text, roughly
_OVERHEAD = 100


@dataclass
class _Frame:
    """A message encoded when it was queued."""

    data: bytes
    droppable: bool  #: an ``output`` event (counted in ``bytes``, not in ``hard_bytes``)

    @property
    def size(self) -> int:
        return len(self.data)


@dataclass
class _Output:
    """Plain ``output`` events of one category, merged."""

    seq: int
    category: str
    texts: list[str] = field(default_factory=list)
    chars: int = 0

    @property
    def size(self) -> int:
        return self.chars + _OVERHEAD

    def encode(self) -> bytes:
        body = {"category": self.category, "output": "".join(self.texts)}
        return dap_framing.encode_message(dap.event("output", body, seq=self.seq))


@dataclass
class _Skipped:
    """Where dropped output was: one notice, counting every byte dropped while it was last."""

    seq: int
    events: int = 0
    nbytes: int = 0

    @property
    def size(self) -> int:
        return 2 * _OVERHEAD


_Item = _Frame | _Output | _Skipped


class Outbox:
    """The messages one IDE connection has yet to be sent; see the module docstring."""

    def __init__(
        self,
        run_id: str,
        *,
        output_limit: int = OUTPUT_LIMIT,
        hard_limit: int = HARD_LIMIT,
        merge_limit: int = MERGE_LIMIT,
    ) -> None:
        self.run_id = run_id
        self.output_limit = output_limit
        self.hard_limit = hard_limit
        self.merge_limit = merge_limit
        self._items: deque[_Item] = deque()
        self.bytes = 0  #: everything queued, roughly as written
        self.hard_bytes = 0  #: what is queued of messages that are never dropped
        self.skipped_bytes = 0  #: program output dropped so far (UTF-8 bytes of its text)
        self.stuck = False
        self.closing = False

    def __repr__(self) -> str:
        state = "stuck" if self.stuck else "closing" if self.closing else "open"
        return (
            f"<Outbox {state} items={len(self._items)} bytes={self.bytes} "
            f"hard={self.hard_bytes} skipped={self.skipped_bytes}>"
        )

    def __len__(self) -> int:
        return len(self._items)

    @property
    def done(self) -> bool:
        """Closed (or stuck) and nothing left to write: the connection may close now."""
        return self.stuck or (self.closing and not self._items)

    def close(self) -> None:
        """Take nothing more; what is queued is still written."""
        self.closing = True

    # --- putting ----------------------------------------------------------------------------------

    def push(self, message: dict[str, Any]) -> bool:
        """Queue one message for the IDE; False if it was not queued (closed, stuck, or dropped
        output). Never raises: a message that cannot be encoded is dropped (``False``)."""
        if self.closing or self.stuck:
            return False
        if message.get("type") == "event" and message.get("event") == "output":
            return self._push_output(message)
        return self._push_frame(message, droppable=False)

    def _push_output(self, message: dict[str, Any]) -> bool:
        body = message.get("body")
        body = body if isinstance(body, dict) else {}
        category = body.get("category", "console")
        text = body.get("output")
        seq = message.get("seq", 0)
        if category == "important":  # tether's own notices: kept like any other message
            return self._push_frame(message, droppable=False)
        if self.bytes > self.output_limit:
            nbytes = len(text.encode(errors="replace")) if isinstance(text, str) else 0
            tail = self._items[-1] if self._items else None
            if not isinstance(tail, _Skipped):
                tail = _Skipped(seq if isinstance(seq, int) else 0)
                self._append(tail)
            tail.events += 1
            tail.nbytes += nbytes
            self.skipped_bytes += nbytes
            return False
        if (
            isinstance(text, str)
            and isinstance(category, str)
            and isinstance(seq, int)
            and _is_plain(body)
        ):
            tail = self._items[-1] if self._items else None
            if (
                isinstance(tail, _Output)
                and tail.category == category
                and tail.chars + len(text) <= self.merge_limit
            ):
                tail.texts.append(text)
                tail.chars += len(text)
                self.bytes += len(text)
            else:
                self._append(_Output(seq, category, [text], len(text)))
            return True
        return self._push_frame(message, droppable=True)

    def _push_frame(self, message: dict[str, Any], *, droppable: bool) -> bool:
        try:
            data = dap_framing.encode_message(message)
        except (orjson.JSONEncodeError, TypeError):
            return False
        self._append(_Frame(data, droppable=droppable))
        if not droppable:
            self.hard_bytes += len(data)
            if self.hard_bytes > self.hard_limit:
                self.stuck = True
        return True

    def _append(self, item: _Item) -> None:
        self._items.append(item)
        self.bytes += item.size

    # --- taking -----------------------------------------------------------------------------------

    def take(self, limit: int = TAKE_BYTES) -> bytes | None:
        """The next bytes to write (whole messages, about ``limit`` of them, at least one), or
        ``None`` when nothing is queued. What is taken no longer counts as queued."""
        if self.stuck or not self._items:
            return None
        chunks: list[bytes] = []
        taken = 0
        while self._items and (not chunks or taken < limit):
            item = self._items.popleft()
            self.bytes -= item.size
            if isinstance(item, _Frame):
                data = item.data
                if not item.droppable:
                    self.hard_bytes -= len(data)
            elif isinstance(item, _Output):
                data = item.encode()
            else:
                data = dap_framing.encode_message(self._notice(item))
            chunks.append(data)
            taken += len(data)
        return b"".join(chunks)

    def _notice(self, skipped: _Skipped) -> dict[str, Any]:
        text = (
            f"tether: skipped {skipped.nbytes:,} bytes of program output ({skipped.events} "
            f"output events): the IDE was not reading fast enough. `tether logs {self.run_id}` "
            "has all of it.\n"
        )
        return dap.event("output", {"category": "important", "output": text}, seq=skipped.seq)


def _is_plain(body: dict[str, Any]) -> bool:
    """Text only (debugpy sends an empty ``source``; ``group``, ``variablesReference``, a
    location, ``data`` would be lost in a merge)."""
    return not any(body[k] for k in body.keys() - {"category", "output"})
