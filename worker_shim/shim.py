"""The worker shim: runs one claimed run and is debugpy's single, long-lived client.

Sequence for a run in debug mode:

1. Connect to the relay (``worker`` role, naming the attempt), materialise the snapshot in a new
   directory of this attempt's own (``worker_shim.files``: blobs checked against their digests, no
   path leaving the directory).
2. Start the program under ``debugpy --listen 127.0.0.1:0 --wait-for-client`` with subprocess
   debugging off (``worker_shim.debuggee``); nothing of the user's code runs yet.
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
   relay will retry (``final``: :func:`protocol_specs.runs.retry_delay`).

The program's stdout and stderr go to the run's logs stream (``LogEntry`` chunks) as well as to a
log file beside the run directory and, when the IDE asked for output, to the IDE as ``output``
events (``worker_shim.output``: pydevd is never asked to redirect; a barrier puts the output before
``stopped``, the exit and every response). While the program stays stopped for more than
:data:`PAUSE_REPORT_AFTER`, the shim reports ``paused`` (with where) for ``tether ls``, and
``resumed`` when it goes on; short stops (stepping) are not reported.

Throughout, the relay link reconnects by itself and resends what the relay has not acknowledged
(``relay.client.RunLink``); debugpy never notices a network drop. If the run was ended meanwhile
(cancelled, or marked lost because the link stayed down past the lease), the program is terminated.
While the program is paused and no IDE is attached, :class:`protocol_specs.attention.Attention`
decides what happens (the run's ``on_unattended_stop`` policy).
"""

from __future__ import annotations

import contextlib
import logging
import os
import sys
from collections.abc import Awaitable, Callable
from contextlib import AbstractAsyncContextManager
from dataclasses import dataclass, field
from functools import partial
from pathlib import Path
from typing import Any

import orjson
import trio

from protocol_specs import dap_framing, wire
from protocol_specs.attention import Attention, Notice, Resume, Terminate, UnattendedPolicy
from protocol_specs.capabilities import (
    DEBUGPY_CAPABILITIES,
    VSCODE_INITIALIZE,
    capabilities_delta,
)
from protocol_specs.dap_models import coalesce_output, plain_output
from protocol_specs.link import Cursor
from protocol_specs.runs import RunRecord, retry_delay
from protocol_specs.session import (
    CONFIGURATION_COMMANDS,
    BreakpointSet,
    DebugSession,
    StatusEvent,
    is_transient,
)
from protocol_specs.snapshots import Manifest
from protocol_specs.wire import DapEntry, PresenceEntry, Role, StatusEntry, StreamName, WireError
from relay.client import LinkPolicy, RunLink, Target, open_run_link

from .debuggee import Debuggee, OutputPump, start_debuggee, start_plain, terminate_group
from .files import Fetch, materialise
from .output import (
    BARRIER_EVENTS,
    ProgramOutput,
    open_program_output,
    pipe_output_attach,
    unbuffered_env,
)

__all__ = ["DEFAULT_INITIALIZE", "run_shim", "worker_link", "worker_link_policy"]

log = logging.getLogger("tether.worker")

#: initialize arguments when no IDE ever sent its own (a run started without waiting for one)
DEFAULT_INITIALIZE: dict[str, Any] = {
    **VSCODE_INITIALIZE,
    "clientID": "tether",
    "clientName": "tether worker",
}
#: client capabilities the shim never claims towards debugpy, whatever the IDE said: it answers no
#: reverse requests (subprocess debugging is off; no terminal on the worker).
_NOT_SUPPORTED = {"supportsStartDebuggingRequest": False, "supportsRunInTerminalRequest": False}
#: debugpy's own events that are about the worker-side connection, not the program
_DROPPED_EVENTS = frozenset(
    {"initialized", "debugpyWaitingForServer", "debugpySockets", "terminated"}
)
HANDSHAKE_TIMEOUT = 60.0
#: how long debugpy may take, after the program exited, to hand over its last events
FINISH_TIMEOUT = 10.0
RECEIVE_SIZE = 256 * 1024
#: a stop shorter than this (a step) is not reported as the run being paused
PAUSE_REPORT_AFTER = 0.5


