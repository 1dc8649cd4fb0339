"""A run that spans nodes, as each node's worker sees it (issue 43): process keys per node, which
entries a node's worker answers, node K's program announced like a child, the rendezvous and the
environment every node's program gets. Stepped message by message (no sockets, a hand clock)."""

from __future__ import annotations

from typing import Any

import orjson
import pytest
from test_shim_processes import FACTS, RUN_DIR, WALL, WORKDIR, Harness, src

from protocol_specs.link.link import Cursor
from protocol_specs.runs.resources import Resources
from protocol_specs.runs.runs import RunRecord
from protocol_specs.runs.spec import RunSpec
from protocol_specs.session.processes import (
    MAIN,
    ProcessInfo,
    ProcessTable,
    node_main,
    node_of,
    process_key,
)
from protocol_specs.session.session import StatusEvent
from protocol_specs.wire.wire import ControlEntry, DapEntry, LogEntry, StatusEntry
from worker_shim.program.nodes import NodeRole, Rendezvous, pick_rendezvous, rendezvous_of
from worker_shim.program.process_names import ProcFacts
from worker_shim.session.core import ShimCore, exit_status
from worker_shim.session.output import OutputHold
from worker_shim.session.processes import DebuggedProcesses
from worker_shim.session.replay import ReplayPhase


class NodeHarness(Harness):
    """:class:`Harness` for node ``node``'s worker of a 2-node run."""

    def __init__(self, node: int, **spec: Any) -> None:
        super().__init__(**spec)
        record = self.p.record.model_copy(
            update={"spec": self.p.record.spec.model_copy(update={"resources": Resources(nodes=2)})}
        )
        main = ShimCore(record, RUN_DIR, tail=Cursor.parse("0-0"), clock=lambda: self.now,
                        wall=lambda: WALL, node=node)  # fmt: skip
        self.p = DebuggedProcesses(main, read=lambda pid: FACTS.get(pid, ProcFacts()), host="h1")
        self.key = node_main(node)

    def start(self, **started: Any) -> None:
        self.perform(self.p.start(100, started=started or None))

    def replay(self) -> None:
        key = self.key
        self.respond(key, "initialize", {})
        self.event(key, "initialized")
        while self.p.main.phase is ReplayPhase.CONFIGURING:
            self.respond(key, self.sent[key][-1]["command"])
        self.respond(key, "configurationDone")
        self.respond(key, "attach")
        assert self.p.main.live

    def answers(self) -> list[DapEntry]:
        return [e for e in self.published if isinstance(e, DapEntry)]


def test_process_keys_name_their_node() -> None:
    assert [process_key(42), process_key(42, 0), process_key(42, 3)] == ["42", "42", "n3:42"]
    assert [node_main(0), node_main(1)] == [MAIN, "n1"]
    assert [node_of(k) for k in ("", "42", "n1", "n3:42", "n12:7")] == [0, 0, 1, 3, 12]
    assert [node_of(k) for k in ("nx", "n", "n01", "n-1:4")] == [-1, -1, -1, -1]


def test_a_process_of_node_k_is_titled_with_its_node() -> None:
    rank = ProcessInfo(key="n1:4242", pid=4242, parent="n1", host="gpu-8", rank=3, node=1)
    assert rank.title() == "rank 3 (pid 4242) on node 1 (gpu-8)"
    main = ProcessInfo(key="n1", pid=4100, host="gpu-8", node=1, program="torchrun")
    assert main.title() == "main process (pid 4100) on node 1 (gpu-8)"
    worker = ProcessInfo(key="n1:4300", pid=4300, parent="n1", host="gpu-8", nth=2, node=1)
    assert (
        worker.title(main) == "worker 2 of the main process of node 1 (pid 4300) on node 1 (gpu-8)"
    )
    table = ProcessTable()
    assert [table.title("n1"), table.title("n2:77")] == [
        "main process of node 1",
        "process (pid 77) on node 2",
    ]
    # node 0's are titled as ever
    assert ProcessInfo(key="42", pid=42, host="gpu-7", rank=0).title() == "rank 0 (pid 42) on gpu-7"


