"""Unattended stops: what the worker does when the program is paused and no IDE is attached.

Theory of operation
-------------------
A paused program holds its GPUs. The worker shim feeds :class:`Attention` two kinds of facts:

- presence, from the run's ``to_worker`` stream (:class:`~protocol_specs.wire.wire.PresenceEntry`): which
  adapters have an IDE attached. Per adapter (``origin``) the entry with the highest ``epoch`` wins;
  at equal epochs a departure wins (the relay writes the departure of a connection with the epoch of
  that connection's last arrival). A departure the relay wrote because the adapter's relay link
  closed (``link_lost``) counts only after :data:`LINK_GRACE` seconds: a network blip or a relay
  restart is over by then, the adapter is back and says so, and nobody is told of an unattended
  stop that never was;
- debugger events from debugpy: ``stopped``, ``continued``, ``thread`` exits.

A debug run's program held before its first line until an IDE configures the debugger (``tether
debug``'s default) is stopped too, for this: :meth:`Attention.on_held` says when it is held, and
its decisions name the thread :data:`HELD` (``Resume(HELD)``: start it without waiting longer).

A stop is *unattended* while some thread is stopped (or the program is held) and no IDE is
attached. When one begins,
:class:`Attention` returns a :class:`Notice` (the shim publishes it; the adapter's terminal, the
desktop and the run's webhook tell the user). Unless the policy is ``wait``, it also sets a
deadline ``timeout`` seconds later; :meth:`Attention.tick` at or after it returns the policy's
action (:class:`Resume`, :class:`Terminate` or :class:`Suspend`). An IDE attaching, or the program resuming, clears the
deadline; the next unattended stop starts a new one.

``suspend`` asks the worker to call the program's ``tether.on_suspend`` function in every paused
process (it saves a checkpoint), then to suspend the run (its slot freed; ``tether resume`` runs
it again from that checkpoint, to the same breakpoints). The worker says how that went:
:meth:`Attention.suspended` (the run is being suspended: nothing more to decide) or
:meth:`Attention.cannot_suspend`, which hands the stop to ``fallback`` (``wait``: nothing more;
``continue``, ``terminate``: at once) and keeps ``fallback`` as the policy for the rest of the
attempt, so a program with nothing to call is never asked again at its next stop.

Sans-I/O: the caller passes the time in and performs the decisions.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from enum import StrEnum
from typing import Any

from ..wire.wire import PresenceEntry

__all__ = [
    "HELD",
    "LINK_GRACE",
    "Attention",
    "Notice",
    "Resume",
    "Suspend",
    "Terminate",
    "UnattendedPolicy",
]

#: how long an adapter whose relay link closed still counts as attached (its link reconnects
#: within seconds; a laptop that went to sleep does not come back in this time)
LINK_GRACE = 30.0
#: the thread id decisions about the program held before its first line name (debugpy's thread
#: ids are positive)
HELD = 0
#: how long a program held for an IDE may wait before the hold is unattended: an IDE that is
#: attaching as the run starts (``tether debug``, F5) is not a person who is gone
HOLD_GRACE = 10.0


class UnattendedPolicy(StrEnum):
    WAIT = "wait"  #: stay paused until an IDE attaches (the GPUs stay allocated)
    CONTINUE = "continue"  #: after the timeout, resume the program (the breakpoint is missed)
    TERMINATE = "terminate"  #: after the timeout, end the run (frees the GPUs)
    #: after the timeout, the program's ``tether.on_suspend`` saves a checkpoint and the run is
    #: suspended (frees the GPUs; ``tether resume`` continues from that checkpoint)
    SUSPEND = "suspend"


@dataclass(frozen=True)
class Notice:
    thread_id: int
    reason: str
    deadline: float | None  #: when the policy acts (None: ``wait``)


@dataclass(frozen=True)
class Resume:
    thread_id: int


@dataclass(frozen=True)
class Terminate:
    detail: str


@dataclass(frozen=True)
class Suspend:
    """Call the program's ``tether.on_suspend`` function in every paused process, then suspend
    the run; tell :meth:`Attention.suspended` or :meth:`Attention.cannot_suspend` how it went."""

    thread_id: int
    waited: float  #: seconds the stop was unattended


Decision = Notice | Resume | Terminate | Suspend


@dataclass
class Attention:
    policy: UnattendedPolicy
    timeout: float
    #: what acts when ``suspend`` cannot (``wait``, ``continue`` or ``terminate``)
    fallback: UnattendedPolicy = UnattendedPolicy.WAIT
    link_grace: float = LINK_GRACE
    #: origin -> (epoch, attached, until when a lost link still counts as attached)
    presence: dict[str, tuple[int, bool, float]] = field(default_factory=dict)
    #: thread id -> the stopped event's body
    stopped: dict[int, dict[str, Any]] = field(default_factory=dict)
    deadline: float | None = None
    #: since when the program is held before its first line, for an IDE's configuration
    held_since: float | None = None
    hold_grace: float = HOLD_GRACE
    #: a :class:`Suspend` was decided and its outcome is not known yet
    suspending: bool = False
    _unattended: bool = False

    def __post_init__(self) -> None:
        if self.fallback is UnattendedPolicy.SUSPEND:
            raise ValueError("the fallback of the suspend policy cannot be suspend")

    def attended(self, now: float) -> bool:
        return any(attached or now < grace for _, attached, grace in self.presence.values())

    @property
    def next_wake(self) -> float | None:
        """When :meth:`tick` has something to decide: the policy's deadline, or the end of a lost
        link's grace while the program is stopped."""
        times = [grace for _, attached, grace in self.presence.values() if not attached and grace]
        if self.held_since is not None and not self._unattended:
            times.append(self.held_since + self.hold_grace)
        if (self.stopped or self.held) and not self._unattended and times:
            ends = min(times)
            return ends if self.deadline is None else min(ends, self.deadline)
        return self.deadline

    def on_presence(self, entry: PresenceEntry, now: float) -> list[Decision]:
        epoch, _, _ = self.presence.get(entry.origin, (-1, False, 0.0))
        if entry.epoch > epoch or (entry.epoch == epoch and not entry.attached):
            grace = now + self.link_grace if entry.link_lost and not entry.attached else 0.0
            self.presence[entry.origin] = (entry.epoch, entry.attached, grace)
        return self._update(now)

    def on_debugger_event(self, msg: dict[str, Any], now: float) -> list[Decision]:
        name = msg.get("event")
        body = msg.get("body") or {}
        tid = body.get("threadId")
        if name == "stopped" and isinstance(tid, int):
            self.stopped[tid] = body
        elif name == "continued":
            if body.get("allThreadsContinued", True):
                self.stopped.clear()
            elif isinstance(tid, int):
                self.stopped.pop(tid, None)
        elif name == "thread" and body.get("reason") == "exited" and isinstance(tid, int):
            self.stopped.pop(tid, None)
        elif name in ("terminated", "exited"):
            self.stopped.clear()
        else:
            return []
        return self._update(now)

    @property
    def held(self) -> bool:
        return self.held_since is not None

    def _held_long(self, now: float) -> bool:
        return self.held_since is not None and now >= self.held_since + self.hold_grace

    def on_held(self, held: bool, now: float) -> list[Decision]:
        """The program is held before its first line for an IDE's configuration, or no more
        (unattended once held :data:`HOLD_GRACE` seconds with no IDE attached)."""
        self.held_since = now if held else None
        return self._update(now)

    def _first(self) -> tuple[int, dict[str, Any]]:
        """The stop a decision is about: the first stopped thread, else the hold."""
        if self.stopped:
            return next(iter(self.stopped.items()))
        return HELD, {"reason": "waiting for an IDE"}

    def tick(self, now: float) -> list[Decision]:
        """A lost link's grace that ended (the stop is unattended now: its notice), and the
        policy's action once the deadline passed (it clears the deadline)."""
        noticed = self._update(now)
        if noticed:
            return noticed
        if self.deadline is None or now < self.deadline or not self._unattended:
            return []
        self.deadline = None
        tid, _ = self._first()
        if self.policy is not UnattendedPolicy.SUSPEND:
            return self._act(self.policy, tid)
        if tid == HELD:  # held before its first line: nothing ran, nothing to save
            return self._act(self.fallback, tid, "--unattended-fallback")
        self.suspending = True
        return [Suspend(tid, self.timeout)]

    def _act(
        self, policy: UnattendedPolicy, tid: int, flag: str = "--on-unattended-stop"
    ) -> list[Decision]:
        if policy is UnattendedPolicy.CONTINUE:
            return [Resume(tid)]
        if policy is UnattendedPolicy.WAIT:
            return []
        what = "paused" if tid != HELD else "waiting for an IDE"
        return [
            Terminate(
                f"the program stayed {what} with no IDE attached for {self.timeout:g} s "
                f"({flag} {policy})"
            )
        ]

    def suspended(self) -> None:
        """The run is being suspended (the program ends with its attempt): nothing more acts."""
        self.suspending = False
        self.deadline = None

    def cannot_suspend(self, now: float) -> list[Decision]:
        """The suspend could not be done: ``fallback`` acts on the stop now (if this one decided
        it and the stop is still unattended), and is the policy from now on."""
        was, self.suspending = self.suspending, False
        if self.policy is UnattendedPolicy.SUSPEND:
            self.policy = self.fallback
        if not was or not self._unattended:
            return []
        tid, _ = self._first()
        return self._act(self.fallback, tid, "--unattended-fallback")

    def _update(self, now: float) -> list[Decision]:
        for origin, (epoch, attached, grace) in list(self.presence.items()):
            if grace and now >= grace:  # that adapter did not come back in time: it is gone
                self.presence[origin] = (epoch, attached, 0.0)
        unattended = (bool(self.stopped) or self._held_long(now)) and not self.attended(now)
        if unattended == self._unattended:
            return []
        self._unattended = unattended
        if not unattended:
            self.deadline = None
            return []
        if self.policy is not UnattendedPolicy.WAIT:
            self.deadline = now + self.timeout
        tid, body = self._first()
        return [Notice(tid, str(body.get("reason", "")), self.deadline)]
