"""The unattended stop's ``suspend`` (``--on-unattended-stop suspend``): what the worker evaluates
in the paused processes, and what their answers mean.

Theory of operation
-------------------
When :class:`protocol_specs.session.attention.Attention` decides :class:`Suspend`, the driver
(:mod:`worker_shim.session.driver`) evaluates :data:`SOURCE` in the top frame of the stopped thread
of every paused process of the run, as the worker's own requests (the cross-rank evaluation's
machinery, :mod:`worker_shim.session.rank_eval`, with :data:`SUSPEND_WAIT`: the program's function
saves a checkpoint, which uploads). Each process answers ``[ran, step]``: whether its
``tether.on_suspend`` function was registered and ran, and its latest checkpoint's step. A process
whose program never imported tether answers ``[False, None]`` (tether is not imported for it).

:func:`outcome` reads the answers: at least one ran and none failed, the run can be suspended (the
driver asks the relay to preempt the attempt with ``suspend``, as the run's worker, and ends the
program); else why not, in one line, and the run's ``unattended_fallback`` acts.
"""

from __future__ import annotations

import ast
from dataclasses import dataclass

from protocol_specs.session.rank_values import RankValue

__all__ = ["SOURCE", "SUSPEND_WAIT", "Outcome", "SuspendAsk", "outcome", "suspended_text"]

#: seconds each paused process has for its ``tether.on_suspend`` function (a save uploads)
SUSPEND_WAIT = 600.0
#: evaluated in each paused process: ``[ran, step]`` (tether imported only if the program did)
SOURCE = (
    "(lambda t: [t._tether_suspend(), t.latest_checkpoint()] "
    "if hasattr(t, '_tether_suspend') else [False, None])"
    "(__import__('sys').modules.get('tether'))"
)
NO_FUNCTION = "the program registered no tether.on_suspend function"


@dataclass(frozen=True)
class SuspendAsk:
    """Who waits for a suspend's evaluation (the driver's, numbered)."""

    number: int


@dataclass(frozen=True)
class Outcome:
    ok: bool
    why: str = ""  #: why not, one line
    step: int | None = None  #: the latest checkpoint's step of the processes that ran it


def outcome(values: list[RankValue]) -> Outcome:
    """What the paused processes answered (``running``: not paused, not asked)."""
    ran, steps, failures = 0, [], []
    for value in values:
        if value.state == "error":
            failures.append(value.error or "no answer")
            continue
        if value.state != "value":
            continue
        try:
            said = ast.literal_eval(value.repr)
        except (ValueError, SyntaxError, MemoryError, RecursionError):
            failures.append(f"unexpected answer {value.repr!r}")
            continue
        if isinstance(said, list) and len(said) == 2 and said[0] is True:
            ran += 1
            if isinstance(said[1], int):
                steps.append(said[1])
    if failures:
        return Outcome(False, failures[0])
    if not ran:
        return Outcome(False, NO_FUNCTION if values else "no process of the run is paused")
    return Outcome(True, step=min(steps) if steps else None)


def suspended_text(run: str, waited: float, step: int | None) -> str:
    """The notice of a suspended run."""
    minutes = f"{waited / 60:.3g} min" if waited >= 60 else f"{waited:g} s"
    start = f"from step {step}" if step is not None else "from its latest checkpoint"
    return (
        f"Run {run} suspended after {minutes} with no IDE: tether resume {run} continues it {start}"
    )


def cannot_text(run: str, why: str, fallback: str) -> str:
    """The notice of a suspend that could not be done."""
    hint = "" if why == NO_FUNCTION else f" ({NO_FUNCTION}?)" if "no answer" in why else ""
    return f"Run {run} cannot suspend: {why}{hint}; --unattended-fallback {fallback} acts"
