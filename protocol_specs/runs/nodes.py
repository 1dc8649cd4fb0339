"""The nodes of a multi-node run's attempt: who may join it, and what each node's news does to it.

Theory of operation
-------------------
A run that asks for ``nodes`` > 1 (``protocol_specs/runs/resources.py``) is still one run with one
attempt counter. Each attempt has nodes ``0..nodes-1``, one worker each. Node 0's worker claims
the attempt as a single-node run's worker does (``protocol_specs/runs/claims.py``); the claim lists
every node in the attempt's :attr:`~protocol_specs.runs.runs.Attempt.nodes` (node 0 with the
claimer's name, the others ``starting`` with no host yet). The other nodes' workers *join* it
(:func:`join_refusal`, :func:`joined`): a join claims nothing, and waits (``job_not_running``,
asked again) while the attempt is still queued.

The attempt follows torchelastic's rules, decided here and performed by the relay
(``relay/runs/worker_status.py``, ``relay/runs/registry.py``):

- node 0's ``started`` starts the run (``running``); another node's only marks its row;
- a node that exits non-zero ends the attempt at once with its exit code (:func:`exited`:
  ``exit_error``, retried if the spec allows); one that exits 0 is done, and the attempt ends 0
  once every node is;
- a node that could not start, whose worker stopped, or whose lease expired ends the attempt
  (its row ``lost``: :func:`lost`);
- whenever the attempt ends, the relay tells every node's worker to end its program (a
  ``terminate`` control entry), and a retry starts all nodes again.

A run of one node has no rows, and none of this applies to it.
"""

from __future__ import annotations

from typing import Any, NamedTuple

from .runs import Attempt, NodeRow, RunEvent, RunRecord, RunState

__all__ = [
    "Refused",
    "Verdict",
    "exited",
    "join_refusal",
    "joined",
    "link_refusal",
    "lost",
    "lost_detail",
    "multi",
    "node_rows",
    "rendezvous",
    "started",
    "trim_point",
    "with_node",
]

#: states in which an attempt's other nodes may join it
_JOINABLE = frozenset({RunState.STARTING, RunState.RUNNING, RunState.PAUSED})


class Refused(NamedTuple):
    """Why a node may not join: ``code`` is a :class:`protocol_specs.wire.wire.ErrorCode` value."""

    code: str
    message: str


class Verdict(NamedTuple):
    """What a node's exit does: ``record`` with the node's row marked, and the event that ends the
    attempt (``None``: it goes on), with its exit code and detail."""

    record: RunRecord
    event: RunEvent | None
    exit_code: int | None = None
    detail: str = ""


def multi(record: RunRecord) -> bool:
    """Whether the run spans nodes."""
    return record.spec.resources.nodes > 1


def node_rows(nodes: int, worker: str) -> list[NodeRow]:
    """A claimed attempt's rows: node 0 is the claimer's; ``[]`` for one node."""
    if nodes <= 1:
        return []
    return [NodeRow(node=0, host=worker), *(NodeRow(node=k) for k in range(1, nodes))]


def _current(record: RunRecord) -> Attempt | None:
    last = record.attempts[-1] if record.attempts else None
    return last if last is not None and last.n == record.attempt else None


def with_node(record: RunRecord, node: int, **changes: Any) -> RunRecord:
    """``record`` with the current attempt's row of ``node`` changed (no such row: unchanged)."""
    current = _current(record)
    if current is None or not any(row.node == node for row in current.nodes):
        return record
    rows = [row.model_copy(update=changes) if row.node == node else row for row in current.nodes]
    return record.with_attempt(nodes=rows)


def link_refusal(record: RunRecord, node: int) -> str | None:
    """Why a worker link may not say it runs ``node`` of ``record``, or ``None``."""
    nodes = record.spec.resources.nodes
    if node < nodes:
        return None
    return (
        f"run {record.id} runs on {nodes} node{'s' if nodes > 1 else ''} (0..{nodes - 1}): "
        f"there is no node {node}"
    )


