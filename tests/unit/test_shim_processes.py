"""The shim's processes, stepped message by message: children announced, named, configured at once
with the run-wide configuration, requests routed by ``process`` (no sockets, a hand clock)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import orjson

from protocol_specs.dap.schema import validate_message
from protocol_specs.link.link import Cursor
from protocol_specs.runs.runs import RunRecord
from protocol_specs.runs.spec import RunSpec
from protocol_specs.session.processes import ProcessInfo
from protocol_specs.session.session import PLACES_EVENT, StatusEvent
from protocol_specs.wire.wire import (
    DapEntry,
    Deliver,
    PresenceEntry,
    StatusEntry,
    StreamName,
    encode_entry,
)
from worker_shim.program.process_names import ProcFacts, describe, read_proc
from worker_shim.session.actions import Action, CloseChild, OpenChild, Publish, ToDebugpy
from worker_shim.session.core import ShimCore
from worker_shim.session.processes import DebuggedProcesses
from worker_shim.session.replay import ReplayPhase

WORKDIR = "/home/me/project"
RUN_DIR = "/runs/r1-1"
WALL = 1_790_000_000.0

FACTS = {
    100: ProcFacts({}, ["python", "train.py"], 1),
    201: ProcFacts({"RANK": "0", "WORLD_SIZE": "2"}, ["python", "train.py"], 100),
    202: ProcFacts({"RANK": "1", "WORLD_SIZE": "2", "LOCAL_RANK": "1"}, ["python", "t.py"], 100),
}


class Harness:
    def __init__(self, **spec: Any) -> None:
        self.now = 10.0
        fields: dict[str, Any] = {"command": ["python", "train.py"], "workdir": WORKDIR,
                                  "post_mortem": False, **spec}  # fmt: skip
        record = RunRecord(id="r1", spec=RunSpec(wait_for_ide=False, **fields), attempt=1)
        main = ShimCore(record, RUN_DIR, tail=Cursor.parse("0-0"), clock=lambda: self.now,
                        wall=lambda: WALL)  # fmt: skip
        self.p = DebuggedProcesses(
            main, read=lambda pid: FACTS.get(pid, ProcFacts()), host="node-7"
        )
        self.sent: dict[str, list[dict[str, Any]]] = {}
        self.published: list[DapEntry | StatusEntry] = []
        self.opened: list[str] = []
        self.closed: list[CloseChild] = []
        self.cursor = 0
        self.seqs: dict[str, int] = {}

    def perform(self, actions: list[Action]) -> list[Action]:
        for action in actions:
            if isinstance(action, ToDebugpy):
                validate_message(action.message)
                self.sent.setdefault(action.process, []).append(action.message)
            elif isinstance(action, Publish):
                if isinstance(action.entry, DapEntry):
                    validate_message(orjson.loads(action.entry.body))
                self.published.append(action.entry)
            elif isinstance(action, OpenChild):
                self.opened.append(action.process)
            elif isinstance(action, CloseChild):
                self.closed.append(action)
        return actions

    def last(self, key: str, command: str) -> dict[str, Any]:
        return next(m for m in reversed(self.sent[key]) if m.get("command") == command)

    def debugpy(self, key: str, msg: dict[str, Any]) -> list[Action]:
        self.seqs[key] = self.seqs.get(key, 0) + 1
        raw = orjson.dumps({"seq": self.seqs[key], **msg})
        return self.perform(self.p.on_debugpy_message(key, raw, 10**6))

    def respond(self, key: str, command: str, body: Any = None) -> list[Action]:
        req = self.last(key, command)
        if body is None and command == "setBreakpoints":
            body = {"breakpoints": []}
        msg = {"type": "response", "request_seq": req["seq"], "success": True, "command": command}
        return self.debugpy(key, {**msg, **({"body": body} if body is not None else {})})

    def event(self, key: str, name: str, body: Any = None) -> list[Action]:
        return self.debugpy(
            key, {"type": "event", "event": name, **({"body": body} if body else {})}
        )

    def deliver(self, entry: DapEntry) -> list[Action]:
        self.cursor += 1
        d = Deliver(
            stream=StreamName.TO_WORKER, cursor=f"{self.cursor}-0", entry=encode_entry(entry)
        )
        return self.perform(self.p.on_delivery(d))

    def ide(self, command: str, arguments: Any, seq: int, process: str = "") -> list[Action]:
        body = {"seq": seq, "type": "request", "command": command, "arguments": arguments}
        bp_ids = [seq] if command == "setBreakpoints" else None
        entry = DapEntry(origin="ide1", body=orjson.dumps(body), bp_ids=bp_ids, process=process)
        return self.deliver(entry)

    def go_live(self) -> None:
        """The main process: started, replayed, live."""
        self.perform(self.p.start(100))
        self.respond("", "initialize", {})
        self.event("", "initialized")
        while self.p.main.phase is ReplayPhase.CONFIGURING:
            self.respond("", self.sent[""][-1]["command"])
        self.respond("", "configurationDone")
        self.respond("", "attach")
        assert self.p.main.live

    def announce(self, parent: str, pid: int, *, reverse: bool = True) -> None:
        config = {"name": f"Subprocess {pid}", "subProcessId": pid,
                  "connect": {"host": "127.0.0.1", "port": 5678}}  # fmt: skip
        if reverse:
            self.debugpy(parent, {"type": "request", "command": "startDebugging",
                                  "arguments": {"request": "attach", "configuration": config}})  # fmt: skip
        else:
            self.event(parent, "debugpyAttach", {**config, "request": "attach"})

    def statuses(self, event: str) -> list[StatusEntry]:
        return [e for e in self.published if isinstance(e, StatusEntry) and e.event == event]


def src(path: str) -> dict[str, Any]:
    return {"source": {"path": f"{WORKDIR}/{path}"}, "breakpoints": [{"line": 3}]}


def test_a_child_is_announced_named_and_configured_at_once_with_the_latest_configuration() -> None:
    h = Harness()
    h.ide("setBreakpoints", src("train.py"), 1)
    h.go_live()
    h.ide("setBreakpoints", {**src("train.py"), "breakpoints": [{"line": 9}]}, 2)
    h.ide("setBreakpoints", src("data.py"), 3, process="999")  # any process's, folded run-wide
    h.announce("", 201)
    answer = h.sent[""][-1]
    assert answer["type"] == "response" and answer["command"] == "startDebugging"
    assert answer["success"] is True
    [started] = h.statuses(StatusEvent.PROCESS_STARTED)
    info = ProcessInfo.model_validate(started.data)
    assert started.process == "201" and started.detail == "rank 0 (pid 201) on node-7"
    assert (info.rank, info.world_size, info.parent, info.nth) == (0, 2, "", 1)
    assert h.opened == ["201"]
    init = h.last("201", "initialize")
    assert init["arguments"]["supportsStartDebuggingRequest"] is True
    h.respond("201", "initialize", {})
    attach = h.last("201", "attach")["arguments"]
    assert attach["subProcessId"] == 201
    assert attach["pathMappings"] == [{"localRoot": WORKDIR, "remoteRoot": RUN_DIR}]
    assert attach["redirectOutput"] is False
    h.event("201", "initialized")
    sent = [m["command"] for m in h.sent["201"]]
    assert sent == ["initialize", "attach", "setBreakpoints", "setBreakpoints", "configurationDone"]
    lines = {m["arguments"]["source"]["path"]: m["arguments"]["breakpoints"] for m in h.sent["201"]
             if m["command"] == "setBreakpoints"}  # fmt: skip
    assert lines == {f"{WORKDIR}/train.py": [{"line": 9}], f"{WORKDIR}/data.py": [{"line": 3}]}
    # the replay's answers stay in the shim: no IDE asked
    before = len(h.published)
    h.respond("201", "setBreakpoints", {"breakpoints": []})
    h.respond("201", "configurationDone")
    h.respond("201", "attach")
    assert len(h.published) == before
    assert h.p.children["201"].live


def child_live(h: Harness, pid: int, answers: list[dict[str, Any]]) -> None:
    """``pid`` announced and configured; debugpy answers its ``setBreakpoints`` with ``answers``."""
    key = str(pid)
    h.announce("", pid)
    h.respond(key, "initialize", {})
    h.event(key, "initialized")
    for answer in answers:
        h.respond(key, "setBreakpoints", answer)
    h.respond(key, "configurationDone")
    h.respond(key, "attach")


def wait(h: Harness) -> None:
    """Time goes by: the child's look-ups time out, and its reports go out."""
    for _ in range(3):
        h.now += 10
        h.perform(h.p.on_tick())


