"""A value described in the process that holds it, for ``tether eval`` and the ``@all`` prefix.

The worker evaluates ``_tether_breakpoint.rank_value(SOURCE, globals(), locals())`` in a paused
rank's frame (``worker_shim/session/rank_eval.py``); that loads this module (once, from beside
itself) and calls :func:`describe`, which evaluates SOURCE in the frame's namespaces and answers
a short JSON text, never the data: ``{"repr", "type"}``, with ``number`` for a number (a 0-d
tensor's or array's too) and, for a torch tensor or a numpy array, ``shape``, ``dtype``,
``device``, ``norm`` (of its finite elements), ``nan`` and ``inf`` counts, computed on the
tensor's own device (only the scalars are copied out, ``.item()``); or ``{"error": "NameError:
name 'loss' is not defined"}``. Short, because debugpy's ``evaluate`` answers a ``repr``.

Loaded by path on the program's interpreter: standalone, stdlib only (torch and numpy are used
only when the value is theirs, from ``sys.modules``).
"""

import json
import sys
from typing import Any

#: the most characters of a repr sent back
REPR_CHARS = 160


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
    if t.is_floating_point() or t.is_complex():
        bad_nan = torch.isnan(t)
        bad_inf = torch.isinf(t)
        out["nan"] = int(bad_nan.sum().item())
        out["inf"] = int(bad_inf.sum().item())
        finite = t[~(bad_nan | bad_inf)] if out["nan"] or out["inf"] else t
        out["norm"] = float(torch.linalg.vector_norm(finite.to(torch.float64)).item())
    elif t.dtype != torch.bool:
        out["nan"] = out["inf"] = 0
        out["norm"] = float(torch.linalg.vector_norm(t.to(torch.float64)).item())
    if t.dim() == 0:
        out["number"] = _number(t.item().real if t.is_complex() else t.item())


def _numpy(value: Any, out: dict[str, Any]) -> None:
    np = sys.modules["numpy"]
    a = np.asarray(value)
    out["shape"] = [int(n) for n in a.shape]
    out["dtype"] = str(a.dtype)
    if np.issubdtype(a.dtype, np.inexact):
        bad_nan = np.isnan(a)
        bad_inf = np.isinf(a)
        out["nan"] = int(bad_nan.sum())
        out["inf"] = int(bad_inf.sum())
        finite = a[~(bad_nan | bad_inf)]
        wide = finite if np.iscomplexobj(a) else finite.astype(np.float64)
        out["norm"] = float(np.linalg.norm(wide.ravel()))
    elif np.issubdtype(a.dtype, np.number):
        out["nan"] = out["inf"] = 0
        out["norm"] = float(np.linalg.norm(a.astype(np.float64).ravel()))
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
