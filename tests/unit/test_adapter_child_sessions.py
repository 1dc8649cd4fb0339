"""A child process's own IDE session (:class:`adapter.dap.children.ChildCore`, dispatched by
:class:`adapter.dap.processes.Processes`), stepped message by message with a hand-driven clock:
its traffic, breakpoints and stops, reattaching, its end and the run's.

Every message sent to an IDE is checked against the official DAP schema, and every connection's
messages are numbered 1, 2, 3, ... whichever session numbered them
(``tests/adapter_processes_harness.py``).
"""

from __future__ import annotations

import orjson
import pytest
from adapter_processes_harness import ATTACH, CHILD, Desk, names

from protocol_specs.session.processes import COLLECTIVE_TIMEOUT_HINT, ProcessInfo
from protocol_specs.session.session import PLACES_EVENT, StatusEvent
from protocol_specs.wire.wire import StatusEntry

# --- a child's session --------------------------------------------------------------------------


def test_a_child_connection_is_an_extra_session_with_its_own_traffic() -> None:
    d = Desk()
    main = d.attach(supportsStartDebuggingRequest=True)
    d.live()
    d.started()
    d.stopped()
    published = len(d.published)
    child = d.attach_child()
    assert main not in d.closed and d.main.configured  # not a takeover
    assert names(d.seen[child])[:2] == ["initialize", "initialized"]
    assert {"thread", "stopped"} <= set(names(d.seen[child]))  # the stop it was offered for
    assert len(d.published) == published  # its handshake is not the worker's business
    assert d.presence[-1].attached
    d.new(main)
    seq = d.request(child, "stackTrace", {"threadId": 1})
    entry = d.last_published("stackTrace")
    assert (entry.process, entry.origin, entry.local) == (CHILD, "me", False)
    assert orjson.loads(entry.body)["seq"] != seq  # rewritten into the adapter's seq space
    d.respond(entry, {"stackFrames": [], "totalFrames": 0})
    answer = d.responses(child)[seq]
    assert answer["success"] and answer["command"] == "stackTrace"
    assert d.new(main) == []  # the main IDE saw none of it
    # the main session is unaffected: its own requests go to the main process
    main_seq = d.request(main, "threads")
    main_entry = d.last_published("threads")
    assert main_entry.process == ""
    d.respond(main_entry, {"threads": [{"id": 5, "name": "MainThread"}]})
    assert d.responses(main)[main_seq]["body"]["threads"][0]["id"] == 5
    assert not any(m.get("command") == "threads" for m in d.seen[child])


def test_a_child_sessions_breakpoints_are_forwarded_for_its_process() -> None:
    d = Desk()
    d.attach()
    d.live()
    d.started()
    child = d.attach_child()
    args = {"source": {"path": "/home/me/project/worker.py"}, "breakpoints": [{"line": 9}]}
    seq = d.request(child, "setBreakpoints", args)
    entry = d.last_published("setBreakpoints")
    assert (entry.process, entry.local, entry.bp_ids) == (CHILD, False, [1])
    d.respond(entry, {"breakpoints": [{"id": 77, "verified": True, "line": 9}]})
    assert d.responses(child)[seq]["body"]["breakpoints"] == [
        {"id": 1, "verified": True, "line": 9}
    ]


def test_a_childs_stop_names_the_ids_its_own_session_gave_also_after_a_reattach() -> None:
    """The worker configured the child with the run's breakpoints before its session existed
    (debugpy's ids 31 and 32 there); its stop names them by the ids the child session's own
    ``setBreakpoints`` answered, to this IDE and to the next one."""
    d = Desk()
    d.attach()
    d.live()
    d.started()
    path = "/home/me/project/worker.py"
    places = {"command": "setBreakpoints", "source": path, "keys": [8, 9], "ids": [31, 32]}
    d.event(PLACES_EVENT, places)
    d.event("thread", {"reason": "started", "threadId": 1})
    d.event("stopped", {"reason": "breakpoint", "threadId": 1, "hitBreakpointIds": [32]})
    for _ in range(2):  # the IDE that attaches, then one that attaches again
        child = d.connect()
        d.request(child, "initialize", {"adapterID": "debugpy"})
        d.request(child, "attach", {**ATTACH, "subProcessId": int(CHILD)})
        args = {"source": {"path": path}, "breakpoints": [{"line": 9}, {"line": 12}]}
        seq = d.request(child, "setBreakpoints", args)
        answer = [{"id": 40, "verified": True}, {"id": 41, "verified": True}]
        d.respond(d.last_published("setBreakpoints"), {"breakpoints": answer})
        ids = [bp["id"] for bp in d.responses(child)[seq]["body"]["breakpoints"]]
        d.request(child, "configurationDone")
        [stopped] = [m for m in d.seen[child] if m.get("event") == "stopped"]
        assert stopped["body"]["hitBreakpointIds"] == [ids[0]]
        assert PLACES_EVENT not in names(d.seen[child])
        d.disconnect(child)
    # live, to the IDE attached: the same
    child = d.attach_child()
    d.event("continued", {"threadId": 1, "allThreadsContinued": True}, CHILD)
    d.event("stopped", {"reason": "breakpoint", "threadId": 1, "hitBreakpointIds": [41, 31]})
    stopped = d.new(child)[-1]
    assert stopped["event"] == "stopped" and stopped["body"]["hitBreakpointIds"] == [ids[1]]


