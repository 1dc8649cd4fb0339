"""A pause must not kill a ``torch.distributed`` job: in a debug run, every process group gets a
long timeout from the moment it is created.

Why at creation. A collective keeps the timeout it was started with: gloo passes it to the
transport's wait when the op starts (measured with torch 2.13, gloo on the CPU: a rank waiting in an
``all_reduce`` with a 3 s timeout, raised to 60 s by ``torch.distributed._set_pg_timeout`` 0.5 s into
the wait, still fails at 3 s); NCCL's watchdog compares each work's elapsed time with the
``opTimeout_`` copied into the ``WorkNCCL`` when it was enqueued (``WorkNCCL::checkTimeout``,
``ProcessGroupNCCL.cpp``). So raising the timeouts when a rank pauses, as
``torch.distributed.breakpoint()`` does for its own pdb session, cannot save the peers that are
already waiting for it, and a pause in a rank is unannounced to the others. What holds, for both:
the work's timeout is long from the start, because the group's timeout is.

How. Loaded by ``_tether_sitecustomize.py`` in every Python process of a debug run (the worker puts
that ``sitecustomize`` on ``PYTHONPATH`` and sets :data:`ENV`), :func:`install` adds an import hook
that, as soon as ``torch.distributed.distributed_c10d`` has run and before ``torch.distributed``
re-exports its names, wraps the functions that create process groups (:data:`CREATORS`): each
gets ``timeout=max(the user's, the floor)``, the floor being :data:`ENV` (seconds, or ``90m``,
``24h``, ``2d``; ``0`` turns it off). The store ``init_process_group`` rendezvouses through gets the
same timeout (torch passes it on). Nothing is imported early: a program that never imports torch
sees only the hook in ``sys.meta_path``.

Where it cannot hold (the docs say so, and so does the rank's output): a pause longer than the
floor; a timeout given to one call (``monitored_barrier(timeout=)``, ``work.wait(timeout)``); a
process that skips ``sitecustomize`` (``python -S``, ``-E``, ``-I``, or a cleared environment); a
torch whose ``distributed_c10d`` lacks these functions (said once, on stderr).

``torch.distributed.breakpoint()`` stops in the debugger. torch's own runs pdb on one rank (after
raising the groups' timeouts) while the others wait in a barrier; under a debugger pdb takes the
thread's tracing from it and reads a stdin that is not the user's terminal. So, once the process
has called ``init_process_group`` (``torch.distributed`` is whole then), the pdb it makes
(:data:`PDB_FACTORIES`) is :class:`DebuggerStop`: the rank stops in the frame that called
``torch.distributed.breakpoint()``, at its next line, past the barrier every rank goes through
(the group's stop then pauses every rank: all of them are at the line after theirs). Without a
configured debugger, torch's pdb as before. ``TETHER_COLLECTIVE_TIMEOUT=0`` keeps this too.

Standalone and stdlib-only (it runs on the user's interpreter); never raises into the program.
"""

from __future__ import annotations

import functools
import inspect
import os
import sys
from collections.abc import Callable, Mapping
from typing import Any

#: the floor of every process group's timeout in a debug run (set by the worker)
ENV = "TETHER_COLLECTIVE_TIMEOUT"
#: the module whose process-group creators are wrapped
C10D = "torch.distributed.distributed_c10d"
#: every public way (and DeviceMesh's private one) to create a process group, each with ``timeout``
CREATORS = ("init_process_group", "new_group", "_new_group_with_tag", "split_group")
#: what ``torch.distributed.breakpoint()`` calls for its pdb (torch >= 2.6; before: the class)
PDB_FACTORIES = ("_make_distributed_pdb", "_DistributedPdb")
_UNITS = {"s": 1, "m": 60, "h": 3600, "d": 86400}


