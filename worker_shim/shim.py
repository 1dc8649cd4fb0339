"""The worker shim: runs one claimed run and is debugpy's single, long-lived client.

Sequence for a run in debug mode:

1. Connect to the relay (``worker`` role, naming the attempt), materialise the snapshot in a new
   directory of this attempt's own (``worker_shim.program.files``: blobs checked against their
   digests, no path leaving the directory).
2. Start the program under ``debugpy --listen 127.0.0.1:0 --wait-for-client`` with subprocess
   debugging on unless the run asked for the main process only (``worker_shim.program.debuggee``);
   nothing of the user's code runs yet. Each child process debugpy announces gets a connection
   and a session of its own, configured at once (``worker_shim.session.processes``).
3. Fold the run's ``to_worker`` stream until the IDE side finished its configuration
   (``configurationDone``), unless the run asked not to wait.
4. Replay the *compacted* configuration into debugpy: ``initialize`` -> ``attach`` (path mappings:
   the IDE's, else the submitted directory mapped to the run directory) -> wait ``initialized`` ->
   the latest ``setBreakpoints`` per source, function and exception breakpoints ->
   ``configurationDone``. debugpy's answers to the breakpoints go back to the adapter, addressed to the
   request they answer, so the IDE gets the real verification.
5. Relay live: requests from ``to_worker`` go to debugpy with the shim's own ``seq``; responses go
   back with the adapter's; events go to ``to_ide``. An IDE leaving is never forwarded (debugpy would
   resume the program and drop every breakpoint).
6. When the program exits, publish its exit status (after all of its output), saying whether the
   relay will retry (``final``: :func:`protocol_specs.runs.runs.retry_delay`).

The program's stdout and stderr go to the run's logs stream (``LogEntry`` chunks) as well as to a
log file beside the run directory and, when the IDE asked for output, to the IDE as ``output``
events (``worker_shim.session.output``: pydevd is never asked to redirect; a barrier puts the output
before ``stopped``, the exit and every response). While the program stays stopped for more than
:data:`PAUSE_REPORT_AFTER`, the shim reports ``paused`` (with where) for ``tether ls``, and
``resumed`` when it goes on; short stops (stepping) are not reported.

Throughout, the relay link reconnects by itself and resends what the relay has not acknowledged
(``relay.client.RunLink``); debugpy never notices a network drop. If the run was ended meanwhile
(cancelled, or marked lost because the link stayed down past the lease), the program is terminated.
While the program is paused and no IDE is attached, :class:`protocol_specs.session.attention.Attention`
decides what happens (the run's ``on_unattended_stop`` policy).

This module is the I/O only: the debugpy socket, the run link, the program. What to send and
publish is decided by :class:`worker_shim.session.core.ShimCore` (routing, the replay, unattended
stops), without I/O; :class:`~worker_shim.session.driver.Driver` performs it.
"""

from __future__ import annotations

import contextlib
import logging
import sys
from collections.abc import Awaitable, Callable, Sequence
from contextlib import AbstractAsyncContextManager
from dataclasses import dataclass
from functools import partial
from pathlib import Path
from typing import Any

import trio

from protocol_specs.link.link import Cursor
from protocol_specs.runs.runs import RunRecord
from protocol_specs.session.processes import ProcessMode
from protocol_specs.session.session import StatusEvent
from protocol_specs.snapshots.snapshots import Manifest
from protocol_specs.wire import wire
from protocol_specs.wire.wire import StreamName, WorkerLink
from relay.client import LinkPolicy, RunLink, Target, open_control, open_run_link

