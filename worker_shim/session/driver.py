"""Performing what a run's debug sessions decide: the debugpy connections (one per debugged
process, each read by a task of its own), the run link, the program (:class:`Driver`, made by
:func:`open_driver`).
"""

from __future__ import annotations

import logging
from collections.abc import AsyncIterator, Callable, Sequence
from contextlib import asynccontextmanager
from typing import Any

import trio

from protocol_specs.dap import framing as dap_framing
from protocol_specs.session.rank_values import EvalReport, RankValue
from protocol_specs.wire import wire
from relay.client import RelayError, RunLink, open_control

from ..program.debuggee import Debuggee
from ..program.metrics import control_action
from ..program.tunnels import Tunnels
from .actions import (
    Action,
    CloseChild,
    EvalAnswered,
    OpenChild,
    OpenTunnel,
    PipeOutputToIde,
    Publish,
    ReplayFailed,
    Say,
    Settle,
    SuspendRun,
    Terminate,
    ToDebugpy,
)
from .output import ProgramOutput
from .processes import DebuggedProcesses
from .rank_eval import EVAL_WAIT
from .suspend import SUSPEND_WAIT, SuspendAsk, cannot_text, outcome, suspended_text

__all__ = ["RECEIVE_SIZE", "Driver", "open_driver"]

log = logging.getLogger("tether.worker")

RECEIVE_SIZE = 256 * 1024
#: how long a suspend tries the relay (then the fallback acts)
_ASK_RELAY_WITHIN = 30.0
#: seconds ``tether eval`` waits past the sessions' own deadline (their timer answers first)
_EVAL_SLACK = 10.0


