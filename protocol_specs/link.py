"""The relay link's state, without sockets: stream cursors (more to come: outbox, acks, dedup).

A cursor is a Redis stream entry id, ``"<ms>-<seq>"``: where a reader stands in a run's stream.
The relay hands one out with every delivered entry and every acknowledged publish; a link keeps
the newest per stream and resumes from it after a cut, so cursors are compared, not just echoed.
"""

from __future__ import annotations

from typing import NamedTuple

__all__ = ["START", "Cursor", "InvalidCursor"]


class InvalidCursor(ValueError):
    """Text that is not a stream entry id."""


class Cursor(NamedTuple):
    """A stream entry id as numbers; ordered like the stream (a tuple compares field by field)."""

    ms: int
    seq: int = 0

    @classmethod
    def parse(cls, text: str) -> Cursor:
        """``"<ms>-<seq>"`` or ``"<ms>"``, like Redis (which answers "Invalid stream ID" otherwise)."""
        ms, sep, seq = text.partition("-")
        if not (ms.isascii() and ms.isdigit()) or (sep and not (seq.isascii() and seq.isdigit())):
            raise InvalidCursor(f"invalid stream id {text!r}")
        return cls(int(ms), int(seq) if sep else 0)

    def __str__(self) -> str:
        return f"{self.ms}-{self.seq}"


#: before the first entry of any stream (Redis's ``0-0``)
START = Cursor(0, 0)