def test_a_child_started_after_an_ide_attached_knows_it_is_attached() -> None:
    """Presence is said once, when it changes: a child started later is watched as attended."""
    h = Harness()
    h.deliver(PresenceEntry(origin="ide1", epoch=1, attached=True))
    h.go_live()
    child_live(h, 201, [])
    h.event("201", "stopped", {"reason": "breakpoint", "threadId": 1})
    wait(h)  # long enough for its pause report (where: debugpy does not say)
    assert h.statuses(StatusEvent.PAUSED)  # a notice would have gone out before it
    assert h.statuses(StatusEvent.UNATTENDED_STOP) == []
    h.deliver(PresenceEntry(origin="ide1", epoch=2, attached=False))  # and when it leaves
    wait(h)
    [notice] = h.statuses(StatusEvent.UNATTENDED_STOP)
    assert notice.process == "201" and "no IDE is attached" in notice.detail


def test_the_places_of_a_childs_breakpoints_are_said_with_debugpys_ids() -> None:
    h = Harness()
    h.ide("setBreakpoints", {**src("train.py"), "breakpoints": [{"line": 3}, {"line": 9}]}, 1)
    h.go_live()
    before = len(h.published)
    answer = {"breakpoints": [{"id": 5, "verified": True}, {"id": 6, "verified": False}]}
    child_live(h, 201, [answer])
    [places] = [e for e in h.published[before:] if isinstance(e, DapEntry)]
    msg = orjson.loads(places.body)
    assert (places.process, places.origin, places.transient) == ("201", "", False)
    assert msg["event"] == PLACES_EVENT
    path = f"{WORKDIR}/train.py"
    assert msg["body"] == {
        "command": "setBreakpoints",
        "source": path,
        "keys": [3, 9],
        "ids": [5, 6],
    }


