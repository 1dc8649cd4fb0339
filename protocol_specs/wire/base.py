"""What every part of the relay wire protocol shares: frame types, error codes, the decode error.

The stream entries (:mod:`protocol_specs.wire.stream_entries`), the link frames (:mod:`protocol_specs.wire.wire`)
and the control-RPC frames (:mod:`protocol_specs.wire.control_frames`) all build on this module, and it on
none of them. Import the protocol through :mod:`protocol_specs.wire.wire`, which re-exports all of it.
"""

from __future__ import annotations

from enum import StrEnum

from pydantic import ConfigDict, ValidationError

from ..plain_words import must_be

__all__ = ["FROZEN", "ErrorCode", "FrameType", "Role", "WireError", "short_reason"]

#: every message of the protocol is immutable, and a field it does not define is an error
FROZEN = ConfigDict(frozen=True, extra="forbid")


class Role(StrEnum):
    """What a peer is: the ``role`` of its ``hello``."""

    IDE = "ide"
    WORKER = "worker"
    CONTROL = "control"
    LOGS = "logs"
    TUNNEL = "tunnel"  #: the user's side of a tunnel (``protocol_specs/wire/tunnels.py``)


class FrameType(StrEnum):
    """The ``t`` key of a frame: which message it is."""

    # the link: handshake, then a run stream's traffic
    HELLO = "hello"
    WELCOME = "welcome"
    PUBLISH = "publish"
    ACK = "ack"
    RECEIVED = "received"
    HEARTBEAT = "heartbeat"
    DELIVER = "deliver"
    COMMIT = "commit"
    ERROR = "error"
    # the control RPC: requests and their answers, correlated by ``rid``
    SUBMIT = "submit"
    RERUN = "rerun"
    HAVE_BLOBS = "have_blobs"
    MISSING = "missing"
    PUT_BLOB = "put_blob"
    STORED = "stored"
    GET_BLOB = "get_blob"
    BLOB = "blob"
    LIST_RUNS = "list_runs"
    RUNS = "runs"
    REPORT = "report"
    CANCEL = "cancel"
    GET_RUN = "get_run"
    CLAIM = "claim"
    DISPATCH = "dispatch"
    CONFIRM = "confirm"
    RUN = "run"
    ASSIGNED = "assigned"
    CREATE_TOKEN = "create_token"
    TOKEN_CREATED = "token_created"
    LIST_TOKENS = "list_tokens"
    TOKENS = "tokens"
    REVOKE_TOKEN = "revoke_token"
    GET_AUDIT = "get_audit"
    AUDIT = "audit"
    OPEN_TUNNEL = "open_tunnel"
    TUNNEL = "tunnel"
    WEB_LOGIN = "web_login"
    WEB_CODE = "web_code"
    SUBMIT_SWEEP = "submit_sweep"
    GET_SWEEP = "get_sweep"
    CANCEL_SWEEP = "cancel_sweep"
    LIST_SWEEPS = "list_sweeps"
    SWEEP = "sweep"
    SWEEPS = "sweeps"
    CLAIM_PAUSE = "claim_pause"
    PAUSE_CLAIMED = "pause_claimed"
    # checkpoints, outputs, preemption (``file_frames.py``)
    PUT_CHECKPOINT = "put_checkpoint"
    CHECKPOINT_STORED = "checkpoint_stored"
    GET_CHECKPOINTS = "get_checkpoints"
    CHECKPOINTS = "checkpoints"
    PUT_OUTPUTS = "put_outputs"
    OUTPUTS_STORED = "outputs_stored"
    GET_OUTPUTS = "get_outputs"
    OUTPUTS = "outputs"
    PREEMPT = "preempt"
    RESUME = "resume"


class ErrorCode(StrEnum):
    """Error codes a relay sends (``fatal`` errors are followed by a close), and the few a client
    gives itself when no relay answered at all (the last three: a relay never sends them)."""

    BAD_FRAME = "bad_frame"  #: not msgpack, or not a known frame, or invalid fields
    BAD_ENTRY = "bad_entry"  #: a published entry is malformed
    UNSUPPORTED_VERSION = "unsupported_version"
    HANDSHAKE_REQUIRED = "handshake_required"
    NOT_ALLOWED = "not_allowed"  #: the frame is not valid for this role
    UNAUTHORIZED = "unauthorized"
    NO_SUCH_RUN = "no_such_run"
    RUN_FINISHED = "run_finished"
    TOO_LARGE = "too_large"
    #: a publish skipped a frame number of its producer (resend from the first unacknowledged)
    OUT_OF_ORDER = "out_of_order"
    #: the run's buffer for this stream is full (entries or bytes not yet read by the other side)
    BUFFER_FULL = "buffer_full"
    #: the worker's lease on the run expired; the run was marked lost
    LEASE_LOST = "lease_lost"
    BAD_SPEC = "bad_spec"
    #: a submit names blobs the relay does not hold (upload them first)
    MISSING_BLOBS = "missing_blobs"
    #: an uploaded blob's bytes do not match its digest
    BAD_BLOB = "bad_blob"
    NO_SUCH_BLOB = "no_such_blob"
    #: a worker of an attempt that is no longer the run's current one
    STALE_ATTEMPT = "stale_attempt"
    #: a ticket's claim before its scheduler backend saw the attempt's job running: ask again
    JOB_NOT_RUNNING = "job_not_running"
    #: the token may not do this: a wrong role or scope, or another run's worker token
    FORBIDDEN = "forbidden"
    #: too many failed authentications from this address lately: answers are slowed down
    TOO_MANY_FAILURES = "too_many_failures"
    #: the user has ``RelayConfig.max_connections`` connections open on this relay already
    TOO_MANY_CONNECTIONS = "too_many_connections"
    #: the user has ``RelayConfig.max_active_runs`` runs not yet finished
    TOO_MANY_RUNS = "too_many_runs"
    NO_SUCH_TOKEN = "no_such_token"
    #: a ``tunnel`` link names no tunnel of the run's current attempt (over, or never opened)
    NO_SUCH_TUNNEL = "no_such_tunnel"
    #: the run is not in a state that allows the request (a resume of a run not suspended)
    WRONG_STATE = "wrong_state"
    INTERNAL = "internal"
    # --- a client's own, never on the wire ---
    #: no relay answering: refused, dropped before the welcome, not a WebSocket, lost meanwhile
    UNREACHABLE = "unreachable"
    #: the TLS handshake with a ``wss://`` relay failed (e.g. its certificate is not trusted)
    TLS = "tls"
    #: the relay's URL is not a WebSocket URL
    BAD_URL = "bad_url"


class WireError(Exception):
    """A frame or entry could not be decoded; ``code`` says what to send back."""

    def __init__(self, code: ErrorCode, message: str) -> None:
        super().__init__(message)
        self.code = code
        self.message = message


def short_reason(exc: ValidationError) -> str:
    """The first few problems pydantic found, on one line (what an error frame says)."""
    parts = []
    for err in exc.errors()[:3]:
        loc = ".".join(str(p) for p in err["loc"])
        parts.append(f"{loc}: {must_be(err)}")  # plain words, not pydantic's
    return "; ".join(parts)