from .program.checkpoints import RestoreError, attempt_checkpoints
from .program.debuggee import (
    Debuggee,
    OutputPump,
    kill_stragglers,
    start_debuggee,
    start_plain,
    terminate_group,
)
from .program.files import Fetch, materialise
from .program.metrics import ProgramControl, control_action, metrics_env, open_program_metrics
from .program.nodes import ONE_NODE, NodeRole, meet, taken_first
from .program.outputs import outputs_hook, send_outputs
from .program.preempt import ATTEMPTS
from .program.quarters import Housing, Quarters, open_quarters, program_env
from .program.reaper import MARK_ENV
from .program.tunnels import Tunnels, open_tunnels
from .session.actions import status_entry
from .session.core import ShimCore, exit_status, parse_delivery, terminates
from .session.debuggable import attach_listener, attachable_argv, until_debugged
from .session.driver import open_driver
from .session.link_news import LinkNews, report_refusals
from .session.output import ProgramOutput, open_program_output, unbuffered_env
from .session.processes import DebuggedProcesses
from .session.replay import DEFAULT_INITIALIZE

__all__ = ["DEFAULT_INITIALIZE", "program_env", "run_dir_of", "run_shim", "worker_link",
           "worker_link_policy"]  # fmt: skip

log = logging.getLogger("tether.worker")

#: how long debugpy may take, after the program exited, to hand over its last events
FINISH_TIMEOUT = 10.0


#: the worker's relay link: keep trying for a minute when the run starts (the pool just reached
#: the relay), then for ever (the lease decides when the run is given up)
def worker_link_policy() -> LinkPolicy:
    return LinkPolicy.from_env(first_connect_within=60.0)


async def run_shim(
    relay_url: Target,
    record: RunRecord,
    manifest: Manifest,
    *,
    runs_dir: Path,
    fetch: Fetch,
    cache: Path,
    env: dict[str, str] | None = None,
    python: str = sys.executable,
    policy: LinkPolicy | None = None,
    on_event: Callable[[str], None] | None = None,
    say_when_stopped: bool = True,
    allow_tunnels: bool = True,
    housing: Housing | None = None,
    node: int = 0,
) -> int | None:
    """Run one claimed attempt to its end; returns the program's exit code (None if it never
    started). ``fetch`` downloads snapshot blobs (kept in ``cache``); ``env`` is added to the
    program's environment (the worker's own ``CUDA_VISIBLE_DEVICES``, for one); ``housing``: as
    whom the program runs and where (default: the worker's own user, ``runs_dir``).

    ``say_when_stopped``: if the worker stops before the attempt ended, tell the relay the
    attempt is over (a pool's worker); a scheduler's job leaves that to its backend, which knows
    why the job ended (requeued, preempted, cancelled). ``allow_tunnels``: serve the user's
    shells, commands and port forwards into the run (``worker_shim/program/tunnels.py``).
    ``node``: the node of a run that spans nodes this worker runs (``worker_shim/program/nodes.py``;
    node K >= 1 joined the attempt node 0 claimed)."""
    say = on_event or (lambda _text: None)
    run_dir = run_dir_of(runs_dir, record, node)
    log_path = run_dir.with_name(f"{run_dir.name}.log")
    news = LinkNews(say, record.id)
    role = NodeRole.of(record, node)
    async with worker_link(
        relay_url, record, policy=policy, on_refused=news.refused, on_state=news.state, early=True,
        node=node,
    ) as link:  # fmt: skip
        if link.run.finished:
            say(f"run {record.id} is {link.run.state.value}; not starting it")
            return None
        try:
            place = _Place(run_dir, log_path, housing or Housing(), allow_tunnels, role)
            async with ATTEMPTS.taken(link, record, node):
                return await _attempt(link, record, manifest, place, fetch, cache, env, python,
                                      say, news)  # fmt: skip
        except BaseException:
            say(
                f"run {record.id}: its attempt ends with the worker; its program's processes were ended"
            )
            if not say_when_stopped:
                raise
            # the worker is going away (stopped, or failing) with the attempt unfinished: say so
            # now, so the run is retried or ended at once instead of after the lease. On a link
            # of its own: this one's tasks are being cancelled with everything else
            with trio.CancelScope(shield=True), trio.move_on_after(STOPPING_NOTICE):
                with contextlib.suppress(Exception):
                    async with worker_link(relay_url, record, node=node) as last:
                        await _status(last, StatusEvent.WORKER_STOPPED, detail="the worker stopped",
                                      **_of_node(role))  # fmt: skip
                        await last.flush()
            raise


