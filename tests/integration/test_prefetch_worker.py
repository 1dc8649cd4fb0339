"""The stop-time prefetch against real debugpy: every answer the adapter would take from it is
the answer debugpy gives when asked (differential), for each cached request type.

The real shim and a real relay (in-memory store); the test plays the adapter through an ``ide``
link. At the first stop the IDE evaluates a watch (forwarded, so the worker learns it), then
continues; at the second stop the worker's prefetch holds threads, frames, scopes, locals and the
watch. The test then asks debugpy itself, through the worker, the requests VS Code sends after a
stop, and compares each response with what :class:`~protocol_specs.session.prefetch.StopCache` answers.
"""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any

import orjson
import pytest
from test_worker_processes import Run, dap, debug_run, line_of, set_breakpoints

from protocol_specs.session.prefetch import FRAMES, PREFETCH_EVENT, StopCache
from protocol_specs.wire.wire import DapEntry

pytestmark = [pytest.mark.slow, pytest.mark.timeout(180)]

PROGRAM = """\
def work(n):
    total = 0
    names = {"a": [1, 2, 3], "b": "text"}
    for i in range(n):
        total += i + len(names)  # STOP
    return total


def deep(k, n):
    return deep(k - 1, n) if k else work(n)


print("RESULT", deep(24, 2))
"""


def _event(name: str) -> Any:
    def match(e: Any) -> bool:
        return isinstance(e, DapEntry) and orjson.loads(e.body).get("event") == name

    return match


async def _ask(run: Run, seq: int, command: str, arguments: dict[str, Any]) -> dict[str, Any]:
    """``command`` sent through the worker to debugpy; its response."""
    body = {"seq": seq, "type": "request", "command": command, "arguments": arguments}
    await run.ide.publish(DapEntry(origin="ide1", body=orjson.dumps(body)))
    got = await run.until(
        lambda e: dap("response", command)(e) and orjson.loads(e.body)["request_seq"] == seq
    )
    assert isinstance(got, DapEntry)
    answer: dict[str, Any] = orjson.loads(got.body)
    return answer


def _same(cached: dict[str, Any] | None, asked: dict[str, Any]) -> None:
    assert cached is not None, asked
    strip = ("seq", "request_seq")
    assert {k: v for k, v in cached.items() if k not in strip} == {
        k: v for k, v in asked.items() if k not in strip
    }


async def test_every_prefetched_answer_is_debugpys_own(tmp_path: Path) -> None:
    bp = set_breakpoints("main.py", line_of(PROGRAM, "# STOP"), 1)
    async with debug_run(tmp_path, {"main.py": PROGRAM}, [sys.executable, "main.py"], [bp]) as run:
        first = await run.until(_event("stopped"))
        thread = orjson.loads(first.body)["body"]["threadId"]
        await run.until(_event(PREFETCH_EVENT))
        top = (await _ask(run, 10, "stackTrace", {"threadId": thread, "levels": 1}))["body"]
        frame = top["stackFrames"][0]["id"]
        watch = {"expression": "total * 2", "frameId": frame, "context": "watch"}
        assert (await _ask(run, 11, "evaluate", watch))["success"]
        await _ask(run, 12, "continue", {"threadId": thread})

        await run.until(_event("stopped"))
        prefetch = await run.until(_event(PREFETCH_EVENT))
        body = orjson.loads(prefetch.body)["body"]
        assert body["threadId"] == thread and body["skipped"] == 0
        commands = [a["command"] for a in body["answers"]]
        assert sorted(commands) == ["evaluate", "scopes", "stackTrace", "threads", "variables"]
        cache = StopCache()
        cache.fill(body)

        asks: list[tuple[str, dict[str, Any]]] = [
            ("threads", {}),
            ("stackTrace", {"threadId": thread, "startFrame": 0, "levels": 1}),
            ("stackTrace", {"threadId": thread, "startFrame": 1, "levels": FRAMES - 1}),
        ]
        seq = 20
        for command, arguments in asks:
            seq += 1
            asked = await _ask(run, seq, command, arguments)
            _same(cache.answer({"seq": seq, "command": command, "arguments": arguments}), asked)
        assert asked["body"]["totalFrames"] > FRAMES  # deeper than what was fetched
        frame = (await _ask(run, 30, "stackTrace", {"threadId": thread, "levels": 1}))["body"][
            "stackFrames"
        ][0]["id"]
        scopes = await _ask(run, 31, "scopes", {"frameId": frame})
        _same(
            cache.answer({"seq": 31, "command": "scopes", "arguments": {"frameId": frame}}), scopes
        )
        ref = next(s for s in scopes["body"]["scopes"] if not s["expensive"])["variablesReference"]
        args = {"variablesReference": ref}
        local_vars = await _ask(run, 32, "variables", args)
        assert {v["name"] for v in local_vars["body"]["variables"]} >= {"total", "names", "n", "i"}
        _same(cache.answer({"seq": 32, "command": "variables", "arguments": args}), local_vars)
        watch = {"expression": "total * 2", "frameId": frame, "context": "watch"}
        _same(cache.answer({"seq": 33, "command": "evaluate", "arguments": watch}),
              await _ask(run, 33, "evaluate", watch))  # fmt: skip
        await _ask(run, 40, "continue", {"threadId": thread})
    assert run.code == [0]
