"""The program's output on its way to the logs stream and the IDE (worker_shim.session.output).

``OutputHold`` is stepped chunk by chunk (merge, pieces, cap, UTF-8 split, redaction); the trio glue
``ProgramOutput`` runs over a fake run link under trio's MockClock (hold while unanswered, the cap
stopping the pump, the barrier and its bound).
"""

from __future__ import annotations

from typing import Any, cast

import pytest
import trio
import trio.testing
from hypothesis import given
from hypothesis import strategies as st

from protocol_specs.dap.models import plain_output
from protocol_specs.runs.spec import REDACTED
from protocol_specs.wire import wire
from relay.client import RelayError, RunLink
from worker_shim.session.output import (
    HOLD_CAP,
    OutputHold,
    ProgramOutput,
    pipe_output_attach,
    unbuffered_env,
)

Entry = wire.LogEntry | wire.DapEntry


def logs(entries: list[Entry]) -> list[tuple[str, bytes]]:
    return [(e.stream, e.data) for e in entries if isinstance(e, wire.LogEntry)]


def events(entries: list[Entry]) -> list[tuple[str, str]]:
    out = []
    for e in entries:
        if isinstance(e, wire.DapEntry):
            assert e.transient and e.origin == ""
            plain = plain_output(e.body)
            assert plain is not None, e.body
            out.append(plain)
    return out


def logged(entries: list[Entry], stream: str) -> bytes:
    return b"".join(data for name, data in logs(entries) if name == stream)


def shown(entries: list[Entry], stream: str) -> str:
    return "".join(text for name, text in events(entries) if name == stream)


# --- OutputHold: no I/O ---------------------------------------------------------------------------


def test_a_trickle_goes_at_once_and_a_flood_waits_merged() -> None:
    hold = OutputHold([], to_ide=True)
    hold.feed("stdout", b"first\n")
    first = hold.ready(answered=0)  # nothing in flight: at once
    assert logs(first) == [("stdout", b"first\n")]
    assert events(first) == [("stdout", "first\n")]
    hold.published(2)  # the log entry was 1, the event 2
    for part in (b"a", b"b\n", b"c\n"):
        hold.feed("stdout", part)
    hold.feed("stderr", b"oops\n")
    hold.feed("stdout", b"d\n")
    assert hold.ready(answered=1) == []  # the previous output entry is not answered yet
    assert hold.held == len(b"ab\nc\noops\nd\n")
    merged = hold.ready(answered=2)
    # one entry per run of one stream, in order: the IDE sees the same text in the same order
    assert logs(merged) == [("stdout", b"ab\nc\n"), ("stderr", b"oops\n"), ("stdout", b"d\n")]
    assert events(merged) == [("stdout", "ab\nc\n"), ("stderr", "oops\n"), ("stdout", "d\n")]
    assert [type(e) for e in merged] == [wire.LogEntry, wire.DapEntry] * 3  # log then event
    assert hold.held == 0 and hold.ready(answered=10) == []


def test_held_output_goes_out_in_bounded_pieces() -> None:
    hold = OutputHold([], to_ide=True, piece=16 * 1024)
    data = bytes(range(48, 58)) * 4000  # 40,000 bytes
    hold.published(5)
    hold.feed("stdout", data[:15000])
    hold.feed("stdout", data[15000:])
    entries = hold.flush()  # the barrier: answered or not
    sizes = [len(d) for _, d in logs(entries)]
    assert sizes == [16384, 16384, 40000 - 2 * 16384]
    assert logged(entries, "stdout") == data
    assert shown(entries, "stdout") == data.decode()


def test_the_cap_stops_the_reader_until_output_is_taken() -> None:
    hold = OutputHold([], cap=64 * 1024)
    hold.published(1)
    chunk = b"x" * 16 * 1024
    for _ in range(3):
        hold.feed("stdout", chunk)
        assert not hold.full
    hold.feed("stdout", chunk)
    assert hold.full and hold.held == 64 * 1024
    assert hold.ready(answered=0) == []  # still unanswered: the pump must wait
    assert len(hold.ready(answered=1)) == 4 and not hold.full
    assert HOLD_CAP == 1024 * 1024


