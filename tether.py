"""tether's API for the program it runs: report metrics, read a sweep trial's parameters, stop when
the sweep says so, save checkpoints that the next attempt resumes from.

    import tether

    for step, batch in enumerate(loader):
        loss = train_step(batch)
        tether.report(step=step, loss=loss)   # a no-op outside tether
        if tether.should_stop():              # a sweep's early stopping pruned this trial
            break
        if tether.should_preempt():           # preempted or paused: save, then exit
            break

Checkpoints follow the run: whatever the program writes in :func:`checkpoint_dir` is stored by
:func:`save_checkpoint` (only what changed is sent), and a retried or resumed attempt, on any
worker, starts with the latest checkpoint restored there::

    start = tether.latest_checkpoint()        # None: a fresh start
    if start is not None:
        state = torch.load(tether.checkpoint_dir() / "state.pt")
    for step in range(0 if start is None else start + 1, steps):
        ...
        if step % 100 == 0:
            torch.save(state, tether.checkpoint_dir() / "state.pt")
            tether.save_checkpoint(step)      # returns once the checkpoint is stored

With several processes (ranks), rank 0 writes and saves; or every rank writes its own shard, then a
barrier, then every rank calls ``save_checkpoint(step)``: the saves of one step that overlap are
one save. On a run over several nodes each node's directory is saved and the next attempt restores
all of them on every node.

Outside a tether run, :func:`report` does nothing, :func:`params` is ``{}`` and
:func:`should_stop` and :func:`should_preempt` are False, :func:`checkpoint_dir` is
``$TETHER_CHECKPOINT_DIR`` or ``./checkpoints``, :func:`save_checkpoint` does nothing and
:func:`latest_checkpoint` is ``None``, so the same program runs anywhere. The standard library only: the
worker puts this file on the program's ``PYTHONPATH``, in whatever Python environment the program
uses (the worker's is not needed). What it sends is read by ``protocol_specs/runs/metrics.py``.
"""

from __future__ import annotations

import json
import math
import os
import socket
import sys
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

__all__ = [
    "CheckpointError",
    "checkpoint_dir",
    "latest_checkpoint",
    "on_suspend",
    "params",
    "report",
    "save_checkpoint",
    "should_preempt",
    "should_stop",
    "trial",
]

_SOCKET = "TETHER_METRICS_SOCKET"
_STOP = "TETHER_STOP_FILE"
_PREEMPT = "TETHER_PREEMPT_FILE"
#: how often :func:`should_preempt` looks at its file at most (a stat), in seconds
PREEMPT_LOOK_EVERY = 0.5
_PARAMS = "TETHER_PARAMS"
_TRIAL = "TETHER_TRIAL"
_WHEN = "TETHER_DEBUG_WHEN"
_CHECKPOINT_DIR = "TETHER_CHECKPOINT_DIR"
_CHECKPOINT_STEP = "TETHER_CHECKPOINT_STEP"
#: what a --debug-when condition may call (``protocol_specs/runs/metrics.py`` checks it at submit)
_FUNCTIONS = {
    "isnan": math.isnan, "isinf": math.isinf, "isfinite": math.isfinite,
    "abs": abs, "min": min, "max": max,
}  # fmt: skip
#: how long a report that met --debug-when waits for the worker to say whether to pause
PAUSE_ASK_TIMEOUT = 120.0

