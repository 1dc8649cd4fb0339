"""Tunnels into a run (``protocol_specs/wire/tunnels.py``): ``exec`` through a real relay and the real
worker shim running a real program, with ``tether exec``'s own client (:func:`run_tunnel`).

A command runs in the run's directory with its environment; its output arrives whole and in
order, each stream apart; stdin goes up; signals reach it; its exit status comes back. What the
relay refuses (a run that is not running, or is over; another user) and what the worker refuses
(``--no-shell``) is said, and a command still running when the attempt ends is ended with it.
"""

from __future__ import annotations

import hashlib
import io
import os
import re
import socket
import sys
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from dataclasses import dataclass
from functools import partial
from pathlib import Path
from typing import BinaryIO

import pytest
import trio
from credentials import user_endpoint
from faults.proxy import FaultProxy

from adapter.cli.tunnel import TETHER_FAILED, run_tunnel
from protocol_specs.access.auth import Scope
from protocol_specs.runs.runs import RunRecord
from protocol_specs.runs.spec import RunSpec
from protocol_specs.snapshots.snapshots import Manifest, ManifestEntry
from protocol_specs.wire import wire
from protocol_specs.wire.tunnels import TunnelSpec
from protocol_specs.wire.wire import TunnelEntry, TunnelLink
from relay.client import (
    ControlClient,
    Endpoint,
    RelayError,
    RunLink,
    follow_logs,
    open_control,
    open_run_link,
)
from relay.server import serve_relay, server_port
from relay.store import MemoryStore
from worker_shim.shim import run_shim

pytestmark = pytest.mark.timeout(60)

WAITS = """\
import sys, time
print("up", flush=True)
time.sleep(float(sys.argv[1]) if len(sys.argv) > 1 else 60)
"""


@dataclass
class Stack:
    url: Endpoint  #: the relay, through ``proxy`` for everyone (the worker too)
    control: ControlClient
    run: RunRecord
    store: MemoryStore
    ended: trio.Event
    proxy: FaultProxy

    async def open(self, spec: TunnelSpec) -> wire.TunnelOpened:
        """A tunnel opened on a control connection of its own (a cut ends the held one)."""
        async with open_control(self.url) as control:
            return await control.open_tunnel(self.run.id, spec)

    async def exec(
        self, argv: list[str], *, stdin: bytes | None = None
    ) -> tuple[int, bytes, bytes]:
        """``tether exec RUN -- argv`` as the CLI does it: (exit status, stdout, stderr)."""
        spec = TunnelSpec(kind="exec", argv=argv, stdin=stdin is not None)
        opened = await self.control.open_tunnel(self.run.id, spec)
        out: dict[int, BinaryIO] = {1: io.BytesIO(), 2: io.BytesIO()}
        fd = None
        if stdin is not None:
            read, write = os.pipe()
            fd = read
        async with trio.open_nursery() as nursery:
            if stdin is not None:
                nursery.start_soon(_write_all, write, stdin)
            code, said = await run_tunnel(self.url, opened, stdin=fd, out=out)
            if said:
                print(f"tether: {said}", file=sys.stderr)  # as the CLI does
        if fd is not None:
            os.close(fd)
        return code, out[1].getvalue(), out[2].getvalue()  # type: ignore[attr-defined]


async def _write_all(fd: int, data: bytes) -> None:
    stream = trio.lowlevel.FdStream(fd)
    async with stream:
        await stream.send_all(data)


