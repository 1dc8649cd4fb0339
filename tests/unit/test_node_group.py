"""The rank group across nodes, event by event on a hand clock: another node's stop, move and
pause taken as the group's own, what a node announces (and a run of one node does not), and
which ``group`` entries of ``to_worker`` a node takes (``worker_shim/session/group.py``,
``worker_shim/session/node_group.py``; wired into the shim's processes at the end)."""

from __future__ import annotations

from typing import Any

import orjson
from hand_clock import HandClock
from test_rank_group import KEYS, continued, released, sends, states, stop_all, stopped
from test_shim_processes import Harness, child_live

from protocol_specs.runs.runs import RunRecord
from protocol_specs.runs.spec import RunSpec
from protocol_specs.session.focus import GROUP_TAG
from protocol_specs.wire.wire import DapEntry, GroupEntry, decode_entry, encode_entry
from worker_shim.session.group import GROUP_WAIT, Announce, GroupAction, RankGroup, RankState
from worker_shim.session.node_group import NodeGroup

R, P, S = RankState.RUNNING, RankState.PAUSING, RankState.STOPPED


def node_group(n: int = 2, *, spans: bool = True) -> tuple[RankGroup, HandClock]:
    """Ranks 0..n-1 of this node (the other node's ranks are 10, 11...)."""
    clock = HandClock()
    g = RankGroup(clock, spans_nodes=spans)
    for rank in range(n):
        assert g.joined(KEYS[rank], rank) == []
    return g, clock


def told(actions: list[GroupAction]) -> list[Announce]:
    return [a for a in actions if isinstance(a, Announce)]


def tagged_with(actions: list[GroupAction], key: str) -> Any:
    [release] = [a for a in actions if not isinstance(a, Announce) and a.key == key]
    return release.msg["body"].get(GROUP_TAG)  # type: ignore[union-attr]


# --- RankGroup: the other nodes' word ------------------------------------------------------------


def test_another_nodes_stop_pauses_the_running_ranks_and_their_stops_name_its_rank() -> None:
    g, _clock = node_group()
    actions = g.remote_stop(11)
    assert sends(actions) == [
        (KEYS[0], "pause", {"threadId": 0}),
        (KEYS[1], "pause", {"threadId": 0}),
    ]
    assert states(g) == [P, P]
    actions = g.on_event(*stopped(0, "pause", thread=3))
    assert released(actions) == [KEYS[0]] and tagged_with(actions, KEYS[0]) == {"with": 11}
    assert told(actions) == []  # the group's stop, not its own: the other nodes are not told


def test_another_nodes_move_moves_the_stopped_ranks_and_is_owed_to_the_pausing() -> None:
    g, _clock = node_group()
    g.remote_stop(11)
    g.on_event(*stopped(0, "pause", thread=3))  # rank 1 is still pausing (in a collective)
    actions = g.remote_move("continue", {"threadId": 99, "singleThread": False}, 11)
    assert sends(actions) == [(KEYS[0], "continue", {"threadId": 3, "singleThread": False})]
    assert told(actions) == []
    actions = g.on_event(*stopped(1, "pause", thread=4))  # its pause lands: it moves at once
    assert sends(actions) == [(KEYS[1], "continue", {"threadId": 4, "singleThread": False})]
    assert released(actions) == []  # a stop over at once is not shown
    assert g.on_event(*continued(1)) == []
    assert states(g) == [R, R]


def test_another_nodes_step_is_a_group_step_on_this_node_its_stops_held_until_all_in() -> None:
    g, _clock = node_group()
    stop_all(g, first=0)
    actions = g.remote_move("next", {}, 11)
    assert [s[1] for s in sends(actions)] == ["next", "next"]
    assert g.on_event(*stopped(0, "step", thread=10)) == []  # held: rank 1 still stepping
    actions = g.on_event(*stopped(1, "step", thread=11))
    assert released(actions) == [KEYS[0], KEYS[1]]
    assert tagged_with(actions, KEYS[0]) == {"with": 11}


def test_another_nodes_pause_pauses_the_running_ranks() -> None:
    g, _clock = node_group()
    actions = g.remote_pause(10)
    assert [s[1] for s in sends(actions)] == ["pause", "pause"]
    assert told(actions) == []


def test_a_rank_that_joins_after_another_nodes_stop_is_paused_until_a_move() -> None:
    g, _clock = node_group(0)  # this node's worker has no rank yet
    assert g.remote_stop(12) == []
    actions = g.joined(KEYS[0], 0)
    assert sends(actions) == [(KEYS[0], "pause", {"threadId": 0})]
    actions = g.on_event(*stopped(0, "pause", thread=3))
    assert tagged_with(actions, KEYS[0]) == {"with": 12}
    g.remote_move("continue", {}, 12)
    assert g.joined(KEYS[1], 1) == []  # the group moves again: a new rank runs


def test_a_ranks_own_stop_and_an_ides_move_and_pause_are_announced_to_the_other_nodes() -> None:
    g, _clock = node_group()
    actions = g.on_event(*stopped(1))
    assert told(actions) == [Announce("stop", 1)]
    g.on_event(*stopped(0, "pause", thread=3))
    actions = g.on_request(KEYS[1], "next", {"threadId": 1, "granularity": "line"})
    assert told(actions) == [Announce("move", 1, "next", {"threadId": 1, "granularity": "line"})]
    g.on_event(*stopped(0, "step"))
    g.on_event(*stopped(1, "step"))
    g.on_request(KEYS[0], "continue", {"threadId": 3})
    actions = g.on_request(KEYS[0], "pause", {"threadId": 3})
    assert told(actions) == [Announce("pause", 0)]