#: the worker's relay link: keep trying for a minute when the run starts (the pool just reached
#: the relay), then for ever (the lease decides when the run is given up)
def worker_link_policy() -> LinkPolicy:
    return LinkPolicy.from_env(first_connect_within=60.0)


@dataclass
class _Sent:
    command: str
    origin: str | None  # None: the shim's own request, answered to a waiter only
    seq: int = 0
    done: trio.Event = field(default_factory=trio.Event)
    response: dict[str, Any] | None = None


class _DebugpyLink:
    """The shim's connection to debugpy: numbering, routing of responses, filtering of events."""

    def __init__(
        self,
        stream: trio.SocketStream,
        link: RunLink,
        on_event: Callable[[dict[str, Any]], None] = lambda _msg: None,
        barrier: Callable[[], Awaitable[None]] | None = None,
    ) -> None:
        self.stream = stream
        self.link = link
        self.on_event = on_event
        #: awaited before publishing a response or a stop or end: the program's output goes first
        self.barrier = barrier
        self.framer = dap_framing.DapFramer()
        self.seq = 0
        self.sent: dict[int, _Sent] = {}
        self.initialized = trio.Event()
        self.closed = trio.Event()
        #: debugpy said ``terminated`` (after every event of the program) or the connection closed
        self.finished = trio.Event()
        self._send_lock = trio.Lock()
        # Output waits while the previous output entry is unanswered by the relay, and goes out
        # merged after it (Nagle's idea, no timer): a trickle is sent at once, a flood in chunks.
        self._publish_lock = trio.Lock()  # publishes in the order they were decided
        self._output: list[bytes] = []  # plain output events held back, in order
        self._output_held = trio.Event()
        self._output_in_flight = 0  # the publish number of the last output entry sent

    async def send(
        self, command: str, arguments: Any, *, origin: str | None = None, seq: int = 0
    ) -> _Sent:
        async with self._send_lock:
            self.seq += 1
            sent = _Sent(command, origin, seq)
            self.sent[self.seq] = sent
            msg: dict[str, Any] = {"seq": self.seq, "type": "request", "command": command}
            if arguments is not None:
                msg["arguments"] = arguments
            await self.stream.send_all(dap_framing.encode_message(msg))
            return sent

    async def request(self, command: str, arguments: Any) -> dict[str, Any]:
        sent = await self.send(command, arguments)
        with trio.fail_after(HANDSHAKE_TIMEOUT):
            await sent.done.wait()
        assert sent.response is not None
        if not sent.response.get("success"):
            raise RuntimeError(f"debugpy refused {command!r}: {sent.response.get('message')}")
        return sent.response

    async def pump(self) -> None:
        """Read debugpy's messages until it closes the connection; publish what the IDE needs."""
        try:
            while data := await self.stream.receive_some(RECEIVE_SIZE):
                self.framer.receive_data(data)
                # pydevd sends an event per write(): output held while the previous output entry
                # is unanswered goes out merged, so debugpy is read as fast as it writes (pydevd
                # drops what it has not sent when the program exits)
                while (raw := self.framer.next_raw()) is not None:
                    if plain_output(raw) is not None:
                        await self._output_event(raw)
                    else:
                        if self._output:
                            await self.flush_output()
                        await self._dispatch(raw)
        except (trio.BrokenResourceError, trio.ClosedResourceError):
            pass
        except dap_framing.DapFramingError as exc:
            log.error("debugpy sent bad DAP data: %s", exc)
        finally:
            self.closed.set()
            self.finished.set()
            for sent in self.sent.values():
                sent.done.set()

    async def _output_event(self, raw: bytes) -> None:
        if self._output or self.link.answered < self._output_in_flight:
            self._output.append(raw)
            self._output_held.set()
        else:
            await self._dispatch(raw)

    async def flush_output(self) -> None:
        async with self._publish_lock:
            held, self._output = self._output, []
            for raw in coalesce_output(held):
                await self._dispatch(raw, locked=True)

    async def flush_output_when_answered(self) -> None:
        """Send held output as soon as the relay answered the output entry before it."""
        while True:
            await self._output_held.wait()
            self._output_held = trio.Event()
            await self.link.wait_answered(self._output_in_flight)
            await self.flush_output()

    async def _publish(self, entry: DapEntry, *, locked: bool) -> int:
        if locked:
            return await self.link.publish(entry)
        async with self._publish_lock:
            return await self.link.publish(entry)

    async def _dispatch(self, raw: bytes, *, locked: bool = False) -> None:
        msg = orjson.loads(raw)
        kind = msg.get("type")
        if kind == "response":
            sent = self.sent.pop(msg.get("request_seq", -1), None)
            if sent is None:
                return
            sent.response = msg
            sent.done.set()
            if sent.origin is not None:
                if self.barrier is not None:
                    await self.barrier()
                body = orjson.dumps({**msg, "request_seq": sent.seq})
                transient = is_transient(msg, sent.command)
                entry = DapEntry(origin=sent.origin, body=body, transient=transient)
                await self._publish(entry, locked=locked)
        elif kind == "event":
            name = msg.get("event")
            if name == "initialized":
                self.initialized.set()
            if name == "terminated":
                self.finished.set()
            if name in _DROPPED_EVENTS:
                return
            if name == "output" and (msg.get("body") or {}).get("category") == "telemetry":
                return
            if name in BARRIER_EVENTS and self.barrier is not None:
                await self.barrier()
            self.on_event(msg)
            n = await self._publish(DapEntry(body=raw, transient=is_transient(msg)), locked=locked)
            if name == "output":
                self._output_in_flight = n
        elif kind == "request":
            # reverse requests (startDebugging, runInTerminal): the shim supports none of them
            reply = {
                "seq": 0,
                "type": "response",
                "request_seq": msg.get("seq", 0),
                "success": False,
                "command": msg.get("command", ""),
                "message": "not supported by tether's worker",
            }
            async with self._send_lock:
                self.seq += 1
                reply["seq"] = self.seq
                await self.stream.send_all(dap_framing.encode_message(reply))


