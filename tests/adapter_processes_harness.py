"""One IDE session per debugged process (:class:`adapter.dap.processes.Processes`) under a
hand-driven clock, for its unit tests (``tests/unit/test_adapter_processes.py``,
``test_adapter_child_sessions.py``): every message sent to an IDE is checked against the official
DAP schema, and every connection's messages are numbered 1, 2, 3, ... whichever session numbered
them."""

from __future__ import annotations

from collections import defaultdict
from typing import Any

import orjson
from hand_clock import HandClock

from adapter.dap.actions import Say
from adapter.dap.core import Action, AdapterCore, CancelRun, CloseIde, Publish, ToIde
from adapter.dap.processes import Processes
from protocol_specs.dap.schema import validate_message
from protocol_specs.session.processes import ProcessInfo
from protocol_specs.session.session import StatusEvent
from protocol_specs.wire.wire import DapEntry, PresenceEntry, StatusEntry, StreamName

CHILD = "4242"
ATTACH = {
    "name": "tether: r1",
    "type": "debugpy",
    "request": "attach",
    "connect": {"host": "127.0.0.1", "port": 7777},
    "justMyCode": False,
    "pathMappings": [{"localRoot": "/home/me/project", "remoteRoot": "."}],
    "processId": 17,
    "restart": True,
    "preLaunchTask": "build",
}


class Desk:
    """IDE connections on one side of the sessions, the relay on the other."""

    def __init__(self, mode: str = "stopped", port: int = 7777) -> None:
        self.clock = HandClock()
        self.main = AdapterCore("r1", origin="me", clock=self.clock)
        self.processes = Processes(self.main, mode=mode, port=port)
        self.seen: dict[int, list[dict[str, Any]]] = defaultdict(list)
        self.published: list[DapEntry] = []
        self.presence: list[PresenceEntry] = []
        self.closed: list[int] = []
        self.cancelled: list[str] = []
        self.said: list[str] = []  #: lines for the terminal
        self.seq: dict[int, int] = defaultdict(lambda: 100)  # the IDEs number from 101

    def perform(self, actions: list[Action]) -> None:
        for action in actions:
            if isinstance(action, ToIde):
                validate_message(action.message)
                seen = self.seen[action.generation]
                assert action.message["seq"] == len(seen) + 1, (action, seen)
                seen.append(action.message)
            elif isinstance(action, Publish):
                if isinstance(action.entry, PresenceEntry):
                    self.presence.append(action.entry)
                else:
                    self.published.append(action.entry)
            elif isinstance(action, CloseIde):
                self.closed.append(action.generation)
            elif isinstance(action, CancelRun):
                self.cancelled.append(action.detail)
            elif isinstance(action, Say):
                self.said.append(action.text)

    # --- the IDE side -----------------------------------------------------------------------------

    def connect(self) -> int:
        return self.processes.connected()

    def request(self, ide: int, command: str, arguments: Any = None) -> int:
        self.seq[ide] += 1
        msg: dict[str, Any] = {"seq": self.seq[ide], "type": "request", "command": command}
        if arguments is not None:
            msg["arguments"] = arguments
        self.perform(self.processes.on_ide_message(ide, msg))
        return self.seq[ide]

    def answer(self, ide: int, request: dict[str, Any], success: bool = True) -> None:
        self.seq[ide] += 1
        msg = {
            "seq": self.seq[ide],
            "type": "response",
            "request_seq": request["seq"],
            "command": request["command"],
            "success": success,
        }
        if not success:
            msg["message"] = "no debugger extension for this configuration"
        self.perform(self.processes.on_ide_message(ide, msg))

    def attach(self, attach: dict[str, Any] | None = None, **init: Any) -> int:
        ide = self.connect()
        self.request(ide, "initialize", {"adapterID": "debugpy", **init})
        self.request(ide, "attach", attach if attach is not None else ATTACH)
        self.request(ide, "configurationDone")
        return ide

    def attach_child(self, key: str = CHILD) -> int:
        return self.attach({**ATTACH, "subProcessId": int(key)})

    def disconnect(self, ide: int) -> None:
        self.perform(self.processes.ide_disconnected(ide))

    def new(self, ide: int) -> list[dict[str, Any]]:
        """What ``ide`` was sent since the last call."""
        seen = self.seen[ide]
        fresh = seen[getattr(self, f"_read_{ide}", 0) :]
        setattr(self, f"_read_{ide}", len(seen))
        return fresh

    def responses(self, ide: int) -> dict[int, dict[str, Any]]:
        return {m["request_seq"]: m for m in self.seen[ide] if m["type"] == "response"}

    def offers(self, ide: int) -> list[dict[str, Any]]:
        return [
            m
            for m in self.seen[ide]
            if m.get("command") == "startDebugging" or m.get("event") == "debugpyAttach"
        ]

    # --- the relay side ---------------------------------------------------------------------------

    def deliver(
        self, entry: DapEntry | StatusEntry, stream: StreamName = StreamName.TO_IDE
    ) -> None:
        self.perform(self.processes.on_delivery(stream, entry))

    def live(self) -> None:
        self.deliver(StatusEntry(event=StatusEvent.STARTED))
        self.deliver(StatusEntry(event=StatusEvent.DEBUGGER_LIVE))

    def started(self, key: str = CHILD, **info: Any) -> None:
        data = ProcessInfo(key=key, pid=int(key), host="gpu-node-7", **info).model_dump()
        self.deliver(StatusEntry(event=StatusEvent.PROCESS_STARTED, process=key, data=data))

    def event(self, name: str, body: dict[str, Any], key: str = CHILD) -> None:
        msg = {"seq": 7, "type": "event", "event": name, "body": body}
        self.deliver(DapEntry(body=orjson.dumps(msg), process=key))

    def stopped(self, key: str = CHILD, tid: int = 1) -> None:
        self.event("thread", {"reason": "started", "threadId": tid}, key)
        body = {"reason": "breakpoint", "threadId": tid, "allThreadsStopped": True}
        self.event("stopped", body, key)

    def respond(self, entry: DapEntry, body: dict[str, Any] | None = None) -> None:
        """The worker's answer to a published request, addressed as the worker addresses it."""
        req = orjson.loads(entry.body)
        msg: dict[str, Any] = {
            "seq": 900,
            "type": "response",
            "request_seq": req["seq"],
            "success": True,
            "command": req["command"],
        }
        if body is not None:
            msg["body"] = body
        self.deliver(DapEntry(origin=entry.origin, body=orjson.dumps(msg), process=entry.process))

    def last_published(self, command: str) -> DapEntry:
        return next(
            e for e in reversed(self.published) if orjson.loads(e.body).get("command") == command
        )


def names(messages: list[dict[str, Any]]) -> list[str]:
    return [m.get("event") or m.get("command") or "" for m in messages]
