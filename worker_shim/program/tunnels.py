"""The worker's end of tunnels (``protocol_specs/wire/tunnels.py``): a command run for the user, in the
run's directory with the run's environment, its bytes through the relay.

The relay writes a ``control`` entry ``tunnel`` into ``to_worker`` for each tunnel the user opens;
whatever reads the run's deliveries (the debug session's driver, a plain run's watch) hands it to
:meth:`Tunnels.open`, which serves it in a task of its own on a link of its own
(a ``WorkerTunnelLink``): what comes ``up`` goes to the command (stdin, signals), what the command
writes goes ``down``, then one ``exit`` with its exit code. A worker that does not allow tunnels
(``tether worker --no-shell``) answers each with an ``exit`` saying so. When the attempt ends,
its tunnels end with it (their commands' process groups are ended, and the ``exit`` says why).
"""

from __future__ import annotations

import logging
import os
import signal
import subprocess
from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import asynccontextmanager, suppress
from pathlib import Path
from typing import Any

import trio

from protocol_specs.runs.runs import RunRecord
from protocol_specs.wire import wire
from protocol_specs.wire.tunnels import CHUNK, TunnelSpec
from protocol_specs.wire.wire import TunnelEntry, WorkerTunnelLink
from relay.client import LinkPolicy, RelayError, RunLink, Target, open_run_link, tunnel_steps

from .debuggee import terminate_group
from .identity import Runtime, spawn_options
from .loopback import NotTheRuns, connect_owned
from .process_names import read_proc
from .quarters import Quarters
from .sampler import sample_stacks
from .terminal import run_shell

__all__ = ["Tunnels", "open_tunnels", "tunnel_request"]

log = logging.getLogger("tether.worker")

#: signals the user's side may send a command (by name)
SIGNALS = {"SIGINT": signal.SIGINT, "SIGTERM": signal.SIGTERM, "SIGHUP": signal.SIGHUP,
           "SIGQUIT": signal.SIGQUIT, "SIGKILL": signal.SIGKILL}  # fmt: skip


#: how long a tunnel's link keeps trying to reach the relay the first time: a relay cut just as
#: the request came must not leave the user waiting for a command that never starts
FIRST_CONNECT_WITHIN = 120.0


def tunnel_request(entry: wire.AnyEntry | None, record: RunRecord) -> TunnelSpec | None:
    """The tunnel ``entry`` asks this attempt to open (``None``: it is no such request, or an
    earlier attempt's, or malformed: logged)."""
    if not isinstance(entry, wire.ControlEntry) or entry.action != "tunnel":
        return None
    if entry.attempt not in (0, record.attempt) or not entry.detail:
        return None
    try:
        return TunnelSpec.model_validate(entry.data)
    except ValueError as exc:
        log.warning("run %s: a malformed tunnel request %s: %s", record.id, entry.detail, exc)
        return None