def _default_path_mappings(
    attach: dict[str, Any], record: RunRecord, run_dir: Path
) -> dict[str, Any]:
    mappings = attach.get("pathMappings")
    if mappings:
        return attach
    return {
        **attach,
        "pathMappings": [{"localRoot": record.spec.workdir, "remoteRoot": str(run_dir)}],
    }


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
) -> int | None:
    """Run one claimed attempt to its end; returns the program's exit code (None if it never
    started). ``fetch`` downloads snapshot blobs (kept in ``cache``); ``env`` is added to the
    program's environment (the worker's own ``CUDA_VISIBLE_DEVICES``, for one).

    ``say_when_stopped``: if the worker stops before the attempt ended, tell the relay the
    attempt is over (a pool's worker); a scheduler's job leaves that to its backend, which knows
    why the job ended (requeued, preempted, cancelled)."""
    say = on_event or (lambda _text: None)
    run_dir = runs_dir / f"{record.id}-{record.attempt}"
    log_path = runs_dir / f"{record.id}-{record.attempt}.log"
    news = _LinkNews(say, record.id)
    async with worker_link(
        relay_url, record, policy=policy, on_refused=news.refused, on_state=news.state
    ) as link:
        news.link = link
        if link.run.finished:
            say(f"run {record.id} is {link.run.state.value}; not starting it")
            return None
        try:
            return await _attempt(link, record, manifest, run_dir, log_path, fetch, cache, env,
                                  python, say, news)  # fmt: skip
        except BaseException:
            if not say_when_stopped:
                raise
            # the worker is going away (stopped, or failing) with the attempt unfinished: say so
            # now, so the run is retried or ended at once instead of after the lease. On a link
            # of its own: this one's tasks are being cancelled with everything else
            with trio.CancelScope(shield=True), trio.move_on_after(STOPPING_NOTICE):
                with contextlib.suppress(Exception):
                    async with worker_link(relay_url, record) as last:
                        await _status(last, StatusEvent.WORKER_STOPPED, detail="the worker stopped")
                        await last.flush()
            raise


