"""Every Redis key tether uses, and the data model behind them.

Per-run keys carry the run id in a ``{hash tag}`` so a Redis Cluster keeps all of a run's keys in
one slot: every script names only keys of one run (a stream and the keys :func:`beside` it). The
global keys (queues, leases, indexes, tokens, users) are each used by single-key commands only, so
on a cluster they are spread over the masters by their own names; a stream without a hash tag (a
queue) keeps its companion keys in its slot as ``{<stream>}:meta`` and so on.

=============================  ======  =========================================  ============  ============
key                            type    contents                                   written by    read by
=============================  ======  =========================================  ============  ============
``tether:run:{R}``             hash    ``record``: the RunRecord as JSON, ``v``:  relay         relay
                                       its version (compare-and-set writes)
``tether:run:{R}:manifest``    string  the snapshot's manifest (JSON), for a run   relay         relay (claim)
                                       submitted with one (one named by its root
                                       tree is expanded at claim: ``relay/snapshots/trees.py``)
``tether:run:{R}:checkpoints``  hash   ``value``: the CheckpointBook (JSON,       relay         relay
                                       ``protocol_specs/checkpoints/book.py``):
                                       kept checkpoints, nodes' parts of steps
                                       not yet complete; ``v``: its version
``tether:run:{R}:outputs``     hash    ``value``: the digest of the outputs' file  relay         relay
                                       set blob (merged); ``v``: its version
``tether:run:{R}:to_worker``   stream  IDE -> worker entries (field ``p``; ``o``,  relay (ide)   relay (worker)
                                       ``n``: the publish that wrote it)
``tether:run:{R}:to_ide``      stream  worker -> IDE entries and run status        relay         relay (ide)
``tether:run:{R}:logs``        stream  program output chunks and attempt markers   relay         relay (logs)
``tether:run:{R}:metrics``     stream  the program's metric points (``Metric-      relay         relay (logs,
                                       Entry``), the newest ``metric_entries``                    sweeps)
``tether:run:{R}:<s>:meta``    hash    per producer: last number and its entry id; relay         relay
                                       ``bytes``: payload bytes held in stream <s>
                                       (a queue's: ``{tether:queue:<b>}:meta``;
                                       ``to_worker``'s producer ``tunnel:<T>``:
                                       tunnel <T>'s ``control`` entry, once)
``tether:run:{R}:<s>:transient``  list  ``"<id> <size>"`` of <s>'s transient entries relay         relay (trim)
``tether:run:{R}:<s>:watchers``  set   relay processes delivering <s> (notices)    relay         relay (append)
``tether:run:{R}:tunnel:<T>:up`` stream a tunnel's entries, user -> worker (and        relay         relay
``...:down``                           back), with their ``meta``/``transient``/``watchers`` keys
``tether:run:{R}:tunnels:<a>`` zset    attempt <a>'s tunnels, scored by when they   relay         relay
                                       opened (:data:`CLOSED` once their ``exit`` came)
``tether:appended:<listener>``  pubsub  append notices and ticks for one relay      relay         that relay
``tether:run:{R}:audit``       stream  who attached, submitted, cancelled, was     relay         ``tether audit``
                                       refused (``AuditEntry`` msgpack)
``tether:run:{R}:refused``     hash    per refuser and request: the refusals of    relay         relay (audit)
                                       the window open now that have no entry of
                                       their own (``Repeats`` JSON,
                                       ``protocol_specs/access/audit.py``)
``tether:runs``                zset    run ids scored by submit time               relay         CLI (list)
``tether:user:<u>:runs``       zset    the user's run ids by submit time           relay         CLI (list)
``tether:user:<u>:active``     zset    the user's unfinished runs (the runs cap)   relay         relay
``tether:user:<u>:blobs``      set     digests of blobs the user uploaded (what    relay         relay
                                       ``have_blobs`` and ``submit`` may count)
``tether:token:<id>``          hash    ``record``: TokenRecord JSON (hash, never   relay, CLI    relay
                                       the secret); worker tokens expire           (bootstrap)
``tether:tokens``              zset    user token ids by creation time             relay         token list
``tether:queue:<backend>``     stream  one entry per queued attempt (``p`` = id)   relay         claims
``tether:leases``              zset    ``R#attempt`` of running attempts, scored   relay         relay sweeps
                                       by when their worker's lease expires
                                       (``R#attempt#K``: node K's, of a multi-node
                                       run)
``tether:delayed``             zset    retried run ids scored by when they queue;  relay         relay sweeps
                                       a pool's claimed run until the claim is
                                       confirmed, at its deadline (a backstop)
``tether:submitting``          zset    run ids being submitted, scored by when a   relay         relay sweeps
                                       relay that died meanwhile is taken to have
                                       (the sweep then finishes the submit)
``tether:unconfirmed``         zset    ``R#attempt#claim`` of claims their worker   relay         relay sweeps
                                       has not confirmed yet, scored by their
                                       deadline (``protocol_specs/runs/claims.py``)
``tether:changes``             stream  each run record as written (redacted JSON),  relay         relay (web
                                       the newest 1000: the web view's live pages                 view)
``tether:sweep:{S}``           hash    ``record``: a SweepRecord (JSON), ``v``     relay         relay
``tether:sweep:{S}:trials``    hash    trial number -> Trial (JSON)                relay         relay
``tether:sweep:{S}:manifest``  string  the sweep's snapshot manifest (JSON)        relay         relay
``tether:sweep:{S}:lease``     hash    the relay process driving it, until when   relay         relay
``tether:sweep:{S}:paused``    hash    the trial run that paused on --debug-when  relay         relay
``tether:sweeps``              zset    sweep ids by creation time (``tether:user:  relay         CLI (list)
                                       <u>:sweeps``: a user's)
``tether:sweeps:active``       zset    unfinished sweeps: what relays drive        relay         relay
                                       (``tether:user:<u>:sweeps:active``: a
                                       user's, the sweeps cap); a sweep's keys
                                       expire with the retention once it ended
``tether:web:session:<h>``     hash    ``session``: a web session (user, token id,  relay         relay (web)
                                       CSRF token), ``<h>`` the SHA-256 of its id;
                                       expires with it
``tether:web:code:<h>``        hash    a one-time login code's token id (taken     relay         relay (web)
                                       once); expires after two minutes
=============================  ======  =========================================  ============  ============

Each backend's queue is read through the consumer group :data:`POOL_GROUP`; an entry is acknowledged
when the attempt it queued ends (or, for a scheduler backend, once the scheduler accepted the job). Stream entries are msgpack (``protocol_specs.wire.wire``).
Lifetimes: a run's keys expire ``RelayConfig.retention`` after it finished; transient entries are
deleted as soon as the reading side reported receiving them (``received`` frames).
"""