def test_a_character_split_across_reads_arrives_whole() -> None:
    hold = OutputHold([], to_ide=True)
    euro = "€".encode()  # three bytes
    hold.feed("stdout", b"price: " + euro[:1])
    first = hold.flush()
    hold.feed("stdout", euro[1:] + b"\n")
    second = hold.flush()
    assert events(first) == [("stdout", "price: ")]
    assert events(second) == [("stdout", "€\n")]
    assert logged(first + second, "stdout") == "price: €\n".encode()  # the logs keep bytes


def test_a_piece_boundary_inside_a_character_and_a_dangling_end() -> None:
    hold = OutputHold([], to_ide=True, piece=4)
    hold.feed("stderr", "aaé€".encode())  # a, a, é (2 bytes), € (3 bytes): 7 bytes
    entries = hold.flush()
    assert [len(d) for _, d in logs(entries)] == [4, 3]
    assert events(entries) == [("stderr", "aaé"), ("stderr", "€")]
    hold.feed("stdout", "é".encode()[:1])  # the program ended in the middle of a character
    assert events(hold.flush()) == []
    assert events(hold.end()) == [("stdout", "\ufffd")]


def test_only_logs_when_the_ide_did_not_ask_for_output() -> None:
    hold = OutputHold([], to_ide=False)
    hold.feed("stdout", b"hello\n")
    entries = hold.ready(answered=0)
    assert logs(entries) == [("stdout", b"hello\n")] and events(entries) == []


def test_secrets_are_blanked_for_the_ide_as_in_the_logs() -> None:
    hold = OutputHold(["hunter2"], to_ide=True)
    hold.feed("stdout", b"token=hun")  # could be the start of the secret: held back
    hold.feed("stdout", b"ter2 ok\nlast: hun")
    entries = hold.flush()
    want = f"token={REDACTED} ok\nlast: "
    assert shown(entries, "stdout") == want
    assert logged(entries, "stdout") == want.encode()
    assert shown(hold.end(), "stdout") == "hun"  # the stream ended: not a secret after all


@given(
    st.lists(st.tuples(st.sampled_from(["stdout", "stderr"]), st.binary(max_size=40)), max_size=30),
    st.integers(min_value=1, max_value=50),
    st.sets(st.integers(min_value=0, max_value=30)),
)
def test_every_byte_arrives_once_in_order(
    chunks: list[tuple[str, bytes]], piece: int, flush_after: set[int]
) -> None:
    hold = OutputHold(["s3cr3t"], to_ide=True, piece=piece)
    entries: list[Entry] = []
    for i, (stream, data) in enumerate(chunks):
        hold.feed(stream, data)
        if i in flush_after:
            entries += hold.flush()
    entries += hold.end()
    for stream in ("stdout", "stderr"):
        sent = b"".join(d for s, d in chunks if s == stream).replace(b"s3cr3t", REDACTED.encode())
        assert logged(entries, stream) == sent
        assert shown(entries, stream) == sent.decode(errors="replace")
    assert all(len(data) <= piece for _, data in logs(entries))


# --- what pydevd is told ----------------------------------------------------------------------------


def test_vscode_attach_gets_output_from_the_pipes() -> None:
    vscode = {"justMyCode": True, "debugOptions": ["RedirectOutput", "ShowReturnValue"]}
    args = pipe_output_attach(vscode)
    assert args == {
        "justMyCode": True,
        "debugOptions": ["ShowReturnValue"],
        "redirectOutput": False,
        "isOutputRedirected": True,  # else pydevd would send a REPL print as an event too
    }
    assert vscode["debugOptions"] == ["RedirectOutput", "ShowReturnValue"]  # not modified