class Driver:
    """Performs what :class:`~worker_shim.session.processes.DebuggedProcesses` (the main
    process's :class:`~worker_shim.session.core.ShimCore` and one
    :class:`~worker_shim.session.child.ChildSession` per child) decides: the debugpy connections
    (one per debugged process, each read by a task of its own), the run link, the program. Each
    task performs the actions of its own decisions, in order; writes to a connection and
    publishes each take a lock, so neither interleaves."""

    def __init__(
        self,
        processes: DebuggedProcesses,
        stream: trio.SocketStream,
        link: RunLink,
        output: ProgramOutput,
        debuggee: Debuggee,
        say: Callable[[str], None],
        nursery: trio.Nursery,
        tunnels: Tunnels | None = None,
    ) -> None:
        """``stream``: the main process's debugpy connection; ``nursery``: where each child's
        pump runs, cancelled when the replay fails."""
        self.processes = processes
        self.tunnels = tunnels
        self.core = processes.main
        self.streams: dict[str, trio.SocketStream] = {processes.main.key: stream}
        self.nursery = nursery
        self.link = link
        self.output = output
        self.debuggee = debuggee
        self.say = say
        self.finished = trio.Event()  #: debugpy said ``terminated``, or closed the connection
        self.failure: ReplayFailed | None = None
        self._terminate = trio.Event()
        self._send_locks: dict[str, trio.Lock] = {}
        #: child connections closed for a session that ended (an exec'd process's old one)
        self._retired: set[trio.SocketStream] = set()
        self._publish_lock = trio.Lock()  # publishes in the order they were decided
        self._output_held = trio.Event()
        self._wake_timer = trio.Event()
        self._timer_at: float | None = None  #: the deadline the timer sleeps until
        #: cross-rank evaluations asked by ``tether eval``, until answered
        self._evals: dict[object, tuple[trio.Event, list[RankValue]]] = {}
        self._eval_asks = 0
        self._suspending = False  #: a suspend is under way (the policy's, once at a time)

    def __repr__(self) -> str:
        return f"<Driver {self.core!r}>"

    async def perform(self, actions: list[Action]) -> None:
        for action in actions:
            if isinstance(action, ToDebugpy):
                await self._send(action.process, action.message)
            elif isinstance(action, OpenChild):
                await self._open_child(action.process)
            elif isinstance(action, OpenTunnel):
                if self.tunnels is not None:
                    self.tunnels.open(action.entry)
            elif isinstance(action, CloseChild):
                stream = self.streams.pop(action.process, None)
                if stream is not None:
                    if action.retired:
                        self._retired.add(stream)
                    await stream.aclose()
            elif isinstance(action, Publish):
                async with self._publish_lock:
                    n = await self.link.publish(action.entry)
                if action.output:
                    self.core.output_published(n)
            elif isinstance(action, Settle):
                await self.output.settle(self.debuggee.output)
            elif isinstance(action, PipeOutputToIde):
                self.output.to_ide = True
            elif isinstance(action, Say):
                self.say(action.text)
            elif isinstance(action, Terminate):
                self._terminate.set()
            elif isinstance(action, SuspendRun):
                if not self._suspending:
                    self._suspending = True
                    self.nursery.start_soon(self.suspend, action.waited)
            elif isinstance(action, EvalAnswered):
                waiting = self._evals.get(action.ask)
                if waiting is not None:
                    waiting[1][:] = action.values
                    waiting[0].set()
            elif isinstance(action, ReplayFailed):
                self.failure = action
                self.nursery.cancel_scope.cancel()
        if self.core.finished:
            self.finished.set()
        if self.core.output_held:
            self._output_held.set()
        deadline = self.processes.next_deadline  # earlier than the timer's: wake it
        if deadline is not None and (self._timer_at is None or deadline < self._timer_at):
            self._wake_timer.set()

    async def evaluate(self, expression: str, ranks: list[int] | None) -> bytes:
        """``expression`` evaluated in every paused rank (or of ``ranks``): an
        :class:`~protocol_specs.session.rank_values.EvalReport` as JSON (``tether eval``). The
        sessions' deadline bounds the wait (:data:`~worker_shim.session.rank_eval.EVAL_WAIT`),
        and, should the sessions' timer be gone with them, this one: what came by then."""
        self._eval_asks += 1
        ask = self._eval_asks
        done, values = self._evals[ask] = (trio.Event(), [])
        try:
            await self.perform(self.processes.evaluate(ask, expression, ranks))
            with trio.move_on_after(EVAL_WAIT + _EVAL_SLACK):
                await done.wait()
        finally:
            del self._evals[ask]
        return EvalReport(expression=expression, values=values).model_dump_json().encode()

    async def suspend(self, waited: float) -> None:
        """The unattended stop's ``suspend`` (:mod:`worker_shim.session.suspend`): the program's
        ``tether.on_suspend`` in every paused process, then the relay suspends the attempt (as
        its worker) and the program ends; or the notice that it cannot, and the fallback."""
        self._eval_asks += 1
        ask = SuspendAsk(self._eval_asks)
        done, values = self._evals[ask] = (trio.Event(), [])
        try:
            await self.perform(self.processes.suspend(ask))
            with trio.move_on_after(SUSPEND_WAIT + _EVAL_SLACK):
                await done.wait()
        finally:
            del self._evals[ask]
        got = outcome(values)
        record = self.core.record
        text = suspended_text(record.id, waited, got.step)
        why = got.why
        if got.ok:
            try:
                with trio.fail_after(_ASK_RELAY_WITHIN):
                    async with open_control(self.link.endpoint, client="tether-worker") as control:
                        await control.preempt(record.id, grace=0, suspend=True, detail=text)
            except (RelayError, trio.TooSlowError, OSError) as exc:
                why = f"the relay did not suspend it ({exc})"
        if why:
            self._suspending = False
            text = cannot_text(record.id, why, record.spec.unattended_fallback)
            await self.perform(self.processes.suspend_outcome(False, text))
            return
        # the relay's preempt order (grace 0) comes back on the link and ends the program, so the
        # attempt ends ``preempted`` and the run ``suspended``
        await self.perform(self.processes.suspend_outcome(True, text))

    def raise_failure(self) -> None:
        """The replay failed: the attempt could not start (``start_failed``)."""
        if self.failure is None:
            return
        if self.failure.timed_out:
            raise trio.TooSlowError(self.failure.detail)
        raise RuntimeError(self.failure.detail)

    async def _send(self, key: str, message: dict[str, Any]) -> None:
        stream = self.streams.get(key)
        if stream is None:
            return  # that process's connection is gone: its pump said so
        async with self._send_locks.setdefault(key, trio.Lock()):
            try:
                await stream.send_all(dap_framing.encode_message(message))
            except (trio.BrokenResourceError, trio.ClosedResourceError):
                pass  # debugpy is gone: the pump sees it too

    async def close_streams(self) -> None:
        """Close every debugpy connection still open (a child announced as the run ended may
        have had no pump to run)."""
        streams, self.streams = list(self.streams.values()), {}
        for stream in streams:
            await stream.aclose()

    async def _open_child(self, key: str) -> None:
        """A new connection to debugpy's adapter for a child process (the "one connection" rule
        is the main session's), read by a pump of its own."""
        try:
            stream = await self.debuggee.connect_child()
        except OSError as exc:
            log.warning("cannot connect to debugpy for process %s: %s", key, exc)
            await self.perform(self.processes.closed(key))
            return
        self.streams[key] = stream
        self.nursery.start_soon(self.pump, key, stream)

    async def pump(self, key: str, stream: trio.SocketStream) -> None:
        """Read debugpy's messages on ``key``'s connection until it is closed."""
        framer = dap_framing.DapFramer()
        try:
            while data := await stream.receive_some(RECEIVE_SIZE):
                framer.receive_data(data)
                while (raw := framer.next_raw()) is not None:
                    answered = self.link.answered
                    await self.perform(self.processes.on_debugpy_message(key, raw, answered))
        except (trio.BrokenResourceError, trio.ClosedResourceError):
            pass
        except dap_framing.DapFramingError as exc:
            log.error("debugpy sent bad DAP data on %r: %s", key or "main", exc)
        finally:
            if key != self.core.key:
                if self.streams.get(key) is stream:
                    del self.streams[key]
                with trio.CancelScope(shield=True):
                    await stream.aclose()
        if stream in self._retired:  # its session ended already: the key is another's now
            self._retired.discard(stream)
            return
        await self.perform(self.processes.closed(key))

    async def flush_output_when_answered(self) -> None:
        """Send held output as soon as the relay answered the output entry before it."""
        while True:
            await self._output_held.wait()
            self._output_held = trio.Event()
            await self.link.wait_answered(self.core.output_in_flight)
            await self.perform(self.core.flush_output())

    async def deliveries(self, backlog: Sequence[wire.Deliver] = ()) -> None:
        """Hand the run's ``to_worker`` entries to the sessions: ``backlog`` (what was taken
        off the link before, by a plain run's watch), then the link's."""
        for delivery in backlog:
            await self.perform(self.processes.on_delivery(delivery))
        async for delivery in self.link.deliveries:
            if self.output.metrics is not None:
                self.output.metrics.control(control_action(delivery, self.link.attempt))
                self.output.metrics.deliver(delivery)
            await self.perform(self.processes.on_delivery(delivery))

    async def timer(self) -> None:
        while True:
            deadline = self._timer_at = self.processes.next_deadline
            self._wake_timer = trio.Event()
            with trio.move_on_at(deadline if deadline is not None else float("inf")):
                await self._wake_timer.wait()
            if deadline is not None and trio.current_time() >= deadline:
                await self.perform(self.processes.on_tick())

    async def end_run(self) -> None:
        await self.perform(self.processes.end_run())

    async def stop_on_terminate(self) -> None:
        await self._terminate.wait()
        await self.debuggee.terminate()


