"""tether's API for the program it runs: report metrics, read a sweep trial's parameters, stop when
the sweep says so.

    import tether

    for step, batch in enumerate(loader):
        loss = train_step(batch)
        tether.report(step=step, loss=loss)   # a no-op outside tether
        if tether.should_stop():              # a sweep's early stopping pruned this trial
            break

Outside a tether run, :func:`report` does nothing, :func:`params` is ``{}`` and
:func:`should_stop` is False, so the same program runs anywhere. The standard library only: the
worker puts this file on the program's ``PYTHONPATH``, in whatever Python environment the program
uses (the worker's is not needed). What it sends is read by ``protocol_specs/metrics.py``.
"""

from __future__ import annotations

import json
import os
import socket
import threading
import time
from typing import Any

__all__ = ["params", "report", "should_stop", "trial"]

_SOCKET = "TETHER_METRICS_SOCKET"
_STOP = "TETHER_STOP_FILE"
_PARAMS = "TETHER_PARAMS"
_TRIAL = "TETHER_TRIAL"

_lock = threading.Lock()
_state: dict[str, Any] = {"sock": None, "pid": 0, "step": 0, "off": False}


def report(step: int | None = None, **values: Any) -> None:
    """Report metrics at ``step``: ``tether.report(step=100, loss=0.42, acc=0.91)``.

    Values are numbers (a float, an int, a numpy scalar, a one-element tensor: anything
    ``float()`` takes); ``step`` an int from 0, or left out: one more than this process's last.
    NaN and infinities are reported as they are. ``TypeError`` or ``ValueError`` for what is not
    a metric. Outside tether this returns at once.
    """
    if _state["off"]:
        return
    path = os.environ.get(_SOCKET)
    if not path:
        _state["off"] = True
        return
    point = {}
    for name, value in values.items():
        if isinstance(value, bool) or isinstance(value, str | bytes):
            raise TypeError(f"tether.report: {name} must be a number, not {type(value).__name__}")
        point[name] = float(value)
    if not point:
        raise ValueError("tether.report: give at least one metric, e.g. loss=0.42")
    if len(point) > 64:
        raise ValueError("tether.report: at most 64 metrics in one report")
    with _lock:
        if step is None:
            step = _state["step"]
        elif type(step) is not int or step < 0:
            raise ValueError(f"tether.report: step must be an int from 0, not {step!r}")
        _state["step"] = step + 1
        data = json.dumps([step, time.time(), point]).encode() + b"\n"
        try:
            _socket(path).sendall(data)
        except OSError:  # the worker is gone: the run is ending; never break the program for it
            _state["off"] = True


def _socket(path: str) -> socket.socket:
    """One connection per process (a forked child makes its own: two processes writing into one
    would interleave their lines)."""
    if _state["sock"] is None or _state["pid"] != os.getpid():
        sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        try:
            sock.connect(path)
        except OSError:
            sock.close()
            raise
        _state["sock"], _state["pid"] = sock, os.getpid()
    return _state["sock"]  # type: ignore[no-any-return]


def should_stop() -> bool:
    """Whether tether asked the program to stop early (a sweep pruned this trial): finish up
    (save what you need) and exit. A program that does not ask is cancelled a little later."""
    path = os.environ.get(_STOP)
    return bool(path) and os.path.exists(path)


def params() -> dict[str, Any]:
    """This sweep trial's parameters (``{"lr": 0.001, "bs": 32}``); ``{}`` outside a sweep."""
    text = os.environ.get(_PARAMS)
    return dict(json.loads(text)) if text else {}


def trial() -> int | None:
    """This run's trial number in its sweep (from 0); ``None`` outside a sweep."""
    text = os.environ.get(_TRIAL)
    return int(text) if text else None
