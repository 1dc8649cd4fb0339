"""Line charts of metrics as SVG, for the web view's run and sweep pages. Sans-I/O: series in,
markup out (every text escaped; colours are attributes, so the pages' strict CSP allows them).

A series is ``[(step, value), ...]`` in step order. Each is thinned to at most :data:`MOST`
points (every k-th, and the last), so a run of a million steps draws as fast as one of a hundred.
NaN and infinities break the line (a gap), as a diverged run's curve does.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from html import escape

__all__ = ["MOST", "PALETTE", "line_chart", "thin"]

#: points drawn per series at most
MOST = 400
#: series colours, in order (the best trial of a sweep gets the first)
PALETTE = (
    "#2563eb", "#dc2626", "#16a34a", "#9333ea", "#ea580c", "#0891b2", "#ca8a04", "#db2777",
    "#4b5563", "#65a30d",
)  # fmt: skip

_W, _H = 560, 200
_PAD_L, _PAD_R, _PAD_T, _PAD_B = 56, 12, 12, 28


def thin(points: Sequence[tuple[int, float]], most: int = MOST) -> list[tuple[int, float]]:
    """Every k-th point, and the last, so that at most about ``most`` remain."""
    if len(points) <= most:
        return list(points)
    k = math.ceil(len(points) / most)
    kept = list(points[::k])
    if kept[-1] != points[-1]:
        kept.append(points[-1])
    return kept


def line_chart(
    title: str,
    series: Mapping[str, Sequence[tuple[int, float]]],
    *,
    colours: Mapping[str, str] | None = None,
    log_y: bool = False,
) -> str:
    """An SVG chart of ``series`` (name -> points) with ``title``; ``log_y``: a log scale (only
    positive values are drawn). Empty series draw an empty chart that says so."""
    drawn = {
        name: [p for p in thin(points) if _usable(p[1], log_y)] for name, points in series.items()
    }
    everything = [p for points in drawn.values() for p in points]
    head = (
        f'<svg class="chart" viewBox="0 0 {_W} {_H}" role="img" '
        f'aria-label="{escape(title)}" xmlns="http://www.w3.org/2000/svg">'
        f"<title>{escape(title)}</title>"
    )
    if not everything:
        return (
            head
            + f'<text x="{_W // 2}" y="{_H // 2}" text-anchor="middle">no points yet</text></svg>'
        )
    x0 = min(s for s, _ in everything)
    x1 = max(s for s, _ in everything)
    ys = [_y(v, log_y) for _, v in everything]
    y0, y1 = min(ys), max(ys)
    if not y1 - y0 > 0:  # one value, or values too close for floats to tell apart
        pad = max(abs(y0) * 1e-6, 1.0)
        y0, y1 = y0 - pad, y1 + pad
    if x0 == x1:
        x1 = x0 + 1

    def at(step: int, value: float) -> str:
        x = _PAD_L + (step - x0) / (x1 - x0) * (_W - _PAD_L - _PAD_R)
        y = _H - _PAD_B - (_y(value, log_y) - y0) / (y1 - y0) * (_H - _PAD_T - _PAD_B)
        return f"{x:.1f},{y:.1f}"

    parts = [head, _axes(x0, x1, y0, y1, log_y)]
    for i, name in enumerate(drawn):
        colour = (colours or {}).get(name, PALETTE[i % len(PALETTE)])
        for run in _runs(thin(series[name]), log_y):
            if len(run) == 1:
                x, y = at(*run[0]).split(",")
                parts.append(f'<circle cx="{x}" cy="{y}" r="2" fill="{colour}"/>')
            else:
                line = " ".join(at(s, v) for s, v in thin(run))
                parts.append(
                    f'<polyline fill="none" stroke="{colour}" stroke-width="1.5" points="{line}">'
                    f"<title>{escape(name)}</title></polyline>"
                )
    return "".join(parts) + "</svg>"


def _usable(value: float, log_y: bool) -> bool:
    return math.isfinite(value) and (value > 0 or not log_y)


def _y(value: float, log_y: bool) -> float:
    """Where a value goes on the y axis (clamped: the span of any two stays a finite float)."""
    return math.log10(value) if log_y else max(-1e300, min(value, 1e300))


def _runs(points: Sequence[tuple[int, float]], log_y: bool) -> list[list[tuple[int, float]]]:
    """The stretches of usable points between gaps (NaN, infinities)."""
    runs: list[list[tuple[int, float]]] = [[]]
    for step, value in points:
        if _usable(value, log_y):
            runs[-1].append((step, value))
        elif runs[-1]:
            runs.append([])
    return [run for run in runs if run]


def _axes(x0: int, x1: int, y0: float, y1: float, log_y: bool) -> str:
    def label(y: float) -> str:
        value = 10**y if log_y else y
        return f"{value:.3g}"

    bottom, right = _H - _PAD_B, _W - _PAD_R
    return (
        f'<line x1="{_PAD_L}" y1="{_PAD_T}" x2="{_PAD_L}" y2="{bottom}" stroke="#9ca3af"/>'
        f'<line x1="{_PAD_L}" y1="{bottom}" x2="{right}" y2="{bottom}" stroke="#9ca3af"/>'
        f'<text x="{_PAD_L - 4}" y="{_PAD_T + 8}" text-anchor="end">{label(y1)}</text>'
        f'<text x="{_PAD_L - 4}" y="{bottom}" text-anchor="end">{label(y0)}</text>'
        f'<text x="{_PAD_L}" y="{_H - 8}">step {x0}</text>'
        f'<text x="{right}" y="{_H - 8}" text-anchor="end">{x1}</text>'
    )
