"""What a relay operator tunes (``tether relay`` options map onto it)."""

from __future__ import annotations

from dataclasses import dataclass, field

from .store import Cap

__all__ = ["SERVER_NAME", "RelayConfig"]

SERVER_NAME = "tether-relay/1"

#: the longest a worker waits between two heartbeats (its lease is renewed by each)
MAX_HEARTBEAT = 10.0


@dataclass(frozen=True)
class RelayConfig:
    """What an operator tunes; the defaults suit a relay on the open internet."""

    #: most entries / bytes one of a run's streams may hold before publishes are refused
    buffer_cap: Cap = field(default_factory=lambda: Cap(entries=100_000, bytes=256 * 1024 * 1024))
    #: a worker that does not renew its lease (heartbeats) for this long loses its run
    lease: float = 90.0
    #: a claim whose worker has not confirmed it holds the answer this long after it was made goes
    #: back to the queue at the same attempt (``protocol_specs/runs/claims.py``: its answer was lost)
    claim_confirm: float = 15.0
    #: how long a finished run's keys stay in Redis
    retention: float = 7 * 24 * 3600.0
    #: a silent peer is probed after ``ping_interval`` and disconnected once it left
    #: ``ping_timeout`` of probes unanswered (TCP keepalive: ``server.keep_alive``)
    ping_interval: float = 15.0
    ping_timeout: float = 15.0
    #: a run's logs stream keeps about this many output chunks (each at most 16 KiB), oldest dropped
    log_entries: int = 20_000
    #: a run's metrics stream keeps about this many entries (each the points of at most a second,
    #: up to 1000: ``protocol_specs/runs/metrics.py``), oldest dropped
    metric_entries: int = 10_000
    #: IDE, worker and logs connections one user may have open to one relay process at once
    max_connections: int = 64
    #: control connections (the CLI, worker pools) one user may have open to one relay process
    #: at once, counted apart so that idle IDE links never lock the user's ``tether ls`` out
    max_control_connections: int = 64
    #: connections one worker token may have open at once
    max_worker_connections: int = 8
    #: runs one user may have queued or running at once
    max_active_runs: int = 1000
    #: sweeps one user may have unfinished at once (each drives up to its ``parallel`` runs)
    max_active_sweeps: int = 20
    #: failed authentications from one address: the first ``auth_free`` in a minute are refused
    #: after ``auth_delay`` s, each further one after twice as long as the last (up to 10 s)
    auth_free: int = 5
    auth_delay: float = 0.2
    #: entries kept in a run's audit stream
    audit_entries: int = 10_000
    #: an open connection's token is looked at again (revoked? expired?) after this many seconds
    recheck: float = 10.0
    #: how often the snapshot blobs no live run names are deleted (0: never); a blob stored or
    #: asked about within ``blob_grace`` is spared (the submit that asked is about to name it)
    blob_gc_interval: float = 24 * 3600.0
    blob_grace: float = 24 * 3600.0
    #: the most bytes one checkpoint (every node's files together) may hold
    checkpoint_limit: int = 20 * 1024**3
    #: serve the web view (``/ui``) on the relay's port
    web: bool = True
    #: the relay's address as browsers reach it (``https://tether.example.com``) when a proxy
    #: stands in front of it: the web view's links and its same-origin check use it
    public_url: str = ""

    @property
    def sweep_interval(self) -> float:
        """How often a relay looks for expired leases and unconfirmed claims."""
        return max(min(self.lease / 6, self.claim_confirm / 3), 0.05)

    @property
    def heartbeat(self) -> float:
        """How often a worker renews its lease: a third of it, at most every
        :data:`MAX_HEARTBEAT` s (so a silent worker shows within seconds in ``tether ls``)."""
        return min(self.lease / 3, MAX_HEARTBEAT)