def worker_link(
    relay_url: Target, record: RunRecord, *, policy: LinkPolicy | None = None, **options: Any
) -> AbstractAsyncContextManager[RunLink]:
    """The link of ``record``'s current attempt's worker to the relay."""
    return open_run_link(
        relay_url,
        role=Role.WORKER,
        run=record.id,
        attempt=record.attempt,
        client="tether-worker",
        policy=policy or worker_link_policy(),
        **options,
    )


#: how long a stopping worker tries to tell the relay its attempt is over
STOPPING_NOTICE = 3.0


async def _attempt(
    link: RunLink,
    record: RunRecord,
    manifest: Manifest,
    run_dir: Path,
    log_path: Path,
    fetch: Fetch,
    cache: Path,
    env: dict[str, str] | None,
    python: str,
    say: Callable[[str], None],
    news: _LinkNews,
) -> int | None:
    """The attempt, once its link is up: files, then the program, plain or under the debugger."""
    try:
        files = await materialise(manifest, run_dir, fetch, cache=cache)
    except Exception as exc:  # a broken snapshot is the run's failure, not the worker's
        await _status(
            link, StatusEvent.START_FAILED, detail=f"cannot materialise the snapshot: {exc}"
        )
        say(f"run {record.id}: cannot materialise the snapshot: {exc}")
        return None
    say(f"run {record.id} attempt {record.attempt}: {files} files in {run_dir}")
    inherited = {k: v for k, v in os.environ.items() if k not in WORKER_ONLY_ENV}
    env = {**inherited, **record.spec.program_env(), **(env or {})}
    async with open_program_output(link, record.attempt, record.spec.secrets()) as output:
        if not record.spec.debug:
            return await _run_plain(link, record, run_dir, env, log_path, say, news, output)
        try:
            async with start_debuggee(
                record.spec.command,
                cwd=str(run_dir),
                env=unbuffered_env(env, record.spec.program_env()),
                log_path=str(log_path),
                python=python,
                on_output=output,
                secrets=record.spec.secrets(),
            ) as debuggee:
                return await _run_debug(link, record, run_dir, debuggee, say, news, output)
        except (ValueError, OSError, RuntimeError) as exc:
            detail = output.blank(str(exc))
            await _status(link, StatusEvent.START_FAILED, detail=detail)
            say(f"run {record.id} could not start: {detail}")
            return None


#: the worker's own credentials: never handed down to the program it runs
WORKER_ONLY_ENV = frozenset({"TETHER_TOKEN", "TETHER_CONFIG"})


async def _exited(link: RunLink, record: RunRecord, code: int) -> None:
    """The program's exit status; ``final``: no further attempt follows."""
    spec = record.spec
    final = code == 0 or retry_delay(record.attempt, spec.max_retries, spec.retry_backoff) is None
    await _status(
        link,
        StatusEvent.EXITED,
        exit_code=code,
        data={"attempt": record.attempt, "final": final},
    )


class _LinkNews:
    """What the run link reports: drops and returns, and entries the relay refused."""

    def __init__(self, say: Callable[[str], None], run_id: str) -> None:
        self.say = say
        self.run_id = run_id
        self.link: RunLink | None = None
        self.ended = trio.Event()  #: the run was ended while we were away
        self.dropped = 0
        self.last_refusal = ""
        self.refusal = trio.Event()

    def state(self, up: bool, detail: str) -> None:
        self.say(f"run {self.run_id}: relay link {'up' if up else 'down'}: {detail}")
        if up and self.link is not None and self.link.run.finished:
            self.say(f"run {self.run_id} is {self.link.run.state.value}: stopping the program")
            self.ended.set()

    def refused(self, n: int, error: wire.Error) -> None:
        del n
        self.dropped += 1
        self.last_refusal = error.message
        self.refusal.set()


