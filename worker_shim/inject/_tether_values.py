"""A value described in the process that holds it, for ``tether eval`` and the ``@all`` prefix.

The worker evaluates ``_tether_breakpoint.rank_value(SOURCE, globals(), locals())`` in a paused
rank's frame (``worker_shim/session/rank_eval.py``); that loads this module (once, from beside
itself) and calls :func:`describe`, which evaluates SOURCE in the frame's namespaces and answers
a short JSON text, never the data: ``{"repr", "type"}``, with ``number`` for a number (a 0-d
tensor's or array's too) and, for a torch tensor or a numpy array, ``shape``, ``dtype``,
``device``, ``norm`` (of its finite elements), ``nan`` and ``inf`` counts, computed on the
tensor's own device a chunk at a time (only the scalars are copied out, ``.item()``); or
``{"error": "NameError: name 'loss' is not defined"}``. Short, because debugpy's ``evaluate`` answers a ``repr``.

A chunk is a view of the value's own memory (a contiguous one's flat run of elements, else slices
along its first dimension, recursing where one slice is still too big): a transposed, sliced or
expanded tensor is never copied whole (``reshape(-1)`` would). Other values' repr is reprlib's,
cut at :data:`REPR_CHARS` as it is written: ``@all dataset.indices`` (ten million ints) writes a
few hundred characters, not a hundred megabytes, in every rank. A torch ``DTensor`` is described
by its local shard (``to_local()``, with ``"local": true``): anything global about it (its sum,
``.item()``) would be a collective run by this rank alone, which hangs.

Loaded by path on the program's interpreter: standalone, stdlib only (torch and numpy are used
only when the value is theirs, from ``sys.modules``).
"""

import json
import math
import reprlib
import sys
from collections.abc import Callable, Iterator
from itertools import islice
from typing import Any

#: the most characters of a repr sent back
REPR_CHARS = 160
#: elements summarized at a time: a summary of a tensor of any size takes one chunk in float64
#: (128 MiB) and its masks (16 MiB each) more of its device's memory, never a copy of the whole
#: tensor (a paused rank may hold most of its GPU's)
CHUNK = 1 << 24


def _short(text: Any) -> str:
    line = " ".join(str(text).split())
    return line if len(line) <= REPR_CHARS else line[: REPR_CHARS - 3] + "..."


class _BoundedRepr(reprlib.Repr):
    """reprlib's repr (a container's first elements, ``...`` for the rest) that also stops
    visiting elements once :data:`REPR_CHARS` are written; dicts and sets in their own order
    (reprlib sorts them: a copy of every key)."""

    def __init__(self) -> None:
        super().__init__()  # no keywords: Python 3.10's takes none
        self.maxlevel = 3
        items = REPR_CHARS // 3  # "0, " each: enough to fill a line
        self.maxtuple = self.maxlist = self.maxarray = self.maxdeque = items
        self.maxdict = self.maxset = self.maxfrozenset = items
        self.maxstring = self.maxlong = self.maxother = REPR_CHARS
        self.left = REPR_CHARS

    def repr(self, x: Any) -> str:
        self.left = REPR_CHARS
        return super().repr(x)

    def repr1(self, x: Any, level: int) -> str:
        if self.left <= 0:
            return "..."
        before = self.left
        text = super().repr1(x, level)
        inner = before - self.left  # what the elements' own calls counted already
        self.left -= max(0, len(text) - inner)
        return text

    def _items(self, x: Any, level: int, most: int, item: Callable[[Any], str]) -> str:
        if level <= 0:
            return "..."
        parts = [item(k) for k in islice(x, most)]
        if len(x) > most:
            parts.append("...")
        return ", ".join(parts)

    def repr_dict(self, x: Any, level: int) -> str:
        if not x:
            return "{}"
        body = self._items(
            x,
            level,
            self.maxdict,
            lambda k: f"{self.repr1(k, level - 1)}: {self.repr1(x[k], level - 1)}",
        )
        return f"{{{body}}}"

    def repr_set(self, x: Any, level: int) -> str:
        if not x:
            return "set()"
        return f"{{{self._items(x, level, self.maxset, lambda k: self.repr1(k, level - 1))}}}"

    def repr_frozenset(self, x: Any, level: int) -> str:
        if not x:
            return "frozenset()"
        body = self._items(x, level, self.maxfrozenset, lambda k: self.repr1(k, level - 1))
        return f"frozenset({{{body}}})"


def _repr(value: Any) -> str:
    """``value``'s repr, cut short; a container's without writing it whole."""
    if isinstance(value, (str, bytes, int, float, complex)) or value is None:
        return _short(repr(value))
    return _short(_BoundedRepr().repr(value))


def _type_name(value: Any) -> str:
    kind = type(value)
    module = kind.__module__
    name = str(kind.__qualname__)
    return name if module == "builtins" else f"{module}.{name}"


def _number(x: Any) -> float:
    """A JSON-safe float (NaN and infinities as JSON's extensions: Python's json reads them)."""
    return float(x)


