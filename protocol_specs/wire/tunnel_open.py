"""Opening a tunnel exactly once, across lost answers and relay restarts.

Theory of operation
-------------------
``open_tunnel`` starts a command, a shell or a forwarded connection on the worker
(``protocol_specs/wire/tunnels.py``). Its answer can be lost: the link is cut, or the relay is killed,
after the relay recorded the tunnel and before the answer arrived. The user's side cannot tell
that from a request that never arrived, so it asks again; asking again must find the first
tunnel and never start a second command, and the user must never hear "failed" about a command
that runs.

- *Named by the asker.* Each request carries a ``key`` the user's side chose at random
  (:func:`new_key`, 128 bits) and sends unchanged with every retry. The relay names the tunnel
  after the caller, the key and the spec (:func:`tunnel_id`): a retry of the same request names
  the same tunnel; another user's request, or another command, never does.
- *Idempotent steps, in order.* The relay notes the tunnel in the run's audit trail, adds it to
  the attempt's set of tunnels if it is not there (what the tunnel's links are checked against),
  appends the worker's ``control`` entry at most once (``append_once`` as the tunnel's own
  producer, number 1), then answers. A relay that dies between two steps leaves what the retry
  completes; nothing is stored twice (only the audit trail may name the tunnel twice, with the
  same id, when a relay died right after noting it).
- *The verdict* (:func:`open_verdict`) looks for the tunnel before anything else: one the current
  attempt knows is answered again (while it is open its steps are done again, storing nothing
  new), whatever the run's state now, so a retry after the command, or the run, ended still
  reads its output and exit code from the tunnel's streams (kept ``LINGER`` s after its exit);
  one only an earlier attempt knew is refused, saying it may have run there; only a tunnel nobody
  knows meets the usual checks (a worker runs the run, fewer than ``MAX_TUNNELS`` are open) and is
  created.
- *The user's side* (:class:`TunnelOpening`) asks on a control connection. A refusal that answers
  the request is final: the relay looked, and started nothing (:class:`DidNotRun`). A relay not
  reached before the request went out: the command did not run either, said at once. A
  connection lost after the request went out (or one the relay turns away for a while: too many
  connections): ask again, after a backoff, until ``give_up_after`` seconds passed since the
  loss; only then, or when a relay refuses the connection for good, :class:`MayHaveRun`, the one
  outcome that cannot say (``tether audit RUN`` lists what the relay started). Once answered,
  the tunnel's links resume from their cursors across later cuts (``relay/client/link.py``): the
  command's output and exit code arrive whole.
"""

from __future__ import annotations

import enum
import hashlib
import random
import secrets
from collections.abc import Callable
from dataclasses import dataclass

from ..runs.runs import RunRecord, RunState
from .base import ErrorCode
from .tunnels import MAX_TUNNELS, TunnelSpec

__all__ = [
    "KEY_PATTERN",
    "Answer",
    "Create",
    "DidNotRun",
    "Known",
    "MayHaveRun",
    "Refuse",
    "Retry",
    "Step",
    "TunnelOpening",
    "Verdict",
    "new_key",
    "open_verdict",
    "tunnel_id",
]

#: what a request's key looks like (``OpenTunnel.key``; empty: the relay names the tunnel, and a
#: retry would open another)
KEY_PATTERN = r"^([0-9a-f]{16,64})?$"

#: the states in which a worker runs the run's program (a tunnel has somewhere to go)
_LIVE = (RunState.RUNNING, RunState.PAUSED)


def new_key() -> str:
    """A request's key: 128 random bits, as hex."""
    return secrets.token_hex(16)


def tunnel_id(user: str, key: str, spec: TunnelSpec) -> str:
    """The id of the tunnel ``user``'s request ``key`` for ``spec`` opens (the same for every
    retry of that request; 96 bits of a digest)."""
    named = "\0".join((user, key, spec.model_dump_json()))
    return hashlib.sha256(named.encode()).hexdigest()[:24]


# --- the relay's verdict ----------------------------------------------------------------------


class Known(enum.Enum):
    """What the current attempt's set of tunnels says of the tunnel asked for."""

    NO = "no"
    OPEN = "open"
    CLOSED = "closed"  #: its worker wrote its ``exit``


@dataclass(frozen=True)
class Answer:
    """The tunnel exists: answer with its id; ``complete``: it is open, so do its steps again
    (a relay may have died before the last of them; they store nothing twice)."""

    complete: bool


@dataclass(frozen=True)
class Create:
    """Nobody knows the tunnel, and the run may have it: note it, store it, tell the worker,
    answer."""


@dataclass(frozen=True)
class Refuse:
    """Answer ``open_tunnel`` with this error (nothing is stored)."""

    code: ErrorCode
    message: str


Verdict = Answer | Create | Refuse