async def _report_refusals(link: RunLink, news: _LinkNews) -> None:
    """Entries the relay refuses (the IDE side's buffer is full) are dropped, but never silently."""
    while True:
        await news.refusal.wait()
        news.refusal = trio.Event()
        await _status(
            link,
            StatusEvent.BUFFER_FULL,
            detail=(
                f"{news.dropped} messages from the program were dropped so far: {news.last_refusal}. "
                "Attach an IDE (or run tether attach) to read the backlog."
            ),
            data={"dropped": news.dropped},
        )
        await trio.sleep(30)  # at most one notice per 30 s


async def _status(link: RunLink, event: str, **fields: Any) -> None:
    await link.publish(StatusEntry(event=event, at=trio.current_time(), **fields))


async def _run_plain(
    link: RunLink,
    record: RunRecord,
    run_dir: Path,
    env: dict[str, str],
    log_path: Path,
    say: Callable[[str], None],
    news: _LinkNews,
    on_output: ProgramOutput,
) -> int | None:
    try:
        process = await start_plain(record.spec.command, cwd=str(run_dir), env=env)
    except (OSError, ValueError) as exc:
        await _status(link, StatusEvent.START_FAILED, detail=str(exc))
        say(f"run {record.id} could not start: {exc}")
        return None
    output = OutputPump(process, str(log_path), on_output, record.spec.secrets())
    await _status(
        link,
        StatusEvent.STARTED,
        data={"pid": process.pid, "run_dir": str(run_dir), "attempt": record.attempt},
    )
    async with trio.open_nursery() as nursery:
        nursery.start_soon(output.run)
        nursery.start_soon(_watch_terminate, link, record, partial(terminate_group, process))
        nursery.start_soon(_terminate_when, news.ended, partial(terminate_group, process))
        code = await process.wait()
        await output.drained()
        nursery.cancel_scope.cancel()
    await on_output.end()  # all of it before the exit status
    await _exited(link, record, code)
    say(f"run {record.id} exited with {code}")
    return code


async def _terminate_when(event: trio.Event, terminate: Callable[[], Awaitable[None]]) -> None:
    await event.wait()
    await terminate()


async def _watch_terminate(
    link: RunLink, record: RunRecord, terminate: Callable[[], Awaitable[None]]
) -> None:
    async for delivery in link.deliveries:
        entry = _decode(delivery)
        if _terminates(entry, record):
            await terminate()


def _terminates(entry: wire.AnyEntry | None, record: RunRecord) -> bool:
    """A ``terminate`` meant for this attempt (not one an earlier attempt was sent)."""
    return (
        isinstance(entry, wire.ControlEntry)
        and entry.action == "terminate"
        and entry.attempt in (0, record.attempt)
    )


