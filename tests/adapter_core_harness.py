"""The adapter's routing core (:class:`adapter.dap.core.AdapterCore`) under a hand-driven clock,
for its unit tests (``tests/unit/test_adapter_core*.py``): every message it sends to the IDE is
checked against the official DAP schema."""

from __future__ import annotations

from typing import Any

import orjson
from hand_clock import HandClock

from adapter.dap.core import (
    Action,
    AdapterCore,
    Publish,
    ToIde,
)
from protocol_specs.dap.schema import validate_message
from protocol_specs.session.session import StatusEvent
from protocol_specs.wire.wire import DapEntry, PresenceEntry, StatusEntry, StreamName

MAIN = "/home/me/project/train.py"
DATA = "/home/me/project/data.py"


class Harness:
    """An IDE on one side of the core, the relay on the other."""

    def __init__(self, origin: str = "me", **kwargs: Any) -> None:
        self.clock = HandClock()
        self.core = AdapterCore("r1", origin=origin, clock=self.clock, **kwargs)
        self.ide_seq = 100  # the IDE's numbering differs from the adapter's on purpose
        self.published: list[DapEntry] = []
        self.presence: list[PresenceEntry] = []

    def sent(self, actions: list[Action]) -> list[dict[str, Any]]:
        out = []
        for action in actions:
            if isinstance(action, ToIde):
                validate_message(action.message)
                out.append(action.message)
            elif isinstance(action, Publish):
                if isinstance(action.entry, PresenceEntry):
                    self.presence.append(action.entry)
                else:
                    self.published.append(action.entry)
        return out

    def connect(self) -> None:
        self.sent(self.core.ide_connected())

    def request(self, command: str, arguments: Any = None) -> list[dict[str, Any]]:
        self.ide_seq += 1
        msg: dict[str, Any] = {"seq": self.ide_seq, "type": "request", "command": command}
        if arguments is not None:
            msg["arguments"] = arguments
        return self.sent(self.core.on_ide_message(msg))

    def handshake(self, **init: Any) -> list[dict[str, Any]]:
        out = self.request("initialize", {"adapterID": "debugpy", **init})
        out += self.request("attach", {"justMyCode": True})
        out += self.request("setBreakpoints", bp_args(MAIN, [11, 17]))
        out += self.request("setExceptionBreakpoints", {"filters": ["uncaught"]})
        out += self.request("configurationDone")
        return out

    def deliver(
        self, entry: DapEntry | StatusEntry, stream: StreamName = StreamName.TO_IDE
    ) -> list[dict[str, Any]]:
        return self.sent(self.core.on_delivery(stream, entry))

    def status(self, event: str, **fields: Any) -> list[dict[str, Any]]:
        return self.deliver(StatusEntry(event=event, **fields))

    def respond(
        self, entry: DapEntry, body: dict[str, Any] | None = None, success: bool = True
    ) -> list[dict[str, Any]]:
        """The worker's response to a published request."""
        req = orjson.loads(entry.body)
        msg: dict[str, Any] = {
            "seq": 900,
            "type": "response",
            "request_seq": req["seq"],
            "success": success,
            "command": req["command"],
        }
        if body is not None:
            msg["body"] = body
        return self.deliver(DapEntry(origin=entry.origin, body=orjson.dumps(msg)))

    def event(self, name: str, body: dict[str, Any] | None = None) -> list[dict[str, Any]]:
        msg: dict[str, Any] = {"seq": 901, "type": "event", "event": name}
        if body is not None:
            msg["body"] = body
        return self.deliver(DapEntry(body=orjson.dumps(msg)))

    def last_published(self, command: str) -> DapEntry:
        return next(
            e for e in reversed(self.published) if orjson.loads(e.body).get("command") == command
        )


def bp_args(path: str, lines: list[int]) -> dict[str, Any]:
    return {
        "source": {"name": path.rsplit("/", 1)[-1], "path": path},
        "breakpoints": [{"line": n} for n in lines],
        "lines": lines,
    }


def kinds(messages: list[dict[str, Any]]) -> list[str]:
    return [m.get("command") if m["type"] == "response" else m.get("event") for m in messages]  # type: ignore[misc]


def live_harness() -> Harness:
    h = Harness(request_timeout=5.0)
    h.connect()
    h.handshake()
    h.status(StatusEvent.DEBUGGER_LIVE)
    return h
