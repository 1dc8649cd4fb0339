"""One expression's value in every paused rank, side by side (``tether eval RUN EXPR``, ``@all``).

Theory of operation
-------------------
Comparing a value across the ranks of a distributed job (``loss`` is NaN on which ranks? do the
gradients' norms agree?) is what an HPC debugger's cross-process comparison does (Linaro DDT).
The worker evaluates the expression in each paused rank (``worker_shim/session/rank_eval.py``)
through a helper of tether's in the rank's own process (``worker_shim/inject/_tether_values.py``),
which answers a short JSON text rather than the value: its ``repr`` (cut short), its type, and for
a number its value, for a tensor or an array its shape, dtype, device, norm and NaN/Inf counts,
computed where the data is (a GPU's tensor on the GPU); the data itself never leaves the rank.

This module is the part both ends share, without I/O: :class:`RankValue` (one rank's answer),
:func:`from_helper` (the helper's JSON, as debugpy's ``evaluate`` quotes it), :func:`render` (the
lines ``tether eval`` prints and an ``@all`` evaluate answers: equal values merged, ``ranks
0-2,4: 0.6931``, then the summary), :func:`parse_prefix` (the debug console's ``@all EXPR``,
``@ranks 0-3 EXPR``, ``@rank 3 EXPR``) and :class:`EvalReport` (``tether eval --json``).
"""

from __future__ import annotations

import ast
import json
import math
from collections import Counter
from collections.abc import Iterable, Sequence
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field

from .focus import MAX_FOCUS
from .stacks import compress_ranks, ranks_text

__all__ = [
    "MAX_RANKS",
    "EvalReport",
    "Prefix",
    "RankValue",
    "console_answer",
    "error_value",
    "from_helper",
    "merge_values",
    "nothing_evaluated",
    "parse_prefix",
    "parse_rank_list",
    "plain_value",
    "render",
    "summary",
]

#: the most ranks one list names (``@ranks``, ``--ranks``): a focus's and a run's or an
#: evaluation's spec's limit, so that a list one end accepts the other end accepts too
MAX_RANKS = MAX_FOCUS

#: the most characters of a value's ``repr`` shown (the helper cuts it there too)
REPR_CHARS = 160

#: ``value``: evaluated; ``error``: the expression raised (or the rank did not answer);
#: ``running``: not paused, not evaluated; ``absent``: asked for (``--ranks``), no such rank
ValueState = Literal["value", "error", "running", "absent"]


class RankValue(BaseModel):
    """One rank's answer (``tether eval --json``'s ``values``; fields may be added)."""

    model_config = ConfigDict(ser_json_inf_nan="strings")

    rank: int
    state: ValueState = "value"
    repr: str = ""  #: the value's repr, cut short (never a tensor's or an array's data)
    type: str = ""  #: ``float``, ``torch.Tensor``, ``numpy.ndarray``
    number: float | None = None  #: a number's value (a 0-d tensor's or array's too)
    shape: list[int] | None = None  #: a tensor's or an array's
    dtype: str = ""
    device: str = ""  #: a tensor's (``cuda:0``)
    norm: float | None = None  #: its 2-norm (of its finite elements when some are not)
    nan: int | None = None  #: how many of its elements are NaN
    inf: int | None = None  #: how many are infinite
    error: str = ""  #: ``NameError: name 'loss' is not defined``, one line
    #: a distributed tensor (``DTensor``) described by this rank's shard alone: nothing global
    #: is computed in one rank (it would be a collective the other ranks never join)
    local: bool = False

    @property
    def is_array(self) -> bool:
        return self.shape is not None

    def text(self) -> str:
        """How the value is shown (and compared: ranks with the same text are merged)."""
        if self.state == "running":
            return "running (not evaluated)"
        if self.state == "absent":
            return "not a rank of this run"
        if self.state == "error":
            return self.error
        if self.shape is None:
            return self.repr
        kind = "tensor" if "torch" in self.type else "array" if "numpy" in self.type else self.type
        where = f" on {self.device}" if self.device and self.device != "cpu" else ""
        head = f"{kind} {_num(self.number)}" if self.number is not None else f"{kind}{self.shape}"
        head += " (local shard)" if self.local else ""
        norm = f" norm {_num(self.norm)}" if self.norm is not None else ""
        bad = f" nan {self.nan} inf {self.inf}" if self.nan is not None else ""
        return f"{head} {self.dtype}{where}{norm}{bad}".replace("  ", " ")


