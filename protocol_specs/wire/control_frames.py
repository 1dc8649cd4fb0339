"""The control RPC of the relay wire protocol: request and answer frames, correlated by ``rid``.

A ``control`` connection (the CLI, the worker pool, scheduler backends) sends one of the requests
below with a fresh ``rid``; the relay answers with the frame named in the request's docstring (or
:class:`~protocol_specs.wire.wire.Error` with the same ``rid``). Requests: upload snapshot blobs
(:class:`HaveBlobs`, :class:`PutBlob`, :class:`GetBlob`), submit and rerun runs, list, get and
cancel them, claim or dispatch the next queued run, report a scheduler's view of an attempt, mint,
list and revoke tokens, read a run's audit trail.

Import these through :mod:`protocol_specs.wire.wire`, which re-exports them.
"""

from __future__ import annotations

from enum import StrEnum
from typing import Literal

from pydantic import BaseModel, Field, field_validator, model_validator

from ..access.audit import AuditEntry
from ..access.auth import Scope, TokenInfo
from ..runs.runs import RunRecord
from ..runs.spec import RunSpec
from ..snapshots.snapshots import BLOB_CHUNK, Digest, Manifest, check_digest
from .base import FROZEN, FrameType
from .file_frames import (
    Checkpoints,
    CheckpointStored,
    GetCheckpoints,
    GetOutputs,
    Outputs,
    OutputsStored,
    Preempt,
    PutCheckpoint,
    PutOutputs,
    Resume,
)
from .sweep_frames import (
    CancelSweep,
    ClaimPause,
    GetSweep,
    ListSweeps,
    PauseClaimed,
    SubmitSweep,
    SweepInfo,
    SweepList,
)
from .tunnel_open import KEY_PATTERN
from .tunnels import TunnelSpec

__all__ = [
    "AnyControlFrame",
    "Assigned",
    "AuditLog",
    "BlobData",
    "Cancel",
    "Claim",
    "Confirm",
    "CreateToken",
    "Dispatch",
    "GetAudit",
    "GetBlob",
    "GetRun",
    "HaveBlobs",
    "ListRuns",
    "ListTokens",
    "Missing",
    "OpenTunnel",
    "PutBlob",
    "Report",
    "ReportEvent",
    "Rerun",
    "RevokeToken",
    "RunInfo",
    "RunList",
    "Stored",
    "Submit",
    "TokenCreated",
    "TokenList",
    "TunnelOpened",
    "WebCode",
    "WebLogin",
]


class ReportEvent(StrEnum):
    """What a scheduler backend's :class:`Report` says about an attempt."""

    JOB = "job"  #: the scheduler accepted the attempt's job
    RUNNING = "running"  #: the attempt's job runs: its ticket may claim the attempt from now on
    LOST = "lost"  #: the job ended, was cancelled or preempted without the attempt finishing


class Submit(BaseModel):
    """Queue a run of ``spec`` on the snapshot ``manifest``, or on the one the root tree ``tree``
    names (``protocol_specs/snapshots/trees.py``; ``manifest`` empty then). The relay must hold its blobs
    and trees."""

    model_config = FROZEN
    t: Literal[FrameType.SUBMIT] = FrameType.SUBMIT
    rid: int
    spec: RunSpec
    manifest: Manifest = Field(default_factory=Manifest)
    tree: str = ""
    #: the submitter's name for this request, sent again with every retry: the same run is
    #: answered, never a second one made (``protocol_specs/runs/submits.py``; empty: a run of its own)
    key: str = Field(default="", pattern=KEY_PATTERN)

    @field_validator("tree")
    @classmethod
    def _tree(cls, value: str) -> str:
        return check_digest(value) if value else value

    @model_validator(mode="after")
    def _one_snapshot(self) -> Submit:
        if self.tree and self.manifest.entries:
            raise ValueError("a submit names its snapshot by a manifest or by a tree, not both")
        return self


class Rerun(BaseModel):
    """Queue a new run with the spec and snapshot of ``run`` (reproduction)."""

    model_config = FROZEN
    t: Literal[FrameType.RERUN] = FrameType.RERUN
    rid: int
    run: str


class HaveBlobs(BaseModel):
    """Which of ``digests`` does the relay lack? Answered by :class:`Missing`."""

    model_config = FROZEN
    t: Literal[FrameType.HAVE_BLOBS] = FrameType.HAVE_BLOBS
    rid: int
    digests: list[Digest] = Field(max_length=10_000)


class Missing(BaseModel):
    model_config = FROZEN
    t: Literal[FrameType.MISSING] = FrameType.MISSING
    rid: int
    digests: list[str]