def test_node_k_replays_the_breakpoints_set_while_queued_and_is_offered_like_a_child() -> None:
    h = NodeHarness(1)
    h.ide("initialize", {"adapterID": "x"}, 1)
    h.ide("setBreakpoints", src("train.py"), 2)  # in the main session, while queued
    h.start()
    started = h.statuses(StatusEvent.PROCESS_STARTED)
    assert [s.process for s in started] == ["n1"]
    info = ProcessInfo.model_validate(started[0].data)
    assert (info.key, info.parent, info.node, info.pid) == ("n1", MAIN, 1, 100)
    assert started[0].detail == "main process (pid 100) on node 1 (h1)"
    [run_started] = h.statuses(StatusEvent.STARTED)
    assert run_started.process == "n1"  # node 1's start, never the main session's
    assert h.published.index(started[0]) < h.published.index(run_started)
    h.replay()
    sent = [m["command"] for m in h.sent["n1"]]
    assert sent == ["initialize", "attach", "setBreakpoints", "configurationDone"]
    bps = h.last("n1", "setBreakpoints")["arguments"]
    assert bps["source"]["path"] == f"{WORKDIR}/train.py"
    assert all(s.process == "n1" for s in h.statuses(StatusEvent.DEBUGGER_LIVE))
    # its stops are its own key's
    h.event("n1", "stopped", {"reason": "breakpoint", "threadId": 1})
    [stopped] = [e for e in h.answers() if b'"stopped"' in e.body]
    assert stopped.process == "n1"


def test_node_k_answers_its_own_keys_only_and_ignores_the_others_silently() -> None:
    h = NodeHarness(1)
    h.start()
    h.replay()
    before = len(h.sent["n1"])
    published = len(h.published)
    h.ide("threads", {}, 5)  # the main process's: node 0's worker answers
    h.ide("threads", {}, 6, process="4242")  # a child on node 0
    h.ide("threads", {}, 7, process="n2:9")  # a child on node 2
    h.ide("evaluate", {"expression": "@all x", "context": "repl"}, 8)  # node 0's console
    assert len(h.sent["n1"]) == before and len(h.published) == published
    h.ide("threads", {}, 9, process="n1")
    assert h.sent["n1"][-1]["command"] == "threads"
    # a request for a child of its own that is gone is answered (by this node)
    h.ide("threads", {}, 10, process="n1:999")
    [error] = h.answers()[-1:]
    assert error.process == "n1:999" and b"not being debugged" in error.body


def test_node_k_keys_its_children_with_its_node() -> None:
    h = NodeHarness(1)
    h.start()
    h.replay()
    h.announce("n1", 201)
    started = h.statuses(StatusEvent.PROCESS_STARTED)[-1]
    assert started.process == "n1:201" and h.opened == ["n1:201"]
    assert started.detail == "rank 0 (pid 201) on node 1 (h1)"
    assert ProcessInfo.model_validate(started.data).parent == "n1"


def test_node_0_ignores_the_keys_of_other_nodes_silently() -> None:
    h = NodeHarness(0)
    h.start(rendezvous={"addr": "10.0.0.1", "port": 29500})
    [run_started] = h.statuses(StatusEvent.STARTED)
    assert run_started.process == MAIN
    assert run_started.data["rendezvous"] == {"addr": "10.0.0.1", "port": 29500}
    assert not h.statuses(StatusEvent.PROCESS_STARTED)  # the main process is never announced
    h.replay()
    published = len(h.published)
    h.ide("threads", {}, 5, process="n1")
    h.ide("threads", {}, 6, process="n1:4242")
    h.ide("evaluate", {"expression": "@all x", "context": "repl"}, 7, process="n1:4242")
    assert len(h.published) == published
    h.ide("threads", {}, 8, process="999")  # its own key's, gone: answered as ever
    assert b"not being debugged" in h.answers()[-1].body


def test_node_k_says_its_program_ended_and_its_exit_names_it() -> None:
    h = NodeHarness(1)
    h.start()
    h.replay()
    h.perform(h.p.end(3))
    [gone] = h.statuses(StatusEvent.PROCESS_EXITED)
    assert (gone.process, gone.exit_code) == ("n1", 3)
    record = h.p.record
    assert exit_status(record, 3, process="n1").process == "n1"
    assert exit_status(record, 0).process == MAIN
    # each node's exit says its node: the IDE takes none for the run's end (the relay says that)
    assert exit_status(record, 3, process="n1", node=1).data["node"] == 1
    assert exit_status(record, 0).data["node"] == 0
    one = record.model_copy(
        update={"spec": record.spec.model_copy(update={"resources": Resources()})}
    )
    assert "node" not in exit_status(one, 0).data  # one node: the run's exit, as before
    # node 0 says nothing of its main process's end (the run's exit says it)
    h0 = NodeHarness(0)
    h0.start()
    h0.replay()
    h0.perform(h0.p.end(0))
    assert not h0.statuses(StatusEvent.PROCESS_EXITED)


