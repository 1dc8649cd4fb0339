"""A tunnel's start is exactly once (``protocol_specs/wire/tunnel_open.py``): through a real relay and
the real worker shim, an ``open_tunnel`` whose answer is lost (a cut before the request reached
the relay, or after the relay stored it and before its answer came back; a relay that died
between two of its steps) is asked for again, and the command runs once and reports its exit
code and output; a relay never reached runs nothing and says so.

Each command appends a line to a file: the count of lines is the count of starts.
"""

from __future__ import annotations

import io
from dataclasses import replace
from pathlib import Path
from typing import BinaryIO

import pytest
import trio
from faults.proxy import Direction, FaultProxy
from test_tunnels import Stack, running

from adapter.cli.tunnel import open_tunnel_once, run_tunnel
from protocol_specs.wire import wire
from protocol_specs.wire.tunnel_open import DidNotRun, new_key
from protocol_specs.wire.tunnels import TunnelSpec
from relay.client import Endpoint
from relay.store import MemoryStore, StoreError, keys

pytestmark = pytest.mark.timeout(60)


def appends(log: Path, code: int = 3) -> TunnelSpec:
    """A command that appends a line to ``log``, writes to both streams and exits ``code``."""
    script = f"echo ran >> {log}; echo out; echo err >&2; exit {code}"
    return TunnelSpec(kind="exec", argv=["sh", "-c", script])


async def served(url: Endpoint, opened: wire.TunnelOpened) -> tuple[int, str, bytes, bytes]:
    """``tether exec``'s end of an opened tunnel: (exit code, what it says, stdout, stderr)."""
    out: dict[int, BinaryIO] = {1: io.BytesIO(), 2: io.BytesIO()}
    with trio.fail_after(30):
        code, said = await run_tunnel(url, opened, stdin=None, out=out)
    return code, said, out[1].getvalue(), out[2].getvalue()  # type: ignore[attr-defined]


async def control_entries(stack: Stack, tunnel: str) -> int:
    """How many ``control`` entries in ``to_worker`` ask the worker to start ``tunnel``."""
    stream = keys.stream(stack.run.id, wire.StreamName.TO_WORKER)
    found = 0
    for _id, payload in await stack.store.read_after(stream, "0", count=10_000):
        entry = wire.decode_entry(payload)
        found += isinstance(entry, wire.ControlEntry) and entry.detail == tunnel
    return found


async def test_a_request_asked_again_finds_its_tunnel_and_starts_nothing_twice(
    tmp_path: Path,
) -> None:
    log = tmp_path / "ran.log"
    async with running(tmp_path) as stack:
        key, spec = new_key(), appends(log)
        first = await stack.control.open_tunnel(stack.run.id, spec, key=key)
        again = await stack.control.open_tunnel(stack.run.id, spec, key=key)
        assert again.tunnel == first.tunnel
        assert await served(stack.url, again) == (3, "", b"out\n", b"err\n")
        # after the command ended: the same tunnel, its exit code still there
        ended = await stack.control.open_tunnel(stack.run.id, spec, key=key)
        assert ended.tunnel == first.tunnel
        assert (await served(stack.url, ended))[:2] == (3, "")
        assert log.read_text() == "ran\n"
        assert await control_entries(stack, first.tunnel) == 1
        audit = await stack.control.audit(stack.run.id)
        assert [e.detail for e in audit if e.event == "tunnel"] == [
            f"{first.tunnel}: {spec.describe()}"
        ]
        # another request of the same command is another start
        other = await stack.control.open_tunnel(stack.run.id, spec, key=new_key())
        assert other.tunnel != first.tunnel
        assert (await served(stack.url, other))[0] == 3
    assert log.read_text() == "ran\nran\n"