def test_requests_are_routed_by_process_and_answered_under_the_askers_seq() -> None:
    h = Harness()
    h.go_live()
    h.announce("", 202, reverse=False)  # debugpy's own event: the same, and nothing to answer
    assert h.sent[""][-1]["command"] != "startDebugging"
    h.ide("threads", {}, 40, process="202")  # before the child is live: held
    assert [m["command"] for m in h.sent["202"]] == ["initialize"]
    h.respond("202", "initialize", {})
    h.event("202", "initialized")
    h.respond("202", "configurationDone")
    h.respond("202", "attach")
    threads = h.last("202", "threads")
    h.ide("stackTrace", {"threadId": 1}, 41, process="")
    assert h.last("", "stackTrace")["arguments"] == {"threadId": 1}  # the main's, on its own
    h.respond("202", "threads", {"threads": []})
    reply = h.published[-1]
    assert isinstance(reply, DapEntry) and reply.process == "202" and reply.origin == "ide1"
    assert orjson.loads(reply.body)["request_seq"] == 40
    assert threads["seq"] != 40  # the connection's own numbering
    # its events carry its key; its end is one process_exited
    h.event("202", "stopped", {"reason": "breakpoint", "threadId": 1})
    stopped = h.published[-1]
    assert isinstance(stopped, DapEntry) and stopped.process == "202"
    h.event("202", "exited", {"exitCode": 3})
    h.event("202", "terminated")
    assert h.last("202", "disconnect")
    [gone] = h.statuses(StatusEvent.PROCESS_EXITED)
    assert (gone.process, gone.exit_code) == ("202", 3)
    h.perform(h.p.closed("202"))
    assert len(h.statuses(StatusEvent.PROCESS_EXITED)) == 1
    # a request for a process that ended, or never was: an error for the asker
    h.ide("threads", {}, 42, process="202")
    h.ide("threads", {}, 43, process="777")
    for entry, seq in zip(h.published[-2:], (42, 43), strict=True):
        assert isinstance(entry, DapEntry) and entry.origin == "ide1"
        msg = orjson.loads(entry.body)
        assert (msg["request_seq"], msg["success"]) == (seq, False)


