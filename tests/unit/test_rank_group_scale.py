"""The rank group at scale (issue 42, item 8): a group stop of n ranks costs O(n), not O(n^2),
and each stop says which rank it came with (``worker_shim/session/group.py``)."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import orjson
import pytest
from hand_clock import HandClock

from protocol_specs.session.focus import GROUP_TAG, group_with
from worker_shim.session.group import RankGroup, RankState, Release, Send


class CountingMembers(dict[str, Any]):
    """The group's members, counting every member any scan of them visits."""

    visits = 0

    def values(self) -> Any:
        return _Counted(self, super().values())


class _Counted:
    def __init__(self, owner: CountingMembers, view: Any) -> None:
        self.owner, self.view = owner, view

    def __iter__(self) -> Iterator[Any]:
        for member in self.view:
            self.owner.visits += 1
            yield member

    def __len__(self) -> int:
        return len(self.view)


def stopped(reason: str = "breakpoint") -> tuple[dict[str, Any], bytes]:
    msg = {"seq": 5, "type": "event", "event": "stopped",
           "body": {"reason": reason, "threadId": 1, "allThreadsStopped": True}}  # fmt: skip
    return msg, orjson.dumps(msg)


def continued() -> tuple[dict[str, Any], bytes]:
    msg = {"seq": 6, "type": "event", "event": "continued", "body": {"threadId": 1}}
    return msg, orjson.dumps(msg)


@pytest.mark.parametrize("n", [64, 512])
def test_a_group_stop_and_continue_of_n_ranks_visits_the_members_a_linear_number_of_times(
    n: int,
) -> None:
    members = CountingMembers()
    g = RankGroup(HandClock(), members=members)
    for rank in range(n):
        g.joined(str(rank), rank)
    members.visits = 0
    first = g.on_event("5", *stopped())
    assert len([a for a in first if isinstance(a, Send)]) == n - 1  # one pause per other rank
    actions = 0
    for rank in range(n):
        if rank != 5:
            actions += len(g.on_event(str(rank), *stopped("pause")))
    assert actions == n - 1  # each paused rank's stop: released, nothing else
    assert {g.state(str(r)) for r in range(n)} == {RankState.STOPPED}
    moves = g.on_request("5", "continue", {"threadId": 1})
    assert len(moves) == n - 1
    for rank in range(n):
        g.on_event(str(rank), *continued())
    # O(n): a few scans of the members for the whole stop and continue, not one per rank
    assert members.visits <= 8 * n, members.visits


def test_a_rank_paused_or_moved_by_the_group_says_which_rank_it_came_with() -> None:
    g = RankGroup(HandClock())
    for rank in range(3):
        g.joined(str(rank), rank)
    [own] = [a for a in g.on_event("1", *stopped()) if isinstance(a, Release)]
    assert group_with(own.msg["body"]) is None  # a breakpoint of its own
    [paused] = g.on_event("0", *stopped("pause"))
    assert isinstance(paused, Release)
    assert paused.msg["body"][GROUP_TAG] == {"with": 1}
    assert orjson.loads(paused.raw)["body"][GROUP_TAG] == {"with": 1}  # what is published
    g.on_event("2", *stopped("pause"))
    g.on_request("2", "next", {"threadId": 1})  # a group step asked in rank 2's session
    g.on_event("0", *stopped("step"))
    g.on_event("1", *stopped("step"))
    held = g.on_event("2", *stopped("step"))
    tags = {a.key: group_with(a.msg["body"]) for a in held if isinstance(a, Release)}
    assert tags == {"0": 2, "1": 2, "2": None}
