"""The replay plan: what of the IDE side's configuration the shim sends debugpy, and in which order.

Theory of operation
-------------------
The shim folds the run's ``to_worker`` stream into a :class:`~protocol_specs.session.session.DebugSession`
(the IDE side's configuration, compacted: the latest ``setBreakpoints`` per source, the latest
function and exception breakpoints). Before debugpy lets user code run, that configuration is
replayed into it, in this order (:class:`ReplayPhase`):

1. ``initialize``: the IDE's arguments (or :data:`DEFAULT_INITIALIZE`), claiming the reverse
   requests the shim serves itself and no other (:data:`NOT_SUPPORTED`): ``startDebugging``
   (a child process to configure, :mod:`worker_shim.session.processes`) but no ``runInTerminal``;
2. ``attach``: the IDE's arguments, path mappings defaulting to the submitted directory mapped to
   the run directory, pydevd never redirecting output (:func:`pipe_output_attach`). debugpy
   answers it only after ``configurationDone``;
3. once debugpy said ``initialized``: the configuration, one batch at a time
   (:class:`ConfigurationPlan`): what changed since the last batch, until a batch comes back with
   nothing new folded meanwhile. debugpy's answers go to the adapter under the request they
   answer, so the IDE gets the real verification;
4. ``configurationDone``, then the ``attach`` response: the shim is live.

Sans-I/O: :class:`worker_shim.session.core.ShimCore` drives it.
"""

from __future__ import annotations

from collections.abc import Mapping
from enum import Enum
from typing import Any

from protocol_specs.dap.capabilities import VSCODE_INITIALIZE
from protocol_specs.session.session import BreakpointSet, DebugSession

__all__ = [
    "DEFAULT_INITIALIZE",
    "HANDSHAKE_TIMEOUT",
    "NOT_SUPPORTED",
    "TRANSITIONS",
    "ConfigurationPlan",
    "IllegalTransition",
    "ReplayPhase",
    "attach_arguments",
    "cleared",
    "initialize_arguments",
    "next_phase",
    "pipe_output_attach",
]

#: initialize arguments when no IDE ever sent its own (a run started without waiting for one)
DEFAULT_INITIALIZE: dict[str, Any] = {
    **VSCODE_INITIALIZE,
    "clientID": "tether",
    "clientName": "tether worker",
}
#: client capabilities the shim claims towards debugpy, whatever the IDE said: it answers
#: ``startDebugging`` itself (debugpy's standard way to announce a child process; without it,
#: debugpy sends its own ``debugpyAttach`` event, which the shim handles too), and no other
#: reverse request (no terminal on the worker).
NOT_SUPPORTED = {"supportsStartDebuggingRequest": True, "supportsRunInTerminalRequest": False}
#: how long debugpy may take over each step of the replay
HANDSHAKE_TIMEOUT = 60.0


class ReplayPhase(Enum):
    FOLDING = "folding"  #: folding ``to_worker`` until the IDE side is configured
    INITIALIZING = "initializing"  #: ``initialize`` sent
    ATTACHING = "attaching"  #: ``attach`` sent, waiting for debugpy's ``initialized``
    CONFIGURING = "configuring"  #: a batch of configuration requests in flight
    FINISHING = "finishing"  #: ``configurationDone`` sent; waiting for it and ``attach``
    LIVE = "live"  #: replayed: requests are forwarded as they come
    ENDED = "ended"  #: debugpy went away (or the run was terminated) before going live


#: phase -> the phases it may move to (the replay's steps, or its end: debugpy gone, the run
#: terminated, debugpy refusing or not answering). Going live is for good.
TRANSITIONS: dict[ReplayPhase, frozenset[ReplayPhase]] = {
    ReplayPhase.FOLDING: frozenset({ReplayPhase.INITIALIZING, ReplayPhase.ENDED}),
    ReplayPhase.INITIALIZING: frozenset({ReplayPhase.ATTACHING, ReplayPhase.ENDED}),
    ReplayPhase.ATTACHING: frozenset(
        {ReplayPhase.CONFIGURING, ReplayPhase.FINISHING, ReplayPhase.ENDED}
    ),
    ReplayPhase.CONFIGURING: frozenset(
        {ReplayPhase.CONFIGURING, ReplayPhase.FINISHING, ReplayPhase.ENDED}
    ),
    ReplayPhase.FINISHING: frozenset({ReplayPhase.LIVE, ReplayPhase.ENDED}),
    ReplayPhase.LIVE: frozenset(),
    ReplayPhase.ENDED: frozenset(),
}