from __future__ import annotations

__all__ = [
    "ACTIVE_SWEEPS",
    "CHANGES",
    "CLOSED",
    "DELAYED",
    "LEASES",
    "NOTICE_CHANNEL",
    "POOL_GROUP",
    "RUNS",
    "SUBMITTING",
    "SWEEPS",
    "TOKENS",
    "UNCONFIRMED",
    "audit",
    "audit_refusals",
    "beside",
    "checkpoints",
    "hash_tag",
    "held",
    "lease",
    "lease_node",
    "leases",
    "manifest",
    "meta_key",
    "outputs",
    "parse_lease",
    "parse_unconfirmed",
    "queue",
    "record",
    "run_keys",
    "stream",
    "sweep",
    "sweep_keys",
    "sweep_lease",
    "sweep_manifest",
    "sweep_paused",
    "sweep_trials",
    "token",
    "transient_key",
    "tunnel_keys",
    "tunnel_producer",
    "tunnel_stream",
    "tunnels",
    "unconfirmed",
    "user_active",
    "user_active_sweeps",
    "user_blobs",
    "user_runs",
    "user_sweeps",
    "watchers_key",
    "web_code",
    "web_session",
]

POOL_GROUP = "pool"
RUNS = "tether:runs"
LEASES = "tether:leases"
DELAYED = "tether:delayed"
SUBMITTING = "tether:submitting"
UNCONFIRMED = "tether:unconfirmed"
TOKENS = "tether:tokens"
#: every run record as written (redacted), for the web view's live pages; the newest are kept
CHANGES = "tether:changes"
CHANGES_KEPT = 1000


#: sweep ids by creation time; the unfinished ones (what relays drive)
SWEEPS = "tether:sweeps"
ACTIVE_SWEEPS = "tether:sweeps:active"