class Tunnels:
    """The tunnels of one attempt; :meth:`open` serves one until its command ends."""

    def __init__(
        self,
        relay: Target,
        record: RunRecord,
        run_dir: Path,
        env: dict[str, str],
        nursery: trio.Nursery,
        *,
        allowed: bool = True,
        say: Callable[[str], None] = lambda _text: None,
        quarters: Quarters | None = None,
        node: int = 0,
    ) -> None:
        """``node``: the node of a run that spans nodes this worker runs: it serves the tunnels
        that name it (``TunnelSpec.node``) and leaves the others to their nodes' workers."""
        self.relay = relay
        self.node = node
        #: as whom the commands run (the attempt's uid on a worker that isolates)
        self.quarters = quarters
        self.record = record
        self.run_dir = run_dir
        self.env = env
        self.nursery = nursery
        self.allowed = allowed
        self.say = say
        #: the program's pid once it started (``spec.process`` must be it or a descendant)
        self.program: int | None = None
        #: a debug run's cross-rank evaluation (the session's driver sets it while it runs):
        #: ``(expression, ranks or None)`` -> the values as JSON (``tether eval``)
        self.evaluate: Callable[[str, list[int] | None], Awaitable[bytes]] | None = None
        self.serving: set[str] = set()
        #: the commands running now, by tunnel (cancelled when the attempt ends)
        self._running: dict[str, trio.CancelScope] = {}
        self._serving = 0  #: tunnels being served (their last words included)
        self._idle = trio.Event()  #: set when ``_serving`` drops to 0
        self._ended = ""  #: why the attempt's tunnels end (set once it does)

    def open(self, entry: wire.AnyEntry | None) -> bool:
        """Serve the tunnel ``entry`` asks for (if it is such a request, for this worker's
        node: True; another node's is left to that node's worker, silently)."""
        spec = tunnel_request(entry, self.record)
        if spec is None or spec.node != self.node:
            return False
        assert isinstance(entry, wire.ControlEntry)
        if entry.detail not in self.serving:  # a request delivered twice is served once
            self.serving.add(entry.detail)
            self.nursery.start_soon(self._serve, entry.detail, spec)
        return True

    async def _serve(self, tunnel: str, spec: TunnelSpec) -> None:
        self._serving += 1
        try:
            await self._serve_link(tunnel, spec)
        finally:
            self._serving -= 1
            if not self._serving:
                self._idle.set()
                self._idle = trio.Event()

    async def _serve_link(self, tunnel: str, spec: TunnelSpec) -> None:
        record = self.record
        try:
            async with open_run_link(
                self.relay,
                link=WorkerTunnelLink(tunnel=tunnel),
                run=record.id,
                attempt=record.attempt,
                client="tether-worker",
                policy=LinkPolicy.from_env(first_connect_within=FIRST_CONNECT_WITHIN),
            ) as link:
                self.say(f"run {record.id}: tunnel {tunnel}: {spec.describe()}")
                code: int | None = None
                detail = self._ended
                if not detail:
                    with trio.CancelScope() as scope:
                        self._running[tunnel] = scope
                        try:
                            code, detail = await self._run(link, spec)
                        except Exception as exc:  # a tunnel never takes the run down with it
                            log.exception("run %s: tunnel %s failed", record.id, tunnel)
                            detail = f"the worker failed serving it: {type(exc).__name__}: {exc}"
                        finally:
                            del self._running[tunnel]
                    if scope.cancelled_caught:
                        code, detail = None, self._ended
                await link.publish(TunnelEntry(op="exit", code=code, detail=detail))
        except* RelayError as group:  # the link's refusal comes wrapped in its exception group
            log.warning("run %s: tunnel %s: %s", record.id, tunnel, group.exceptions[0])

    async def end(self, why: str) -> None:
        """The attempt is over: every tunnel's command is ended, and its ``exit`` says ``why``
        (waits a while for those to be stored)."""
        self._ended = why
        for scope in list(self._running.values()):
            scope.cancel()
        with trio.move_on_after(15):  # the commands' groups end, the links flush
            while self._serving:
                await self._idle.wait()

    async def _run(self, link: RunLink, spec: TunnelSpec) -> tuple[int | None, str]:
        """Run what ``spec`` asks for; its exit code, and why when it did not run to its end."""
        if spec.kind == "stacks":  # reads the run's own processes, runs nothing: --no-shell too
            return await self._stacks(link)
        if spec.kind == "eval":  # what an IDE's debug console may do: --no-shell too
            return await self._eval(link, spec)
        if not self.allowed:
            return None, "this worker does not allow shells, commands or port forwards (--no-shell)"
        user = self.quarters.user if self.quarters is not None else None
        if spec.kind == "forward":
            return await _forward(link, spec.port, None if user is None else user.uid)
        where = self._context(spec)
        if isinstance(where, str):
            return None, where
        cwd, env = where
        if spec.kind == "exec":
            return await _exec(link, spec, cwd, env, spawn_options(user))
        return await run_shell(link, spec, cwd, env, user)

    async def _stacks(self, link: RunLink) -> tuple[int | None, str]:
        """The stacks of the program's processes (``sampler.py``), as JSON on ``fd`` 1."""
        if self.program is None:
            return None, f"run {self.record.id}'s program has not started yet"
        user = self.quarters.user if self.quarters is not None else None
        runtime = self.quarters.runtime if self.quarters is not None else None
        pyspy = runtime.pyspy if runtime is not None else Runtime.installed().pyspy
        paths = (self.run_dir, self.record.spec.workdir)
        answer = await sample_stacks(self.program, pyspy, user, paths=paths)
        for at in range(0, len(answer), CHUNK):
            await link.publish(TunnelEntry(op="data", fd=1, data=answer[at : at + CHUNK]))
        await link.publish(TunnelEntry(op="eof", fd=1))
        return 0, ""

    async def _eval(self, link: RunLink, spec: TunnelSpec) -> tuple[int | None, str]:
        """``spec.expression`` in every paused rank (``worker_shim/session/rank_eval.py``), the
        values as JSON on ``fd`` 1."""
        if self.evaluate is None:
            return None, (
                f"run {self.record.id} is not being debugged now (tether eval needs a debug run "
                "whose program runs: tether debug)"
            )
        answer = await self.evaluate(spec.expression, spec.ranks or None)
        for at in range(0, len(answer), CHUNK):
            await link.publish(TunnelEntry(op="data", fd=1, data=answer[at : at + CHUNK]))
        await link.publish(TunnelEntry(op="eof", fd=1))
        return 0, ""

    def _context(self, spec: TunnelSpec) -> tuple[Path, dict[str, str]] | str:
        """Where a command runs, with what environment: the run's, or (``spec.process``) that
        process's own, if it is the program or one of its descendants; else why not."""
        if not spec.process:
            return self.run_dir, self.env
        pid = int(spec.process)
        ancestor, hops = pid, 0
        while ancestor and ancestor != self.program and hops < 64:
            ancestor, hops = read_proc(ancestor).ppid or 0, hops + 1
        if self.program is None or ancestor != self.program:
            return f"process {pid} is not one of run {self.record.id}'s (tether status lists them)"
        try:
            cwd = Path(os.readlink(f"/proc/{pid}/cwd"))
        except OSError as exc:
            return f"process {pid} is gone ({exc.strerror})"
        return cwd, read_proc(pid).environ


