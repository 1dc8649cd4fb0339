"""A run's logs stream as the web view's pages show it (its page's tail, and the live page's
pushes: ``relay/web/live.py``)."""

from __future__ import annotations

from protocol_specs.wire.wire import LogEntry, StatusEntry, WireError, decode_entry

__all__ = ["LogText"]


class LogText:
    """A run's logs stream as the page shows it: output as it came, each status a marker line of
    its own (on a new line, even after output that did not end one)."""

    def __init__(self) -> None:
        self.at_line_start = True

    def __call__(self, payload: bytes) -> str:
        try:
            entry = decode_entry(payload)
        except WireError:
            return ""
        text = ""
        if isinstance(entry, LogEntry):
            text = entry.data.decode("utf-8", "replace")
        elif isinstance(entry, StatusEntry):
            text = ("" if self.at_line_start else "\n") + f"── {entry.detail or entry.event} ──\n"
        if text:
            self.at_line_start = text.endswith("\n")
        return text