@asynccontextmanager
async def open_driver(
    processes: DebuggedProcesses,
    stream: trio.SocketStream,
    link: RunLink,
    output: ProgramOutput,
    debuggee: Debuggee,
    say: Callable[[str], None],
    tunnels: Tunnels | None = None,
) -> AsyncIterator[Driver]:
    """A :class:`Driver` with its tasks running in :attr:`Driver.nursery` (the block's own may
    join them): the main connection's pump, the held output's flush, the timer, the wait for
    ``terminate``. A failed replay cancels the block (:meth:`Driver.raise_failure` after it says
    why). When the block ends its tasks are cancelled; then every debugpy connection still open
    is closed (shielded)."""
    driver: Driver | None = None
    try:
        async with trio.open_nursery() as nursery:
            driver = Driver(processes, stream, link, output, debuggee, say, nursery, tunnels)
            if output.metrics is not None:  # a preempt's grace ends the run as a terminate does
                output.metrics.preemption.terminate = driver.end_run
            if tunnels is not None:
                tunnels.evaluate = driver.evaluate  # ``tether eval``: while the sessions run
            nursery.start_soon(driver.pump, processes.main.key, stream)
            nursery.start_soon(driver.flush_output_when_answered)
            nursery.start_soon(driver.timer)
            nursery.start_soon(driver.stop_on_terminate)
            yield driver
            nursery.cancel_scope.cancel()
    finally:
        if tunnels is not None:
            tunnels.evaluate = None
        with trio.CancelScope(shield=True):
            if driver is not None:
                await driver.close_streams()
            else:
                await stream.aclose()
