"""Focus: the ranks a debug session controls and shows, chosen during the session.

Theory of operation
-------------------
``RunSpec.ranks`` (``tether debug --ranks``) chooses at submit which ranks get breakpoints. The
focus chooses it later, and which ranks the IDE is offered a session for: ``tether attach RUN
--ranks 0-3`` or the custom DAP request :data:`FOCUS_COMMAND` that the adapter answers in any
session of the run (the VS Code command "tether: Focus on ranks...", the Ranks view)::

    {"command": "tetherFocus", "arguments": {"ranks": [0, 1, 2, 3]}}   # or {"ranks": null}
    -> {"ranks": [0, 1, 2, 3] | null, "offered": ["rank 3 (pid 4242) on gpu-7", ...]}

``{"ranks": [7], "add": true}`` adds rank 7 to the focus (no focus stays no focus) and offers
it alone: how the Ranks view opens a rank without narrowing the focus of every IDE of the run.

The adapter records the focus in the run's ``to_worker`` stream (a ``local`` request
:func:`focus_request`, process ``""``): the worker reads it there, also when it starts hours
later, and every adapter of the run folds it too. The last one in the stream wins (two IDEs
attached with different foci: the later choice holds for both). ``null`` is no focus: every
rank, or those ``RunSpec.ranks`` named.

On the worker, a rank outside the focus is configured with no breakpoints (it does not stop on its
own); the rank group still stops and moves it with the others. An IDE session already open for such
a rank (``--processes all``, or opened before the focus moved) does not set breakpoints in it
either: its configuration requests are answered by the worker, every breakpoint unverified with
:func:`outside_focus_answer`'s reason, and still folded into the run's configuration (what the rank
is sent if it enters the focus). In the adapter, a rank outside the
focus is not offered to the IDE.

Many ranks: in a group larger than :data:`OFFER_ALL_UP_TO` ranks, the ranks the group paused (or
moved) along with the rank whose stop started it are not offered (``--processes all`` still offers
every one): their stops carry :data:`GROUP_TAG` (set by the worker's rank group), and the
initiator's session gets one line, :func:`summary_text`.

Sans-I/O: plain functions on DAP messages.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

from .stacks import compress_ranks, ranks_text

__all__ = [
    "FOCUS_COMMAND",
    "GROUP_TAG",
    "MAX_FOCUS",
    "OFFER_ALL_UP_TO",
    "focus_request",
    "group_with",
    "in_focus",
    "outside_focus_answer",
    "parse_focus",
    "summary_text",
]

#: the custom request that sets the focus (keep the name and shape: the extension sends it)
FOCUS_COMMAND = "tetherFocus"
#: the key a ``stopped`` body carries when the rank was paused or moved along with another
#: (``{"with": <that rank>}``): the worker's rank group sets it
GROUP_TAG = "tetherGroup"
#: above this many ranks in a group, only the rank that started a group stop is offered
OFFER_ALL_UP_TO = 8
#: most ranks one focus lists
MAX_FOCUS = 4096


def parse_focus(arguments: Any) -> list[int] | None:
    """The focus a :data:`FOCUS_COMMAND` request's ``arguments`` ask for (None: no focus);
    raises ``ValueError`` with one line to show when they are not ``{"ranks": [int, ...] |
    null}``."""
    if not isinstance(arguments, dict) or "ranks" not in arguments:
        raise ValueError('tetherFocus needs {"ranks": [0, 3, ...]} or {"ranks": null} (all)')
    ranks = arguments["ranks"]
    if ranks is None:
        return None
    if (
        not isinstance(ranks, list)
        or len(ranks) > MAX_FOCUS
        or not all(isinstance(r, int) and not isinstance(r, bool) and r >= 0 for r in ranks)
    ):
        raise ValueError(
            f"tetherFocus: ranks must be a list of at most {MAX_FOCUS} numbers from 0, or null"
        )
    return sorted(set(ranks))


def focus_request(ranks: list[int] | None) -> dict[str, Any]:
    """The request recorded in ``to_worker`` for a focus (numbered when published)."""
    return {"type": "request", "seq": 0, "command": FOCUS_COMMAND, "arguments": {"ranks": ranks}}


def in_focus(rank: int | None, focus: Iterable[int] | None) -> bool:
    """Whether a process of ``rank`` (None: not a rank) is in ``focus`` (None: no focus)."""
    return focus is None or rank is None or rank in focus


def group_with(body: Any) -> int | None:
    """The rank a ``stopped`` body says this rank stopped along with (None: its own stop)."""
    tag = body.get(GROUP_TAG) if isinstance(body, dict) else None
    rank = tag.get("with") if isinstance(tag, dict) else None
    return rank if isinstance(rank, int) and not isinstance(rank, bool) else None


def summary_text(ranks: Iterable[int], with_rank: int, run_id: str) -> str:
    """The one line for the session of the rank that started a group stop."""
    return (
        f"tether: {ranks_text(ranks)} paused with rank {with_rank}; open one: the Ranks view, "
        f'"tether: Focus on ranks..." or tether attach {run_id} --rank K'
    )


def outside_focus_answer(
    request: dict[str, Any], rank: int, focus: list[int] | None, submitted: list[int]
) -> dict[str, Any]:
    """The answer to a configuration request (``setBreakpoints``, ``setFunctionBreakpoints``,
    ``setExceptionBreakpoints``) of a session of ``rank``, which is outside the ``focus`` (None:
    outside ``submitted``, ``RunSpec.ranks``): success, and each breakpoint unverified with a
    message the IDE shows on it, saying why (numbered when published)."""
    if focus is not None:
        where = f"outside the focus ({ranks_text(focus) if focus else 'no rank'})"
    else:
        where = f"outside --ranks {compress_ranks(submitted)}"
    why = f"rank {rank} is {where}: its breakpoints are not set there; focus on it to set them"
    arguments = request.get("arguments")
    arguments = arguments if isinstance(arguments, dict) else {}
    if request.get("command") == "setExceptionBreakpoints":
        asked = [*_list(arguments.get("filters")), *_list(arguments.get("filterOptions"))]
    else:
        asked = _list(arguments.get("breakpoints"))
        if not asked and request.get("command") == "setBreakpoints":
            asked = _list(arguments.get("lines"))  # the deprecated form
    return {
        "seq": 0,
        "type": "response",
        "request_seq": request.get("seq", 0),
        "success": True,
        "command": request.get("command", ""),
        "body": {"breakpoints": [{"verified": False, "message": why} for _ in asked]},
    }


def _list(value: Any) -> list[Any]:
    return value if isinstance(value, list) else []