def run_dir_of(runs_dir: Path, record: RunRecord, node: int = 0) -> Path:
    """The directory of ``record``'s current attempt under ``runs_dir`` (node K >= 1's has its
    own, should two nodes share a host and a work directory)."""
    return runs_dir / (f"{record.id}-{record.attempt}" + (f"-n{node}" if node else ""))


def worker_link(
    relay_url: Target,
    record: RunRecord,
    *,
    policy: LinkPolicy | None = None,
    early: bool = False,
    node: int = 0,
    **options: Any,
) -> AbstractAsyncContextManager[RunLink]:
    """The link of ``record``'s current attempt's worker (of node ``node``) to the relay."""
    return open_run_link(
        relay_url,
        link=WorkerLink(early=early, node=node),
        run=record.id,
        attempt=record.attempt,
        client="tether-worker",
        policy=policy or worker_link_policy(),
        **options,
    )


#: how long a stopping worker tries to tell the relay its attempt is over
STOPPING_NOTICE = 3.0


@dataclass(frozen=True)
class _Place:
    """Where an attempt runs: its directory, its log, its worker's housing, its tunnels' rule,
    its node."""

    run_dir: Path
    log_path: Path
    housing: Housing
    allow_tunnels: bool
    role: NodeRole = ONE_NODE


def _of_node(role: NodeRole) -> dict[str, Any]:
    """A status's fields on node K >= 1: it is about that node's program."""
    return {"process": role.key} if role.node else {}


async def _attempt(
    link: RunLink,
    record: RunRecord,
    manifest: Manifest,
    place: _Place,
    fetch: Fetch,
    cache: Path,
    env: dict[str, str] | None,
    python: str,
    say: Callable[[str], None],
    news: LinkNews,
) -> int | None:
    """The attempt, once its link is up: files, its user, its checkpoint, then the program,
    plain or under the debugger, with its tunnels."""
    run_dir, housing = place.run_dir, place.housing
    try:
        files = await materialise(manifest, run_dir, fetch, cache=cache)
    except Exception as exc:  # a broken snapshot is the run's failure, not the worker's
        return await _cannot_start(link, f"cannot materialise the snapshot: {exc}", say)
    role, news.taken = await meet(link, record, place.role, say, partial(_start_failed, link))
    if role is None:
        return None
    try:
        user = await trio.to_thread.run_sync(housing.lease, run_dir)
    except (RuntimeError, OSError) as exc:
        return await _cannot_start(link, str(exc), say, role)
    who = "" if user is None else f", as uid {user.uid}"
    say(f"run {record.id} attempt {record.attempt}: {files} files in {run_dir}{who}")
    mark = housing.attempt_mark(record.id, record.attempt)
    # the first trial of its sweep only asks the relay whether to pause at ``--debug-when``
    may_pause = (
        partial(_claim_pause, link, record) if record.trial and record.spec.debug_when else None
    )
    env = {**(env or {}), **role.env(record.id)}
    async with open_quarters(run_dir, user=user, runtime=housing.runtime, mark=mark) as quarters:
        checkpoints = attempt_checkpoints(link, record, quarters, node=role.node)
        checkpoints.after_save.append(outputs_hook(link, record, run_dir, node=role.node))
        try:  # the latest checkpoint, restored before the program starts
            env = {**env, **await checkpoints.restore()}
        except RestoreError as exc:
            return await _cannot_start(link, str(exc), say, role)
        env = metrics_env(
            quarters.private, program_env(record, env, quarters), housing.runtime.user_module
        )
        async with (
            open_tunnels(  # their commands end with the attempt's tunnels, not its program
                link.endpoint, record, run_dir, {**env, MARK_ENV: f"{mark}-tunnels"},
                allowed=place.allow_tunnels, say=say, quarters=quarters, node=role.node,
            ) as tunnels,
            open_program_metrics(
                link, quarters.private, patterns=record.spec.metrics, attempt=record.attempt,
                hand_over=quarters.hand_over, may_pause=may_pause, save=checkpoints.serve,
            ) as metrics,
            open_program_output(
                link, record.attempt, record.spec.secrets(), metrics, node=role.node
            ) as output,
            ATTEMPTS.running(link, record, metrics.preemption, role.node),
        ):  # fmt: skip
            return await _program(
                link, record, quarters, place.log_path, env, python, say, news, tunnels, output,
                role,
            )  # fmt: skip


