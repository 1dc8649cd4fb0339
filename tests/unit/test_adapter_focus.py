"""Focus and many ranks in the adapter: :class:`adapter.dap.processes.Processes` stepped message by
message (``tests/adapter_processes_harness.py``): which ranks the IDE is offered with a focus
(``tether attach --ranks``, ``tetherFocus``), and a large group's stop offered as one session and
one summary line."""

from __future__ import annotations

from typing import Any

import orjson
from adapter_processes_harness import Desk

from adapter.dap.focus import SUMMARY_WAIT
from adapter.dap.processes import Processes
from protocol_specs.session.focus import FOCUS_COMMAND, GROUP_TAG, focus_request
from protocol_specs.wire.wire import DapEntry, StreamName


def key(rank: int) -> str:
    return str(5000 + rank)


def ranks(d: Desk, n: int) -> None:
    for r in range(n):
        d.started(key(r), rank=r, world_size=n)


def stop(d: Desk, rank: int, *, along: int | None = None) -> None:
    body: dict[str, Any] = {"reason": "pause", "threadId": 1, "allThreadsStopped": True}
    if along is None:
        body["reason"] = "breakpoint"
    else:
        body[GROUP_TAG] = {"with": along}
    d.event("stopped", body, key(rank))


def offered(d: Desk, ide: int) -> list[int]:
    return [o["arguments"]["configuration"]["subProcessId"] - 5000 for o in d.offers(ide)]


def focused_desk(focus: list[int] | None) -> Desk:
    d = Desk()
    d.processes = Processes(d.main, mode="stopped", port=7777, focus=focus)
    return d


def test_an_attach_with_a_focus_is_offered_only_its_ranks_and_records_the_focus() -> None:
    d = focused_desk([1, 2])
    main = d.attach(supportsStartDebuggingRequest=True)
    recorded = d.last_published(FOCUS_COMMAND)
    assert orjson.loads(recorded.body)["arguments"] == {"ranks": [1, 2]}
    assert recorded.local and recorded.process == ""
    d.live()
    ranks(d, 4)
    stop(d, 2)
    for r in (0, 1, 3):
        stop(d, r, along=2)
    assert offered(d, main) == [2, 1]  # ranks 0 and 3 are outside the focus


def test_tether_focus_offers_each_focused_rank_at_once_and_answers_what_it_offered() -> None:
    d = Desk()
    main = d.attach(supportsStartDebuggingRequest=True)
    d.live()
    ranks(d, 4)
    seq = d.request(main, FOCUS_COMMAND, {"ranks": [3, 1]})
    answer = d.responses(main)[seq]
    assert answer["success"] and answer["body"]["ranks"] == [1, 3]
    assert [n.split(" (")[0] for n in answer["body"]["offered"]] == ["rank 1", "rank 3"]
    assert offered(d, main) == [1, 3]  # running ranks too: opened on demand
    recorded = d.last_published(FOCUS_COMMAND)
    assert orjson.loads(recorded.body)["arguments"] == {"ranks": [1, 3]}
    # asked again: nothing new to offer; null is every rank, offered by the usual rules
    seq = d.request(main, FOCUS_COMMAND, {"ranks": None})
    assert d.responses(main)[seq]["body"] == {"ranks": None, "offered": []}


def test_a_malformed_focus_is_one_clear_error_and_changes_nothing() -> None:
    d = focused_desk([2])
    main = d.attach(supportsStartDebuggingRequest=True)
    published = len(d.published)
    seq = d.request(main, FOCUS_COMMAND, {"ranks": ["x"]})
    answer = d.responses(main)[seq]
    assert not answer["success"] and "ranks must be a list" in answer["message"]
    assert len(d.published) == published and d.processes.focus.ranks == [2]


def test_the_last_focus_recorded_by_any_adapter_wins() -> None:
    d = Desk()
    main = d.attach(supportsStartDebuggingRequest=True)
    d.live()
    ranks(d, 4)
    theirs = orjson.dumps({**focus_request([3]), "seq": 9})
    d.deliver(DapEntry(origin="them", body=theirs, local=True), StreamName.TO_WORKER)
    assert d.processes.focus.ranks == [3]
    stop(d, 1)
    assert offered(d, main) == []  # rank 1 is outside the other IDE's focus now