@asynccontextmanager
async def running(
    tmp_path: Path,
    *args: str,
    allow_tunnels: bool = True,
    debug: bool = False,
    program: str = WAITS,
    up: bytes = b"up",
    store: MemoryStore | None = None,
) -> AsyncIterator[Stack]:
    """A plain run (``debug``: a debug run that does not wait for an IDE) of ``program`` (as
    ``waits.py args``) started by the real shim, once its output said ``up``."""
    store = store or MemoryStore()
    async with trio.open_nursery() as nursery:
        server = await nursery.start(
            lambda task_status: serve_relay(store, port=0, task_status=task_status)
        )
        proxy = FaultProxy("127.0.0.1", server_port(server))
        await nursery.start(proxy.run)
        url = await user_endpoint(store, proxy.url_for())
        data = program.encode()
        digest = hashlib.sha256(data).hexdigest()
        manifest = Manifest(entries=[ManifestEntry(path="waits.py", digest=digest, size=len(data))])
        spec = RunSpec(
            command=[sys.executable, "waits.py", *args],
            workdir="/home/me/project",
            debug=debug,
            wait_for_ide=False,
            env={"TUNNEL_TEST": "yes"},
        )
        async with open_control(url) as control:
            await control.put_blob(digest, data)
            record = await control.submit(spec, manifest)
            assigned = await control.claim("w-0")
            ended = trio.Event()

            async def worker() -> None:
                await run_shim(
                    url.with_token(assigned.token),
                    assigned.run,
                    assigned.manifest,
                    runs_dir=tmp_path / "runs",
                    fetch=control.read_blob,
                    cache=tmp_path / "cache",
                    python=sys.executable,
                    allow_tunnels=allow_tunnels,
                )
                ended.set()

            nursery.start_soon(worker)
            # its output comes after its ``started`` (one link, stored in order): it is running
            await _until_output(url, record.id, up)
            yield Stack(url, control, await control.get_run(record.id), store, ended, proxy)
            if not ended.is_set():  # the shim ends the program and returns
                async with open_control(url) as fresh:  # the test may have cut the held one
                    await fresh.cancel(record.id)
            with trio.fail_after(30):
                await ended.wait()
        nursery.cancel_scope.cancel()


async def _until_output(url: Endpoint, run_id: str, text: bytes) -> None:
    seen = trio.Event()
    output = bytearray()  # a line may come in pieces

    def show(entry: wire.LogEntry | wire.StatusEntry) -> None:
        if isinstance(entry, wire.LogEntry):
            output.extend(entry.data)
            if text in output:
                seen.set()

    with trio.fail_after(30):
        async with trio.open_nursery() as nursery:
            nursery.start_soon(follow_logs, url, run_id, show)
            await seen.wait()
            nursery.cancel_scope.cancel()


# --- exec ---------------------------------------------------------------------------------------


async def test_a_command_runs_in_the_runs_directory_with_its_environment(tmp_path: Path) -> None:
    async with running(tmp_path) as stack:
        script = "import os, sys; print(os.getcwd()); print(os.environ['TUNNEL_TEST']); " + (
            "print('to stderr', file=sys.stderr); sys.exit(7)"
        )
        code, out, err = await stack.exec([sys.executable, "-c", script])
    assert code == 7
    assert out.decode().splitlines() == [str(tmp_path / "runs" / f"{stack.run.id}-1"), "yes"]
    assert err == b"to stderr\n"


async def test_large_output_arrives_whole_and_in_order_and_stdin_goes_up(tmp_path: Path) -> None:
    big = b"".join(i.to_bytes(4, "big") for i in range(1_500_000))  # 6 MB, every chunk unlike
    writes = (
        "import sys; data = bytes(range(256)) * 24000; "
        "[sys.stdout.buffer.write(data[i:i + 1000]) for i in range(0, len(data), 1000)]"
    )
    digest = "import hashlib, sys; print(hashlib.sha256(sys.stdin.buffer.read()).hexdigest())"
    async with running(tmp_path) as stack:
        code, out, _err = await stack.exec([sys.executable, "-c", writes])
        assert code == 0 and out == bytes(range(256)) * 24000
        code, out, _err = await stack.exec([sys.executable, "-c", digest], stdin=big)
        assert code == 0 and out.decode().strip() == hashlib.sha256(big).hexdigest()