def parse_seconds(text: str | None) -> float | None:
    """``"86400"``, ``"90m"``, ``"24h"``, ``"2d"`` -> seconds (float); ``None`` for anything else
    (empty, negative, not a number)."""
    text = (text or "").strip().lower()
    unit = _UNITS.get(text[-1:], None) if text else None
    number = text[:-1] if unit is not None else text
    try:
        value = float(number) * (unit or 1)
    except ValueError:
        return None
    return value if value >= 0 and value == value and value != float("inf") else None


def raised(given: float | None, floor: float) -> float:
    """The timeout (seconds) a group gets: the user's ``given`` (``None``: torch's default, which
    is below any sensible floor: 10 or 30 minutes) raised to ``floor``; never lowered."""
    return floor if given is None else max(given, floor)


def describe(seconds: float) -> str:
    """``86400`` -> ``"24h"``, ``90`` -> ``"90s"``: the biggest whole unit up to hours."""
    for unit in ("h", "m"):
        if seconds >= _UNITS[unit] and seconds % _UNITS[unit] == 0:
            return f"{int(seconds // _UNITS[unit])}{unit}"
    return f"{seconds:g}s"


def wrap(c10d: Any, floor: float, say: Callable[[str], Any]) -> str | None:
    """Wrap :data:`CREATORS` in the module ``c10d`` so each group's timeout is raised to
    ``floor``; ``say(line)`` is told once per process, at the first group. ``None`` when done,
    else why not (nothing is wrapped then)."""
    from datetime import timedelta

    found: dict[str, Any] = {name: getattr(c10d, name, None) for name in CREATORS}
    missing = [name for name, fn in found.items() if not callable(fn)]
    if missing:
        return f"{C10D} has no {', '.join(missing)}"
    signatures: dict[str, inspect.Signature] = {}
    for name, fn in found.items():
        try:
            signature = inspect.signature(fn)
        except (TypeError, ValueError) as exc:
            return f"{name}: {exc}"
        if "timeout" not in signature.parameters:
            return f"{name}{signature} takes no timeout"
        signatures[name] = signature
    told: list[str] = []

    def wrapped(name: str, fn: Any, signature: inspect.Signature) -> Any:
        @functools.wraps(fn)
        def create(*args: Any, **kwargs: Any) -> Any:
            try:
                bound = signature.bind_partial(*args, **kwargs)
            except TypeError:
                return fn(*args, **kwargs)  # torch says what is wrong with the call
            given = bound.arguments.get("timeout")
            seconds = given.total_seconds() if isinstance(given, timedelta) else None
            if given is None or seconds is not None:
                new = raised(seconds, floor)
                if new != seconds:
                    bound.arguments["timeout"] = timedelta(seconds=new)
                    if not told:
                        told.append(name)
                        was = "torch's default" if seconds is None else describe(seconds)
                        say(
                            f"tether: debug run: torch.distributed process groups get a timeout "
                            f"of {describe(new)} (not {was}), so a paused rank does not end the "
                            f"job ({ENV}={describe(floor)}; 0 turns this off)"
                        )
            return fn(*bound.args, **bound.kwargs)

        create.__tether_raised__ = True  # type: ignore[attr-defined]
        return create

    for name, fn in found.items():
        if not getattr(fn, "__tether_raised__", False):
            setattr(c10d, name, wrapped(name, fn, signatures[name]))
    return None


class DebuggerStop:
    """The pdb ``torch.distributed.breakpoint()`` gets in a debug run: :meth:`set_trace` stops the
    frame that called it in the debugger; torch's own pdb (``fallback()``) where it cannot."""

    def __init__(self, fallback: Callable[[], Any]) -> None:
        self.fallback = fallback
        self.said: list[str] = []

    def message(self, text: str) -> None:
        self.said.append(text)  # pdb's ("Type 'up' to get to the frame..."): for pdb alone

    def set_trace(self, frame: Any = None) -> None:
        caller = frame or sys._getframe(1)
        while caller is not None and caller.f_globals.get("__name__", "").startswith("torch."):
            caller = caller.f_back  # torch.distributed.breakpoint -> whoever called it
        stop = getattr(sys.modules.get("_tether_breakpoint"), "stop_here", None)
        if caller is not None and callable(stop) and stop(caller):
            return
        pdb = self.fallback()
        for text in self.said:
            pdb.message(text)
        pdb.set_trace(frame or sys._getframe(1))


