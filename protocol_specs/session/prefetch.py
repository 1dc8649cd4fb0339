"""Stop-time prefetch: what the IDE asks after a stop, answered before it asks.

Theory of operation
-------------------
After ``stopped``, VS Code asks, one after the other: ``threads``; ``stackTrace`` of the stopped
thread's top frame; the next 19 frames; ``scopes`` of the top frame, then ``variables`` of its
first non-expensive scope; and every watch expression, in parallel (``shared/research/
latency-wan.md``). Each is a round trip to the worker; over a 50 ms link, a quarter of a second
per step. So the worker asks debugpy itself the moment a thread stops (:class:`Gathering`) and
sends the answers after the ``stopped`` event as one :data:`PREFETCH_EVENT`; the adapter keeps
them (:class:`StopCache`) and answers those requests from it, with debugpy's own response (only
``seq`` and ``request_seq`` are the adapter's). The IDE's requests that reach the adapter between
``stopped`` and the prefetch wait for it (a few milliseconds of the worker's time, no round trip).

What is asked: nothing the IDE would not ask. ``threads``; ``stackTrace`` of the stopped thread
(:data:`FRAMES` frames: any slice of them is served, with debugpy's ``totalFrames``); ``scopes``
of the top frame; ``variables`` of its first non-expensive scope (debugpy's own paging: no
``start``/``count``); and ``evaluate`` in the ``watch`` context of the expressions the IDE
evaluated as watches since the previous stop of that process (VS Code re-evaluates them at every
stop anyway). At most :data:`MAX_BYTES` of answers per stop: what does not fit is left out (a
variables answer full of large values, a watch on a tensor) and asked for as usual.

What invalidates (DAP's "Lifetime of Object References": references live while the program is
suspended): a request that runs the program (``continue``, the steps, ``goto``, ...), a new
``stopped``, ``continued``, ``exited``, ``terminated``, ``invalidated``; ``thread`` events drop
``threads``; ``setVariable`` / ``setExpression`` and a ``repl`` evaluation (which may change
anything) drop everything but ``threads``. Only an exact request is answered: arguments such as
``format``, ``filter``, ``start``, ``count`` or another ``context`` go to debugpy.

Both ends use this module; it does no I/O.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import orjson

__all__ = [
    "ENDS_STOP",
    "FRAMES",
    "MAX_BYTES",
    "MAX_WATCHES",
    "PREFETCH_EVENT",
    "RUNS_PROGRAM",
    "STALES",
    "Gathering",
    "StopCache",
    "WatchList",
    "cache_key",
]

#: the DAP event the worker sends after a ``stopped`` (never shown to the IDE): ``body``:
#: ``{"threadId": int, "answers": [{"command", "arguments", "response"}], "skipped": int}``
PREFETCH_EVENT = "tetherPrefetch"
#: frames of the stopped thread fetched at once (VS Code asks 1, then 19 more)
FRAMES = 20
#: the answers of one stop, at most (JSON bytes)
MAX_BYTES = 512 * 1024
#: watch expressions evaluated per stop, at most
MAX_WATCHES = 16

#: requests after which no reference of the stop is valid
RUNS_PROGRAM = frozenset(
    {
        "continue",
        "next",
        "stepIn",
        "stepOut",
        "stepBack",
        "reverseContinue",
        "goto",
        "restartFrame",
        "restart",
        "pause",
        "terminateThreads",
    }
)
#: requests that may change any value: every cached answer but ``threads`` goes
_CHANGES_VALUES = frozenset({"setVariable", "setExpression"})
#: events after which no reference of the stop is valid
ENDS_STOP = frozenset({"stopped", "continued", "exited", "terminated", "invalidated"})
#: events that make some cached answer stale (``thread``: the thread list)
STALES = ENDS_STOP | {"thread"}


def cache_key(command: str, arguments: Any) -> tuple[Any, ...] | None:
    """The key a request is cached under, or ``None`` if its answer is never taken from a cache.
    ``stackTrace`` keys by thread only (any slice is served from :data:`FRAMES` frames)."""
    args = arguments if isinstance(arguments, dict) else {}
    if command == "threads":
        return ("threads",)
    if command == "stackTrace":
        thread = args.get("threadId")
        if not isinstance(thread, int) or set(args) - {"threadId", "startFrame", "levels"}:
            return None
        return ("stackTrace", thread)
    if command == "scopes":
        frame = args.get("frameId")
        return ("scopes", frame) if isinstance(frame, int) and set(args) == {"frameId"} else None
    if command == "variables":
        ref = args.get("variablesReference")
        if not isinstance(ref, int) or set(args) != {"variablesReference"}:
            return None
        return ("variables", ref)
    if command == "evaluate":
        expression, frame = args.get("expression"), args.get("frameId")
        if (
            args.get("context") != "watch"
            or not isinstance(expression, str)
            or not isinstance(frame, int)
            or set(args) - {"expression", "frameId", "context"}
        ):
            return None
        return ("evaluate", expression, frame)
    return None


@dataclass
class StopCache:
    """The answers of the current stop of one process (the adapter's)."""

    answers: dict[tuple[Any, ...], dict[str, Any]] = field(default_factory=dict)

    def fill(self, body: Any) -> None:
        """Take a :data:`PREFETCH_EVENT`'s answers (replacing any earlier stop's)."""
        self.answers.clear()
        items = body.get("answers") if isinstance(body, dict) else None
        for item in items if isinstance(items, list) else []:
            if not isinstance(item, dict):
                continue
            response = item.get("response")
            key = cache_key(str(item.get("command")), item.get("arguments"))
            if key is not None and isinstance(response, dict) and response.get("success"):
                self.answers[key] = response

    def answer(self, request: dict[str, Any]) -> dict[str, Any] | None:
        """debugpy's response to ``request`` (its ``seq`` still to be set), or ``None``."""
        command = request.get("command", "")
        raw_args = request.get("arguments")
        args: dict[str, Any] = raw_args if isinstance(raw_args, dict) else {}
        key = cache_key(command, args)
        cached = self.answers.get(key) if key is not None else None
        if cached is None:
            return None
        if command != "stackTrace":
            return {**cached, "request_seq": request.get("seq")}
        return self._frames(cached, args, request.get("seq"))

    @staticmethod
    def _frames(cached: dict[str, Any], args: dict[str, Any], seq: Any) -> dict[str, Any] | None:
        body = cached.get("body") or {}
        frames = body.get("stackFrames")
        total = body.get("totalFrames")
        start, levels = args.get("startFrame", 0), args.get("levels", 0)
        if not isinstance(frames, list) or not isinstance(total, int):
            return None
        if not isinstance(start, int) or not isinstance(levels, int) or start < 0 or levels < 0:
            return None
        end = total if levels == 0 else min(start + levels, total)
        if end > len(frames):
            return None  # beyond what was fetched: debugpy answers
        return {**cached, "request_seq": seq, "body": {**body, "stackFrames": frames[start:end]}}

    def on_request(self, command: str) -> None:
        """The IDE sent ``command`` (before it is answered)."""
        if command in RUNS_PROGRAM:
            self.answers.clear()
        elif command in _CHANGES_VALUES:
            self._keep_threads()

    def on_evaluate(self, arguments: Any) -> None:
        """An ``evaluate`` that is not a watch: a ``repl`` one may change anything."""
        context = arguments.get("context", "repl") if isinstance(arguments, dict) else "repl"
        if context in ("repl", "clipboard", None):
            self._keep_threads()

    def on_event(self, name: str) -> None:
        """The worker sent the event ``name``."""
        if name in ENDS_STOP:
            self.answers.clear()
        elif name == "thread":
            self.answers.pop(("threads",), None)

    def _keep_threads(self) -> None:
        threads = self.answers.get(("threads",))
        self.answers.clear()
        if threads is not None:
            self.answers[("threads",)] = threads


@dataclass
class WatchList:
    """The watch expressions the IDE evaluated since the previous stop of one process (the
    worker's): what is evaluated at the next stop."""

    expressions: list[str] = field(default_factory=list)

    def note(self, command: str, arguments: Any) -> None:
        if command != "evaluate" or not isinstance(arguments, dict):
            return
        expression = arguments.get("expression")
        if arguments.get("context") != "watch" or not isinstance(expression, str):
            return
        if expression not in self.expressions and len(self.expressions) < MAX_WATCHES:
            self.expressions.append(expression)

    def take(self) -> list[str]:
        """The list for this stop; the next stop's starts empty."""
        taken, self.expressions = self.expressions, []
        return taken


Request = tuple[str, dict[str, Any]]


class Gathering:
    """The worker's prefetch for one stop: which requests to send debugpy, in which order, and
    the :data:`PREFETCH_EVENT` body once every one is answered."""

    def __init__(self, thread: int, watches: list[str], *, max_bytes: int = MAX_BYTES) -> None:
        self.thread = thread
        self.watches = watches
        self.max_bytes = max_bytes
        self.answers: list[dict[str, Any]] = []
        self.skipped = 0
        self.waiting = 0
        self._size = 0
        self._top: int | None = None  #: the stopped thread's top frame

    def start(self) -> list[Request]:
        """The first requests: ``threads`` and the stopped thread's frames, together."""
        return self._ask(
            [
                ("threads", {}),
                ("stackTrace", {"threadId": self.thread, "startFrame": 0, "levels": FRAMES}),
            ]
        )

    def answered(self, command: str, arguments: dict[str, Any], response: Any) -> list[Request]:
        """debugpy answered one of them: keep it; the requests it leads to."""
        self.waiting -= 1
        if not isinstance(response, dict) or not response.get("success"):
            return self._next_watch()
        size = len(orjson.dumps(response))
        if self._size + size > self.max_bytes:
            self.skipped += 1
            return self._next_watch()
        self._size += size
        self.answers.append({"command": command, "arguments": arguments, "response": response})
        raw_body = response.get("body")
        body: dict[str, Any] = raw_body if isinstance(raw_body, dict) else {}
        if command == "stackTrace":
            frames = body.get("stackFrames")
            top = frames[0].get("id") if isinstance(frames, list) and frames else None
            if not isinstance(top, int):
                return []
            self._top = top
            return self._ask([("scopes", {"frameId": top})])
        if command == "scopes":
            scopes = body.get("scopes")
            first = next(
                (s for s in scopes if isinstance(s, dict) and not s.get("expensive")), None
            ) if isinstance(scopes, list) else None  # fmt: skip
            ref = first.get("variablesReference") if first else None
            if isinstance(ref, int) and ref > 0:
                return self._ask([("variables", {"variablesReference": ref})])
        return self._next_watch()

    def _next_watch(self) -> list[Request]:
        """One watch at a time: pydevd runs them on the stopped thread, which takes one queued
        command per wake-up and then sleeps 0.2 s, so a third request in flight waits that long."""
        if not self.watches or self._top is None:
            return []
        expression, self.watches = self.watches[0], self.watches[1:]
        return self._ask([("evaluate", {"expression": expression, "frameId": self._top,
                                        "context": "watch"})])  # fmt: skip

    @property
    def done(self) -> bool:
        return self.waiting == 0

    def body(self) -> dict[str, Any]:
        return {"threadId": self.thread, "answers": self.answers, "skipped": self.skipped}

    def _ask(self, requests: list[Request]) -> list[Request]:
        self.waiting += len(requests)
        return requests
