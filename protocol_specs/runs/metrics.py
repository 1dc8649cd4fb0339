"""A run's metrics: scalars the program reports, as points of a series per name. Sans-I/O.

Theory of operation
-------------------
A program reports a point in one of two ways:

- ``tether.report(step=100, loss=0.42)`` (the ``tether`` module, ``tether.py`` at the top of the
  project: stdlib only, put on the program's ``PYTHONPATH`` by the worker). Each call is one
  JSON line ``[step, at, {name: value}]`` on the process's connection to a Unix socket the worker
  listens on (``TETHER_METRICS_SOCKET``), read by :func:`decode_report`.
- Without a code change: lines of its output that match a pattern the run names
  (``--metric 'loss=(?P<loss>[\\d.e+-]+)'``): each named group is a metric, ``step`` (if the
  pattern has it) the step; a pattern without one counts its own matches from 0
  (:class:`LineMetrics`).

The worker holds points in a :class:`MetricHold` and publishes them as
:class:`~protocol_specs.wire.stream_entries.MetricEntry` (up to :data:`MAX_VALUES` values each) on the run's
link, exactly once like the logs: the first point at once, later ones together at most every
:data:`INTERVAL` s while the relay answered the previous entries (so a program reporting every
millisecond costs one entry a second; one reporting faster, a few more). The relay keeps them in the run's ``metrics`` stream, the
newest ``RelayConfig.metric_entries`` entries (older ones are trimmed: bounded like the logs).
"""

from __future__ import annotations

import ast
import json
import math
import re
from collections.abc import Iterable, Sequence
from typing import Any

import orjson

__all__ = [
    "CONDITION_FUNCTIONS",
    "INTERVAL",
    "MAX_NAMES",
    "MAX_PATTERNS",
    "MAX_POINTS",
    "MAX_REPORT_BYTES",
    "MAX_VALUES",
    "NAME",
    "LineMetrics",
    "MetricHold",
    "Point",
    "check_condition",
    "decode_pause",
    "decode_report",
    "format_value",
    "last_values",
    "number",
    "parse_pattern",
    "point_line",
    "points_of",
]

#: what a metric's name may be (a keyword argument of ``tether.report``, a pattern's group)
NAME = re.compile(r"^[A-Za-z_][A-Za-z0-9_./-]{0,63}$")
#: most names in one point
MAX_NAMES = 64
#: most points in one stream entry, and most values (points times names) in all
MAX_POINTS = 1000
MAX_VALUES = 1000
#: most ``--metric`` patterns a run names
MAX_PATTERNS = 16
#: seconds between two metric entries of a run (the first goes at once)
INTERVAL = 1.0
#: the longest output line a pattern is tried on
MAX_LINE = 64 * 1024
#: most points held on the worker before it stops reading the program's reports
HOLD_CAP = 100_000
#: the longest line ``tether.report`` sends
MAX_REPORT_BYTES = 16 * 1024

#: one point: (step, wall time it was reported, {name: value})
Point = tuple[int, float, dict[str, float]]


def parse_pattern(text: str) -> re.Pattern[str]:
    """A ``--metric`` pattern, compiled; ``ValueError`` saying what is wrong with it."""
    if not text or len(text) > 1000:
        raise ValueError("a metric pattern is 1 to 1000 characters")
    try:
        pattern = re.compile(text)
    except re.error as exc:
        raise ValueError(f"metric pattern {text!r} is not a regular expression: {exc}") from None
    if _nested_repeat(text):
        raise ValueError(
            f"metric pattern {text!r} repeats a repeat (like (a+)+): on some lines such a "
            "pattern takes forever; write it without the nesting"
        )
    names = [name for name in pattern.groupindex if name != "step"]
    if not names:
        raise ValueError(
            f"metric pattern {text!r} names no metric: give it a named group, "
            "e.g. 'loss=(?P<loss>[\\d.e+-]+)'"
        )
    for name in names:
        if not NAME.fullmatch(name):
            raise ValueError(f"metric pattern {text!r}: {name!r} is not a metric name")
    return pattern


#: what a ``--debug-when`` condition may call (``tether.py`` gives it the same)
CONDITION_FUNCTIONS = frozenset({"isnan", "isinf", "isfinite", "abs", "min", "max"})
_CONDITION_NODES = (
    ast.Expression, ast.BoolOp, ast.And, ast.Or, ast.UnaryOp, ast.Not, ast.USub, ast.UAdd,
    ast.BinOp, ast.Add, ast.Sub, ast.Mult, ast.Div, ast.Pow, ast.Mod, ast.FloorDiv,
    ast.Compare, ast.Eq, ast.NotEq, ast.Lt, ast.LtE, ast.Gt, ast.GtE,
    ast.Name, ast.Load, ast.Constant, ast.Call,
)  # fmt: skip