def _pieces(x: Any, size: int, flat: Callable[[Any], Any]) -> Iterator[Any]:
    """``x``'s elements as views of its memory of at most ``size`` elements each: ``flat(x)`` (a
    1-d view of ``x`` when it is contiguous, else None) cut in runs, else slices along the first
    dimension, a slice that is still too big in pieces of its own. Never a copy: a piece's
    conversion to float64 is the most a summary copies at once."""
    whole = flat(x)
    if whole is not None:
        for start in range(0, int(whole.shape[0]), size):
            yield whole[start : start + size]
        return
    rows = int(x.shape[0])
    per_row = math.prod(int(n) for n in x.shape[1:])
    step = max(1, size // max(per_row, 1))
    for start in range(0, rows, step):
        if per_row <= size:
            yield x[start : start + step]
        else:  # one row is more than a piece: its own pieces
            yield from _pieces(x[start], size, flat)


def _torch(value: Any, out: dict[str, Any]) -> None:
    torch = sys.modules["torch"]
    t = value.detach()
    out["shape"] = [int(n) for n in t.shape]
    out["dtype"] = str(t.dtype).replace("torch.", "")
    out["device"] = str(t.device)
    if t.dtype != torch.bool:
        inexact = t.is_floating_point() or t.is_complex()
        nan = inf = 0
        squares = 0.0
        for part in _pieces(t, CHUNK, _torch_flat):
            wide, owned = _torch_wide(torch, part)
            if inexact:
                finite = torch.isfinite(wide)
                bad = wide.numel() - int(finite.sum().item())
                if bad:
                    some_nan = int(torch.isnan(wide).sum().item())
                    nan, inf = nan + some_nan, inf + bad - some_nan
                    finite.logical_not_()  # now: not finite
                    # a copy of the piece is ours to change; the piece itself is the user's
                    wide = (
                        wide.masked_fill_(finite, 0.0) if owned else wide.masked_fill(finite, 0.0)
                    )
            squares += float(torch.dot(wide, wide).item())
        out["nan"], out["inf"], out["norm"] = nan, inf, math.sqrt(squares)
    if t.dim() == 0:
        out["number"] = _number(t.item().real if t.is_complex() else t.item())


def _torch_wide(torch: Any, part: Any) -> tuple[Any, bool]:
    """A piece as a 1-d float64 tensor (of its elements' magnitudes, when complex), and whether
    it is a copy: one copy at most (``.to`` keeps a transposed piece's strides, and flattening
    that would copy it again)."""
    owned = part.is_complex()
    if owned:
        part = part.abs()
    if part.dtype == torch.float64 and part.is_contiguous():
        return part.view(-1), owned
    wide = torch.empty(part.shape, dtype=torch.float64, device=part.device)
    return wide.copy_(part).view(-1), True


def _torch_flat(t: Any) -> Any:
    return t.view(-1) if t.is_contiguous() else None


def _numpy_flat(a: Any) -> Any:
    return a.reshape(-1) if a.flags.c_contiguous else None  # a view, then


def _numpy(value: Any, out: dict[str, Any]) -> None:
    np = sys.modules["numpy"]
    a = np.asarray(value)
    out["shape"] = [int(n) for n in a.shape]
    out["dtype"] = str(a.dtype)
    if np.issubdtype(a.dtype, np.number):
        inexact = np.issubdtype(a.dtype, np.inexact)
        nan = inf = 0
        squares = 0.0
        for part in _pieces(a, CHUNK, _numpy_flat):
            # a C-ordered copy (one: astype keeps a transposed piece's order), ours to change
            mag = np.abs(part) if np.iscomplexobj(part) else part
            wide = np.array(mag, dtype=np.float64, order="C").reshape(-1)
            if inexact:
                finite = np.isfinite(wide)
                bad = wide.size - int(finite.sum())
                if bad:
                    some_nan = int(np.isnan(wide).sum())
                    nan, inf = nan + some_nan, inf + bad - some_nan
                    wide[~finite] = 0.0
            squares += float(np.dot(wide, wide))
        out["nan"], out["inf"], out["norm"] = nan, inf, math.sqrt(squares)
    if a.ndim == 0 and np.issubdtype(a.dtype, np.number):
        out["number"] = _number(a.real.item() if np.iscomplexobj(a) else a.item())


def summarize(value: Any) -> dict[str, Any]:
    """The JSON-able description of ``value`` (see the module's docstring)."""
    if type(value).__name__ == "DTensor" and callable(getattr(value, "to_local", None)):
        shard = summarize(value.to_local())  # this rank's shard: nothing global, no collective
        shard.update(type=_type_name(value), local=True)
        return shard
    out: dict[str, Any] = {"type": _type_name(value)}
    module = type(value).__module__ or ""
    if module.startswith("torch") and "torch" in sys.modules and hasattr(value, "detach"):
        _torch(value, out)
        if "number" in out:
            out["repr"] = _short(repr(out["number"]))
        return out
    if module.startswith("numpy") and "numpy" in sys.modules and hasattr(value, "dtype"):
        _numpy(value, out)
        if "number" in out:
            out["repr"] = _short(repr(out["number"]))
        return out
    if isinstance(value, (int, float)) and not isinstance(value, bool):
        out["number"] = _number(value)
    out["repr"] = _repr(value)
    return out


def describe(source: str, globals_: Any, locals_: Any) -> str:
    """``source`` evaluated in a frame's namespaces, described as a JSON text."""
    try:
        value = eval(compile(source, "<tether eval>", "eval"), globals_, locals_)
    except Exception as exc:
        return json.dumps({"error": _short(f"{type(exc).__name__}: {exc}")})
    try:
        out = summarize(value)
    except Exception as exc:  # a value that cannot be described: its repr at least
        try:
            text = _repr(value)
        except Exception:
            text = f"<{_type_name(value)}>"
        out = {
            "type": _type_name(value),
            "repr": _short(text),
            "note": _short(f"{type(exc).__name__}: {exc}"),
        }
    return json.dumps(out, allow_nan=True)