class EvalReport(BaseModel):
    """What ``tether eval --json`` prints: the expression and every rank's value, by rank."""

    model_config = ConfigDict(ser_json_inf_nan="strings")

    run: str = ""
    expression: str = ""
    values: list[RankValue] = Field(default_factory=list)
    summary: list[str] = Field(default_factory=list)


def _num(x: float | None) -> str:
    if x is None:
        return ""
    if math.isnan(x):
        return "nan"
    if math.isinf(x):
        return "inf" if x > 0 else "-inf"
    if x == int(x) and abs(x) < 1e15:
        return str(int(x))
    return f"{x:.6g}"


def _one_line(text: str, limit: int = REPR_CHARS) -> str:
    line = " ".join(text.split())
    return line if len(line) <= limit else line[: limit - 3] + "..."


def from_helper(rank: int, result: str) -> RankValue:
    """The helper's answer (a JSON text) as debugpy's ``evaluate`` gives it: the ``repr`` of a
    ``str`` (quoted). A result that is not the helper's is taken as a plain value's repr."""
    try:
        text = ast.literal_eval(result)
        data = json.loads(text) if isinstance(text, str) else None
    except (ValueError, SyntaxError, MemoryError, RecursionError):
        data = None
    if not isinstance(data, dict):
        return RankValue(rank=rank, repr=_one_line(result))
    if isinstance(data.get("error"), str):
        return RankValue(rank=rank, state="error", error=_one_line(data["error"], 300))
    fields: dict[str, Any] = {"rank": rank}
    for name in ("repr", "type", "dtype", "device"):
        if isinstance(data.get(name), str):
            fields[name] = _one_line(data[name])
    for name in ("number", "norm"):
        value = data.get(name)
        if isinstance(value, int | float) and not isinstance(value, bool):
            fields[name] = float(value)
    for name in ("nan", "inf"):
        value = data.get(name)
        if isinstance(value, int) and not isinstance(value, bool):
            fields[name] = value
    if data.get("local") is True:
        fields["local"] = True
    shape = data.get("shape")
    if isinstance(shape, list) and all(isinstance(n, int) for n in shape):
        fields["shape"] = shape
    return RankValue(**fields)


def plain_value(rank: int, result: str, type_: str = "") -> RankValue:
    """A value debugpy evaluated itself (no helper in the rank): its ``result``, the value's repr,
    cut to one line of :data:`REPR_CHARS` as the helper's are."""
    return RankValue(rank=rank, repr=_one_line(result), type=_one_line(type_))


def error_value(rank: int, message: str) -> RankValue:
    """debugpy refused the evaluation: its message, one line (of a traceback, as pydevd's
    ``repl`` evaluations answer, its last line: the exception's type and message)."""
    lines = [line for line in (message or "").splitlines() if line.strip()]
    if lines and lines[0].startswith("Traceback (most recent call last)"):
        lines = lines[-1:]
    return RankValue(rank=rank, state="error", error=_one_line(" ".join(lines) or "no answer", 300))


#: which of two answers for one rank a merge keeps: the one that says the most
_SAYS = {"value": 2, "error": 2, "running": 1, "absent": 0}


def merge_values(answers: Iterable[Iterable[RankValue]]) -> list[RankValue]:
    """The values of a run that spans nodes, by rank, from each node's worker's answer: a rank is
    one node's, so another node's word for it is at most ``absent`` (``--ranks`` names ranks of
    every node); of two answers for one rank the one that says more is kept (the first of
    equals)."""
    kept: dict[int, RankValue] = {}
    for answer in answers:
        for v in answer:
            had = kept.get(v.rank)
            if had is None or _SAYS[v.state] > _SAYS[had.state]:
                kept[v.rank] = v
    return [kept[rank] for rank in sorted(kept)]


def console_answer(
    values: list[RankValue], run: str, nodes: int = 1, node: int = 0
) -> tuple[str, str]:
    """An ``@all`` evaluate's answer (result, error: one of them ""), on node ``node``'s worker of
    run ``run`` over ``nodes`` nodes: that node's ranks only, which a run over several nodes says
    (the cross-node console answer is to come; ``tether eval`` asks every node)."""
    note = ""
    if nodes > 1:
        note = (
            f"(node {node}'s ranks only: the other nodes' ranks are not included here; "
            f"tether eval {run} EXPR evaluates every node's)"
        )
    why = nothing_evaluated(values)
    if why:
        return "", f"{why} {note}".strip()
    return "\n".join(render(values) + ([note] if note else [])), ""