async def _run_debug(
    link: RunLink,
    record: RunRecord,
    run_dir: Path,
    debuggee: Debuggee,
    say: Callable[[str], None],
    news: _LinkNews,
    output: ProgramOutput,
) -> int | None:
    session = DebugSession()
    stream = await debuggee.connect()
    attention = _Watch(record, run_dir, say)
    dbg = _DebugpyLink(
        stream, link, attention.debugger_event, barrier=partial(output.settle, debuggee.output)
    )
    attention.dbg = dbg
    await _status(
        link,
        StatusEvent.STARTED,
        data={
            "pid": debuggee.process.pid,
            "run_dir": str(run_dir),
            "debugpy": "1.8.22",
            "attempt": record.attempt,
        },
    )
    terminate = trio.Event()

    async def stop_on_terminate() -> None:
        await terminate.wait()
        say(f"run {record.id}: terminating on request")
        await debuggee.terminate()

    async with trio.open_nursery() as nursery:
        nursery.start_soon(dbg.pump)
        nursery.start_soon(dbg.flush_output_when_answered)
        nursery.start_soon(stop_on_terminate)
        nursery.start_soon(_terminate_when, news.ended, _set_event(terminate))
        nursery.start_soon(_report_refusals, link, news)
        nursery.start_soon(attention.run, link, terminate)
        # 3. fold the IDE side: everything stored before we connected, then (unless the run
        #    does not wait) until the IDE finished its configuration
        tail = Cursor.parse(link.tails.get(StreamName.TO_WORKER.value, "0"))
        seen = (0, 0)
        waiting_said = False
        while not terminate.is_set():
            caught_up = seen >= tail
            if caught_up and (session.configuration_done or not record.spec.wait_for_ide):
                break
            if caught_up and not waiting_said:
                await _status(
                    link, StatusEvent.WAITING_FOR_IDE, detail="waiting for the IDE's configuration"
                )
                say(f"run {record.id}: debugger ready, waiting for the IDE's configuration")
                waiting_said = True
            delivery = await link.deliveries.receive()
            seen = Cursor.parse(delivery.cursor)
            _fold(delivery, session, terminate, attention, record)
        _drain(link, session, terminate, attention, record)  # configuration here counts too
        if not terminate.is_set():
            # 4. replay the compacted configuration
            await _replay(
                dbg,
                session,
                record,
                run_dir,
                lambda: _drain(link, session, terminate, attention, record),
                output,
            )
            await _status(
                link,
                StatusEvent.DEBUGGER_LIVE,
                data={"capabilities_delta": session.capabilities_delta},
            )
            say(f"run {record.id}: debugger live")
            # 5. live traffic
            nursery.start_soon(_forward_live, link, dbg, terminate, attention, record)
        code = await debuggee.wait()
        # what the program wrote is in its pipes now (debugpy's adapter holds them open, so no
        # end of file comes): read up to there; what a child left running writes later follows
        await output.settle(debuggee.output)
        await output.end()
        # debugpy may still hold its last output events (logpoints): they come before its
        # ``terminated``, which the pump sees after publishing them, before the exit status below
        with trio.move_on_after(FINISH_TIMEOUT):
            await dbg.finished.wait()
            await dbg.flush_output()
        nursery.cancel_scope.cancel()
    await _exited(link, record, code)
    say(f"run {record.id} exited with {code}")
    return code


def _set_event(event: trio.Event) -> Callable[[], Awaitable[None]]:
    async def set_it() -> None:
        event.set()

    return set_it


def _fold(
    delivery: wire.Deliver,
    session: DebugSession,
    terminate: trio.Event,
    attention: _Watch,
    record: RunRecord,
) -> None:
    entry = _decode(delivery)
    if isinstance(entry, DapEntry):
        session.apply_to_worker(entry)
    elif isinstance(entry, PresenceEntry):
        attention.presence(entry)
    elif _terminates(entry, record):
        terminate.set()


def _drain(
    link: RunLink,
    session: DebugSession,
    terminate: trio.Event,
    attention: _Watch,
    record: RunRecord,
) -> None:
    """Fold every delivery already received, without waiting (before debugpy starts the program,
    configuration entries are only ever folded, never forwarded)."""
    while True:
        try:
            delivery = link.deliveries.receive_nowait()
        except trio.WouldBlock:
            return
        _fold(delivery, session, terminate, attention, record)


def _decode(delivery: wire.Deliver) -> wire.AnyEntry | None:
    try:
        return wire.decode_entry(delivery.entry)
    except WireError as exc:
        log.warning("skipping malformed entry %s: %s", delivery.cursor, exc.message)
        return None