class IllegalTransition(RuntimeError):
    """A bug in the shim: the replay tried a step its table does not have (state unchanged)."""


def next_phase(phase: ReplayPhase, to: ReplayPhase, why: str) -> ReplayPhase:
    """``to`` if the table allows it from ``phase``; raises :class:`IllegalTransition` naming
    the event (``why``) and both phases otherwise."""
    if to not in TRANSITIONS[phase]:
        raise IllegalTransition(f"replay: {why} in phase {phase.value} cannot lead to {to.value}")
    return to


def initialize_arguments(session: DebugSession) -> dict[str, Any]:
    args = {**(session.initialize_args or DEFAULT_INITIALIZE), **NOT_SUPPORTED}
    args.setdefault("adapterID", "debugpy")
    return args


def attach_arguments(session: DebugSession, workdir: str, run_dir: str) -> dict[str, Any]:
    """The IDE's ``attach``, with path mappings defaulting to ``workdir`` -> ``run_dir``."""
    args = dict(session.attach_args or {})
    # debugpy announces no child of a session attached by "processId" (clients.py
    # ``notify_of_subprocess``); the shim attaches to the port it started anyway
    args.pop("processId", None)
    if not args.get("pathMappings"):
        args["pathMappings"] = [{"localRoot": workdir, "remoteRoot": run_dir}]
    return pipe_output_attach(args)


def pipe_output_attach(attach: Mapping[str, Any]) -> dict[str, Any]:
    """The ``attach`` arguments to send debugpy: pydevd never redirects output, and is told
    (``isOutputRedirected``) that someone else shows stdout, so a REPL ``print`` is not sent twice.

    The IDE gets the program's output from its pipes whatever its ``attach`` said: debugpy's
    default for an attach (no ``redirectOutput``) shows nothing, which is not what a user debugging
    a program on another machine wants, and a later IDE that asks for output must get it too
    (the attach replayed into debugpy is the first IDE's).
    """
    args = dict(attach)
    options = args.get("debugOptions")
    if isinstance(options, list):
        args["debugOptions"] = [o for o in options if o != "RedirectOutput"]
    args["redirectOutput"] = False
    args["isOutputRedirected"] = True
    return args


#: what the worker configures when the run is post-mortem (``spec.post_mortem``) and no IDE
#: configured exception breakpoints: stop on uncaught exceptions (its own request: origin "")
POST_MORTEM = BreakpointSet("setExceptionBreakpoints", {"filters": ["uncaught"]}, [], "", 0)


def configuration(session: DebugSession, *, post_mortem: bool) -> list[BreakpointSet]:
    """``session``'s configuration to replay, with :data:`POST_MORTEM` if it applies: the IDE's
    own exception breakpoints always win (a user who turned uncaught exceptions off)."""
    plan = session.configuration()
    if post_mortem and session.exception_breakpoints is None:
        plan.append(POST_MORTEM)
    return plan


class ConfigurationPlan:
    """Which configuration requests to send next: only the latest state per kind and source ever
    applies, and what was sent already (the same request: origin and seq) is not sent again."""

    def __init__(self, *, post_mortem: bool = False) -> None:
        self._applied: dict[tuple[str, str], tuple[str, int]] = {}
        self.post_mortem = post_mortem

    def __repr__(self) -> str:
        return f"<ConfigurationPlan applied={len(self._applied)}>"

    def next_batch(self, session: DebugSession) -> list[BreakpointSet]:
        batch = []
        for bset in configuration(session, post_mortem=self.post_mortem):
            key = (bset.command, _source_of(bset))
            if self._applied.get(key) == (bset.origin, bset.seq):
                continue
            self._applied[key] = (bset.origin, bset.seq)
            batch.append(bset)
        return batch


def _source_of(bset: BreakpointSet) -> str:
    source = bset.arguments.get("source") or {}
    return str(source.get("path") or source.get("sourceReference") or source.get("name") or "")


def cleared(bset: BreakpointSet) -> BreakpointSet:
    """The request that takes away what ``bset`` set (no breakpoints of its kind and source)."""
    if bset.command == "setExceptionBreakpoints":
        arguments: dict[str, Any] = {"filters": []}
    elif bset.command == "setBreakpoints":
        arguments = {"source": bset.arguments.get("source") or {}, "breakpoints": []}
    else:
        arguments = {"breakpoints": []}
    return BreakpointSet(bset.command, arguments, [], "", 0)