# --- rendering ----------------------------------------------------------------------------------


def _groups(values: Iterable[RankValue]) -> list[tuple[str, list[int]]]:
    """Ranks with the same text, in the order of their lowest rank."""
    groups: dict[str, list[int]] = {}
    for v in sorted(values, key=lambda v: v.rank):
        groups.setdefault(v.text(), []).append(v.rank)
    return list(groups.items())


def _value_order(values: list[RankValue]) -> dict[str, tuple[int, float, str]]:
    """``--by-value``: numbers ascending, then NaN, then other values by text (tensors and arrays
    with NaN or Inf elements last of them), errors, ranks not evaluated."""
    order: dict[str, tuple[int, float, str]] = {}
    for v in values:
        text = v.text()
        if v.state != "value":
            key = (3 if v.state == "error" else 4, 0.0, text)
        elif v.number is not None and not math.isnan(v.number):
            key = (0, v.number, text)
        elif v.number is not None:
            key = (1, 0.0, text)
        else:  # a tensor or an array with NaN or Inf elements after those without
            key = (2, 1.0 if v.nan or v.inf else 0.0, text)
        order[text] = key
    return order


def render(values: list[RankValue], *, by_value: bool = False) -> list[str]:
    """One line per set of ranks with the same value (``ranks 0-2,4: 0.6931``), then the
    summary. ``by_value``: the sets ordered by value (numbers ascending, NaN, other values,
    errors, ranks not evaluated), each with its count."""
    groups = _groups(values)
    if by_value:
        order = _value_order(values)
        groups.sort(key=lambda g: (order[g[0]], min(g[1])))
        lines = [f"{ranks_text(r)} ({len(r)}): {text}" for text, r in groups]
    else:
        lines = [f"{ranks_text(r)}: {text}" for text, r in groups]
    return lines + summary(values)


def summary(values: list[RankValue]) -> list[str]:
    """What the values say together: min/max/mean of the numbers, the tensors' and arrays'
    shapes and norms, NaN/Inf, errors, and which ranks differ from the majority."""
    done = [v for v in values if v.state == "value"]
    lines: list[str] = []
    numbers = [v for v in done if v.number is not None and not v.is_array]
    if numbers:
        lines.append("numbers: " + _stats([(v.rank, v.number) for v in numbers]))
    arrays = [v for v in done if v.is_array]
    if arrays:
        lines.append(_arrays(arrays))
    errors = [v.rank for v in values if v.state == "error"]
    if errors:
        lines.append(f"errors: {ranks_text(errors)}")
    running = [v.rank for v in values if v.state == "running"]
    if running:
        lines.append(f"not paused, not evaluated: {ranks_text(running)}")
    lines += _differ(done)
    return ["summary: " + lines[0], *("  " + line for line in lines[1:])] if lines else []


def _stats(pairs: Sequence[tuple[int, float | None]]) -> str:
    nans = [r for r, x in pairs if x is not None and math.isnan(x)]
    real = [(r, x) for r, x in pairs if x is not None and not math.isnan(x)]
    parts: list[str] = []
    if real:
        low = min(real, key=lambda p: p[1])
        high = max(real, key=lambda p: p[1])
        mean = sum(x for _, x in real) / len(real)
        parts.append(
            f"min {_num(low[1])} ({ranks_text(r for r, x in real if x == low[1])}), "
            f"max {_num(high[1])} ({ranks_text(r for r, x in real if x == high[1])}), "
            f"mean {_num(mean)} of {len(real)}"
        )
    if nans:
        parts.append(f"NaN in {ranks_text(nans)}")
    return "; ".join(parts)


def _arrays(arrays: list[RankValue]) -> str:
    shapes = Counter(f"{v.shape} {v.dtype}".strip() for v in arrays)
    if len(shapes) == 1:
        shape = f"shape {next(iter(shapes))}"
    else:
        shape = "shapes differ: " + ", ".join(
            f"{ranks_text(v.rank for v in arrays if f'{v.shape} {v.dtype}'.strip() == s)}: {s}"
            for s in shapes
        )
    parts = [f"{len(arrays)} tensor{'s' if len(arrays) != 1 else ''}/arrays, {shape}"]
    norms = [(v.rank, v.norm) for v in arrays if v.norm is not None]
    if norms:
        parts.append("norm " + _stats(norms))
    nan = [v.rank for v in arrays if v.nan]
    inf = [v.rank for v in arrays if v.inf]
    if nan or inf:
        if nan:
            counts = ", ".join(f"rank {v.rank}: {v.nan}" for v in arrays if v.nan)
            parts.append(f"NaN elements in {ranks_text(nan)} ({counts})")
        if inf:
            counts = ", ".join(f"rank {v.rank}: {v.inf}" for v in arrays if v.inf)
            parts.append(f"Inf elements in {ranks_text(inf)} ({counts})")
    elif all(v.nan is not None for v in arrays):
        parts.append("no NaN or Inf")
    return "; ".join(parts)