def test_a_second_connection_for_a_child_takes_its_session_over() -> None:
    d = Desk()
    main = d.attach()
    d.live()
    d.started()
    first = d.attach_child()
    second = d.attach_child()
    assert d.closed == [first]  # the child's previous connection, and nothing else
    assert d.main.configured and d.processes.core_of(main) is d.main
    d.stopped()
    assert "stopped" in names(d.seen[second]) and "stopped" not in names(d.seen[first])


def test_reattach_to_a_paused_child_replays_its_stop() -> None:
    d = Desk()
    d.attach()
    d.live()
    d.started()
    d.stopped(tid=3)
    first = d.attach_child()
    d.perform(
        d.processes.on_ide_message(first, {"seq": 50, "type": "request", "command": "disconnect"})
    )
    assert first in d.closed and not d.cancelled
    d.disconnect(first)
    again = d.attach_child()
    events = [m for m in d.seen[again] if m["type"] == "event"]
    assert [(m["event"], m.get("body", {}).get("threadId")) for m in events[-2:]] == [
        ("thread", 3),
        ("stopped", 3),
    ]


def test_a_childs_all_threads_stop_is_shown_once_on_the_thread_that_stopped() -> None:
    """A rank with a DataLoader has queue feeder threads beside its main thread: its session,
    offered after the stop, sees one ``stopped`` (thread 1's), not one per thread."""
    d = Desk()
    d.attach(supportsStartDebuggingRequest=True)
    d.live()
    d.started()
    for tid in (2, 3):
        d.event("thread", {"reason": "started", "threadId": tid})
    d.stopped(tid=1)
    child = d.attach_child()
    stops = [m["body"] for m in d.seen[child] if m.get("event") == "stopped"]
    assert stops == [{"reason": "breakpoint", "threadId": 1, "allThreadsStopped": True}]


def test_a_child_session_ends_when_its_process_exits() -> None:
    d = Desk()
    main = d.attach()
    d.live()
    d.started()
    child = d.attach_child()
    seq = d.request(child, "threads")
    d.new(main)
    d.new(child)
    d.deliver(StatusEntry(event=StatusEvent.PROCESS_EXITED, process=CHILD, exit_code=3))
    fresh = d.new(child)
    assert d.responses(child)[seq]["success"] is False  # answered, exactly once
    assert names(fresh)[-2:] == ["exited", "terminated"] and fresh[-2]["body"]["exitCode"] == 3
    assert d.new(main) == []
    d.disconnect(child)
    late = d.connect()  # the process is gone: nothing to attach to, nothing taken over
    d.request(late, "initialize", {"adapterID": "debugpy"})
    seq = d.request(late, "attach", {**ATTACH, "subProcessId": 4242})
    assert d.responses(late)[seq]["success"] is False and d.main.configured


def test_the_end_of_the_run_ends_every_child_session() -> None:
    d = Desk()
    main = d.attach()
    d.live()
    d.started("4242")
    d.started("4243")
    children = [d.attach_child("4242"), d.attach_child("4243")]
    d.deliver(StatusEntry(event=StatusEvent.EXITED, exit_code=0))
    for child in children:
        assert names(d.seen[child])[-1] == "terminated"
    assert names(d.seen[main])[-1] == "terminated"


def test_a_child_session_never_cancels_the_run() -> None:
    d = Desk()
    d.attach()
    d.live()
    d.started()
    child = d.attach_child()
    published = len(d.published)
    seq = d.request(child, "terminate")
    assert d.responses(child)[seq]["success"] and names(d.seen[child])[-1] == "terminated"
    seq = d.request(child, "disconnect", {"terminateDebuggee": True})
    assert d.responses(child)[seq]["success"] and child in d.closed
    assert not d.cancelled and len(d.published) == published