def sweep(sweep_id: str) -> str:
    """A sweep's record (``record`` field, versioned like a run's)."""
    return f"tether:sweep:{{{sweep_id}}}"


def sweep_trials(sweep_id: str) -> str:
    """A sweep's trials: field ``n`` is trial n (JSON)."""
    return f"tether:sweep:{{{sweep_id}}}:trials"


def sweep_manifest(sweep_id: str) -> str:
    return f"tether:sweep:{{{sweep_id}}}:manifest"


def sweep_lease(sweep_id: str) -> str:
    """Which relay process drives the sweep, until when (``holder`` field, versioned)."""
    return f"tether:sweep:{{{sweep_id}}}:lease"


def sweep_paused(sweep_id: str) -> str:
    """The run of the sweep's trial that paused where ``--debug-when`` was met (``run``)."""
    return f"tether:sweep:{{{sweep_id}}}:paused"


def user_sweeps(user: str) -> str:
    return f"tether:user:{user}:sweeps"


def user_active_sweeps(user: str) -> str:
    """The user's unfinished sweeps (the sweeps cap)."""
    return f"tether:user:{user}:sweeps:active"


def sweep_keys(sweep_id: str) -> list[str]:
    """Every key of one sweep (they expire together when its retention ends)."""
    return [
        sweep(sweep_id),
        sweep_trials(sweep_id),
        sweep_manifest(sweep_id),
        sweep_lease(sweep_id),
        sweep_paused(sweep_id),
    ]


def web_session(hashed: str) -> str:
    return f"tether:web:session:{hashed}"


def web_code(hashed: str) -> str:
    return f"tether:web:code:{hashed}"


def token(token_id: str) -> str:
    return f"tether:token:{token_id}"


def user_runs(user: str) -> str:
    return f"tether:user:{user}:runs"


def user_active(user: str) -> str:
    return f"tether:user:{user}:active"


def user_blobs(user: str) -> str:
    return f"tether:user:{user}:blobs"


def lease(run_id: str, attempt: int, node: int = 0) -> str:
    """A running attempt's member of :data:`LEASES`: its node 0's, or (``R#attempt#K``) node
    ``K``'s of a multi-node run."""
    return f"{run_id}#{attempt}#{node}" if node else f"{run_id}#{attempt}"


def leases(run_id: str, attempt: int, nodes: int) -> list[str]:
    """Every node's member of :data:`LEASES` for an attempt of a run of ``nodes`` nodes."""
    return [lease(run_id, attempt, node) for node in range(max(nodes, 1))]


def parse_lease(member: str) -> tuple[str, int | None]:
    """``(run id, attempt)`` of a :data:`LEASES` member (attempt ``None``: written before leases
    named their attempt; it is the run's current one)."""
    run_id, _, rest = member.partition("#")
    attempt = rest.partition("#")[0]
    return run_id, int(attempt) if attempt.isdigit() else None


def lease_node(member: str) -> int:
    """The node a :data:`LEASES` member is of (0 for node 0 and single-node runs)."""
    node = member.split("#")[2] if member.count("#") >= 2 else ""
    return int(node) if node.isdigit() else 0


def unconfirmed(run_id: str, attempt: int, claim: str) -> str:
    """A claim's member of :data:`UNCONFIRMED`."""
    return f"{run_id}#{attempt}#{claim}"


def parse_unconfirmed(member: str) -> tuple[str, int, str] | None:
    """``(run id, attempt, claim id)`` of an :data:`UNCONFIRMED` member (``None``: malformed)."""
    run_id, _, rest = member.partition("#")
    attempt, _, claim = rest.partition("#")
    return (run_id, int(attempt), claim) if attempt.isdigit() and claim else None


def audit(run_id: str) -> str:
    return f"tether:run:{{{run_id}}}:audit"


def audit_refusals(run_id: str) -> str:
    """The refusals of a run's audit trail being coalesced (``protocol_specs/access/audit.py``)."""
    return f"tether:run:{{{run_id}}}:refused"


def queue(backend: str) -> str:
    return f"tether:queue:{backend}"


def record(run_id: str) -> str:
    return f"tether:run:{{{run_id}}}"