def check_condition(text: str) -> str:
    """A ``--debug-when`` condition: a Python expression over the metrics of one report (their
    names, and ``step``): comparisons, arithmetic, ``and``/``or``/``not``, numbers, and
    :data:`CONDITION_FUNCTIONS` (``loss != loss``, ``isnan(loss) or grad_norm > 1e3``). Evaluated
    in the program at each ``tether.report`` call; a name the report lacks makes it false.
    ``ValueError`` saying what is wrong."""
    if not text.strip() or len(text) > 500:
        raise ValueError("a --debug-when condition is 1 to 500 characters, e.g. 'loss != loss'")
    try:
        tree = ast.parse(text.strip(), mode="eval")
    except SyntaxError as exc:
        raise ValueError(f"--debug-when {text!r} is not an expression: {exc.msg}") from None
    for node in ast.walk(tree):
        if not isinstance(node, _CONDITION_NODES):
            raise ValueError(
                f"--debug-when {text!r}: {type(node).__name__} is not allowed (comparisons, "
                f"arithmetic, and/or/not, numbers, metric names, {', '.join(sorted(CONDITION_FUNCTIONS))})"
            )
        if isinstance(node, ast.Call) and not (
            isinstance(node.func, ast.Name) and node.func.id in CONDITION_FUNCTIONS
        ):
            raise ValueError(
                f"--debug-when {text!r}: only {', '.join(sorted(CONDITION_FUNCTIONS))} may be called"
            )
        if isinstance(node, ast.Constant) and not isinstance(node.value, int | float):
            raise ValueError(f"--debug-when {text!r}: only numbers are constants")
    return text.strip()


def _nested_repeat(text: str) -> bool:
    """Whether the pattern repeats something that itself repeats without bound (star height
    over 1: ``(a+)+``, ``(\\d*)*``), the shape that makes a regular expression take exponential
    time on a line that almost matches. Read with the standard library's own parser."""
    try:
        from re import _parser  # type: ignore[attr-defined]

        parsed = _parser.parse(text)
    except Exception:  # another Python's internals: no check, the pattern compiled already
        return False
    repeats = {_parser.MAX_REPEAT, _parser.MIN_REPEAT, getattr(_parser, "POSSESSIVE_REPEAT", None)}

    def walk(items: Any, inside: bool) -> bool:
        for op, arg in items:
            if op in repeats:
                _low, high, sub = arg
                forever = high == _parser.MAXREPEAT
                if forever and inside:
                    return True
                if walk(sub, inside or forever):
                    return True
            elif op is _parser.SUBPATTERN:
                if walk(arg[-1], inside):
                    return True
            elif op is _parser.BRANCH:
                if any(walk(branch, inside) for branch in arg[1]):
                    return True
        return False

    return walk(parsed, False)


def number(value: object) -> float | None:
    """``value`` as a metric's value (an int, a float, a numpy scalar, a one-element tensor...);
    ``None`` if it is none of those (a bool is not a metric)."""
    if isinstance(value, bool) or isinstance(value, str | bytes):
        return None
    try:
        return float(value)  # type: ignore[arg-type]
    except (TypeError, ValueError, OverflowError):
        return None


def decode_report(data: bytes) -> Point | None:
    """A line from ``tether.report``: ``[step, at, {name: value}]``; ``None`` if malformed
    (what a program sends cannot break the worker: a number too large for a float, JSON nested
    too deep, anything). NaN and infinities are values like others (Python's ``json`` writes
    and reads them)."""
    return _point(_json(data))


def _json(data: bytes) -> Any:
    """``data`` parsed, or ``None``."""
    if len(data) > MAX_REPORT_BYTES:
        return None
    try:
        return orjson.loads(data)
    except orjson.JSONDecodeError:  # NaN or Infinity (orjson reads neither), or not JSON
        pass
    try:
        return json.loads(data)
    except (ValueError, RecursionError):
        return None


def _point(raw: Any) -> Point | None:
    if not isinstance(raw, list) or len(raw) != 3:
        return None
    step, at, values = raw
    if type(step) is not int or not isinstance(at, int | float) or not isinstance(values, dict):
        return None
    if not 0 <= step < 2**63 or not values or len(values) > MAX_NAMES:
        return None
    out: dict[str, float] = {}
    try:
        for name, value in values.items():
            if not isinstance(name, str) or not NAME.fullmatch(name):
                return None
            if not isinstance(value, int | float) or isinstance(value, bool):
                return None
            out[name] = float(value)
        when = float(at)
    except OverflowError:  # an int beyond any float
        return None
    return (step, when if math.isfinite(when) else 0.0, out)


def decode_pause(data: bytes) -> tuple[int, dict[str, float]] | None:
    """A program's question whether to pause (its report met ``--debug-when``):
    ``{"pause": [step, {name: value}]}``; ``None`` if malformed."""
    raw = _json(data)
    asked = raw.get("pause") if isinstance(raw, dict) else None
    if not isinstance(asked, list) or len(asked) != 2:
        return None
    point = _point([asked[0], 0.0, asked[1]])
    return None if point is None else (point[0], point[2])


