"""The worker's end of the metrics socket (``worker_shim/program/metrics.py``) over a fake run link,
with real unix sockets: whatever a program writes is at worst dropped, a flood neither holds the
worker's loop nor its memory, and the patterns run off the loop."""

from __future__ import annotations

import socket
import threading
from pathlib import Path
from typing import Any, cast

import trio
from test_program_output import FakeLink

from protocol_specs.runs.metrics import HOLD_CAP, points_of
from protocol_specs.wire.wire import (
    AnyEntry,
    ControlEntry,
    DapEntry,
    Deliver,
    StreamName,
    encode_entry,
)
from relay.client import RunLink
from worker_shim.program.metrics import (
    SOCKET_NAME,
    ProgramControl,
    control_action,
    open_program_metrics,
)


def connect(where: Path) -> socket.socket:
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    sock.connect(str(where / SOCKET_NAME))
    return sock


async def test_garbage_is_dropped_and_the_good_lines_go_through(tmp_path: Path) -> None:
    link = FakeLink()
    async with open_program_metrics(
        cast(RunLink, link), tmp_path, patterns=[], attempt=1
    ) as metrics:
        with connect(tmp_path) as program:
            program.sendall(
                b'[0, 1.0, {"loss": 1'
                + b"0" * 400
                + b"}]\n"  # beyond any float
                + b"[" * 5000
                + b"\n"  # nested too deep for a parser
                + b'{"pause": "no"}\n'  # a question that means nothing: answered no
                + b"\xff\xfe not utf-8\n"
                + b'[1, 2.0, {"loss": 0.5}]\n'
            )
            program.settimeout(5)
            assert await trio.to_thread.run_sync(program.recv, 64) == b"go on\n"
    # the end read and published what was left
    assert metrics.dropped == 3
    assert points_of(cast(list[Any], link.entries)) == [(1, 2.0, {"loss": 0.5})]


async def test_a_flood_leaves_the_loop_free_and_the_hold_bounded(tmp_path: Path) -> None:
    link = FakeLink()
    link.room = 0  # the relay takes nothing: the hold fills
    lines = b"".join(b'[%d, 0.0, {"loss": 0.5}]\n' % i for i in range(HOLD_CAP * 3))
    async with open_program_metrics(
        cast(RunLink, link), tmp_path, patterns=[], attempt=1
    ) as metrics:
        program = connect(tmp_path)
        writer = threading.Thread(target=lambda: _send_quietly(program, lines), daemon=True)
        writer.start()
        ticks = 0
        with trio.move_on_after(2):
            while True:  # the worker's loop goes on serving while the program floods
                await trio.sleep(0.01)
                ticks += 1
        # a loop the reader holds barely ticks in the 2 s; a free one about 200 times
        # (fewer on a loaded machine, where each sleep overshoots: hence the low bar)
        assert ticks > 10
        assert HOLD_CAP <= len(metrics.hold) < HOLD_CAP + 20_000  # full: reading stopped
        program.close()
        link.failed = None
        link.make_room(10**9)


def _send_quietly(sock: socket.socket, data: bytes) -> None:
    try:
        sock.sendall(data)
    except OSError:  # the test closed it: the program goes on (its report is lost, not it)
        pass


def test_what_a_control_entry_asks_of_the_program_is_one_of_a_closed_set() -> None:
    """``stop``, ``suspend`` and ``resume`` for this attempt (0: any) reach the program; the
    shim's own actions, another attempt's and any other entry are nothing to it."""

    def asked(entry: AnyEntry, attempt: int = 2) -> ProgramControl | None:
        deliver = Deliver(stream=StreamName.TO_WORKER, cursor="1-0", entry=encode_entry(entry))
        return control_action(deliver, attempt)

    assert asked(ControlEntry(action="stop", attempt=2)) is ProgramControl.STOP
    assert asked(ControlEntry(action="suspend", attempt=0)) is ProgramControl.SUSPEND
    assert asked(ControlEntry(action="resume")) is ProgramControl.RESUME
    assert asked(ControlEntry(action="stop", attempt=1)) is None  # an earlier attempt's
    assert asked(ControlEntry(action="terminate", attempt=2)) is None  # the shim's to perform
    assert asked(ControlEntry(action="tunnel", attempt=2)) is None
    assert asked(DapEntry(origin="a1", body=b"{}")) is None