_lock = threading.Lock()
_state: dict[str, Any] = {"sock": None, "pid": 0, "step": 0, "off": False, "when": None}
#: the step this process last saved (it outranks the one restored)
_saved: dict[str, int] = {}


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
        try:
            point[name] = float(value)
        except OverflowError:
            raise ValueError(f"tether.report: {name} is too large for a float") from None
    if not point:
        raise ValueError("tether.report: give at least one metric, e.g. loss=0.42")
    if len(point) > 64:
        raise ValueError("tether.report: at most 64 metrics in one report")
    pause = False
    with _lock:
        if step is None:
            step = _state["step"]
        elif type(step) is not int or step < 0:
            raise ValueError(f"tether.report: step must be an int from 0, not {step!r}")
        _state["step"] = step + 1
        data = json.dumps([step, time.time(), point]).encode() + b"\n"
        try:
            _socket(path).sendall(data)
            pause = _met(step, point) and _may_pause(step, point)
        except OSError:  # the worker is gone: the run is ending; never break the program for it
            _state["off"] = True
            return
    if pause:
        _pause(sys._getframe(1), step)


def _met(step: int, point: dict[str, float]) -> bool:
    """Whether this report meets the run's ``--debug-when`` condition (checked until it first
    does, in each process)."""
    when = _state["when"]
    if when is None:
        text = os.environ.get(_WHEN, "")
        when = _state["when"] = compile(text, "<debug-when>", "eval") if text else False
    if when is False:
        return False
    try:
        met = bool(eval(when, {"__builtins__": {}}, {**_FUNCTIONS, **point, "step": step}))
    except Exception:  # a name this report lacks, a division by zero: not met
        return False
    if not met:
        return False
    _state["when"] = False  # once
    hooks = sys.modules.get("_tether_hooks")
    if hooks is None or not hooks.can_pause():  # a sweep's one pause is not spent here
        _cannot_pause(step)
        return False
    return True


def _may_pause(step: int, point: dict[str, float]) -> bool:
    """Ask the worker whether to pause (a sweep pauses its first trial to meet the condition,
    not every one): a line on this process's connection, and its answer."""
    sock = _state["sock"]
    request = json.dumps({"pause": [step, point]}).encode() + b"\n"
    sock.sendall(request)
    sock.settimeout(PAUSE_ASK_TIMEOUT)
    answer = b""
    try:
        while not answer.endswith(b"\n"):
            got = sock.recv(64)
            if not got:
                return False
            answer += got
    except TimeoutError:
        return False
    finally:
        sock.settimeout(None)
    return answer.strip() == b"pause"


def _pause(frame: Any, step: int) -> None:
    """Stop here, in the caller's frame, under the debugger (the worker's boot script knows
    how); the IDE that attaches sees the values that met the condition."""
    hooks = sys.modules.get("_tether_hooks")
    if hooks is None or not hooks.pause_here(frame):
        _cannot_pause(step)


def _cannot_pause(step: int) -> None:
    print(
        f"tether: --debug-when was met at step {step}, but this process cannot be paused "
        "(it runs without tether's debugger, or is a fork of the process that does)",
        file=sys.stderr,
    )


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


_preempt: dict[str, Any] = {"looked": None, "yes": False}


def should_preempt() -> bool:
    """Whether this attempt is preempted (``tether preempt``, ``tether pause``, a scheduler's
    warning, the worker pool stopping): save a checkpoint and exit; the run's next attempt
    resumes from it. Cheap enough for every step (at most one ``stat`` per 0.5 s; once true, it
    stays true). The program also gets ``SIGUSR1`` if it traps it; one that does not exit is
    ended after the run's ``--preempt-grace``. False outside tether."""
    if _preempt["yes"]:
        return True
    now = time.monotonic()
    looked = _preempt["looked"]
    if looked is not None and now - looked < PREEMPT_LOOK_EVERY:
        return False
    _preempt["looked"] = now
    path = os.environ.get(_PREEMPT)
    _preempt["yes"] = bool(path) and os.path.exists(path)  # type: ignore[arg-type]
    return bool(_preempt["yes"])


def params() -> dict[str, Any]:
    """This sweep trial's parameters (``{"lr": 0.001, "bs": 32}``); ``{}`` outside a sweep."""
    text = os.environ.get(_PARAMS)
    return dict(json.loads(text)) if text else {}


def trial() -> int | None:
    """This run's trial number in its sweep (from 0); ``None`` outside a sweep."""
    text = os.environ.get(_TRIAL)
    return int(text) if text else None