async def _program(
    link: RunLink,
    record: RunRecord,
    quarters: Quarters,
    log_path: Path,
    env: dict[str, str],
    python: str,
    say: Callable[[str], None],
    news: LinkNews,
    tunnels: Tunnels,
    output: ProgramOutput,
    role: NodeRole,
) -> int | None:
    """The program, plain or under the debugger, its output and metrics going to ``output``."""
    run_dir = quarters.run_dir
    if not record.spec.debug:
        attachable = await attachable_argv(record, quarters, env, python)
        return await _run_plain(
            link, record, quarters, env, log_path, say, news, output, attachable, tunnels, role
        )
    try:
        async with start_debuggee(
            record.spec.command,
            cwd=str(run_dir),
            env=unbuffered_env(env, record.spec.program_env()),
            log_path=str(log_path),
            python=python,
            on_output=output,
            secrets=record.spec.secrets(),
            # children debugged too, each configured by the shim (``worker_shim.session.processes``)
            subprocesses=ProcessMode(record.spec.processes) is not ProcessMode.MAIN,
            quarters=quarters,
        ) as debuggee:
            tunnels.program = debuggee.process.pid
            if output.metrics is not None:
                output.metrics.program = debuggee.process.pid
            return await _run_debug(
                link, record, run_dir, debuggee, say, news, output, tunnels=tunnels, role=role
            )
    except (ValueError, OSError, RuntimeError) as exc:
        detail = output.blank(str(exc))
        await _status(link, StatusEvent.START_FAILED, detail=detail, **_of_node(role))
        say(f"run {record.id} could not start: {detail}")
        return None


async def _claim_pause(
    link: RunLink, record: RunRecord, step: int, values: dict[str, float]
) -> bool:
    """Whether the relay lets the program pause where it met ``--debug-when``."""
    async with open_control(link.endpoint, client="tether-worker") as control:
        return (await control.claim_pause(record.id, record.attempt, step, values)).pause


async def _exited(
    link: RunLink,
    record: RunRecord,
    code: int,
    role: NodeRole,
    run_dir: Path,
    output: ProgramOutput,
) -> None:
    """The outputs sent home (``--outputs``), then the exit status published."""
    await send_outputs(link, record, run_dir, node=role.node)
    status = exit_status(record, code, process=role.key, node=role.node, preempted=output.preempted)
    await link.publish(status)


async def _status(link: RunLink, event: StatusEvent, **fields: Any) -> None:
    await link.publish(status_entry(event, **fields))


async def _start_failed(link: RunLink, detail: str) -> None:
    await _status(link, StatusEvent.START_FAILED, detail=detail)


async def _cannot_start(
    link: RunLink, detail: str, say: Callable[[str], None], role: NodeRole = ONE_NODE
) -> int | None:
    await _status(link, StatusEvent.START_FAILED, detail=detail, **_of_node(role))
    say(f"run {link.run_id}: {detail}")
    return None