def test_a_run_of_one_node_announces_nothing() -> None:
    g, _clock = node_group(spans=False)
    actions = [*g.on_event(*stopped(1)), *g.on_event(*stopped(0, "pause"))]
    actions += g.on_request(KEYS[1], "continue", {"threadId": 1})
    actions += g.on_request(KEYS[1], "pause", {"threadId": 1})
    assert told(actions) == []


# --- NodeGroup: which entries a node takes ------------------------------------------------------


def across(node: int = 0, attempt: int = 2) -> tuple[NodeGroup, RankGroup]:
    g, _clock = node_group()
    return NodeGroup(g, node, attempt, wall=lambda: 1_790_000_000.0), g


def entry(op: str, node: int = 1, attempt: int = 2, rank: int = 11, **kw: Any) -> GroupEntry:
    return GroupEntry(op=op, node=node, attempt=attempt, rank=rank, **kw)  # type: ignore[arg-type]


def test_a_node_takes_the_other_nodes_entries_of_its_attempt_only() -> None:
    n, g = across()
    assert n.on_entry(entry("stop", attempt=1)) == []  # an earlier attempt's: the stream's past
    assert n.on_entry(entry("stop", node=0)) == []  # its own node's
    assert states(g) == [R, R]
    assert [s[1] for s in sends(n.on_entry(entry("stop")))] == ["pause", "pause"]


def test_an_entry_read_before_the_nodes_own_comes_back_is_earlier_in_the_stream_and_skipped() -> (
    None
):
    """Node 0's rank stops on its own while node 1's continue is on its way: the stream says
    which came last, and both nodes end as it says."""
    n, g = across()
    stop_all(g, first=0)
    published = n.entry(Announce("stop", 0))
    assert n.on_entry(entry("move", command="continue")) == []  # before our stop: it decided
    assert states(g) == [S, S]
    n.on_entry(published)  # our own, back
    assert [s[1] for s in sends(n.on_entry(entry("move", command="continue")))] == [
        "continue",
        "continue",
    ]


def test_the_published_entry_says_node_attempt_rank_and_the_move_without_the_thread() -> None:
    n, _g = across(node=3, attempt=2)
    e = n.entry(Announce("move", 5, "stepIn", {"threadId": 7, "granularity": "line", "x": 1}))
    assert e == GroupEntry(op="move", node=3, attempt=2, rank=5, command="stepIn",
                           arguments={"granularity": "line"}, at=1_790_000_000.0)  # fmt: skip
    assert decode_entry(encode_entry(e)) == e


def test_without_a_group_stop_one_a_node_takes_no_entry() -> None:
    n = NodeGroup(None, 0, 2)
    assert n.on_entry(entry("stop")) == []


def test_a_node_group_spans_nodes_only_for_a_run_of_several() -> None:
    spec = RunSpec(command=["python", "t.py"], workdir="/w", resources={"nodes": 2})  # type: ignore[arg-type]
    one, two = RankGroup(HandClock()), RankGroup(HandClock())
    NodeGroup.of(one, RunRecord(id="r", spec=RunSpec(command=["x"], workdir="/w")), 0, lambda: 0)
    NodeGroup.of(two, RunRecord(id="r", spec=spec, attempt=1), 1, lambda: 0)
    assert (one.spans_nodes, two.spans_nodes) == (False, True)


# --- in the shim's processes ----------------------------------------------------------------------


def two_ranks_of_two_nodes() -> Harness:
    h = Harness(resources={"nodes": 2})
    h.go_live()
    child_live(h, 201, [])  # rank 0
    child_live(h, 202, [])  # rank 1
    return h


def commands(h: Harness, key: str) -> list[str]:
    return [m["command"] for m in h.sent[key] if m["type"] == "request"]


def test_the_shim_publishes_its_ranks_stop_and_takes_another_nodes_move() -> None:
    h = two_ranks_of_two_nodes()
    h.event("202", "stopped", {"reason": "breakpoint", "threadId": 7})
    [mine] = [e for e in h.published if isinstance(e, GroupEntry)]
    assert (mine.op, mine.node, mine.attempt, mine.rank) == ("stop", 0, 1, 1)
    h.event("201", "stopped", {"reason": "pause", "threadId": 3})
    h.deliver(mine)  # type: ignore[arg-type]  # back in to_worker
    h.deliver(entry("move", node=1, attempt=1, command="continue"))  # type: ignore[arg-type]
    assert h.last("202", "continue")["arguments"] == {"threadId": 7}
    assert h.last("201", "continue")["arguments"] == {"threadId": 3}
    assert len([e for e in h.published if isinstance(e, GroupEntry)]) == 1  # nothing echoed


def test_the_shim_pauses_its_ranks_on_another_nodes_stop_and_says_with_which_rank() -> None:
    h = two_ranks_of_two_nodes()
    h.deliver(entry("stop", node=1, attempt=1, rank=3))  # type: ignore[arg-type]
    assert commands(h, "201")[-1] == "pause" and commands(h, "202")[-1] == "pause"
    h.event("201", "stopped", {"reason": "pause", "threadId": 3})
    stops = [
        orjson.loads(e.body)
        for e in h.published
        if isinstance(e, DapEntry) and e.process == "201" and b'"stopped"' in e.body
    ]
    assert stops[-1]["body"][GROUP_TAG] == {"with": 3}
    assert not [e for e in h.published if isinstance(e, GroupEntry)]


def test_a_shim_of_a_run_of_one_node_publishes_no_group_entry() -> None:
    h = Harness()
    h.go_live()
    child_live(h, 201, [])
    child_live(h, 202, [])
    h.event("202", "stopped", {"reason": "breakpoint", "threadId": 7})
    h.ide("continue", {"threadId": 7}, 40, process="202")
    h.now += GROUP_WAIT
    h.perform(h.p.on_tick())
    assert not [e for e in h.published if isinstance(e, GroupEntry)]