@pytest.mark.parametrize(
    "attach",
    [
        {"redirectOutput": True},
        {"redirectOutput": False, "debugOptions": ["RedirectOutput"]},
        {},
        {"debugOptions": ["ShowReturnValue"]},
    ],
)
def test_pydevd_never_redirects_whatever_the_ide_asked(attach: dict[str, Any]) -> None:
    """The IDE gets the pipes' output in every case (debugpy's attach default shows nothing)."""
    args = pipe_output_attach(attach)
    assert args["redirectOutput"] is False
    assert "RedirectOutput" not in args.get("debugOptions", [])
    assert args["isOutputRedirected"] is True


def test_debug_runs_are_unbuffered_unless_the_run_says_otherwise() -> None:
    assert unbuffered_env({"PATH": "/bin"}, {})["PYTHONUNBUFFERED"] == "1"
    assert unbuffered_env({"PYTHONUNBUFFERED": "1"}, {})["PYTHONUNBUFFERED"] == "1"
    kept = unbuffered_env({"PYTHONUNBUFFERED": ""}, {"PYTHONUNBUFFERED": ""})
    assert kept == {"PYTHONUNBUFFERED": ""}


# --- ProgramOutput over a fake run link -------------------------------------------------------------


class FakeLink:
    """What ProgramOutput uses of a RunLink: numbered publishes, answers the test gives."""

    def __init__(self) -> None:
        self.entries: list[Entry] = []
        self.answered = 0
        self.failed: RelayError | None = None
        self.room = 10**9  #: publishes that fit before publish waits (a full outbox)
        self._changed = trio.Event()

    async def publish(self, entry: Entry) -> int:
        await trio.lowlevel.checkpoint()
        while self.room <= 0:
            await self._changed.wait()
        if self.failed is not None:
            raise self.failed
        self.room -= 1
        self.entries.append(entry)
        return len(self.entries)

    def make_room(self, n: int) -> None:
        self.room += n
        self._changed.set()
        self._changed = trio.Event()

    def answer(self) -> None:
        self.answered = len(self.entries)
        self._changed.set()
        self._changed = trio.Event()

    async def wait_answered(self, n: int) -> None:
        while self.answered < n and self.failed is None:
            await self._changed.wait()

    def stdout(self) -> str:
        return shown(self.entries, "stdout")


class FakePipes:
    """A pump's view for the barrier: ``written`` bytes were written, ``handed`` handed over."""

    def __init__(self) -> None:
        self.written = 0
        self.handed = 0
        self._moved = trio.Event()

    def mark(self) -> dict[str, int]:
        return {"stdout": self.written}

    def reached(self, mark: dict[str, int]) -> bool:
        return self.handed >= mark["stdout"]

    async def moved(self) -> None:
        await self._moved.wait()

    def hand_over(self, n: int) -> None:
        self.handed += n
        self._moved.set()
        self._moved = trio.Event()


def program_output(link: FakeLink, **hold: Any) -> ProgramOutput:
    return ProgramOutput(cast(RunLink, link), OutputHold([], to_ide=True, **hold))


async def test_output_waits_for_the_answer_then_goes_merged(
    autojump_clock: trio.testing.MockClock,
) -> None:
    link = FakeLink()
    output = program_output(link)
    async with trio.open_nursery() as nursery:
        nursery.start_soon(output.run)
        await output("stdout", b"one\n")
        assert link.stdout() == "one\n"  # nothing in flight: published at once
        for line in (b"two\n", b"three\n", b"four\n"):
            await output("stdout", line)
        await trio.testing.wait_all_tasks_blocked()
        assert len(link.entries) == 2  # held: the relay has not answered
        link.answer()
        await trio.testing.wait_all_tasks_blocked()
        assert link.stdout() == "one\ntwo\nthree\nfour\n"
        assert len(link.entries) == 4  # the three lines went as one log entry and one event
        nursery.cancel_scope.cancel()