async def _run_plain(
    link: RunLink,
    record: RunRecord,
    quarters: Quarters,
    env: dict[str, str],
    log_path: Path,
    say: Callable[[str], None],
    news: LinkNews,
    on_output: ProgramOutput,
    attachable: tuple[list[str], str] | None,
    tunnels: Tunnels,
    role: NodeRole,
) -> int | None:
    """A run without the debugger; ``attachable``: its program waits for a ``tether attach``
    (an IDE's presence on the run): then debugpy starts in it, and the run goes on as a debug
    run does (:func:`_run_debug`, what this attempt took off the link first). However it ends
    (an exit, a cancel, the worker stopping), its process group and every process marked with the
    attempt are ended before this returns (shielded, bounded)."""
    run_dir = quarters.run_dir
    listener = None
    if attachable is not None:
        try:
            listener = await attach_listener(attachable[1], quarters)
        except OSError as exc:
            log.warning("run %s runs without a way to attach later: %s", record.id, exc)
            attachable = None
    argv = attachable[0] if attachable else record.spec.command
    try:
        process = await start_plain(argv, cwd=str(run_dir), env=env, quarters=quarters)
    except (OSError, ValueError) as exc:
        if listener is not None:
            listener.close()
        await _status(link, StatusEvent.START_FAILED, detail=str(exc), **_of_node(role))
        say(f"run {record.id} could not start: {exc}")
        return None
    try:
        return await _plain_process(
            link, record, quarters, process, log_path, say, news, on_output, listener, tunnels,
            role,
        )  # fmt: skip
    finally:
        with trio.CancelScope(shield=True):
            await terminate_group(process)
            await kill_stragglers(quarters.mark)


async def _plain_process(
    link: RunLink,
    record: RunRecord,
    quarters: Quarters,
    process: trio.Process,
    log_path: Path,
    say: Callable[[str], None],
    news: LinkNews,
    on_output: ProgramOutput,
    listener: trio.socket.SocketType | None,
    tunnels: Tunnels,
    role: NodeRole,
) -> int | None:
    run_dir = quarters.run_dir
    tunnels.program = process.pid
    terminate = partial(terminate_group, process)
    if on_output.metrics is not None:
        on_output.metrics.program = process.pid
        on_output.metrics.preemption.terminate = terminate
    output = OutputPump(process, str(log_path), on_output, record.spec.secrets())
    await _status(
        link,
        StatusEvent.STARTED,
        data={"pid": process.pid, "run_dir": str(run_dir), "attempt": record.attempt,
              **role.started_data()},
        **_of_node(role),
    )  # fmt: skip
    async with trio.open_nursery() as nursery:
        nursery.start_soon(output.run)
        nursery.start_soon(_end_when_ended, link, news, terminate)
        if listener is not None:
            with listener:
                debugged = await until_debugged(
                    link, record, process, terminate, listener, say,
                    on_entry=partial(_entry_of_plain, tunnels, on_output, record.attempt),
                )  # fmt: skip
            if debugged is not None:
                if debugged.pause:
                    say(f"run {record.id}: --debug-when was met; the program waits")
                elif debugged.post_mortem:
                    say(f"run {record.id}: an uncaught exception; the program waits post-mortem")
                else:
                    say(f"run {record.id}: an IDE attached; debugging the running program")
                uid = quarters.user.uid if quarters.user is not None else None
                debuggee = Debuggee(process, debugged.port, output, uid=uid)
                code = await _run_debug(
                    link, record, run_dir, debuggee, say, news, on_output,
                    backlog=debugged.backlog, post_mortem=debugged.post_mortem, tunnels=tunnels,
                    role=role,
                )  # fmt: skip
                nursery.cancel_scope.cancel()
                return code
        nursery.start_soon(
            _watch_terminate, link, record, terminate, tunnels, on_output, news.taken
        )
        code = await process.wait()
        await output.drained()
        nursery.cancel_scope.cancel()
    await on_output.end()  # all of it before the exit status
    await _exited(link, record, code, role, run_dir, on_output)
    say(f"run {record.id} exited with {code}")
    return code


def _entry_of_plain(
    tunnels: Tunnels, output: ProgramOutput, attempt: int, entry: wire.AnyEntry | None
) -> None:
    """An entry a plain run's watch took: a tunnel to open, a ``stop`` to pass on."""
    tunnels.open(entry)
    if output.metrics is not None:
        output.metrics.control(ProgramControl.of(entry, attempt))
        output.metrics.deliver(entry)


