"""The capabilities tether's adapter answers ``initialize`` with, pinned to the worker's debugpy.

``DEBUGPY_CAPABILITIES`` is debugpy 1.8.22's ``initialize`` response body, as observed
(``shared/research/dap.md`` §3; debugpy ``adapter/clients.py``). It depends only on the client's
``initialize``, not on the program, so the adapter can answer before any worker exists. The worker
installs exactly this debugpy version; if the one it talks to answers differently, the difference is
sent to the IDE as a ``capabilities`` event (:func:`capabilities_delta`).
"""

from __future__ import annotations

from typing import Any

__all__ = [
    "DEBUGPY_CAPABILITIES",
    "DEBUGPY_REQUESTS",
    "DEBUGPY_VERSION",
    "VSCODE_INITIALIZE",
    "capabilities_delta",
    "debugpy_answers",
]

DEBUGPY_VERSION = "1.8.22"

DEBUGPY_CAPABILITIES: dict[str, Any] = {
    "supportsCompletionsRequest": True,
    "supportsConditionalBreakpoints": True,
    "supportsConfigurationDoneRequest": True,
    "supportsDebuggerProperties": True,
    "supportsDelayedStackTraceLoading": True,
    "supportsEvaluateForHovers": True,
    "supportsExceptionInfoRequest": True,
    "supportsExceptionOptions": True,
    "supportsFunctionBreakpoints": True,
    "supportsHitConditionalBreakpoints": True,
    "supportsLogPoints": True,
    "supportsModulesRequest": True,
    "supportsSetExpression": True,
    "supportsSetVariable": True,
    "supportsValueFormattingOptions": True,
    "supportsTerminateDebuggee": True,
    "supportsTerminateRequest": True,
    "supportsGotoTargetsRequest": True,
    "supportsClipboardContext": True,
    "exceptionBreakpointFilters": [
        {
            "filter": "raised",
            "label": "Raised Exceptions",
            "default": False,
            "description": "Break whenever any exception is raised.",
        },
        {
            "filter": "uncaught",
            "label": "Uncaught Exceptions",
            "default": True,
            "description": "Break when the process is exiting due to unhandled exception.",
        },
        {
            "filter": "userUnhandled",
            "label": "User Uncaught Exceptions",
            "default": False,
            "description": "Break when exception escapes into library code.",
        },
    ],
    "supportsStepInTargetsRequest": True,
}


def capabilities_delta(pinned: dict[str, Any], actual: dict[str, Any]) -> dict[str, Any]:
    """What a ``capabilities`` event must carry to turn ``pinned`` into ``actual``.

    The IDE merges the event's capabilities into the ones it has (VS Code ``mergeCapabilities``),
    so a key can be changed or added but not removed: keys that changed or appeared take their new
    value; keys that disappeared take the empty value of their kind, ``False`` for a flag (every
    boolean capability defaults to false in DAP), ``[]`` for a list, ``{}`` for an object. Empty when
    nothing differs. Neither argument is modified.
    """
    delta = {k: v for k, v in actual.items() if k not in pinned or pinned[k] != v}
    for key, value in pinned.items():
        if key not in actual:
            delta[key] = [] if isinstance(value, list) else {} if isinstance(value, dict) else False
    return delta


#: Requests debugpy 1.8.22 answers (pydevd's ``on_<command>_request`` handlers, matched
#: case-insensitively, plus the adapter's own). debugpy's adapter forwards any other request to
#: pydevd with a *blocking* delegate (``adapter/clients.py`` ``Client.request``) and pydevd never
#: answers it, so one unsupported request (``loadedSources``, ``cancel``, ...) would stall every
#: later request of the session. tether's adapter answers those itself instead of forwarding them.
DEBUGPY_REQUESTS = frozenset(
    {
        "attach",
        "completions",
        "configurationdone",
        "continue",
        "debugpysysteminfo",
        "disconnect",
        "evaluate",
        "exceptioninfo",
        "goto",
        "gototargets",
        "initialize",
        "launch",
        "modules",
        "next",
        "pause",
        "pydevdauthorize",
        "pydevdsysteminfo",
        "scopes",
        "setbreakpoints",
        "setdebuggerproperty",
        "setexceptionbreakpoints",
        "setexpression",
        "setfunctionbreakpoints",
        "setpydevdsourcemap",
        "setvariable",
        "source",
        "stacktrace",
        "stepin",
        "stepintargets",
        "stepout",
        "terminate",
        "threads",
        "variables",
    }
)


def debugpy_answers(command: str) -> bool:
    return command.lower() in DEBUGPY_REQUESTS


#: The ``initialize`` arguments VS Code sends when attaching to debugpy (``shared/research/dap.md``
#: §2.2; the same bytes appear in a capture in debugpy #1973). The demo's scripted IDE and the tests
#: speak as VS Code does; the worker uses it when no IDE ever configured the run.
VSCODE_INITIALIZE: dict[str, Any] = {
    "clientID": "vscode",
    "clientName": "Visual Studio Code",
    "adapterID": "debugpy",
    "pathFormat": "path",
    "linesStartAt1": True,
    "columnsStartAt1": True,
    "supportsVariableType": True,
    "supportsVariablePaging": True,
    "supportsRunInTerminalRequest": True,
    "locale": "en",
    "supportsProgressReporting": True,
    "supportsInvalidatedEvent": True,
    "supportsMemoryReferences": True,
    "supportsArgsCanBeInterpretedByShell": True,
    "supportsMemoryEvent": True,
    "supportsStartDebuggingRequest": True,
    "supportsANSIStyling": True,
}