def test_the_output_of_node_k_carries_its_node() -> None:
    hold = OutputHold([], attempt=2, to_ide=True, node=1)
    hold.feed("stdout", b"hello\n")
    entries = hold.flush()
    log = next(e for e in entries if isinstance(e, LogEntry))
    assert (log.node, log.attempt) == (1, 2)
    event = next(e for e in entries if isinstance(e, DapEntry))
    assert event.process == "n1" and b"hello" in event.body
    zero = OutputHold([], to_ide=True)
    zero.feed("stdout", b"x\n")
    assert {getattr(e, "node", 0) for e in zero.flush()} == {0}


RDZV = Rendezvous("10.1.2.3", 29400)


def test_every_node_s_program_is_told_the_rendezvous() -> None:
    env = NodeRole(1, 2, RDZV).env("r42")
    assert env == {
        "NNODES": "2",
        "NODE_RANK": "1",
        "MASTER_ADDR": "10.1.2.3",
        "MASTER_PORT": "29400",
        "PET_NNODES": "2",
        "PET_NODE_RANK": "1",
        "PET_MASTER_ADDR": "10.1.2.3",
        "PET_MASTER_PORT": "29400",
        "PET_RDZV_ENDPOINT": "10.1.2.3:29400",
        "PET_RDZV_ID": "r42",
        "PET_RDZV_CONF": "is_host=0",
        "TETHER_NODE": "1",
        "TETHER_NNODES": "2",
    }
    assert NodeRole(0, 2, RDZV).env("r42")["NODE_RANK"] == "0"
    assert NodeRole(0, 2, RDZV).env("r42")["PET_RDZV_CONF"] == "is_host=1"  # node 0 serves it
    # c10d's workers meet rank 0's node at its address, not its FQDN
    assert NodeRole(1, 2, RDZV, "10.1.2.4").env("r42")["PET_LOCAL_ADDR"] == "10.1.2.4"
    assert NodeRole().env("r42") == {}  # a run on one node: as before
    assert NodeRole(0, 2, RDZV).started_data() == {
        "rendezvous": {"addr": "10.1.2.3", "port": 29400}
    }
    assert NodeRole(1, 2, RDZV).started_data() == {} and NodeRole().started_data() == {}
    assert Rendezvous("fe80::1", 5).endpoint == "[fe80::1]:5"


def test_node_k_takes_the_rendezvous_of_its_own_attempt_only() -> None:
    data = {"addr": "10.1.2.3", "port": 29400}
    assert rendezvous_of(ControlEntry(action="rendezvous", attempt=2, data=data), 2) == RDZV
    assert rendezvous_of(ControlEntry(action="rendezvous", attempt=1, data=data), 2) is None
    assert rendezvous_of(ControlEntry(action="terminate", attempt=2, data=data), 2) is None
    assert rendezvous_of(None, 2) is None
    for bad in ({"addr": "", "port": 1}, {"addr": "a", "port": 0}, {"addr": "a", "port": True},
                {"addr": 3, "port": 5}, {"port": 5}):  # fmt: skip
        assert Rendezvous.of(bad) is None


def test_node_0_picks_a_free_port_on_the_route_to_the_relay() -> None:
    here = pick_rendezvous("ws://127.0.0.1:1234", environ={})
    assert here.addr == "127.0.0.1" and 0 < here.port < 65536
    named = pick_rendezvous("ws://relay.invalid:1", environ={"TETHER_NODE_ADDR": "127.0.0.1"})
    assert named.addr == "127.0.0.1"
    with pytest.raises(OSError, match="assign"):  # not this host's address: cannot be bound
        pick_rendezvous("ws://127.0.0.1:1", environ={"TETHER_NODE_ADDR": "192.0.2.1"})


def test_a_single_node_run_publishes_as_before() -> None:
    spec = RunSpec(command=["python", "t.py"], workdir=WORKDIR)
    record = RunRecord(id="r1", spec=spec, attempt=1)
    assert NodeRole.of(record) == NodeRole(0, 1)
    entry = exit_status(record, 0)
    assert isinstance(entry, StatusEntry) and entry.process == MAIN
    assert orjson.loads(orjson.dumps(entry.data))["final"] is True