async def _end_when_ended(
    link: RunLink, news: LinkNews, terminate: Callable[[], Awaitable[None]]
) -> None:
    """``terminate`` the program once the link comes back to a run that was ended (cancelled, or
    lost) while it was away."""
    while True:
        returned = news.returned  # no checkpoint before the look: no return goes unseen
        if link.run.finished:
            break
        await returned.wait()
    if not news.ended:
        news.ended = True
        news.say(f"run {news.run_id} is {link.run.state.value}: stopping the program")
    await terminate()


async def _watch_terminate(
    link: RunLink,
    record: RunRecord,
    terminate: Callable[[], Awaitable[None]],
    tunnels: Tunnels,
    output: ProgramOutput,
    taken: Sequence[wire.Deliver] = (),
) -> None:
    """A plain run's deliveries (``taken`` off the link before, first): a ``terminate`` for this
    attempt, a ``stop``, tunnels to open."""
    # closed here, not left to the garbage collector once cancelled (after the run's end)
    async with contextlib.aclosing(taken_first(taken, link.deliveries)) as deliveries:
        async for delivery in deliveries:
            if output.metrics is not None:
                output.metrics.control(control_action(delivery, record.attempt))
                output.metrics.deliver(delivery)
            entry = parse_delivery(delivery)[1]
            if terminates(entry, record):
                await terminate()
            tunnels.open(entry)


async def _run_debug(
    link: RunLink,
    record: RunRecord,
    run_dir: Path,
    debuggee: Debuggee,
    say: Callable[[str], None],
    news: LinkNews,
    output: ProgramOutput,
    *,
    backlog: list[wire.Deliver] | None = None,
    post_mortem: bool = False,
    tunnels: Tunnels | None = None,
    role: NodeRole = ONE_NODE,
) -> int | None:
    """``backlog``: a plain run an IDE attached to (what its watch took off the link; the
    program has been running since its ``started``); ``post_mortem``: no IDE, an uncaught
    exception holds the program (the replay does not wait for an IDE's configuration);
    ``role``: the node it runs (node K's session folds what its rendezvous wait took first)."""
    stream = await debuggee.connect()
    tail = Cursor.parse(link.tails.get(StreamName.TO_WORKER.value, "0"))
    taken, news.taken = [*news.taken, *(backlog or ())], []
    if taken:
        tail = max(tail, *(Cursor.parse(d.cursor) for d in taken if d.cursor))
    core = ShimCore(record, str(run_dir), tail=tail, clock=trio.current_time, node=role.node)
    processes = DebuggedProcesses(core)
    async with open_driver(processes, stream, link, output, debuggee, say, tunnels) as driver:
        driver.nursery.start_soon(report_refusals, link, news)
        # the fold starts once ``started`` is out: the replay may follow at once
        late = backlog is not None
        pid = debuggee.process.pid
        start = processes.start(
            pid, record.spec.command, late=late, post_mortem=post_mortem,
            started=role.started_data(),
        )  # fmt: skip
        await driver.perform(start)
        driver.nursery.start_soon(driver.deliveries, taken)
        driver.nursery.start_soon(_end_when_ended, link, news, driver.end_run)
        code = await debuggee.wait()
        # what the program wrote is in its pipes now (debugpy's adapter holds them open, so no
        # end of file comes): read up to there; what a child left running writes later follows
        await output.settle(debuggee.output)
        await output.end()
        # debugpy may still hold its last output events (logpoints): they come before its
        # ``terminated``, which the pump sees after publishing them, before the exit status below
        with trio.move_on_after(FINISH_TIMEOUT):
            await driver.finished.wait()
            await driver.perform(core.flush_output())
        await driver.perform(processes.end(code))
    driver.raise_failure()
    await _exited(link, record, code, role, run_dir, output)
    say(f"run {record.id} exited with {code}")
    return code