async def test_the_pump_waits_at_the_cap_until_the_relay_answers(
    autojump_clock: trio.testing.MockClock,
) -> None:
    link = FakeLink()
    output = program_output(link, cap=32 * 1024)
    fed = 0

    async def pump() -> None:
        nonlocal fed
        for _ in range(10):
            await output("stdout", b"y" * 16 * 1024)
            fed += 1

    async with trio.open_nursery() as nursery:
        nursery.start_soon(output.run)
        nursery.start_soon(pump)
        await trio.testing.wait_all_tasks_blocked()
        assert fed == 2  # one chunk went at once; two more held reach the cap: the pump waits
        assert output.hold.held == 32 * 1024
        while fed < 10:
            link.answer()
            await trio.testing.wait_all_tasks_blocked()
            assert output.hold.held <= 32 * 1024
        link.answer()
        await trio.testing.wait_all_tasks_blocked()
        assert len(link.stdout()) == 10 * 16 * 1024
        nursery.cancel_scope.cancel()


async def test_the_barrier_publishes_what_was_written_before_it(
    autojump_clock: trio.testing.MockClock,
) -> None:
    """Lines written before a stop are read and published before the stop, answered or not."""
    link = FakeLink()
    pipes = FakePipes()
    output = program_output(link)
    await output("stdout", b"early\n")  # in flight, never answered in this test
    await output("stdout", b"held\n")  # so this one is held
    pipes.written = 2 * len(b"late\n")  # in the pipe, not read yet

    async def pump() -> None:
        for _ in range(2):
            await trio.sleep(0.01)
            await output("stdout", b"late\n")
            pipes.hand_over(len(b"late\n"))

    async with trio.open_nursery() as nursery:
        nursery.start_soon(pump)
        with trio.fail_after(1):
            await output.settle(pipes)
        await link.publish(wire.StatusEntry(event="stopped-marker", at=0))
    assert link.stdout() == "early\nheld\nlate\nlate\n"
    assert isinstance(link.entries[-1], wire.StatusEntry)  # after all of it


async def test_the_barrier_is_bounded(autojump_clock: trio.testing.MockClock) -> None:
    """A child writing for ever (or a stuck pump) delays a stop by BARRIER_TIMEOUT at most."""
    link = FakeLink()
    pipes = FakePipes()
    output = program_output(link)
    await output("stdout", b"early\n")
    await output("stdout", b"held\n")
    pipes.written = 10**9
    start = trio.current_time()
    await output.settle(pipes, timeout=0.2)
    assert trio.current_time() - start == pytest.approx(0.2)
    assert link.stdout() == "early\nheld\n"  # what was read went out


async def test_a_link_that_gave_up_drops_output_without_blocking_the_pump(
    autojump_clock: trio.testing.MockClock,
) -> None:
    link = FakeLink()
    output = program_output(link, cap=16)
    async with trio.open_nursery() as nursery:
        nursery.start_soon(output.run)
        await output("stdout", b"before\n")
        link.failed = RelayError(wire.ErrorCode.STALE_ATTEMPT, "a later attempt owns the run")
        with trio.fail_after(1):
            for _ in range(5):
                await output("stdout", b"x" * 20)  # over the cap: would wait for an answer
            await output.end()
        nursery.cancel_scope.cancel()
    assert link.stdout() == "before\n"


async def test_a_publish_cancelled_at_a_full_outbox_loses_nothing(
    autojump_clock: trio.testing.MockClock,
) -> None:
    link = FakeLink()
    output = program_output(link, piece=4)
    link.room = 3
    output.hold.published(1)  # something in flight: the next output is held
    await output("stdout", b"aaaabbbbcccc")  # three pieces: six entries
    with trio.move_on_after(1):
        await output.flush()  # the outbox takes three, then the rest waits: cancelled
    assert len(link.entries) == 3
    link.make_room(10)
    await output.end()
    assert logged(link.entries, "stdout") == b"aaaabbbbcccc"
    assert link.stdout() == "aaaabbbbcccc"