def _differ(done: list[RankValue]) -> list[str]:
    """Which ranks differ from the majority (the most common value; of equals, the one of the
    lowest rank)."""
    if len(done) < 2:
        return []
    counts = Counter(v.text() for v in done)
    if len(counts) == 1:
        return [f"all {len(done)} evaluated ranks agree"]
    top = max(counts.values())
    if top == 1:
        return [f"all {len(done)} evaluated ranks differ"]
    majority = min((v for v in done if counts[v.text()] == top), key=lambda v: v.rank).text()
    same = [v.rank for v in done if v.text() == majority]
    other = [v.rank for v in done if v.text() != majority]
    verb = "differs" if len(other) == 1 else "differ"
    return [f"{ranks_text(other)} {verb} from the majority ({ranks_text(same)}: {majority})"]


def nothing_evaluated(values: list[RankValue]) -> str:
    """Why no rank was evaluated (one line), or "" when some were."""
    if any(v.state in ("value", "error") for v in values):
        return ""
    running = [v.rank for v in values if v.state == "running"]
    absent = [v.rank for v in values if v.state == "absent"]
    if running:
        others = f"; {ranks_text(absent)}: no such rank" if absent else ""
        return f"no rank is paused ({ranks_text(running)} running{others}): pause the run first"
    if absent:
        return f"{ranks_text(absent)}: no such rank is being debugged"
    return "no ranks are being debugged (processes with a RANK, as torchrun starts them)"


# --- the debug console's prefix ----------------------------------------------------------------


class Prefix(BaseModel):
    """An ``@all`` / ``@ranks R`` / ``@rank N`` evaluate: the ranks (None: every one) and the
    expression; or ``error``: why it cannot be (one line)."""

    ranks: list[int] | None = None
    expression: str = ""
    error: str = ""


#: the words of the debug console's prefix
PREFIXES = ("@all", "@ranks", "@rank")


def parse_rank_list(text: str) -> list[int]:
    """``0,3`` or ``0-3,8`` (as ``tether debug --ranks``), :data:`MAX_RANKS` ranks at most;
    ValueError saying what is wrong."""
    ranks: set[int] = set()
    for part in text.split(","):
        first, dash, last = part.strip().partition("-")
        if not first.isdigit() or (dash and not last.isdigit()):
            raise ValueError(f"{_one_line(text, 40)!r}: give ranks like 0,3 or 0-3")
        low, high = int(first), int(last) if dash else int(first)
        if high < low or high - low >= MAX_RANKS:
            raise ValueError(f"{part.strip()!r}: a range goes up, {MAX_RANKS} ranks at most")
        ranks.update(range(low, high + 1))
        if len(ranks) > MAX_RANKS:  # before the next range: the list's own size is bounded
            raise ValueError(f"{MAX_RANKS} ranks at most in all")
    return sorted(ranks)


def parse_prefix(expression: str) -> Prefix | None:
    """The debug console's ``@all EXPR``, ``@ranks 0-3 EXPR``, ``@rank 3 EXPR`` (None: an
    ordinary expression, evaluated as ever)."""
    text = expression.lstrip()
    word, _, rest = text.partition(" ")
    if word not in PREFIXES:
        return None
    rest = rest.strip()
    ranks: list[int] | None = None
    if word != "@all":
        spec, _, rest = rest.partition(" ")
        rest = rest.strip()
        try:
            ranks = parse_rank_list(spec)
        except ValueError as exc:
            return Prefix(error=f"{word}: {exc} (e.g. {word} 0-3 loss.item())")
        if word == "@rank" and len(ranks) != 1:
            return Prefix(error=f"@rank takes one rank, not {compress_ranks(ranks)} (@ranks does)")
    if not rest:
        return Prefix(ranks=ranks, error=f"{word}: no expression (e.g. {word} loss.item())")
    return Prefix(ranks=ranks, expression=rest)
