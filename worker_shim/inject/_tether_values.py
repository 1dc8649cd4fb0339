"""A value described in the process that holds it, for ``tether eval`` and the ``@all`` prefix.

The worker evaluates ``_tether_breakpoint.rank_value(SOURCE, globals(), locals())`` in a paused
rank's frame (``worker_shim/session/rank_eval.py``); that loads this module (once, from beside
itself) and calls :func:`describe`, which evaluates SOURCE in the frame's namespaces and answers
a short JSON text, never the data: ``{"repr", "type"}``, with ``number`` for a number (a 0-d
tensor's or array's too) and, for a torch tensor or a numpy array, ``shape``, ``dtype``,
``device``, ``norm`` (of its finite elements), ``nan`` and ``inf`` counts, computed on the
tensor's own device a chunk at a time (only the scalars are copied out, ``.item()``); or
``{"error": "NameError: name 'loss' is not defined"}``. Short, because debugpy's ``evaluate`` answers a ``repr``.

Loaded by path on the program's interpreter: standalone, stdlib only (torch and numpy are used
only when the value is theirs, from ``sys.modules``).
"""

import json
import math
import sys
from typing import Any

#: the most characters of a repr sent back
REPR_CHARS = 160
#: elements summarized at a time, in float64: a summary of a tensor of any size takes at most
#: 128 MiB more of its device's memory (a paused rank may hold most of its GPU's)
CHUNK = 1 << 24


def _short(text: Any) -> str:
    line = " ".join(str(text).split())
    return line if len(line) <= REPR_CHARS else line[: REPR_CHARS - 3] + "..."


def _type_name(value: Any) -> str:
    kind = type(value)
    module = kind.__module__
    name = str(kind.__qualname__)
    return name if module == "builtins" else f"{module}.{name}"


def _number(x: Any) -> float:
    """A JSON-safe float (NaN and infinities as JSON's extensions: Python's json reads them)."""
    return float(x)


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
        for part in t.reshape(-1).split(CHUNK):
            wide = (part.abs() if part.is_complex() else part).to(torch.float64)
            if inexact:
                finite = torch.isfinite(wide)
                bad = wide.numel() - int(finite.sum().item())
                if bad:
                    some_nan = int(torch.isnan(wide).sum().item())
                    nan, inf = nan + some_nan, inf + bad - some_nan
                    wide = wide.masked_fill(~finite, 0.0)
            squares += float(torch.dot(wide, wide).item())
        out["nan"], out["inf"], out["norm"] = nan, inf, math.sqrt(squares)
    if t.dim() == 0:
        out["number"] = _number(t.item().real if t.is_complex() else t.item())


def _numpy(value: Any, out: dict[str, Any]) -> None:
    np = sys.modules["numpy"]
    a = np.asarray(value)
    out["shape"] = [int(n) for n in a.shape]
    out["dtype"] = str(a.dtype)
    if np.issubdtype(a.dtype, np.number):
        inexact = np.issubdtype(a.dtype, np.inexact)
        nan = inf = 0
        squares = 0.0
        flat = a.reshape(-1)
        for start in range(0, flat.size, CHUNK):
            part = flat[start : start + CHUNK]
            wide = (np.abs(part) if np.iscomplexobj(part) else part).astype(np.float64)
            if inexact:
                finite = np.isfinite(wide)
                bad = wide.size - int(finite.sum())
                if bad:
                    some_nan = int(np.isnan(wide).sum())
                    nan, inf = nan + some_nan, inf + bad - some_nan
                    wide = np.where(finite, wide, 0.0)
            squares += float(np.dot(wide, wide))
        out["nan"], out["inf"], out["norm"] = nan, inf, math.sqrt(squares)
    if a.ndim == 0 and np.issubdtype(a.dtype, np.number):
        out["number"] = _number(a.real.item() if np.iscomplexobj(a) else a.item())


def summarize(value: Any) -> dict[str, Any]:
    """The JSON-able description of ``value`` (see the module's docstring)."""
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
    out["repr"] = _short(repr(value))
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
            text = repr(value)
        except Exception:
            text = f"<{_type_name(value)}>"
        out = {
            "type": _type_name(value),
            "repr": _short(text),
            "note": _short(f"{type(exc).__name__}: {exc}"),
        }
    return json.dumps(out, allow_nan=True)