async def _exec(
    link: RunLink, spec: TunnelSpec, cwd: Path, env: dict[str, str], spawn: dict[str, Any]
) -> tuple[int | None, str]:
    try:
        process = await trio.lowlevel.open_process(
            spec.argv,
            cwd=str(cwd),
            env=env,
            stdin=subprocess.PIPE if spec.stdin else subprocess.DEVNULL,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            start_new_session=True,  # its own group: a signal or the end reaches its children
            **spawn,  # as the run's uid, on a worker that gives programs uids of their own
        )
    except OSError as exc:
        code = 127 if isinstance(exc, FileNotFoundError) else 126
        return code, f"cannot run {spec.argv[0]}: {exc.strerror or exc}"
    try:
        async with trio.open_nursery() as feeding:
            feeding.start_soon(_feed, link, process)
            async with trio.open_nursery() as pumps:
                assert process.stdout is not None and process.stderr is not None
                pumps.start_soon(_pump, link, process.stdout, 1)
                pumps.start_soon(_pump, link, process.stderr, 2)
            code = await process.wait()
            feeding.cancel_scope.cancel()
    finally:
        if process.returncode is None:  # cancelled: the attempt ended
            with trio.CancelScope(shield=True):
                await terminate_group(process)
    return (128 - code if code < 0 else code), ""


async def _forward(link: RunLink, port: int, uid: int | None = None) -> tuple[int | None, str]:
    """One forwarded connection: to ``port`` on the worker's loopback, both ways, each direction
    ending on its own (half-close), as ``ssh -L`` does. ``uid``: only to a port the run's own
    processes listen on (a worker that gives programs uids of their own connects as root, and
    another run's debugger lets the worker in: ``worker_shim/program/loopback.py``)."""
    try:
        if uid is None:
            stream = await trio.open_tcp_stream("127.0.0.1", port)
        else:
            stream = await connect_owned(port, uid)
    except NotTheRuns as exc:
        return None, f"{exc}: a run forwards only ports its own processes listen on"
    except OSError as exc:
        return None, f"nothing accepts connections on port {port} of the worker ({exc})"
    async with stream:
        async with trio.open_nursery() as nursery:
            nursery.start_soon(_pump, link, stream, 1)
            async for entry in tunnel_steps(link):
                try:
                    if entry.op == "data":
                        await stream.send_all(entry.data)
                    elif entry.op == "eof":
                        await stream.send_eof()
                        break
                except (trio.BrokenResourceError, trio.ClosedResourceError) as exc:
                    nursery.cancel_scope.cancel()
                    return None, f"the connection to port {port} ended: {exc}"
    return 0, ""


async def _pump(link: RunLink, stream: trio.abc.ReceiveStream, fd: int) -> None:
    """What the command (or the forwarded connection) writes on ``fd``, down the tunnel, then
    its end (a connection reset ends it too)."""
    try:
        while chunk := await stream.receive_some(CHUNK):
            await link.publish(TunnelEntry(op="data", fd=fd, data=bytes(chunk), transient=True))
    except trio.BrokenResourceError:
        pass
    await link.publish(TunnelEntry(op="eof", fd=fd))


async def _feed(link: RunLink, process: trio.Process) -> None:
    """What comes up the tunnel, to the command: its stdin and signals."""
    async for entry in tunnel_steps(link):
        if entry.op == "data" and process.stdin is not None:
            with suppress(trio.BrokenResourceError, trio.ClosedResourceError):
                await process.stdin.send_all(entry.data)
        elif entry.op == "eof" and process.stdin is not None:
            await process.stdin.aclose()
        elif entry.op == "signal" and entry.detail in SIGNALS:
            with suppress(ProcessLookupError, PermissionError):
                os.killpg(process.pid, SIGNALS[entry.detail])


@asynccontextmanager
async def open_tunnels(
    relay: Target,
    record: RunRecord,
    run_dir: Path,
    env: dict[str, str],
    *,
    allowed: bool = True,
    say: Callable[[str], None] = lambda _text: None,
    ending: str = "",
    quarters: Quarters | None = None,
    node: int = 0,
) -> AsyncIterator[Tunnels]:
    """The attempt's tunnels, served until the block ends (then what still runs is ended, its
    ``exit`` saying ``ending``: by default, that the attempt ended); ``quarters``: as whom their
    commands run; ``node``: see :class:`Tunnels`."""
    async with trio.open_nursery() as nursery:
        tunnels = Tunnels(
            relay, record, run_dir, env, nursery, allowed=allowed, say=say, quarters=quarters,
            node=node,
        )  # fmt: skip
        try:
            yield tunnels
        finally:
            with trio.CancelScope(shield=True):
                await tunnels.end(ending or f"run {record.id}'s attempt {record.attempt} ended")
            nursery.cancel_scope.cancel()