class CheckpointError(Exception):
    """A checkpoint could not be stored (over the relay's limit, the relay unreachable): the
    message is one line saying why. Earlier checkpoints are intact."""


def checkpoint_dir() -> Path:
    """The directory whose files :func:`save_checkpoint` stores, and where a new attempt finds
    the latest checkpoint restored (``$TETHER_CHECKPOINT_DIR``; outside tether, that or
    ``./checkpoints``); created if missing."""
    path = Path(os.environ.get(_CHECKPOINT_DIR) or "checkpoints")
    path.mkdir(parents=True, exist_ok=True)
    return path


def latest_checkpoint() -> int | None:
    """The step of the latest checkpoint: the one this process saved last, else the one restored
    in :func:`checkpoint_dir` before the program started; ``None``: none (a fresh start)."""
    if "step" in _saved:
        return _saved["step"]
    text = os.environ.get(_CHECKPOINT_STEP, "")
    return int(text) if text.isdigit() else None


def save_checkpoint(step: int) -> dict[str, Any]:
    """Store :func:`checkpoint_dir` as the checkpoint of ``step`` (only the parts the relay does
    not hold yet are sent); returns once it is stored, with what was stored (``step``, ``count``
    files, ``size`` bytes, ``sent`` bytes, ``complete``: every node of the run saved the step).
    :class:`CheckpointError` if it cannot be. Outside tether: ``{}``, nothing done."""
    if type(step) is not int or step < 0:
        raise ValueError(f"tether.save_checkpoint: step must be an int from 0, not {step!r}")
    path = os.environ.get(_SOCKET)
    if not path or not os.environ.get(_CHECKPOINT_DIR):
        return {}
    request = json.dumps({"checkpoint": step}).encode() + b"\n"
    answer = b""
    # a connection of its own: a save may take minutes, reports from other threads go on meanwhile
    try:
        with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as sock:
            sock.connect(path)
            sock.sendall(request)
            while not answer.endswith(b"\n"):
                got = sock.recv(4096)
                if not got:
                    break
                answer += got
    except OSError as exc:
        raise CheckpointError(f"cannot reach the worker to save step {step}: {exc}") from None
    try:
        said = json.loads(answer)
    except ValueError:
        said = None
    if not isinstance(said, dict) or not isinstance(said.get("stored"), dict):
        error = said.get("error") if isinstance(said, dict) else None
        raise CheckpointError(str(error or f"the worker did not store step {step} (it is ending)"))
    _saved["step"] = step
    return dict(said["stored"])


#: the function a suspend calls (``on_suspend``); a list so the worker's call sees the latest
_on_suspend: list[Callable[[], object] | None] = [None]


def on_suspend(fn: Callable[[], object] | None) -> None:
    """Register ``fn`` to be called when the run is suspended while it is paused at a breakpoint
    with no IDE attached (``--on-unattended-stop suspend``): it saves what the next attempt needs,
    typically ``tether.save_checkpoint(step)``. The last registration wins; ``None`` clears it.
    Without one, the suspend cannot be done and ``--unattended-fallback`` acts."""
    if fn is not None and not callable(fn):
        raise TypeError(f"tether.on_suspend: expected a function or None, not {fn!r}")
    _on_suspend[0] = fn


def _tether_suspend() -> bool:
    """Called by the worker (a debugger evaluation in the paused thread's top frame): run the
    ``on_suspend`` function; False if none is registered. If it raises, a ``RuntimeError`` whose
    message is one line says why."""
    fn = _on_suspend[0]
    if fn is None:
        return False
    try:
        fn()
    except BaseException as exc:
        why = " ".join(str(exc).split())[:300]
        raise RuntimeError(
            f"its tether.on_suspend function raised {type(exc).__name__}"
            + (f": {why}" if why else "")
        ) from None
    return True
