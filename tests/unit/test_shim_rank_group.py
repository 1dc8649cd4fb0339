"""The rank group wired into the shim's processes: a rank's stop pauses the other rank on its own
connection, a continue in one rank's session continues both, ``--stop one`` leaves each alone
(message by message, no sockets; the group's decisions themselves: ``test_rank_group.py``)."""

from __future__ import annotations

from typing import Any

import orjson
from test_shim_processes import Harness, child_live

from protocol_specs.wire.wire import DapEntry
from worker_shim.session.actions import Say
from worker_shim.session.group import GROUP_WAIT

FRAME = {"id": 1, "name": "step", "line": 3, "column": 1, "source": {"path": "/w/train.py"}}


def two_ranks(stop: str = "all") -> Harness:
    h = Harness(stop=stop)
    h.go_live()
    child_live(h, 201, [])  # rank 0
    child_live(h, 202, [])  # rank 1
    return h


def commands(h: Harness, key: str) -> list[str]:
    return [m["command"] for m in h.sent[key] if m["type"] == "request"]


def events(h: Harness, key: str, name: str) -> list[dict[str, Any]]:
    out = []
    for entry in h.published:
        if isinstance(entry, DapEntry) and entry.process == key:
            msg = orjson.loads(entry.body)
            if msg.get("event") == name:
                out.append(msg)
    return out


def test_a_ranks_stop_pauses_the_other_and_a_continue_in_its_session_moves_both() -> None:
    h = two_ranks()
    before = len(h.sent["201"])
    h.event("202", "stopped", {"reason": "breakpoint", "threadId": 7})
    assert events(h, "202", "stopped")  # its own stop, published at once
    pause = h.last("201", "pause")
    assert len(h.sent["201"]) > before and pause["arguments"] == {"threadId": 0}
    h.event("201", "stopped", {"reason": "pause", "threadId": 3})
    assert events(h, "201", "stopped")[0]["body"]["reason"] == "pause"
    # the worker's own pause is answered to nobody
    published = len(h.published)
    h.respond("201", "pause")
    assert len(h.published) == published
    # continue in rank 1's session: forwarded to it, and sent to rank 0 for its stopped thread
    h.ide("continue", {"threadId": 7}, 40, process="202")
    assert h.last("202", "continue")["arguments"] == {"threadId": 7}
    assert h.last("201", "continue")["arguments"] == {"threadId": 3}


def test_a_rank_that_does_not_pause_is_named_in_the_stopped_ranks_session() -> None:
    h = two_ranks()
    h.event("201", "stopped", {"reason": "breakpoint", "threadId": 1})
    h.now += GROUP_WAIT
    actions = h.perform(h.p.on_tick())
    [note] = [e for e in events(h, "201", "output") if e["body"]["category"] == "important"]
    assert note["body"]["output"].startswith("tether: rank 1 still running")
    assert any(isinstance(a, Say) and "rank 1 still running" in a.text for a in actions)


def test_stop_one_leaves_every_rank_on_its_own() -> None:
    h = two_ranks(stop="one")
    h.event("202", "stopped", {"reason": "breakpoint", "threadId": 7})
    h.ide("continue", {"threadId": 7}, 40, process="202")
    assert "pause" not in commands(h, "201") and "continue" not in commands(h, "201")
    h.now += GROUP_WAIT
    h.perform(h.p.on_tick())
    assert events(h, "202", "output") == []


def test_the_unattended_continue_of_one_rank_continues_its_group() -> None:
    """``--on-unattended-stop continue``: when the stopped rank's wait is over, the worker's own
    continue moves the group as an IDE's would; else the paused ranks stay paused (each on its
    own timer), and a rank whose pause lands late (it was blocked in a collective the continued
    rank now completes) stops the group all over again."""
    h = Harness(on_unattended_stop="continue", unattended_timeout=30)
    h.go_live()
    child_live(h, 201, [])  # rank 0
    child_live(h, 202, [])  # rank 1
    h.event("202", "stopped", {"reason": "breakpoint", "threadId": 7})
    h.now += 20  # rank 0 was blocked outside Python: its pause lands later (its own wait: 30 s)
    h.event("201", "stopped", {"reason": "pause", "threadId": 3})
    started = commands(h, "201").count("continue")
    h.now += 11  # rank 1's wait is over, not rank 0's
    for _ in range(3):  # the watches look up where their rank stopped, then act
        h.perform(h.p.on_tick())
        for key in ("202", "201"):
            if commands(h, key)[-1] == "stackTrace":
                h.respond(key, "stackTrace", {"stackFrames": [FRAME], "totalFrames": 1})
    assert h.last("202", "continue")["arguments"] == {"threadId": 7}
    assert h.last("201", "continue")["arguments"] == {"threadId": 3}
    assert commands(h, "201").count("continue") >= started + 1


def test_a_group_move_ends_the_other_ranks_stop_prefetch_as_an_ides_move_does() -> None:
    """A rank the group paused gathers its stop's prefetch; the group's continue ends it: nothing
    more is asked of that rank's debugpy (a request sent after the continue queues there before
    the continue and delays its ``continued``), and what was gathered goes out at once."""
    h = two_ranks()
    h.event("202", "stopped", {"reason": "breakpoint", "threadId": 7})
    h.event("201", "stopped", {"reason": "pause", "threadId": 3})
    assert {"threads", "stackTrace"} <= set(commands(h, "201"))  # its prefetch, in flight
    h.ide("continue", {"threadId": 7}, 40, process="202")
    assert commands(h, "201")[-1] == "continue"
    assert events(h, "201", "tetherPrefetch")  # what it had, published with the move
    frames = {"stackFrames": [{"id": 9, "name": "main", "line": 1, "column": 1}]}
    h.respond("201", "stackTrace", frames)  # the prefetch's answer, after the continue
    h.respond("201", "threads", {"threads": [{"id": 3, "name": "MainThread"}]})
    assert commands(h, "201")[-1] == "continue"  # no ``scopes`` asked after the move
