"""Text cut to a width on a terminal or a page: :func:`columns` counts the columns a text takes
(East Asian wide characters take two), :func:`clip` cuts it with an ellipsis (never mid-word when a
word boundary is near). Below every view of a run (:mod:`protocol_specs.runs`, the CLI's tables,
the web view's pages)."""

from __future__ import annotations

import unicodedata

__all__ = ["ELLIPSIS", "clip", "columns"]

ELLIPSIS = "\u2026"
#: a cut goes back to the last space if that loses no more than this share of the width
_WORD_BACK = 0.3


def columns(text: str) -> int:
    """Columns ``text`` takes on a terminal (East Asian wide characters take two)."""
    return sum(2 if unicodedata.east_asian_width(c) in "WF" else 1 for c in text)


def clip(text: str, width: int) -> str:
    """``text`` in at most ``width`` columns: whole if it fits, else cut with an ellipsis, at the
    end of a word when one ends near the cut."""
    if columns(text) <= width:
        return text
    if width <= 1:
        return ELLIPSIS[:width]
    out, used = "", 0
    for c in text:
        w = columns(c)
        if used + w > width - 1:
            break
        out, used = out + c, used + w
    space = out.rfind(" ")
    if space > 0 and len(out) - space <= max(1, int(width * _WORD_BACK)):
        out = out[:space]
    return out.rstrip(" ,;:") + ELLIPSIS
