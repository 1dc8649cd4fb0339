"""What every control handler works with: the connection it answers, the relay's rooms, and the
one way a request is refused (:class:`Refused`, decided by ``protocol_specs/access/permissions.py``)."""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field

import trio

from protocol_specs.access.audit import AuditRole
from protocol_specs.access.auth import Principal
from protocol_specs.access.permissions import Act, authorize
from protocol_specs.runs.runs import RunRecord
from protocol_specs.wire import wire
from protocol_specs.wire.wire import AuditEvent, ErrorCode

from ..auth import TokenStore
from ..config import RelayConfig
from ..gate import Peer
from ..runs.audit import AuditTrail
from ..runs.claims import Claims
from ..runs.queue_wait import explain
from ..runs.registry import Registry
from ..runs.run_names import Ambiguous, named_run
from ..runs.tunnels import Tunnels
from ..snapshots.blobs import BlobStore, Upload
from ..snapshots.trees import CheckedTrees
from ..store import Store
from ..sweeps import Sweeps
from ..web.sessions import WebSessions

__all__ = ["Conn", "Refused", "Rooms", "allow", "run_info"]


@dataclass(eq=False)
class Conn:
    """One control connection, as its handlers see it."""

    peer: Peer
    who: Principal
    token: str = field(default="", repr=False)
    #: what the peer said it is (its ``hello``), for the audit trail
    client: str = ""
    #: when the token was last looked at (a revoked or expired token ends the connection)
    checked: float = field(default_factory=trio.current_time)
    uploads: dict[str, Upload] = field(default_factory=dict)
    #: worker tokens: the digests of their run's snapshot
    digests: frozenset[str] | None = None
    #: worker tokens: the blobs their run's (and its seed's) checkpoints name, as last looked at
    files: frozenset[str] = frozenset()
    #: what to do if the reply being sent never reaches the peer (a claim to release)
    undo: Callable[[], Awaitable[object]] | None = None


class Refused(Exception):
    """A request refused: answered ``error`` with ``code``, and recorded in the audit trail of
    ``run`` when it names one that exists."""

    def __init__(self, code: ErrorCode, message: str, *, run: RunRecord | None = None) -> None:
        super().__init__(message)
        self.code = code
        self.message = message
        #: the run the refused request names, if it exists (its audit trail records it)
        self.run = run


def allow(
    who: Principal,
    act: Act,
    run: RunRecord | None = None,
    *,
    about_run: str = "",
    attempt: int | None = None,
) -> None:
    """Raise :class:`Refused` unless ``who`` may do ``act`` (on ``run``)."""
    refusal = authorize(who, act, run, about_run=about_run, attempt=attempt)
    if refusal is not None:
        raise Refused(ErrorCode(refusal.code), refusal.message, run=run)


@dataclass(eq=False)
class Rooms:
    """The relay's rooms the control handlers read and write, built once by the relay."""

    registry: Registry
    claims: Claims
    blobs: BlobStore
    tokens: TokenStore
    audit: AuditTrail
    config: RelayConfig
    tunnels: Tunnels
    sweeps: Sweeps
    #: the subtrees each user had checked lately: a second submit reads what changed
    checked: CheckedTrees
    sessions: WebSessions

    @property
    def store(self) -> Store:
        return self.registry.store

    async def run(self, who: Principal, act: Act, run_id: str) -> RunRecord:
        """``run_id``'s record if ``who`` may do ``act`` on it (``relay/runs/run_names.py``: an id,
        a prefix or a name); a user cannot tell another's run from none."""
        try:
            record = await named_run(self.registry, who, run_id)
        except Ambiguous as exc:
            raise Refused(ErrorCode.NO_SUCH_RUN, str(exc)) from None
        allow(who, act, record, about_run=run_id or "?")
        if record is None:
            raise Refused(ErrorCode.NO_SUCH_RUN, f"no run {run_id!r} (or not yours)")
        return record

    async def explained(self, runs: list[RunRecord], who: Principal) -> list[RunRecord]:
        """``runs`` as answered to ``who``: a queued one says what holds its pool's slots."""
        viewer = None if who.admin else who.user
        return await explain(self.registry, runs, free=self.claims.waiting, viewer=viewer)

    async def note(self, run_id: str, event: AuditEvent, conn: Conn, *, detail: str = "") -> None:
        """Record ``event`` in ``run_id``'s audit trail, as done on ``conn``."""
        await self.audit.record(
            run_id,
            event,
            conn.who,
            source=conn.peer.source,
            role=AuditRole.CONTROL,
            client=conn.client,
            detail=detail,
        )


def run_info(got: RunRecord | wire.Error, rid: int | None) -> wire.AnyFrame:
    """A run as answered (redacted), or the error in its place, with the request's ``rid``."""
    if isinstance(got, wire.Error):
        return got.model_copy(update={"rid": rid})
    return wire.RunInfo(rid=rid or 0, run=got.redacted())