def test_a_large_group_stop_offers_one_session_and_tells_it_of_the_others() -> None:
    d = Desk()
    main = d.attach(supportsStartDebuggingRequest=True)
    d.live()
    ranks(d, 64)
    stop(d, 5)
    [offer] = d.offers(main)
    rank5 = d.attach({**offer["arguments"]["configuration"]})
    d.new(rank5)
    for r in range(64):
        if r != 5:
            stop(d, r, along=5)
    assert offered(d, main) == [5]  # one session, not 64
    lines = [m["body"]["output"] for m in d.new(rank5) if m.get("event") == "output"]
    assert lines == [
        'tether: ranks 0-4,6-63 paused with rank 5; open one: the Ranks view, "tether: Focus on '
        'ranks..." or '
        "tether attach r1 --rank K\n"
    ]
    d.request(main, FOCUS_COMMAND, {"ranks": [7]})
    assert offered(d, main) == [5, 7]


def test_a_small_group_offers_every_paused_rank_and_a_rank_s_own_stop_is_offered() -> None:
    d = Desk()
    main = d.attach(supportsStartDebuggingRequest=True)
    d.live()
    ranks(d, 8)
    stop(d, 0)
    for r in range(1, 8):
        stop(d, r, along=0)
    assert offered(d, main) == list(range(8))
    big = Desk()
    main = big.attach(supportsStartDebuggingRequest=True)
    big.live()
    ranks(big, 9)
    stop(big, 0)
    stop(big, 4)  # a breakpoint of its own: offered as ever
    stop(big, 1, along=0)
    assert offered(big, main) == [0, 4]


def test_the_summary_comes_after_a_wait_when_some_rank_does_not_pause() -> None:
    d = Desk()
    main = d.attach(supportsStartDebuggingRequest=True)
    d.live()
    ranks(d, 16)
    stop(d, 3)  # rank 3's session not opened yet: it hears the line when it attaches
    for r in (0, 1):
        stop(d, r, along=3)
    d.clock.advance(SUMMARY_WAIT - 1)
    stop(d, 2, along=3)  # stops still trickle in: the wait starts again
    d.clock.advance(SUMMARY_WAIT - 1)
    d.perform(d.processes.on_tick())
    assert d.processes.focus.held == {3: {0, 1, 2}}  # not said yet
    d.clock.advance(1)
    d.perform(d.processes.on_tick())
    [offer] = d.offers(main)
    rank3 = d.attach({**offer["arguments"]["configuration"]})
    lines = [m["body"]["output"] for m in d.new(rank3) if m.get("event") == "output"]
    assert any(line.startswith("tether: ranks 0-2 paused with rank 3;") for line in lines)


def test_adding_a_rank_offers_it_without_narrowing_the_focus() -> None:
    """The Ranks view opens one rank (``"add": true``): it is offered, and the focus every IDE of
    the run shares is widened, never narrowed to it."""
    d = Desk()
    main = d.attach(supportsStartDebuggingRequest=True)
    d.live()
    ranks(d, 16)
    stop(d, 5)
    for r in range(16):
        if r != 5:
            stop(d, r, along=5)
    assert offered(d, main) == [5]
    seq = d.request(main, FOCUS_COMMAND, {"ranks": [7], "add": True})
    answer = d.responses(main)[seq]
    assert answer["body"]["ranks"] is None  # no focus: it stays none
    assert offered(d, main) == [5, 7]
    assert orjson.loads(d.last_published(FOCUS_COMMAND).body)["arguments"] == {"ranks": None}
    d.request(main, FOCUS_COMMAND, {"ranks": [1, 2]})
    seq = d.request(main, FOCUS_COMMAND, {"ranks": [9], "add": True})
    answer = d.responses(main)[seq]
    assert answer["body"]["ranks"] == [1, 2, 9]
    assert offered(d, main) == [5, 7, 1, 2, 9]
    seq = d.request(main, FOCUS_COMMAND, {"ranks": None, "add": True})
    refused = d.responses(main)[seq]
    assert refused["success"] is False and "add" in refused["message"]