def open_verdict(
    record: RunRecord,
    *,
    known: Known,
    earlier: int = 0,
    held: bool = False,
    open_now: int = 0,
    node: int = 0,
) -> Verdict:
    """What the relay does with an ``open_tunnel`` for ``record`` (the caller may: checked
    before). ``known``: the tunnel in the current attempt's set; ``earlier``: the earlier attempt
    whose set has it (0: none); ``held``: a worker keeps the ended run's directory; ``open_now``:
    the attempt's tunnels still open; ``node``: the node whose worker is to serve it."""
    if known is not Known.NO:
        return Answer(complete=known is Known.OPEN)
    nodes = record.spec.resources.nodes
    if node >= nodes:
        return Refuse(
            ErrorCode.BAD_SPEC,
            f"run {record.id} has no node {node}: it runs on "
            + (f"nodes 0-{nodes - 1}" if nodes > 1 else "one node (node 0)"),
        )
    if earlier:
        return Refuse(
            ErrorCode.NO_SUCH_TUNNEL,
            f"this request reached attempt {earlier} of run {record.id}, which ended since "
            "(and its commands with it)",
        )
    if record.finished and node:
        return Refuse(
            ErrorCode.RUN_FINISHED,
            f"run {record.id} has ended ({record.state.value}): node {node}'s worker ended with "
            "it (node 0's may keep its directory: without --node)",
        )
    if record.finished and not held:
        return Refuse(
            ErrorCode.RUN_FINISHED,
            f"run {record.id} has ended ({record.state.value}) and no worker keeps its "
            "directory any more (a pool keeps its newest runs'; a scheduler's job ends "
            "with its run)",
        )
    if record.state not in _LIVE and not record.finished:
        return Refuse(
            ErrorCode.NOT_ALLOWED,
            f"run {record.id} is {record.state.value}: nothing runs it yet; a tunnel goes to "
            "the worker that runs it (see tether ls)",
        )
    if open_now >= MAX_TUNNELS:
        return Refuse(
            ErrorCode.TOO_MANY_CONNECTIONS,
            f"run {record.id} has {MAX_TUNNELS} tunnels open, the most it may; end one first",
        )
    return Create()


# --- the user's side --------------------------------------------------------------------------


@dataclass(frozen=True)
class Retry:
    """Ask again (on a new connection, with the same key) after ``delay`` seconds."""

    delay: float


@dataclass(frozen=True)
class DidNotRun:
    """The relay started nothing for this request (``why``: what it said, or why it was never
    reached)."""

    why: str


@dataclass(frozen=True)
class MayHaveRun:
    """The request went out and no relay could be asked again: it may or may not have started."""

    why: str


Step = Retry | DidNotRun | MayHaveRun

#: codes a relay's handshake (or the lack of one) gives for a while: asking again may get through
_PASSING = frozenset(
    {
        ErrorCode.UNREACHABLE,
        ErrorCode.TOO_MANY_CONNECTIONS,
        ErrorCode.TOO_MANY_FAILURES,
        ErrorCode.INTERNAL,
    }
)


class TunnelOpening:
    """The user's side of one ``open_tunnel`` request, across the connections it takes.

    The driver calls :meth:`asking` on a welcomed control connection just before it sends the
    request (with :attr:`key`), and :meth:`failed` with every error that ended a try: ``answered``
    when the relay answered the request itself with it. The answer :meth:`failed` returns says
    whether to ask again, and when.
    """

    def __init__(
        self,
        *,
        key: str | None = None,
        give_up_after: float = 120.0,
        backoff_initial: float = 0.1,
        backoff_max: float = 2.0,
        jitter: Callable[[float], float] = lambda bound: random.uniform(0, bound),
    ) -> None:
        self.key = key or new_key()
        self.give_up_after = give_up_after
        self.backoff_initial = backoff_initial
        self.backoff_max = backoff_max
        self._jitter = jitter
        #: a request went out on a welcomed connection: the relay may have acted on it
        self.asked = False
        #: when the first try after the request went out failed (the retries' clock)
        self.lost_at: float | None = None
        self.retries = 0

    def __repr__(self) -> str:
        state = "asked" if self.asked else "not asked"
        return f"<TunnelOpening {self.key[:8]} {state} retries={self.retries}>"

    def asking(self) -> None:
        """The request goes out now on a welcomed connection."""
        self.asked = True

    def failed(self, code: ErrorCode, message: str, now: float, *, answered: bool) -> Step:
        """A try ended with ``code``: what to do next."""
        if answered and code is not ErrorCode.INTERNAL:  # internal: it lost its store mid-way
            if code is ErrorCode.NO_SUCH_TUNNEL:  # the request reached an attempt that ended
                return MayHaveRun(message)
            return DidNotRun(message)  # the relay looked, and started nothing
        if not self.asked:
            return DidNotRun(message)  # nothing was asked of any relay
        if code not in _PASSING:  # turned away for good (the token was revoked, say)
            return MayHaveRun(message)
        if self.lost_at is None:
            self.lost_at = now
        if now - self.lost_at >= self.give_up_after:
            return MayHaveRun(f"no relay for {self.give_up_after:g} s: {message}")
        bound = min(self.backoff_max, self.backoff_initial * 2**self.retries)
        self.retries += 1
        return Retry(self._jitter(bound))
