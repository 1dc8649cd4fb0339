"""The nodes of a multi-node run's attempt (``protocol_specs/runs/nodes.py``), stepped event by
event: node 0's claim lists every node, the others join only once it claimed, and each node's
news ends the attempt as torchelastic's rules say; a run of one node has no rows at all."""

from __future__ import annotations

import pytest

from protocol_specs.runs import nodes
from protocol_specs.runs.claims import claim, release
from protocol_specs.runs.resources import Resources
from protocol_specs.runs.runs import Attempt, RunEvent, RunRecord, RunState, StaleAttempt
from protocol_specs.runs.spec import RunSpec
from relay.store import keys


def queued(n: int = 2) -> RunRecord:
    spec = RunSpec(command=["python", "app.py"], workdir="/w", resources=Resources(nodes=n))
    return RunRecord(id="r1", spec=spec, attempts=[Attempt(n=1)])


def claimed(n: int = 2) -> RunRecord:
    return claim(queued(n), "host-a", at=1.0, claim_id="c1", confirm_within=15, from_queue=True)


def rows(record: RunRecord) -> list[tuple[int, str, str, int | None]]:
    return [(r.node, r.host, r.state, r.exit_code) for r in record.attempts[-1].nodes]


def test_node_0s_claim_lists_every_node_and_a_release_forgets_them() -> None:
    record = claimed(3)
    assert rows(record) == [
        (0, "host-a", "starting", None),
        (1, "", "starting", None),
        (2, "", "starting", None),
    ]
    back = release(record, "c1", at=2.0, about=1)
    assert back.state is RunState.QUEUED and back.attempts[-1].nodes == []
    assert rows(claimed(1)) == []  # one node: no rows, nothing of this applies


def test_a_node_joins_only_a_claimed_attempt_of_a_run_that_has_it() -> None:
    refusal = nodes.join_refusal(queued(), "r1", 1, 1)
    assert refusal == nodes.Refused("job_not_running", "node 0 has not claimed attempt 1 yet")
    record = claimed()
    assert nodes.join_refusal(record, "r1", 1, 1) is None
    assert nodes.join_refusal(record, "r1", 2, 1).code == "stale_attempt"  # type: ignore[union-attr]
    beyond = nodes.join_refusal(record, "r1", 1, 2)
    assert beyond is not None and beyond.code == "bad_frame" and "no node 2" in beyond.message
    assert nodes.join_refusal(None, "r1", 1, 1).code == "no_such_run"  # type: ignore[union-attr]
    one = claimed(1)
    assert nodes.join_refusal(one, "r1", 1, 1).code == "bad_frame"  # type: ignore[union-attr]
    joined = nodes.joined(record, 1, "host-b")
    assert rows(joined)[1] == (1, "host-b", "starting", None)
    assert nodes.joined(joined, 1, "host-b") is joined  # asked again: nothing to write
    lost = nodes.lost(joined, 1)
    assert nodes.join_refusal(lost, "r1", 1, 1).code == "stale_attempt"  # type: ignore[union-attr]


def test_a_non_zero_exit_of_any_node_ends_the_attempt_with_its_code() -> None:
    record = nodes.started(claimed(), 1, about=1)
    verdict = nodes.exited(record, 1, 7, about=1)
    assert (verdict.event, verdict.exit_code, verdict.detail) == (
        RunEvent.EXIT_ERROR,
        7,
        "node 1 exited with code 7",
    )
    assert rows(verdict.record)[1] == (1, "", "exited", 7)
    with pytest.raises(StaleAttempt):
        nodes.exited(record, 1, 7, about=2)


def test_the_attempt_ends_0_only_once_every_node_exited_0() -> None:
    first = nodes.exited(claimed(), 0, 0, about=1)
    assert first.event is None and rows(first.record)[0][2:] == ("exited", 0)
    second = nodes.exited(first.record, 1, 0, about=1)
    assert (second.event, second.exit_code) == (RunEvent.EXIT_OK, 0)


def test_a_lost_node_is_marked_unless_it_had_exited() -> None:
    done = nodes.exited(claimed(), 0, 0, about=1).record
    assert rows(nodes.lost(done, 0))[0][2] == "exited"
    assert rows(nodes.lost(done, 1))[1][2] == "lost"
    assert "node 1's worker stopped renewing" in nodes.lost_detail(1, 30)


def test_only_a_valid_rendezvous_is_passed_on() -> None:
    good = {"rendezvous": {"addr": "10.1.2.3", "port": 29500}}
    assert nodes.rendezvous(good) == {"addr": "10.1.2.3", "port": 29500}
    for bad in ({}, {"rendezvous": "x"}, {"rendezvous": {"addr": "", "port": 1}}):
        assert nodes.rendezvous(bad) is None
    assert nodes.rendezvous({"rendezvous": {"addr": "a b", "port": 1}}) is None
    assert nodes.rendezvous({"rendezvous": {"addr": "h", "port": 70000}}) is None
    assert nodes.rendezvous({"rendezvous": {"addr": "h", "port": True}}) is None


def test_each_node_has_its_own_lease_member() -> None:
    assert keys.leases("r1", 2, 3) == ["r1#2", "r1#2#1", "r1#2#2"]
    assert [keys.parse_lease(m) for m in keys.leases("r1", 2, 2)] == [("r1", 2), ("r1", 2)]
    assert [keys.lease_node(m) for m in keys.leases("r1", 2, 3)] == [0, 1, 2]
    assert keys.parse_lease("r1") == ("r1", None) and keys.lease_node("r1") == 0


def test_to_worker_is_trimmed_to_what_every_node_received() -> None:
    from protocol_specs.runs.nodes import trim_point

    assert trim_point({"0": "5-1"}, 2) is None  # node 1 has not said
    assert trim_point({"0": "5-1", "1": "3-0"}, 2) == "3-0"
    assert trim_point({"0": "5-1", "1": "7-2"}, 2) == "5-1"
    assert trim_point({"0": "5-1", "1": "bad"}, 2) is None