@pytest.mark.parametrize(
    "held",
    [
        pytest.param("up", id="cut-before-the-request-reached-the-relay"),
        pytest.param("down", id="cut-after-the-relay-stored-it-before-its-answer"),
    ],
)
async def test_an_open_cut_off_is_asked_for_again_and_the_command_runs_once(
    tmp_path: Path, held: Direction
) -> None:
    log = tmp_path / "ran.log"
    async with running(tmp_path) as stack, trio.open_nursery() as nursery:
        # the user's side alone through a proxy of its own: the worker's links are not cut
        proxy = FaultProxy(*stack.proxy.target)
        await nursery.start(proxy.run)
        url = replace(stack.url, url=proxy.url_for())

        def after_the_welcome(direction: Direction, chunk: bytes) -> None:
            if direction == "down" and b"welcome" in chunk:
                proxy.on_pass = None
                proxy.stall(held)  # the request, or its answer, waits in the proxy

        proxy.on_pass = after_the_welcome
        result: list[object] = []
        done = trio.Event()

        async def exec_() -> None:
            result.append(await open_tunnel_once(url, stack.run.id, appends(log)))
            done.set()

        nursery.start_soon(exec_)
        with trio.fail_after(30):
            await proxy.wait_held(held)
        stored = await stack.store.zrange_by_score(keys.tunnels(stack.run.id, 1), 2**60, 10)
        assert len(stored) == (held == "down")  # the relay answers what it stored
        assert await proxy.cut() == 1
        proxy.resume()
        with trio.fail_after(30):
            await done.wait()
        opened = result[0]
        assert isinstance(opened, wire.TunnelOpened), opened
        assert await served(url, opened) == (3, "", b"out\n", b"err\n")
        assert await control_entries(stack, opened.tunnel) == 1
        nursery.cancel_scope.cancel()
    assert log.read_text() == "ran\n"
    assert proxy.accepted >= 2  # asked again on a new connection


async def test_tunnel_links_that_cannot_reach_the_relay_at_first_wait_for_it(
    tmp_path: Path,
) -> None:
    """The tunnel is open, and either end's first connection is turned away: the worker starts
    the command once it gets through, and the user's side still gets its output and exit code
    (it does not say "failed" about a command that runs)."""
    log = tmp_path / "ran.log"
    async with running(tmp_path) as stack, trio.open_nursery() as nursery:
        proxy = FaultProxy(*stack.proxy.target)  # the user's side's own way in
        await nursery.start(proxy.run)
        url = replace(stack.url, url=proxy.url_for())
        stack.proxy.refuse(True)  # the worker's new links (its run link stays up)
        opened = await open_tunnel_once(url, stack.run.id, appends(log))
        assert isinstance(opened, wire.TunnelOpened)
        proxy.refuse(True)
        result: list[tuple[int, str, bytes, bytes]] = []
        done = trio.Event()

        async def serve() -> None:
            result.append(await served(url, opened))
            done.set()

        nursery.start_soon(serve)
        with trio.fail_after(30):
            await stack.proxy.wait_refused(1)  # the worker's tunnel link, turned away
            await proxy.wait_refused(1)  # and ours
        stack.proxy.refuse(False)
        proxy.refuse(False)
        with trio.fail_after(30):
            await done.wait()
        assert result == [(3, "", b"out\n", b"err\n")]
        nursery.cancel_scope.cancel()
    assert log.read_text() == "ran\n"


class DiesOnce(MemoryStore):
    """A store whose relay "dies" (the store fails) once, after a tunnel was added to its
    attempt's set and before the worker's ``control`` entry was appended."""

    armed = True

    async def append_once(  # type: ignore[override]
        self, stream: str, producer: str, n: int, payload: bytes | None, **options: object
    ) -> object:
        if self.armed and producer.startswith("tunnel:"):
            self.armed = False
            raise StoreError("the relay died here")
        return await super().append_once(stream, producer, n, payload, **options)  # type: ignore[arg-type]


async def test_a_relay_that_died_between_the_steps_of_an_open_leaves_what_the_retry_completes(
    tmp_path: Path,
) -> None:
    log = tmp_path / "ran.log"
    store = DiesOnce()
    async with running(tmp_path, store=store) as stack:
        with trio.fail_after(30):
            opened = await open_tunnel_once(stack.url, stack.run.id, appends(log, 0))
        assert isinstance(opened, wire.TunnelOpened) and not store.armed
        assert await served(stack.url, opened) == (0, "", b"out\n", b"err\n")
        assert await control_entries(stack, opened.tunnel) == 1
    assert log.read_text() == "ran\n"


async def test_a_relay_never_reached_ran_nothing_and_says_so(tmp_path: Path) -> None:
    log = tmp_path / "ran.log"
    async with running(tmp_path) as stack:
        stack.proxy.refuse(True)
        got = await open_tunnel_once(stack.url, stack.run.id, appends(log))
        stack.proxy.refuse(False)
        assert isinstance(got, DidNotRun) and "no relay answering at" in got.why, got
    assert not log.exists()