class PutBlob(BaseModel):
    """One piece of a blob of ``size`` bytes, at ``offset`` (pieces in order, from 0).

    The relay checks the digest when the last piece arrives and answers :class:`Stored`.
    """

    model_config = FROZEN
    t: Literal[FrameType.PUT_BLOB] = FrameType.PUT_BLOB
    rid: int
    digest: Digest
    size: int = Field(ge=0)
    offset: int = Field(ge=0)
    data: bytes = Field(max_length=BLOB_CHUNK)


class Stored(BaseModel):
    """``received`` bytes of the blob are held; ``complete`` once all of it was checked."""

    model_config = FROZEN
    t: Literal[FrameType.STORED] = FrameType.STORED
    rid: int
    received: int
    complete: bool = False


class GetBlob(BaseModel):
    model_config = FROZEN
    t: Literal[FrameType.GET_BLOB] = FrameType.GET_BLOB
    rid: int
    digest: Digest
    offset: int = Field(default=0, ge=0)
    length: int = Field(default=BLOB_CHUNK, ge=1, le=BLOB_CHUNK)
    #: a user reads a blob that this run of theirs names in its checkpoints or outputs
    run: str = ""


class BlobData(BaseModel):
    model_config = FROZEN
    t: Literal[FrameType.BLOB] = FrameType.BLOB
    rid: int
    size: int
    offset: int
    data: bytes


class ListRuns(BaseModel):
    model_config = FROZEN
    t: Literal[FrameType.LIST_RUNS] = FrameType.LIST_RUNS
    rid: int
    limit: int = Field(default=50, ge=1, le=1000)


class RunList(BaseModel):
    model_config = FROZEN
    t: Literal[FrameType.RUNS] = FrameType.RUNS
    rid: int
    runs: list[RunRecord]


class Report(BaseModel):
    """A scheduler backend's news about an attempt it launched.

    ``job``: the scheduler accepted it (``job`` is its id); ``running``: that job runs (a ticket
    claims only then); ``lost``: the job ended, was cancelled or preempted without the worker
    finishing the attempt (retried like a lost lease).
    """

    model_config = FROZEN
    t: Literal[FrameType.REPORT] = FrameType.REPORT
    rid: int
    run: str
    attempt: int = Field(ge=1)
    event: ReportEvent
    job: str = Field(default="", max_length=200)
    detail: str = Field(default="", max_length=2000)


class Cancel(BaseModel):
    model_config = FROZEN
    t: Literal[FrameType.CANCEL] = FrameType.CANCEL
    rid: int
    run: str
    detail: str = "cancelled by the user"


class GetRun(BaseModel):
    model_config = FROZEN
    t: Literal[FrameType.GET_RUN] = FrameType.GET_RUN
    rid: int
    run: str


class Claim(BaseModel):
    """Block until a queued run of ``backend`` is available, then take it.

    With ``run``: take that run (a worker a scheduler started for it), if it is queued for
    ``attempt``. With ``node`` >= 1 as well: *join* node ``node`` of that attempt of a multi-node
    run (``protocol_specs/runs/nodes.py``), which node 0 claimed: nothing is claimed, and the
    answer is the same :class:`Assigned` (token ``""``); ``job_not_running`` while node 0 has
    not claimed it yet (ask again).
    """

    model_config = FROZEN
    t: Literal[FrameType.CLAIM] = FrameType.CLAIM
    rid: int
    worker: str
    backend: str = "local"
    run: str = ""
    attempt: int = 0
    node: int = Field(default=0, ge=0, le=63)


class Confirm(BaseModel):
    """A worker holds a claim's answer (``protocol_specs/runs/claims.py``): the claim ``claim`` (the
    claimed attempt's ``claim``, as the answer's record says) counts. Answered with
    :class:`RunInfo`; ``stale_attempt`` if it went back to the queue meanwhile (not confirmed in
    time): the worker then drops the run. Said again, it is answered the same."""

    model_config = FROZEN
    t: Literal[FrameType.CONFIRM] = FrameType.CONFIRM
    rid: int
    run: str
    attempt: int = Field(ge=1)
    claim: str = Field(min_length=1, max_length=64)


class Dispatch(BaseModel):
    """A scheduler backend: block until a run is queued for ``backend``, then hand it over (the
    run stays ``queued`` until the worker its job starts claims it, naming its attempt)."""

    model_config = FROZEN
    t: Literal[FrameType.DISPATCH] = FrameType.DISPATCH
    rid: int
    backend: str
    dispatcher: str
    #: answer with a ticket (``ttht_``: good only to claim the attempt) instead of a worker token,
    #: for schedulers that show what a job carries to everyone who can list jobs (Ray)
    ticket: bool = False


class RunInfo(BaseModel):
    model_config = FROZEN
    t: Literal[FrameType.RUN] = FrameType.RUN
    rid: int
    run: RunRecord


class Assigned(BaseModel):
    """A run's attempt handed to a worker (``claim``) or a scheduler backend (``dispatch``), with
    the worker token minted for it ("" when the claimer already holds that attempt's token)."""

    model_config = FROZEN
    t: Literal[FrameType.ASSIGNED] = FrameType.ASSIGNED
    rid: int
    run: RunRecord
    manifest: Manifest = Field(default_factory=Manifest)
    token: str = ""