def test_ranks_not_listed_run_free_and_children_of_children_are_named_from_their_parent() -> None:
    h = Harness(ranks=[0])
    h.ide("setBreakpoints", src("train.py"), 1)
    h.go_live()
    h.announce("", 202)  # rank 1: not listed
    h.respond("202", "initialize", {})
    h.event("202", "initialized")
    assert [m["command"] for m in h.sent["202"]] == ["initialize", "attach", "configurationDone"]
    h.announce("", 201)  # rank 0
    h.respond("201", "initialize", {})
    h.event("201", "initialized")
    assert "setBreakpoints" in [m["command"] for m in h.sent["201"]]
    h.announce("201", 301)  # a worker of rank 0, announced on rank 0's connection
    assert h.sent["201"][-1]["command"] == "startDebugging"
    started = h.statuses(StatusEvent.PROCESS_STARTED)[-1]
    assert started.process == "301" and started.detail == "worker 1 of rank 0 (pid 301) on node-7"


def test_every_child_reported_started_is_reported_gone_even_one_announced_as_the_program_ended() -> (
    None
):
    h = Harness()
    h.go_live()
    h.announce("", 201)
    h.perform(h.p.end())  # the program exited: the shim ends what it thought alive
    h.announce("", 202)  # debugpy's announcement was on its way
    assert h.sent[""][-1]["command"] == "startDebugging"  # answered all the same
    started = {s.process for s in h.statuses(StatusEvent.PROCESS_STARTED)}
    gone = {s.process for s in h.statuses(StatusEvent.PROCESS_EXITED)}
    assert started == gone == {"201"} and h.opened == ["201"]


def test_stale_requests_for_processes_of_the_streams_past_are_not_answered() -> None:
    h = Harness()
    h.ide("continue", {"threadId": 1}, 5, process="4242")  # an earlier attempt's child
    assert h.published == []


def test_describe_reads_the_processes_environment_command_and_parent(tmp_path: Path) -> None:
    proc = tmp_path / "4242"
    proc.mkdir()
    (proc / "environ").write_bytes(b"PATH=/bin\0RANK=3\0LOCAL_RANK=1\0WORLD_SIZE=8\0X=a=b\0")
    (proc / "cmdline").write_bytes(b"python\0-u\0train step.py\0")
    (proc / "stat").write_bytes(b"4242 (py (thon) x) S 4100 4242 4100 0 -1")
    facts = read_proc(4242, str(tmp_path))
    assert facts.ppid == 4100 and facts.environ["X"] == "a=b"
    info = describe(4242, facts, parent="", nth=2, host="gpu-node-7")
    assert (info.key, info.rank, info.local_rank, info.world_size) == ("4242", 3, 1, 8)
    assert info.command == "python -u 'train step.py'"
    assert info.title() == "rank 3 (pid 4242) on gpu-node-7"
    gone = read_proc(999, str(tmp_path))
    assert gone == ProcFacts()


def test_a_pid_announced_again_is_a_new_incarnation_its_old_session_ended() -> None:
    """fork then exec: debugpy announces the pid again for the exec'd program (and keeps the old
    connection open until its client lets go): the old session ends, a new one is configured."""
    h = Harness()
    h.ide("setBreakpoints", src("train.py"), 1)
    h.go_live()
    child_live(h, 201, [{"breakpoints": []}])
    old = h.p.children["201"]
    h.announce("", 201)  # the exec'd program, same pid
    assert old.ended and h.p.children["201"] is not old
    started = h.statuses(StatusEvent.PROCESS_STARTED)
    [gone] = h.statuses(StatusEvent.PROCESS_EXITED)
    assert [s.process for s in started] == ["201", "201"] and gone.process == "201"
    # in order: the old one's end, then the new one's start
    assert h.published.index(gone) < h.published.index(started[1])
    assert h.closed == [CloseChild("201", retired=True)] and h.opened == ["201", "201"]
    assert ProcessInfo.model_validate(started[1].data).parent == ""
    # the new incarnation is configured with the run's breakpoints, then live
    h.respond("201", "initialize", {})
    h.event("201", "initialized")
    assert [m["command"] for m in h.sent["201"][-4:]] == [
        "initialize", "attach", "setBreakpoints", "configurationDone"]  # fmt: skip
    h.respond("201", "setBreakpoints")
    h.respond("201", "configurationDone")
    h.respond("201", "attach")
    assert h.p.children["201"].live


def test_a_pid_announced_again_on_its_own_connection_keeps_its_parent() -> None:
    h = Harness()
    h.go_live()
    child_live(h, 201, [])
    h.announce("201", 201)  # no session for its parent: debugpy tells the old connection
    started = h.statuses(StatusEvent.PROCESS_STARTED)
    assert [ProcessInfo.model_validate(s.data).parent for s in started] == ["", ""]
