"""Two output streams on one terminal, line by line: ``loss=0.42`` on stdout and a warning on
stderr must not become ``loss=0.42warn: epoch 16 done``.

:class:`LineJoiner` is fed the program's stdout and stderr chunks in the order they came and gives
back what to write, and where: whole lines, never a line of one stream inside a line of the other.
A line still being written (a prompt, a progress bar redrawn with ``\\r``) is shown at once when
the other stream has nothing waiting; while it is open, the other stream's lines wait for its end,
up to :data:`HOLD_LIMIT` bytes, then the open line is ended with a line break. Sans-I/O.
"""

from __future__ import annotations

__all__ = ["HOLD_LIMIT", "LineJoiner"]

#: most bytes one stream waits while the other's line stays open
HOLD_LIMIT = 64 * 1024

_STREAMS = ("stdout", "stderr")


class LineJoiner:
    def __init__(self) -> None:
        self._held = {name: bytearray() for name in _STREAMS}
        self._open: str | None = None  #: the stream whose line is half written on the terminal

    def __repr__(self) -> str:
        held = {name: len(b) for name, b in self._held.items()}
        return f"<LineJoiner open={self._open} held={held}>"

    def feed(self, stream: str, data: bytes) -> list[tuple[str, bytes]]:
        """What to write now, after ``stream`` (``stdout``/``stderr``) produced ``data``."""
        self._held[stream] += data
        out = self._drain(stream)
        other = _other(stream)
        if self._open == other and len(self._held[stream]) > HOLD_LIMIT:
            out.append((other, b"\n"))  # that line has been open too long: end it
            self._open = None
            out += self._drain(stream)
        return out

    def flush(self) -> list[tuple[str, bytes]]:
        """Everything held (the output ended): the open line first."""
        out: list[tuple[str, bytes]] = []
        order = [self._open, *_STREAMS] if self._open else list(_STREAMS)
        for name in dict.fromkeys(order):
            assert name is not None
            if self._held[name]:
                out.append((name, bytes(self._held[name])))
                self._held[name].clear()
        self._open = None
        return out

    def _drain(self, prefer: str) -> list[tuple[str, bytes]]:
        out: list[tuple[str, bytes]] = []
        moved = True
        while moved:
            moved = False
            first = self._open or prefer
            for name in (first, _other(first)):
                if self._open not in (None, name):
                    continue
                held = self._held[name]
                end = max(held.rfind(b"\n"), held.rfind(b"\r"))
                if end >= 0:
                    out.append((name, bytes(held[: end + 1])))
                    del held[: end + 1]
                    self._open = None
                    moved = True
                continues = self._open == name  # more of the line already on the terminal
                if held and (continues or (self._open is None and not self._held[_other(name)])):
                    out.append((name, bytes(held)))  # a line being written: show it now
                    held.clear()
                    moved = moved or not continues  # a newly opened line may free nothing else
                    self._open = name
        return out


def _other(stream: str) -> str:
    return "stderr" if stream == "stdout" else "stdout"