def test_a_disconnect_before_attach_takes_nothing_over() -> None:
    d = Desk()
    main = d.attach()
    stray = d.connect()
    d.request(stray, "initialize", {"adapterID": "debugpy"})
    seq = d.request(stray, "disconnect")
    assert d.responses(stray)[seq]["success"] and d.closed == [stray] and d.main.configured
    assert d.processes.core_of(main) is d.main


@pytest.mark.parametrize(("world_size", "hinted"), [(2, True), (None, False)])
def test_a_paused_rank_of_a_distributed_job_is_warned_once(
    world_size: int | None, hinted: bool
) -> None:
    d = Desk()
    d.attach()
    d.live()
    d.started(rank=1, world_size=world_size)
    child = d.attach_child()
    d.stopped()
    d.event("continued", {"threadId": 1, "allThreadsContinued": True})
    d.stopped()
    hints = [
        m for m in d.seen[child] if COLLECTIVE_TIMEOUT_HINT in m.get("body", {}).get("output", "")
    ]
    assert len(hints) == (1 if hinted else 0)
    # the terminal hears it too, once, whether an IDE shows the child or not
    paused = StatusEntry(event=StatusEvent.PAUSED, process=CHILD, data={"where": "w.py:3"})
    d.deliver(paused)
    d.deliver(paused)
    assert d.said == (
        [f"rank 1 (pid 4242) on gpu-node-7 is paused: {COLLECTIVE_TIMEOUT_HINT}"] if hinted else []
    )


def test_deliveries_go_to_the_session_of_their_process() -> None:
    d = Desk()
    main = d.attach()
    d.live()
    d.started()
    child = d.attach_child()
    d.new(main)
    d.new(child)
    d.event("output", {"category": "stdout", "output": "main\n"}, key="")
    d.event("thread", {"reason": "started", "threadId": 8})
    assert names(d.new(main)) == ["output"]
    assert names(d.new(child)) == ["thread"]


def test_a_process_of_another_node_is_attached_by_the_pid_its_offer_carries() -> None:
    """Node 1's program (key ``n1``) and a rank of it (``n1:PID``) are offered with their pids as
    ``subProcessId``, as node 0's are; an attach with that pid opens that process's session."""
    d = Desk()
    main = d.attach(supportsStartDebuggingRequest=True)
    d.live()
    for key, pid in (("n1", 5150), ("n1:5151", 5151)):
        data = ProcessInfo(key=key, pid=pid, host="node-1", node=1).model_dump()
        d.deliver(StatusEntry(event=StatusEvent.PROCESS_STARTED, process=key, data=data))
        d.stopped(key)
    offered = {o["arguments"]["configuration"]["subProcessId"] for o in d.offers(main)}
    assert offered == {5150, 5151}
    for key, pid in (("n1", 5150), ("n1:5151", 5151)):
        child = d.attach({**ATTACH, "subProcessId": pid})
        [attached] = [m for m in d.responses(child).values() if m["command"] == "attach"]
        assert attached["success"], attached
        d.request(child, "stackTrace", {"threadId": 1})
        assert d.last_published("stackTrace").process == key


def test_a_nodes_exit_is_not_the_runs_end_the_relays_exited_is() -> None:
    """Node 0's program of a 2-node run exits 0 while node 1's is stopped: its ``exited`` (it
    carries ``node``) ends no session; the relay's ``exited`` once the run is over ends them."""
    d = Desk()
    main = d.attach(supportsStartDebuggingRequest=True)
    d.live()
    data = ProcessInfo(key="n1", pid=5150, host="node-1", node=1).model_dump()
    d.deliver(StatusEntry(event=StatusEvent.PROCESS_STARTED, process="n1", data=data))
    d.stopped("n1")
    child = d.attach({**ATTACH, "subProcessId": 5150})
    node_exit = {"attempt": 1, "final": True, "node": 0}
    d.deliver(StatusEntry(event=StatusEvent.EXITED, exit_code=0, data=node_exit))
    assert not {"exited", "terminated"} & set(names(d.seen[main]) + names(d.seen[child]))
    d.request(child, "stackTrace", {"threadId": 1})
    assert d.last_published("stackTrace").process == "n1"  # node 1's session goes on
    d.deliver(StatusEntry(event=StatusEvent.EXITED, exit_code=0, data={"final": True}))
    assert {"exited", "terminated"} <= set(names(d.seen[main]))