async def test_a_signal_reaches_the_command_and_its_status_comes_back(tmp_path: Path) -> None:
    async with running(tmp_path) as stack:
        spec = TunnelSpec(kind="exec", argv=["sh", "-c", "echo ready; exec sleep 30"])
        opened = await stack.control.open_tunnel(stack.run.id, spec)
        async with open_run_link(
            stack.url, link=TunnelLink(tunnel=opened.tunnel), run=opened.run
        ) as link:
            ops = []
            with trio.fail_after(30):
                async for delivery in link.deliveries:
                    entry = wire.decode_entry(delivery.entry)
                    assert isinstance(entry, TunnelEntry)
                    ops.append(entry.op)
                    if entry.op == "data":
                        await link.publish(TunnelEntry(op="signal", detail="SIGINT"))
                    if entry.op == "exit":
                        break
    assert entry.code == 130  # 128 + SIGINT, as a shell says
    assert ops == ["data", "eof", "eof", "exit"]


async def test_what_cannot_run_is_said_with_the_status_a_shell_gives(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    async with running(tmp_path) as stack:
        code, _out, err = await stack.exec(["no-such-command-here"])
    assert _out == b""
    assert code == 127 and err == b""
    assert "cannot run no-such-command-here: No such file" in capsys.readouterr().err


# --- refusals -----------------------------------------------------------------------------------


async def test_a_worker_that_allows_no_tunnels_says_so(tmp_path: Path) -> None:
    async with running(tmp_path, allow_tunnels=False) as stack:
        spec = TunnelSpec(kind="exec", argv=["true"])
        opened = await stack.control.open_tunnel(stack.run.id, spec)
        async with open_run_link(
            stack.url, link=TunnelLink(tunnel=opened.tunnel), run=opened.run
        ) as link:
            with trio.fail_after(30):
                delivery = await link.deliveries.receive()
    entry = wire.decode_entry(delivery.entry)
    assert isinstance(entry, TunnelEntry) and entry.op == "exit" and entry.code is None
    assert "--no-shell" in entry.detail


async def test_only_a_running_run_of_ones_own_has_tunnels(tmp_path: Path) -> None:
    async with running(tmp_path, "0.5") as stack:
        other = await user_endpoint(stack.store, stack.url, user="bob", scopes=[Scope.RUNS])
        async with open_control(other) as control:
            with pytest.raises(RelayError) as refused:
                await control.open_tunnel(stack.run.id, TunnelSpec(kind="shell"))
        assert refused.value.code == "no_such_run"
        # a link to a tunnel nobody opened
        nobodys = wire.TunnelOpened(rid=0, run=stack.run.id, tunnel="x")
        code, said = await run_tunnel(stack.url, nobodys, stdin=None, out={})
        assert code == TETHER_FAILED and "has no tunnel 'x' now" in said
        queued = await stack.control.submit(RunSpec(command=["true"], workdir="/w", debug=False))
        with pytest.raises(RelayError) as refused:
            await stack.control.open_tunnel(queued.id, TunnelSpec(kind="shell"))
        assert "is queued: nothing runs it yet" in refused.value.message
        with trio.fail_after(30):
            await stack.ended.wait()  # the program ended: the run is over
        with pytest.raises(RelayError) as refused:
            await stack.control.open_tunnel(stack.run.id, TunnelSpec(kind="shell"))
        assert refused.value.code == "run_finished" and "has ended (succeeded)" in (
            refused.value.message
        )


async def test_a_command_still_running_when_the_attempt_ends_is_ended_and_says_why(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    async with running(tmp_path, "1") as stack:
        code, _out, _err = await stack.exec(["sleep", "30"])
    assert code == TETHER_FAILED
    assert f"tether: run {stack.run.id}'s attempt 1 ended" in capsys.readouterr().err


# --- shell --------------------------------------------------------------------------------------


async def test_a_shell_runs_on_a_terminal_of_the_asked_size_and_ends_with_its_status(
    tmp_path: Path,
) -> None:
    async with running(tmp_path) as stack:
        spec = TunnelSpec(kind="shell", cols=100, rows=30)
        opened = await stack.control.open_tunnel(stack.run.id, spec)
        async with open_run_link(
            stack.url, link=TunnelLink(tunnel=opened.tunnel), run=opened.run
        ) as link:
            typed = b"stty size; echo $((6 * 7))-$TUNNEL_TEST; tty; exit 3\r"
            await link.publish(TunnelEntry(op="data", data=typed))
            shown = b""
            with trio.fail_after(30):
                async for delivery in link.deliveries:
                    entry = wire.decode_entry(delivery.entry)
                    assert isinstance(entry, TunnelEntry)
                    if entry.op == "data":
                        shown += entry.data
                    if entry.op == "exit":
                        break
    assert entry.code == 3, shown
    assert b"30 100" in shown and b"42-yes" in shown and b"/dev/pts/" in shown


# --- forward ------------------------------------------------------------------------------------


async def test_a_forward_to_a_port_nothing_listens_on_ends_saying_so(tmp_path: Path) -> None:
    async with running(tmp_path) as stack:
        with socket.socket() as probe:
            probe.bind(("127.0.0.1", 0))
            port = probe.getsockname()[1]
        opened = await stack.open(TunnelSpec(kind="forward", port=port))
        code, said = await run_tunnel(stack.url, opened, stdin=None, out={})
    assert code == TETHER_FAILED and f"nothing accepts connections on port {port}" in said


# --- link cuts ----------------------------------------------------------------------------------


async def _until(link: RunLink, op: str) -> TunnelEntry:
    """The next entry of ``op`` that comes down (data before it: dropped)."""
    with trio.fail_after(30):
        async for delivery in link.deliveries:
            entry = wire.decode_entry(delivery.entry)
            assert isinstance(entry, TunnelEntry)
            if entry.op == op:
                return entry
    raise AssertionError(f"the tunnel ended before {op!r}")


async def _read_all(link: RunLink) -> tuple[bytes, TunnelEntry]:
    """Everything that comes down, and the ``exit``."""
    got = b""
    with trio.fail_after(30):
        async for delivery in link.deliveries:
            entry = wire.decode_entry(delivery.entry)
            assert isinstance(entry, TunnelEntry)
            if entry.op == "data":
                got += entry.data
            if entry.op == "exit":
                return got, entry
    raise AssertionError("the tunnel ended without its exit")


async def test_cut_links_lose_nothing_of_a_command_a_shell_or_a_forwarded_connection(
    tmp_path: Path,
) -> None:
    """Every link (the user's side and the worker's) is cut mid-tunnel: each reconnects and
    resumes, and the bytes both ways arrive whole, once and in order."""
    rest = b"".join(b"%d\n" % i for i in range(30000))
    script = "import sys; print('ready', flush=True); sys.stdin.readline(); " + (
        "sys.stdout.write(''.join('%d\\n' % i for i in range(30000)))"
    )
    async with running(tmp_path) as stack:
        # a command: its first output, the cut, then our line up and all of its output down
        spec = TunnelSpec(kind="exec", argv=[sys.executable, "-c", script], stdin=True)
        opened = await stack.open(spec)
        async with open_run_link(
            stack.url, link=TunnelLink(tunnel=opened.tunnel), run=opened.run
        ) as link:
            first = b""
            while not first.endswith(b"\n"):
                first += (await _until(link, "data")).data
            assert first == b"ready\n"
            assert await stack.proxy.cut() >= 2  # the worker's tunnel link and ours at least
            await link.publish(TunnelEntry(op="data", data=b"go\n"))
            got, end = await _read_all(link)
        assert (got, end.code) == (rest, 0)
        # a shell: a line typed, the cut, another line
        opened = await stack.open(TunnelSpec(kind="shell"))
        async with open_run_link(
            stack.url, link=TunnelLink(tunnel=opened.tunnel), run=opened.run
        ) as link:
            await link.publish(TunnelEntry(op="data", data=b"echo one-$((40 + 1))\r"))
            shown = b""
            while b"one-41" not in shown:
                shown += (await _until(link, "data")).data
            await stack.proxy.cut()
            await link.publish(TunnelEntry(op="data", data=b"echo two-$((40 + 2)); exit 4\r"))
            got, end = await _read_all(link)
        assert b"two-42" in got and end.code == 4
        # a forwarded connection to an echo server on the worker's loopback
        echoed = await _forward_through_a_cut(stack)
        assert echoed == b"first half|second half"
    assert stack.proxy.faults["cut"] == 3


async def _forward_through_a_cut(stack: Stack) -> bytes:
    async def echo(stream: trio.SocketStream) -> None:
        async with stream:
            async for chunk in stream:
                await stream.send_all(chunk)

    async with trio.open_nursery() as nursery:
        listeners = await nursery.start(partial(trio.serve_tcp, echo, 0, host="127.0.0.1"))
        port = listeners[0].socket.getsockname()[1]
        opened = await stack.open(TunnelSpec(kind="forward", port=port))
        async with open_run_link(
            stack.url, link=TunnelLink(tunnel=opened.tunnel), run=opened.run
        ) as link:
            await link.publish(TunnelEntry(op="data", data=b"first half|"))
            got = (await _until(link, "data")).data
            await stack.proxy.cut()
            await link.publish(TunnelEntry(op="data", data=b"second half"))
            await link.publish(TunnelEntry(op="eof"))  # the echo server then closes its end
            rest, end = await _read_all(link)
        nursery.cancel_scope.cancel()
    assert end.code == 0
    return got + rest


# --- the other ways in --------------------------------------------------------------------------

PARENT = """\
import os, subprocess, sys, time
os.makedirs("rank1", exist_ok=True)
child = subprocess.Popen(
    [sys.executable, "-c", "import time; time.sleep(60)"],
    cwd="rank1", env={**os.environ, "RANK": "1"},
)
print("child", child.pid, flush=True)
time.sleep(60)
"""


async def test_a_command_runs_as_one_of_the_runs_processes_and_only_those(tmp_path: Path) -> None:
    """``--process PID``: in that process's directory with its environment (a rank's), if it
    is the program or a descendant; any other pid of the node is refused."""
    async with running(tmp_path, program=PARENT, up=b"child") as stack:
        pid = await _child_pid(stack)
        spec = TunnelSpec(kind="exec", argv=["sh", "-c", "pwd; echo $RANK"], process=str(pid))
        opened = await stack.open(spec)
        out: dict[int, BinaryIO] = {1: io.BytesIO(), 2: io.BytesIO()}
        code, said = await run_tunnel(stack.url, opened, stdin=None, out=out)
        assert (code, said) == (0, "")
        cwd, rank = out[1].getvalue().decode().split()  # type: ignore[attr-defined]
        assert cwd.endswith("/rank1") and rank == "1"
        spec = TunnelSpec(kind="exec", argv=["true"], process=str(os.getpid()))
        code, said = await run_tunnel(stack.url, await stack.open(spec), stdin=None, out={})
        assert code == TETHER_FAILED and f"process {os.getpid()} is not one of run" in said


async def _child_pid(stack: Stack) -> int:
    found: list[int] = []
    got = trio.Event()
    output = bytearray()  # a line may come in pieces (each of print's writes, unbuffered)

    def show(entry: wire.LogEntry | wire.StatusEntry) -> None:
        if isinstance(entry, wire.LogEntry):
            output.extend(entry.data)
            if (m := re.search(rb"child (\d+)\n", output)) and not found:
                found.append(int(m[1]))
                got.set()

    with trio.fail_after(30):
        async with trio.open_nursery() as nursery:
            nursery.start_soon(follow_logs, stack.url, stack.run.id, show)
            await got.wait()
            nursery.cancel_scope.cancel()
    return found[0]


async def test_a_debug_runs_worker_serves_tunnels_too(tmp_path: Path) -> None:
    async with running(tmp_path, debug=True) as stack:
        code, out, _err = await stack.exec(["sh", "-c", "echo $TUNNEL_TEST"])
    assert (code, out) == (0, b"yes\n")