def manifest(run_id: str) -> str:
    return f"tether:run:{{{run_id}}}:manifest"


def checkpoints(run_id: str) -> str:
    """The run's checkpoint book (``relay/runs/checkpoints.py``)."""
    return f"tether:run:{{{run_id}}}:checkpoints"


def outputs(run_id: str) -> str:
    """The digest of the run's outputs' file set (``relay/runs/checkpoints.py``)."""
    return f"tether:run:{{{run_id}}}:outputs"


def stream(run_id: str, name: str) -> str:
    """``name`` is ``to_worker``, ``to_ide`` or ``logs`` (:class:`protocol_specs.wire.wire.StreamName`)."""
    return f"tether:run:{{{run_id}}}:{name}"


def tunnel_stream(run_id: str, tunnel: str, name: str) -> str:
    """A tunnel's stream: ``name`` is ``up`` or ``down`` (``protocol_specs/wire/tunnels.py``)."""
    return f"tether:run:{{{run_id}}}:tunnel:{tunnel}:{name}"


def held(run_id: str) -> str:
    """Set (with a short expiry, renewed) while a worker keeps the run's ended attempt's
    directory and serves its tunnels (a ``worker`` connection's ``after`` link)."""
    return f"tether:run:{{{run_id}}}:held"


def tunnels(run_id: str, attempt: int) -> str:
    """The zset of an attempt's tunnels (member: the tunnel's id)."""
    return f"tether:run:{{{run_id}}}:tunnels:{attempt}"


#: a closed tunnel's score in :func:`tunnels` (open ones score when they opened, far below)
CLOSED = float(2**52)


def tunnel_producer(tunnel: str) -> str:
    """The producer (in ``to_worker``'s ``meta``) whose entry number 1 is the worker's
    ``control`` entry for ``tunnel``: appended once however often its open is retried."""
    return f"tunnel:{tunnel}"


def tunnel_keys(run_id: str, tunnel: str) -> list[str]:
    """Every key of one tunnel (they expire together once it is over)."""
    out = []
    for name in ("up", "down"):
        base = tunnel_stream(run_id, tunnel, name)
        out += [base, meta_key(base), transient_key(base), watchers_key(base), received_key(base)]
    return out


def hash_tag(key: str) -> str | None:
    """The part of ``key`` a Redis Cluster hashes to find its slot, if not the whole key: what
    stands between the first ``{`` and the first ``}`` after it, when that is not empty."""
    start = key.find("{")
    end = key.find("}", start + 1) if start >= 0 else -1
    return key[start + 1 : end] if end > start + 1 else None


def beside(key: str, suffix: str) -> str:
    """A key named after ``key``, in ``key``'s hash slot (so one script may use both on a Redis
    Cluster): ``key:suffix``, or ``{key}:suffix`` for a key without a hash tag (hashed whole)."""
    return f"{key}:{suffix}" if hash_tag(key) is not None else f"{{{key}}}:{suffix}"


def meta_key(stream: str) -> str:
    """The hash :meth:`~relay.store.Store.append_once` keeps a stream's producers and byte count in."""
    return beside(stream, "meta")


def watchers_key(stream: str) -> str:
    """The set of listeners (relay processes) that deliver ``stream`` and want its notices."""
    return beside(stream, "watchers")


def received_key(stream: str) -> str:
    """What each node's worker of a run that spans nodes received of ``stream`` (node -> cursor):
    its transient entries are trimmed to the least of them (``protocol_specs/runs/nodes.py``)."""
    return beside(stream, "received")


def transient_key(stream: str) -> str:
    """The list of a stream's transient entries (``"<id> <size>"``) not yet trimmed."""
    return beside(stream, "transient")


#: a listener's (relay process's) pub/sub channel for append notices is this prefix and its id
NOTICE_CHANNEL = "tether:appended:"


def run_keys(run_id: str) -> list[str]:
    """Every key of one run (they expire together when its retention ends)."""
    out = [record(run_id), manifest(run_id), audit(run_id), audit_refusals(run_id)]
    out += [checkpoints(run_id), outputs(run_id)]
    for name in ("to_worker", "to_ide", "logs", "metrics"):
        base = stream(run_id, name)
        out += [base, meta_key(base), transient_key(base), watchers_key(base), received_key(base)]
    return out