def map_breakpoint(c10d: Any) -> None:
    """Once ``init_process_group`` (of the module ``c10d``) has run, ``torch.distributed``'s pdb
    for its ``breakpoint()`` is a :class:`DebuggerStop`."""
    create = getattr(c10d, "init_process_group", None)
    if not callable(create) or getattr(create, "__tether_breakpoint__", False):
        return

    @functools.wraps(create)
    def init_process_group(*args: Any, **kwargs: Any) -> Any:
        done = create(*args, **kwargs)
        dist = sys.modules.get("torch.distributed")
        for name in PDB_FACTORIES:
            made = getattr(dist, name, None)
            if callable(made) and not getattr(made, "__tether_breakpoint__", False):
                stop = functools.partial(DebuggerStop, made)
                stop.__tether_breakpoint__ = True  # type: ignore[attr-defined]
                setattr(dist, name, stop)
        return done

    init_process_group.__tether_breakpoint__ = True  # type: ignore[attr-defined]
    c10d.init_process_group = init_process_group


class _AfterC10d:
    """A ``sys.meta_path`` finder that lets the real finders find :data:`C10D`, then runs
    ``then(module)`` right after the module's code, before its importer goes on (so
    ``torch.distributed``'s ``from .distributed_c10d import *`` re-exports the wrapped names)."""

    def __init__(self, then: Callable[[Any], None]) -> None:
        self.then = then

    def find_spec(self, fullname: str, path: Any = None, target: Any = None) -> Any:
        if fullname != C10D:
            return None
        sys.meta_path.remove(self)  # once
        spec = None
        for finder in sys.meta_path:
            find = getattr(finder, "find_spec", None)
            spec = find(fullname, path, target) if find is not None else None
            if spec is not None:
                break
        loader: Any = getattr(spec, "loader", None)
        if spec is None or not hasattr(loader, "exec_module"):
            return spec
        run = loader.exec_module
        then = self.then

        def exec_module(module: Any) -> None:
            run(module)
            then(module)

        try:
            loader.exec_module = exec_module
        except AttributeError:
            return spec
        return spec


def install(
    environ: Mapping[str, str] | None = None, say: Callable[[str], Any] | None = None
) -> float | None:
    """Raise every process group's timeout to :data:`ENV`'s floor in this process, if set (and
    not 0), and map ``torch.distributed.breakpoint()`` to a debugger stop (if set, 0 too);
    ``say``: where the one-line notes go (stderr). Returns the floor, or ``None``."""
    environ = os.environ if environ is None else environ
    say = say or (lambda line: sys.stderr.write(line + "\n"))
    floor = parse_seconds(environ.get(ENV, ""))
    if environ.get(ENV) and floor is None:
        say(f"tether: {ENV}={environ[ENV]!r} is not a duration (86400, 90m, 24h, 2d); ignored")
    if floor is None:  # not a debug run (the worker sets it), or not a duration
        return None
    quiet = environ.get("RANK", "0") != "0"  # one rank's note is the job's: not 64 of them

    def then(module: Any) -> None:
        if floor:
            try:
                why_not = wrap(module, floor, (lambda _line: None) if quiet else say)
            except Exception as exc:  # never the program's problem
                why_not = f"{type(exc).__name__}: {exc}"
            if why_not is not None:
                say(
                    f"tether: cannot raise torch.distributed's timeouts ({why_not}): a rank "
                    "paused longer than a process group's timeout ends the job"
                )
        try:
            map_breakpoint(module)
        except Exception as exc:  # torch's own breakpoint() stays
            say(f"tether: torch.distributed.breakpoint() runs pdb ({type(exc).__name__}: {exc})")

    if C10D in sys.modules:
        then(sys.modules[C10D])  # too late for names imported from it already; the rest holds
    else:
        sys.meta_path.insert(0, _AfterC10d(then))
    return floor or None
