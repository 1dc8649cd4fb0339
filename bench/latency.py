"""Benchmarks 1 and 2: request round trips and stepping on a paused program, three ways at once.

The same program (``programs/loop.py``, paused 20 frames deep) runs three times: through tether,
under stock debugpy and under the floor (see :data:`common.WAY_NAMES`). The three sessions are
measured interleaved, one request each in turn (the order rotating), so machine noise hits all.
"""

from __future__ import annotations

import shutil
from collections.abc import Awaitable, Callable
from contextlib import AsyncExitStack
from pathlib import Path
from typing import Any

from .common import (
    PROGRAMS,
    WAYS,
    Dist,
    Session,
    Stack,
    break_line,
    direct_session,
    tether_session,
    timed,
)

REQUESTS = ("threads", "stackTrace", "scopes", "variables", "evaluate")


async def open_sessions(
    stack: AsyncExitStack, tether: Stack, tmp: Path, name: str, ways: tuple[str, ...] = WAYS
) -> dict[str, Session]:
    line = break_line("loop.py")
    sessions = {}
    for way in ways:
        workdir = tmp / f"{name}-{way}"
        workdir.mkdir(parents=True)
        shutil.copyfile(PROGRAMS / "loop.py", workdir / "loop.py")
        argv = ["python", "loop.py"]
        if way == "tether":
            session, _adapter = await stack.enter_async_context(
                tether_session(tether, workdir, argv, {"loop.py": [line]})
            )
        else:
            session = await stack.enter_async_context(
                direct_session(way, workdir, argv, {"loop.py": [line]})
            )
        sessions[way] = session
    return sessions


async def _frame(s: Session) -> tuple[int, int]:
    """(top frame id, its locals' variablesReference)."""
    stack = await s.client.request("stackTrace", {"threadId": s.thread, "levels": 1})
    frame = stack["body"]["stackFrames"][0]["id"]
    scopes = await s.client.request("scopes", {"frameId": frame})
    return frame, scopes["body"]["scopes"][0]["variablesReference"]


def _arguments(s: Session, frame: int, ref: int) -> dict[str, dict[str, Any] | None]:
    return {
        "threads": None,
        "stackTrace": {"threadId": s.thread, "startFrame": 0, "levels": 20},
        "scopes": {"frameId": frame},
        "variables": {"variablesReference": ref},
        "evaluate": {"expression": "total * factor", "frameId": frame, "context": "watch"},
    }


async def requests(sessions: dict[str, Session], n: int) -> dict[str, dict[str, Dist]]:
    """Benchmark 1: ``n`` round trips of each request, per way."""
    args = {}
    for way, s in sessions.items():
        frame, ref = await _frame(s)
        args[way] = _arguments(s, frame, ref)
    result: dict[str, dict[str, Dist]] = {c: {w: Dist([]) for w in sessions} for c in REQUESTS}
    order = list(sessions)
    for i in range(n):
        for command in REQUESTS:
            for way in order[i % 3 :] + order[: i % 3]:
                client = sessions[way].client
                ms, response = await timed(client.request(command, args[way][command]))
                assert response["success"], response
                result[command][way].samples.append(ms)
    return result


async def _step(s: Session) -> None:
    s.client.discard_events("stopped")
    seq = s.client.send_request_nowait("next", {"threadId": s.thread})
    await s.client.wait_event("stopped")
    await s.client.response(seq)


async def _vscode_stop(s: Session) -> None:
    """A step as VS Code shows it: next, stopped, then what the UI asks for."""
    await _step(s)
    c = s.client
    await c.request("threads")
    top = await c.request("stackTrace", {"threadId": s.thread, "startFrame": 0, "levels": 1})
    await c.request("stackTrace", {"threadId": s.thread, "startFrame": 1, "levels": 19})
    frame = top["body"]["stackFrames"][0]["id"]
    scopes = await c.request("scopes", {"frameId": frame})
    await c.request(
        "variables", {"variablesReference": scopes["body"]["scopes"][0]["variablesReference"]}
    )
    for expression in ("total", "i * factor"):
        await c.request(
            "evaluate", {"expression": expression, "frameId": frame, "context": "watch"}
        )


async def _interleaved(
    sessions: dict[str, Session], n: int, what: Callable[[Session], Awaitable[None]]
) -> dict[str, Dist]:
    result = {w: Dist([]) for w in sessions}
    order = list(sessions)
    for i in range(n):
        for way in order[i % 3 :] + order[: i % 3]:
            ms, _ = await timed(what(sessions[way]))
            result[way].samples.append(ms)
    return result


async def stepping(
    sessions: dict[str, Session], steps: int, stops: int
) -> dict[str, dict[str, Dist]]:
    """Benchmark 2: ``next`` -> ``stopped``, and a whole VS Code stop, per way."""
    return {
        "next -> stopped": await _interleaved(sessions, steps, _step),
        "VS Code stop": await _interleaved(sessions, stops, _vscode_stop),
    }