async def _replay(
    dbg: _DebugpyLink,
    session: DebugSession,
    record: RunRecord,
    run_dir: Path,
    catch_up: Callable[[], None],
    output: ProgramOutput,
) -> None:
    """The handshake and the latest configuration, before debugpy lets user code run.

    Configuration that arrives while the replay is in flight is folded (``catch_up``) and sent
    too, still before ``configurationDone``: only the latest state per source ever applies.
    pydevd is never asked to redirect output: ``output`` sends the IDE the program's pipes
    (:func:`~worker_shim.output.pipe_output_attach`).
    """
    init_args = {**(session.initialize_args or DEFAULT_INITIALIZE), **_NOT_SUPPORTED}
    init_args.setdefault("adapterID", "debugpy")
    response = await dbg.request("initialize", init_args)
    session.capabilities_delta = capabilities_delta(
        DEBUGPY_CAPABILITIES, response.get("body") or {}
    )
    attach_args = _default_path_mappings(dict(session.attach_args or {}), record, run_dir)
    attach_args = pipe_output_attach(attach_args)
    output.to_ide = True
    attach = await dbg.send("attach", attach_args)
    with trio.fail_after(HANDSHAKE_TIMEOUT):
        await dbg.initialized.wait()
    applied: dict[tuple[str, str], int] = {}
    while True:
        sent = []
        for bset in session.configuration():
            key = (bset.command, _source_of(bset))
            if applied.get(key) == bset.seq:
                continue
            applied[key] = bset.seq
            sent.append(
                await dbg.send(bset.command, bset.arguments, origin=bset.origin, seq=bset.seq)
            )
        if not sent:
            break
        with trio.fail_after(HANDSHAKE_TIMEOUT):
            for s in sent:
                await s.done.wait()
        catch_up()
    await dbg.request("configurationDone", None)
    with trio.fail_after(HANDSHAKE_TIMEOUT):
        await attach.done.wait()


def _source_of(bset: BreakpointSet) -> str:
    source = bset.arguments.get("source") or {}
    return str(source.get("path") or source.get("sourceReference") or source.get("name") or "")


async def _forward_live(
    link: RunLink, dbg: _DebugpyLink, terminate: trio.Event, attention: _Watch, record: RunRecord
) -> None:
    async for delivery in link.deliveries:
        entry = _decode(delivery)
        if isinstance(entry, wire.ControlEntry):
            if _terminates(entry, record):
                terminate.set()
            continue
        if isinstance(entry, PresenceEntry):
            attention.presence(entry)
            continue
        if not isinstance(entry, DapEntry):
            continue
        msg = _request(entry)
        if msg is None:
            continue  # not a request debugpy could take (anyone with the user's token can write)
        command = msg["command"]
        if entry.local and command not in CONFIGURATION_COMMANDS:
            continue  # a handshake request the adapter answered (initialize, attach, ...)
        await dbg.send(command, msg.get("arguments"), origin=entry.origin, seq=msg["seq"])


def _request(entry: DapEntry) -> dict[str, Any] | None:
    """The DAP request ``entry`` carries, if it is a well-formed one: an object with a string
    ``command``, an integer ``seq`` and ``arguments`` absent or an object."""
    try:
        msg = orjson.loads(entry.body)
    except orjson.JSONDecodeError:
        return None
    if not isinstance(msg, dict) or msg.get("type") != "request":
        return None
    seq = msg.get("seq")
    if not isinstance(msg.get("command"), str) or not isinstance(seq, int) or isinstance(seq, bool):
        return None
    if not isinstance(msg.get("arguments", {}), dict | None):
        return None
    return msg