def join_refusal(record: RunRecord | None, run_id: str, attempt: int, node: int) -> Refused | None:
    """Why node ``node`` (>= 1) may not join ``run_id``'s attempt ``attempt`` now, or ``None``."""
    if record is None:
        return Refused("no_such_run", f"no run {run_id!r}")
    if (why := link_refusal(record, node)) is not None:
        return Refused("bad_frame", why)
    if record.finished:
        return Refused("run_finished", f"run {run_id} is {record.state.value}")
    if attempt != record.attempt:
        return Refused(
            "stale_attempt",
            f"run {run_id} is at attempt {record.attempt} ({record.state.value}); attempt "
            f"{attempt} is not to be joined",
        )
    if record.state is RunState.QUEUED:
        return Refused("job_not_running", f"node 0 has not claimed attempt {attempt} yet")
    current = _current(record)
    row = next((r for r in current.nodes if r.node == node), None) if current else None
    if record.state not in _JOINABLE or row is None:
        return Refused("stale_attempt", f"run {run_id} attempt {attempt} is not to be joined")
    if row.state in ("exited", "lost"):
        return Refused(
            "stale_attempt", f"node {node} of run {run_id} attempt {attempt} is over ({row.state})"
        )
    return None


def joined(record: RunRecord, node: int, worker: str) -> RunRecord:
    """``record`` with ``worker`` as ``node``'s host (checked by :func:`join_refusal` first);
    ``record`` itself if it is already (a join asked again)."""
    current = _current(record)
    row = next((r for r in current.nodes if r.node == node), None) if current else None
    if row is None or row.host == worker:
        return record
    return with_node(record, node, host=worker)


def started(record: RunRecord, node: int, *, about: int) -> RunRecord:
    """Node ``node``'s program started (``StaleAttempt`` for news of another attempt)."""
    record.check_attempt(RunEvent.START, about)
    return with_node(record, node, state="running")


def exited(record: RunRecord, node: int, exit_code: int | None, *, about: int) -> Verdict:
    """Node ``node``'s program exited with ``exit_code`` (``StaleAttempt`` for another attempt's):
    non-zero ends the attempt; 0 ends it once every node exited 0."""
    event = RunEvent.EXIT_OK if exit_code == 0 else RunEvent.EXIT_ERROR
    record.check_attempt(event, about)
    marked = with_node(record, node, state="exited", exit_code=exit_code)
    if exit_code != 0:
        return Verdict(marked, event, exit_code, f"node {node} exited with code {exit_code}")
    current = _current(marked)
    rows = current.nodes if current else []
    if all(row.state == "exited" and row.exit_code == 0 for row in rows):
        return Verdict(marked, event, 0, f"all {len(rows)} nodes exited with code 0")
    return Verdict(marked, None)


def lost(record: RunRecord, node: int) -> RunRecord:
    """Node ``node`` is gone (its worker stopped, or its lease expired): its row ``lost``, unless
    it had exited."""
    current = _current(record)
    row = next((r for r in current.nodes if r.node == node), None) if current else None
    if row is None or row.state == "exited":
        return record
    return with_node(record, node, state="lost")


def lost_detail(node: int, lease: float) -> str:
    """What a multi-node run's attempt says when node ``node``'s lease expired."""
    return (
        f"node {node}'s worker stopped renewing its lease for over {lease:g} s (its host is "
        "down, or it has been cut off from the relay)"
    )


def rendezvous(data: dict[str, Any]) -> dict[str, Any] | None:
    """The rendezvous node 0's ``started`` status names (``data["rendezvous"]``:
    ``{"addr": str, "port": int}``), or ``None`` if it names none that is valid."""
    got = data.get("rendezvous")
    if not isinstance(got, dict):
        return None
    addr, port = got.get("addr"), got.get("port")
    if not isinstance(addr, str) or not 0 < len(addr) <= 255 or any(c.isspace() for c in addr):
        return None
    if isinstance(port, bool) or not isinstance(port, int) or not 0 < port < 65536:
        return None
    return {"addr": addr, "port": port}


def trim_point(received: dict[str, str], nodes: int) -> str | None:
    """How far the run's ``to_worker`` may lose its transient entries: the least of what every
    node's worker says it received (``received``: node -> cursor). ``None`` while a node has not
    said: each node reads the stream for itself, and one that reconnects re-reads it from its
    cursor, so an entry another node received may still be owed to it (a live request for its
    processes)."""
    if len(received) < nodes:
        return None
    least = min((_entry_id(cursor) for cursor in received.values()), default=None)
    return None if least is None or least < (0, 0) else f"{least[0]}-{least[1]}"


def _entry_id(text: str) -> tuple[int, int]:
    """A stream entry id (``"<ms>-<seq>"``) as numbers to compare; ``(-1, -1)`` if it is not one
    (then nothing is trimmed)."""
    ms, _, seq = text.partition("-")
    if not (ms.isascii() and ms.isdigit() and (not seq or (seq.isascii() and seq.isdigit()))):
        return (-1, -1)
    return (int(ms), int(seq or 0))