class CreateToken(BaseModel):
    """A new user token; ``user`` other than one's own, or ``admin``/``backend`` scopes need an
    admin token. ``expires_in`` seconds (0: never)."""

    model_config = FROZEN
    t: Literal[FrameType.CREATE_TOKEN] = FrameType.CREATE_TOKEN
    rid: int
    user: str = Field(default="", max_length=64)
    scopes: list[Scope] = Field(default_factory=lambda: [Scope.RUNS], max_length=3)
    label: str = Field(default="", max_length=200)
    expires_in: float = Field(default=0.0, ge=0)


class TokenCreated(BaseModel):
    """The new token: the only time the relay ever sends one."""

    model_config = FROZEN
    t: Literal[FrameType.TOKEN_CREATED] = FrameType.TOKEN_CREATED
    rid: int
    token: str
    info: TokenInfo


class WebLogin(BaseModel):
    """A one-time code that opens a web view session as the caller (``tether ui``): good once,
    for ``protocol_specs.web.web.CODE_TTL`` s."""

    model_config = FROZEN
    t: Literal[FrameType.WEB_LOGIN] = FrameType.WEB_LOGIN
    rid: int


class WebCode(BaseModel):
    """The code, and the relay's address as browsers reach it if its operator set one
    (``public_url``; else the client's own relay URL is the web view's, over HTTP)."""

    model_config = FROZEN
    t: Literal[FrameType.WEB_CODE] = FrameType.WEB_CODE
    rid: int
    code: str
    expires_in: float
    base: str = ""


class ListTokens(BaseModel):
    """One's own tokens (admins: everyone's, or ``user``'s)."""

    model_config = FROZEN
    t: Literal[FrameType.LIST_TOKENS] = FrameType.LIST_TOKENS
    rid: int
    user: str = Field(default="", max_length=64)


class TokenList(BaseModel):
    model_config = FROZEN
    t: Literal[FrameType.TOKENS] = FrameType.TOKENS
    rid: int
    tokens: list[TokenInfo]


class RevokeToken(BaseModel):
    model_config = FROZEN
    t: Literal[FrameType.REVOKE_TOKEN] = FrameType.REVOKE_TOKEN
    rid: int
    id: str = Field(max_length=64)


class GetAudit(BaseModel):
    model_config = FROZEN
    t: Literal[FrameType.GET_AUDIT] = FrameType.GET_AUDIT
    rid: int
    run: str


class AuditLog(BaseModel):
    model_config = FROZEN
    t: Literal[FrameType.AUDIT] = FrameType.AUDIT
    rid: int
    run: str
    entries: list[AuditEntry]


class OpenTunnel(BaseModel):
    """Open a tunnel into ``run``'s worker (``protocol_specs/wire/tunnels.py``); answered
    :class:`TunnelOpened`. The relay checks the run is the caller's and has a worker now.
    ``key``: the request's name, chosen by the asker and sent again with every retry: a retry
    finds the tunnel the first request opened instead of opening another
    (``protocol_specs/wire/tunnel_open.py``); empty: the relay names the tunnel (never retry then)."""

    model_config = FROZEN
    t: Literal[FrameType.OPEN_TUNNEL] = FrameType.OPEN_TUNNEL
    rid: int
    run: str
    spec: TunnelSpec
    key: str = Field(default="", pattern=KEY_PATTERN)


class TunnelOpened(BaseModel):
    """``tunnel``: the tunnel's id, for the ``tunnel`` connection's ``hello``; ``run``: the run's
    full id (the request may have named it by a prefix or its name)."""

    model_config = FROZEN
    t: Literal[FrameType.TUNNEL] = FrameType.TUNNEL
    rid: int
    run: str
    tunnel: str


AnyControlFrame = (
    Submit
    | Rerun
    | HaveBlobs
    | Missing
    | PutBlob
    | Stored
    | GetBlob
    | BlobData
    | ListRuns
    | RunList
    | Report
    | Cancel
    | GetRun
    | Claim
    | Confirm
    | Dispatch
    | RunInfo
    | Assigned
    | CreateToken
    | TokenCreated
    | ListTokens
    | TokenList
    | RevokeToken
    | GetAudit
    | AuditLog
    | OpenTunnel
    | TunnelOpened
    | WebLogin
    | WebCode
    | SubmitSweep
    | GetSweep
    | CancelSweep
    | ListSweeps
    | SweepInfo
    | SweepList
    | ClaimPause
    | PauseClaimed
    | PutCheckpoint
    | CheckpointStored
    | GetCheckpoints
    | Checkpoints
    | PutOutputs
    | OutputsStored
    | GetOutputs
    | Outputs
    | Preempt
    | Resume
)