class LineMetrics:
    """Points from the program's output lines, by the run's patterns. Feed it chunks of one
    stream in order (``stdout`` and ``stderr`` are split into lines apart)."""

    def __init__(self, patterns: Sequence[str]) -> None:
        self.patterns = [parse_pattern(text) for text in patterns]
        self._tails: dict[str, bytearray] = {}
        #: per pattern without a ``step`` group: matches so far (its next step)
        self._counts = [0] * len(self.patterns)

    def __bool__(self) -> bool:
        return bool(self.patterns)

    def feed(self, stream: str, data: bytes, at: float) -> list[Point]:
        """The points in the lines ``data`` completes (a line still open waits for its end)."""
        if not self.patterns:
            return []
        tail = self._tails.setdefault(stream, bytearray())
        tail += data
        end = tail.rfind(b"\n")
        if end < 0:
            if len(tail) > MAX_LINE:  # never a line: forget it
                tail.clear()
            return []
        lines = bytes(tail[:end]).split(b"\n")
        del tail[: end + 1]
        points: list[Point] = []
        for line in lines:
            if len(line) <= MAX_LINE:
                points += self.scan(line.decode(errors="replace").rstrip("\r"), at)
        return points

    def scan(self, line: str, at: float) -> list[Point]:
        """The points in one line: one per pattern that matches it with a value."""
        points: list[Point] = []
        for i, pattern in enumerate(self.patterns):
            match = pattern.search(line)
            if match is None:
                continue
            values = {}
            for name, text in match.groupdict().items():
                if name != "step" and text is not None:
                    value = _float(text)
                    if value is not None:
                        values[name] = value
            if not values:
                continue
            step = _int(match.groupdict().get("step"))
            if step is None:
                step = self._counts[i]
                self._counts[i] += 1
            points.append((step, at, values))
        return points


def _float(text: str) -> float | None:
    try:
        return float(text)
    except ValueError:
        return None


def _int(text: str | None) -> int | None:
    if text is None:
        return None
    try:
        value = int(text)
    except ValueError:
        value = int(f) if (f := _float(text)) is not None and f.is_integer() else -1
    return value if 0 <= value < 2**63 else None


class MetricHold:
    """Which points to publish, and when. No I/O: feed points, take entries' points.

    ``ready(answered, now)`` gives what may go now: everything held, in entries of up to
    :data:`MAX_VALUES` values, once the relay answered the previous metric entry and
    :data:`INTERVAL` passed since they went (the first at once); report the last one's number
    with ``published``. ``take`` gives what is held regardless (the program ended).
    """

    def __init__(self, *, interval: float = INTERVAL, cap: int = HOLD_CAP) -> None:
        self.interval = interval
        self.cap = cap
        self._points: list[Point] = []
        #: the publish number of the last metric entry, and when it went
        self.in_flight = 0
        self.sent_at: float | None = None

    def __repr__(self) -> str:
        return f"<MetricHold held={len(self._points)} in_flight={self.in_flight}>"

    def __len__(self) -> int:
        return len(self._points)

    @property
    def full(self) -> bool:
        return len(self._points) >= self.cap

    def feed(self, points: Iterable[Point]) -> None:
        self._points.extend(points)

    def due(self) -> float:
        """When the held points may go (as far as the interval says)."""
        return -math.inf if self.sent_at is None else self.sent_at + self.interval

    def ready(self, answered: int, now: float) -> list[list[Point]]:
        if not self._points or answered < self.in_flight or now < self.due():
            return []
        return self.take()

    def take(self) -> list[list[Point]]:
        """Everything held, as entries' worth of points (at most :data:`MAX_VALUES` values
        each)."""
        out: list[list[Point]] = []
        batch: list[Point] = []
        count = 0
        for point in self._points:
            if batch and count + len(point[2]) > MAX_VALUES:
                out.append(batch)
                batch, count = [], 0
            batch.append(point)
            count += len(point[2])
        if batch:
            out.append(batch)
        self._points = []
        return out

    def published(self, n: int, now: float) -> None:
        self.in_flight = max(self.in_flight, n)
        self.sent_at = now


def points_of(entries: Iterable[Any]) -> list[Point]:
    """The points of metric entries (anything else is skipped), in order."""
    out: list[Point] = []
    for entry in entries:
        points = getattr(entry, "points", None)
        if getattr(entry, "k", None) == "metric" and points is not None:
            out.extend((int(p[0]), float(p[1]), dict(p[2])) for p in points)
    return out


def last_values(points: Iterable[Point]) -> dict[str, float]:
    """Each name's last value, in the order the names first came."""
    last: dict[str, float] = {}
    for _step, _at, values in points:
        last.update(values)
    return last


def format_value(value: float) -> str:
    """A value as people read it: 4 significant digits (``0.4213``, ``1.2e-05``, ``nan``)."""
    if math.isnan(value) or math.isinf(value):
        return str(value)
    return f"{value:.4g}"


def point_line(point: Point) -> str:
    """``step 100  loss 0.42  acc 0.913``"""
    step, _at, values = point
    return f"step {step}  " + "  ".join(f"{k} {format_value(v)}" for k, v in values.items())