class _Watch:
    """Performs what :class:`~protocol_specs.attention.Attention` decides about unattended stops."""

    def __init__(self, record: RunRecord, run_dir: Path, say: Callable[[str], None]) -> None:
        spec = record.spec
        self.record = record
        self.run_dir = run_dir
        self.say = say
        self.attention = Attention(
            UnattendedPolicy(spec.on_unattended_stop), spec.unattended_timeout
        )
        self.dbg: _DebugpyLink | None = None
        self._decisions: list[Notice | Resume | Terminate] = []
        self._changed = trio.Event()
        #: when the program last went from running to stopped (None: running)
        self._stopped_since: float | None = None
        self._paused_reported = False

    def presence(self, entry: PresenceEntry) -> None:
        self._add(self.attention.on_presence(entry, trio.current_time()))

    def debugger_event(self, msg: dict[str, Any]) -> None:
        now = trio.current_time()
        self._add(self.attention.on_debugger_event(msg, now))
        if self.attention.stopped and self._stopped_since is None:
            self._stopped_since = now
        elif not self.attention.stopped:
            self._stopped_since = None

    def _add(self, decisions: list[Notice | Resume | Terminate]) -> None:
        self._decisions += decisions
        self._changed.set()

    async def run(self, link: RunLink, terminate: trio.Event) -> None:
        while True:
            deadline = self.attention.next_wake
            if self._stopped_since is not None and not self._paused_reported:
                report_at = self._stopped_since + PAUSE_REPORT_AFTER
                deadline = report_at if deadline is None else min(deadline, report_at)
            with trio.move_on_at(deadline if deadline is not None else float("inf")):
                await self._changed.wait()
            self._changed = trio.Event()
            await self._report_pause(link)
            self._decisions += self.attention.tick(trio.current_time())
            decisions, self._decisions = self._decisions, []
            for decision in decisions:
                if isinstance(decision, Notice):
                    await self._notice(link, decision)
                elif isinstance(decision, Resume) and self.dbg is not None:
                    self.say(f"run {self.record.id}: unattended stop timed out; continuing")
                    await self.dbg.send("continue", {"threadId": decision.thread_id})
                elif isinstance(decision, Terminate):
                    self.say(f"run {self.record.id}: {decision.detail}; terminating")
                    await _status(
                        link, StatusEvent.UNATTENDED_STOP, detail=f"Terminating: {decision.detail}."
                    )
                    terminate.set()

    async def _report_pause(self, link: RunLink) -> None:
        """``paused`` (with where) once a stop lasted :data:`PAUSE_REPORT_AFTER`; ``resumed``."""
        since = self._stopped_since
        if since is None:
            if self._paused_reported:
                self._paused_reported = False
                await _status(link, StatusEvent.RESUMED)
            return
        if self._paused_reported or trio.current_time() < since + PAUSE_REPORT_AFTER:
            return
        self._paused_reported = True
        tid, body = next(iter(self.attention.stopped.items()))
        where = (await self._where(tid)).removeprefix(" at ")
        await _status(
            link,
            StatusEvent.PAUSED,
            detail=where,
            data={"where": where, "reason": body.get("reason", ""), "thread_id": tid},
        )

    async def _notice(self, link: RunLink, notice: Notice) -> None:
        where = await self._where(notice.thread_id)
        spec = self.record.spec
        policy = spec.on_unattended_stop
        if policy == "wait":
            then = (
                "It stays paused until an IDE attaches (--on-unattended-stop wait): "
                "its GPUs stay allocated meanwhile."
            )
        else:
            then = f"If no IDE attaches within {spec.unattended_timeout:g} s, it will {policy}."
        detail = (
            f"Run {self.record.id} is paused{where} ({notice.reason or 'stopped'}) "
            f"and no IDE is attached. {then} Attach with: tether attach {self.record.id}"
        )
        self.say(detail)
        await _status(
            link,
            StatusEvent.UNATTENDED_STOP,
            detail=detail,
            data={
                "policy": policy,
                "timeout": spec.unattended_timeout,
                "thread_id": notice.thread_id,
                "reason": notice.reason,
                "where": where.removeprefix(" at "),
            },
        )

    async def _where(self, thread_id: int) -> str:
        """`` at train.py:18 in train_step`` (the submitted path), or "" if debugpy won't say."""
        if self.dbg is None:
            return ""
        try:
            sent = await self.dbg.send("stackTrace", {"threadId": thread_id, "levels": 1})
            with trio.move_on_after(5):
                await sent.done.wait()
            frames = ((sent.response or {}).get("body") or {}).get("stackFrames") or []
        except (trio.BrokenResourceError, trio.ClosedResourceError):
            return ""
        if not frames:
            return ""
        frame = frames[0]
        path = str((frame.get("source") or {}).get("path") or "")
        for root in (self.run_dir, Path(self.record.spec.workdir)):  # debugpy maps to the latter
            try:
                path = str(Path(path).relative_to(root))
                break
            except ValueError:
                continue
        return f" at {path}:{frame.get('line')} in {frame.get('name')}"
