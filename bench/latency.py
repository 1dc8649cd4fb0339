"""Sessions on a paused program for a benchmark that drives it from Python (the idle benchmark's
live session): ``programs/loop.py`` paused 20 frames deep, reached through tether, under stock
debugpy or under the floor (see :data:`common.WAY_NAMES`). The latency figures themselves come
from VS Code's own client (``node_latency.py``).
"""

from __future__ import annotations

import shutil
from contextlib import AsyncExitStack
from pathlib import Path

from .common import (
    PROGRAMS,
    WAYS,
    Session,
    Stack,
    break_line,
    direct_session,
    tether_session,
)


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
