"""Workers: the local pool of ``tether up`` / ``tether worker``, and the one-run worker a scheduler
job starts (``tether worker --run RUN --attempt N``).

The pool runs N slots; each claims queued runs of the ``local`` backend from the relay and runs them
to the end, one at a time. With GPUs (``--gpus 0,1,2,3``, else what ``nvidia-smi -L`` lists, else
none), a run asking for ``k`` GPUs waits until ``k`` are free and gets them pinned through
``CUDA_VISIBLE_DEVICES``; a run asking for more GPUs than the pool has fails at once with a clear
reason rather than waiting for ever.
"""

from __future__ import annotations

import logging
import os
import shutil
import socket
import subprocess
import sys
from collections.abc import AsyncIterator, Callable
from contextlib import AbstractAsyncContextManager, AsyncExitStack, asynccontextmanager
from dataclasses import dataclass
from functools import partial
from pathlib import Path

import trio

from protocol_specs.runs.runs import RunRecord
from protocol_specs.session.session import StatusEvent
from protocol_specs.snapshots.snapshots import Manifest
from protocol_specs.wire import wire
from protocol_specs.wire.wire import ErrorCode
from relay.client import (
    ControlClient,
    Endpoint,
    RelayError,
    Target,
    endpoint,
    open_control,
    relay_error_of,
)

from ..program.files import Fetch
from ..program.identity import Isolation
from ..program.preempt import ATTEMPTS, preempt_self
from ..program.quarters import Housing
from ..program.reaper import open_guard
from ..program.sched_warnings import Warned, slurm_cancelled, trap_warnings, warnings_of
from ..session.actions import status_entry
from ..shim import run_dir_of, run_shim, worker_link
from .afterlife import Afterlives
from .confirm import confirm_claim
from .housekeeping import CACHE_MAX_BYTES, KEEP_RUNS, tidy
from .nodes import Node, NodePool, node_workers

__all__ = ["GpuPool", "detect_gpus", "run_node", "run_one", "run_pool"]

log = logging.getLogger("tether.worker")

#: how often a blob read tries a new control connection after losing the relay
FETCH_TRIES = 8
#: how long a job's worker holding a ticket waits for its backend to see the job running
TICKET_WAIT = 600.0


def detect_gpus() -> list[str]:
    """The indices ``nvidia-smi -L`` lists (none without it)."""
    if shutil.which("nvidia-smi") is None:
        return []
    try:
        out = subprocess.run(
            ["nvidia-smi", "-L"], capture_output=True, text=True, timeout=10, check=True
        ).stdout
    except (OSError, subprocess.SubprocessError):
        return []
    return [str(i) for i, line in enumerate(out.splitlines()) if line.startswith("GPU ")]


class GpuPool:
    """Which of the pool's GPUs are free; runs wait for theirs."""

    def __init__(self, gpus: list[str]) -> None:
        self.gpus = list(gpus)
        self.free = list(gpus)
        self._changed = trio.Condition()

    async def take(self, count: int) -> list[str]:
        if count > len(self.gpus):
            raise ValueError(
                f"the run asks for {count} GPUs; this worker pool has {len(self.gpus)}"
            )
        async with self._changed:
            while len(self.free) < count:
                await self._changed.wait()
            taken, self.free = self.free[:count], self.free[count:]
            return taken

    async def give_back(self, gpus: list[str]) -> None:
        async with self._changed:
            self.free += gpus
            self._changed.notify_all()


async def run_pool(
    relay_url: Target,
    *,
    slots: int = 1,
    start_delay: float = 0.0,
    work_dir: Path,
    gpus: list[str] | None = None,
    name: str | None = None,
    python: str = sys.executable,
    on_event: Callable[[str], None] | None = None,
    keep_runs: int = KEEP_RUNS,
    cache_max: int = CACHE_MAX_BYTES,
    allow_tunnels: bool = True,
    isolation: Isolation | None = None,
    nodes: int = 1,
    node_via: list[list[str]] | None = None,
    task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED,
) -> None:
    """Run ``slots`` claim loops until cancelled. ``start_delay`` stands in for a GPU queue;
    ``allow_tunnels``: serve the users' ``tether exec``/``shell``/``port-forward``;
    ``isolation``: as whom programs run (``worker_shim/program/identity.py``; default: the worker's
    own user, every user's runs); ``nodes``, ``node_via``: the pool's nodes for multi-node runs,
    this host and ``nodes - 1`` more, each run behind its prefix (``worker_shim/backends/nodes.py``).

    ``relay_url``'s token needs the ``backend`` scope; each claimed attempt runs with the worker
    token the relay minted for it. Every process of its runs ends with the pool, however the pool
    ends (``worker_shim/program/reaper.py``)."""
    say = on_event or (lambda _text: None)
    base = name or f"{socket.gethostname()}-pool"
    housing = Housing(isolation)
    runs_dir = await trio.to_thread.run_sync(housing.prepare, work_dir)
    pool = GpuPool(detect_gpus() if gpus is None else gpus)
    async with _guarded(housing, runs_dir), trio.open_nursery() as nursery:
        # the tunnels of the runs that ended here, served in their directories while they stay
        afterlives = Afterlives(nursery, say, housing) if allow_tunnels else None
        place = _PoolPlace(
            work_dir, runs_dir, housing, (keep_runs, cache_max), allow_tunnels,
            NodePool(nodes, node_via or [], work_dir),
        )  # fmt: skip
        for slot in range(slots):
            nursery.start_soon(
                _slot, relay_url, f"{base}-{slot}", start_delay, place, python, pool, say,
                afterlives,
            )  # fmt: skip
        task_status.started()


@dataclass(frozen=True)
class _PoolPlace:
    """A pool's places: its work directory (blobs), its runs' directory, its housing, its
    bounds (runs kept, cache bytes), whether it serves tunnels."""

    work_dir: Path
    runs_dir: Path
    housing: Housing
    bounds: tuple[int, int]
    allow_tunnels: bool
    #: the pool's nodes beyond this host (a job's worker: none)
    nodes: NodePool | None = None


def _guarded(housing: Housing, runs_dir: Path) -> AbstractAsyncContextManager[None]:
    """The worker's guard (``worker_shim/program/reaper.py``), sweeping ``runs_dir``'s uids too."""
    leases = housing.leases
    if leases is None:
        return open_guard(housing.mark)
    return open_guard(housing.mark, leases=leases.where, runs_dir=runs_dir, uids=leases.uids)


async def _slot(
    relay_url: Target,
    worker: str,
    start_delay: float,
    place: _PoolPlace,
    python: str,
    gpus: GpuPool,
    say: Callable[[str], None],
    afterlives: Afterlives | None = None,
) -> None:
    work_dir, runs_dir, housing = place.work_dir, place.runs_dir, place.housing
    backoff = 0.2
    lost = False
    while True:  # a lost relay (a redeploy, a cut) ends this connection, never the slot
        try:
            async with open_control(relay_url, client=f"tether-worker {worker}") as control:
                backoff = 0.2
                if lost:
                    say(f"{worker}: back with the relay; waiting for a run")
                    lost = False
                while True:
                    # none once the pool stops (its running attempts are preempted)
                    assigned = await ATTEMPTS.claim(partial(control.claim, worker))
                    record, manifest = assigned.run, assigned.manifest
                    as_worker = endpoint(relay_url).with_token(assigned.token)
                    try:  # a claim counts once the relay knows this worker holds it
                        await confirm_claim(
                            control, as_worker, assigned, client=f"tether-worker {worker}"
                        )
                    except RelayError as exc:
                        say(f"{worker}: run {record.id} is not this worker's to run: {exc.message}")
                        continue
                    say(f"{worker}: claimed run {record.id} (attempt {record.attempt})")
                    refused = housing.isolation.refusal(record.owner, control.user)
                    if refused is not None:
                        await _start_failed(as_worker, record, refused)
                        say(f"{worker}: run {record.id} is {record.owner}'s: not run here")
                        continue
                    if start_delay > 0:
                        say(
                            f"{worker}: waiting {start_delay:g} s before starting run {record.id} (--start-delay)"
                        )
                        await trio.sleep(start_delay)
                    try:  # the nodes first: a slot holding GPUs never waits for nodes
                        nodes = await _take_nodes(place.nodes, record)
                        taken = await _take_gpus(gpus, record, nodes, place.nodes)
                    except ValueError as exc:
                        await _start_failed(as_worker, record, str(exc))
                        say(f"{worker}: run {record.id}: {exc}")
                        continue
                    env = {"CUDA_VISIBLE_DEVICES": ",".join(taken)} if gpus.gpus else {}
                    try:
                        async with node_workers(
                            nodes, record.id, record.attempt, as_worker,
                            mark=f"{housing.mark}/nodes-{record.id}-{record.attempt}",
                            say=lambda text: say(f"{worker}: {text}"),
                            allow_tunnels=place.allow_tunnels, isolation=housing.isolation,
                        ):  # fmt: skip
                            await _run(as_worker, record, manifest, control, place, python, say,
                                       env)  # fmt: skip
                    except (RelayError, BaseExceptionGroup) as exc:
                        # the relay lost, or the attempt over (a node of it lost: retried): the
                        # slot serves on (the shim's nurseries nest the error in groups)
                        lost_with = relay_error_of(exc)
                        if lost_with is None:
                            raise
                        say(f"{worker}: lost the relay while running {record.id}: {lost_with}")
                    finally:
                        await gpus.give_back(taken)
                        if place.nodes is not None:
                            await place.nodes.give_back(nodes)
                        with trio.CancelScope(shield=True):
                            await tidy(work_dir, runs_dir, keep_runs=place.bounds[0],
                                       cache_max=place.bounds[1], release=housing.release)  # fmt: skip
                        if afterlives is not None:
                            afterlives.tidied()
                            run_dir = run_dir_of(runs_dir, record)
                            afterlives.start(as_worker, record, run_dir, env)
        except RelayError as exc:
            log.debug("%s: %s; retrying in %.1f s", worker, exc, backoff)
            say(f"{worker}: lost the relay ({exc.message}); retrying in {backoff:.1f} s")
            lost = True
            await trio.sleep(backoff)
            backoff = min(backoff * 2, 5.0)


async def _take_nodes(pool: NodePool | None, record: RunRecord) -> list[Node]:
    """The pool's nodes for the run's nodes 1..M-1 (none for one node), waiting until free."""
    wanted = record.spec.resources.nodes
    if pool is None:
        return []
    return await pool.take(wanted)


async def _take_gpus(
    gpus: GpuPool, record: RunRecord, nodes: list[Node], pool: NodePool | None
) -> list[str]:
    """Node 0's GPUs, waiting until free; on a :class:`ValueError` the nodes go back."""
    try:
        return await gpus.take(record.spec.resources.gpus)
    except ValueError:
        if pool is not None:
            await pool.give_back(nodes)
        raise


async def _start_failed(relay_url: Endpoint, record: RunRecord, detail: str) -> None:
    async with worker_link(relay_url, record) as link:
        await link.publish(status_entry(StatusEvent.START_FAILED, detail=detail))


async def run_one(
    relay_url: Target,
    run_id: str,
    attempt: int,
    *,
    work_dir: Path,
    worker: str,
    python: str = sys.executable,
    on_event: Callable[[str], None] | None = None,
    allow_tunnels: bool = True,
    scheduler: str = "",
    term_wait: float = 0.0,
) -> int | None:
    """Claim ``run_id``'s attempt ``attempt`` and run it (a scheduler job's worker, holding the
    attempt's worker token, or a ticket: the claim then answers with the worker token, which
    serves from there on). Its program runs as the job does (the scheduler's user), and ends with
    this worker however it ends (``worker_shim/program/reaper.py``). ``scheduler`` (``slurm``,
    ``ray``): the scheduler's warnings preempt the attempt once it is claimed, ``term_wait``: its
    wait between ``SIGTERM`` and ``SIGKILL`` (``worker_shim/program/sched_warnings.py``)."""
    say = on_event or (lambda _text: None)
    client = f"tether-worker {worker}"
    housing = Housing()
    runs_dir = await trio.to_thread.run_sync(housing.prepare, work_dir)
    place = _PoolPlace(work_dir, runs_dir, housing, (KEEP_RUNS, CACHE_MAX_BYTES), allow_tunnels)

    async def started(ep: Endpoint, assigned: wire.Assigned, control: ControlClient) -> int | None:
        record = assigned.run
        say(f"{worker}: claimed run {record.id} (attempt {record.attempt})")
        try:
            async with trio.open_nursery() as nursery:
                if scheduler:
                    await nursery.start(_warned_by, scheduler, term_wait, record, control, say)
                code = await _run(
                    ep, record, assigned.manifest, control, place, python, say, scheduled=True
                )
                nursery.cancel_scope.cancel()
                return code
        finally:
            with trio.CancelScope(shield=True):
                await tidy(work_dir, runs_dir)

    async with _guarded(housing, runs_dir):
        assigned = await _claim(relay_url, client, worker, run_id, attempt, say)
        as_worker = endpoint(relay_url)
        if assigned.token:
            as_worker = as_worker.with_token(assigned.token)
        async with open_control(as_worker, client=client) as control:
            await confirm_claim(control, as_worker, assigned, client=client)
            return await started(as_worker, assigned, control)


async def _warned_by(
    scheduler: str,
    term_wait: float,
    record: RunRecord,
    control: ControlClient,
    say: Callable[[str], None],
    task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED,
) -> None:
    """The scheduler's warnings preempt ``record``'s attempt, asked with the worker's token."""
    warned = warnings_of(scheduler, preempt_grace=record.spec.preempt_grace, term_wait=term_wait)

    async def preempt(what: Warned) -> None:
        link = ATTEMPTS.link_of(record.id, record.attempt)
        if link is None:  # its program has not started: the relay's order will reach it
            await control.preempt(record.id, grace=what.grace, detail=what.detail)
        else:  # through the relay, or here if the relay cannot be reached
            await preempt_self(link, record, what.grace, what.detail)

    cancelled = partial(slurm_cancelled, os.environ) if scheduler == "slurm" else None
    await trap_warnings(warned, preempt, say=say, cancelled=cancelled, task_status=task_status)


async def run_node(
    relay_url: Target,
    run_id: str,
    attempt: int,
    node: int,
    *,
    work_dir: Path,
    worker: str,
    python: str = sys.executable,
    on_event: Callable[[str], None] | None = None,
    allow_tunnels: bool = True,
    isolation: Isolation | None = None,
) -> int | None:
    """Join node ``node`` (>= 1) of ``run_id``'s attempt ``attempt``, which node 0's worker
    claimed, and run that node's part (``tether worker --run RUN --attempt A --node K``, holding
    the attempt's worker token): asked again while node 0 has not claimed it yet; the program
    starts once node 0's rendezvous is known (``worker_shim/program/nodes.py``). ``isolation``: as
    whom its program runs (a pool's node: the pool's own; default: as this worker)."""
    say = on_event or (lambda _text: None)
    client = f"tether-worker {worker}"
    housing = Housing(isolation)
    runs_dir = await trio.to_thread.run_sync(housing.prepare, work_dir)
    place = _PoolPlace(work_dir, runs_dir, housing, (KEEP_RUNS, CACHE_MAX_BYTES), allow_tunnels)
    async with _guarded(housing, runs_dir):
        assigned = await _claim(relay_url, client, worker, run_id, attempt, say, node=node)
        record = assigned.run
        say(f"{worker}: joined run {record.id} (attempt {record.attempt}) as node {node}")
        as_worker = endpoint(relay_url)
        if assigned.token:  # a ticket's join (a Ray job's node) is answered with a worker token
            as_worker = as_worker.with_token(assigned.token)
        async with open_control(as_worker, client=client) as control:
            try:
                return await _run(
                    as_worker, record, assigned.manifest, control, place, python, say,
                    scheduled=True, node=node,
                )  # fmt: skip
            finally:
                with trio.CancelScope(shield=True):
                    await tidy(work_dir, runs_dir, release=housing.release)


#: how long a job's worker asks again for its claim when the answer was lost (the relay died, or
#: lost its store): the claim goes back to the queue once its confirmation is overdue
CLAIM_PATIENCE = 120.0


async def _claim(
    relay_url: Target,
    client: str,
    worker: str,
    run_id: str,
    attempt: int,
    say: Callable[[str], None],
    *,
    node: int = 0,
) -> wire.Assigned:
    """Claim the attempt, on a connection of its own each time it asks. A ticket's claim is
    refused until the backend saw this job running (it looks every few seconds): asked again,
    for :data:`TICKET_WAIT` seconds at most. A claim whose answer was lost (the relay went, or
    its store) was made for nobody: the relay puts it back in the queue once it stays
    unconfirmed (``--claim-confirm``), and it is asked again until then, for
    :data:`CLAIM_PATIENCE` seconds at most. With ``node`` >= 1: a join, refused the same way
    until node 0 claimed the attempt."""
    start = trio.current_time()
    said: set[str] = set()
    pause = 0.5
    while True:
        try:
            async with open_control(relay_url, client=client) as control:
                return await control.claim(worker, run=run_id, attempt=attempt, node=node)
        except RelayError as exc:
            waited = trio.current_time() - start
            if exc.code == ErrorCode.JOB_NOT_RUNNING and waited < TICKET_WAIT:
                why = (
                    f"waiting for node 0 to claim attempt {attempt}"
                    if node
                    else "waiting for the backend to see this job running"
                )
                pause = 0.5  # the backend's next look at its jobs
            elif _answer_lost(exc, attempt) and waited < CLAIM_PATIENCE:
                why = "its claim's answer was lost with the relay; asking again"
                pause = min(pause * 2, 5.0)
            else:
                raise
        if why not in said:
            say(f"{worker}: run {run_id}: {why}")
            said.add(why)
        await trio.sleep(pause)  # the relay's or the backend's next move: nothing to wait on


def _answer_lost(exc: RelayError, attempt: int) -> bool:
    """Whether a claim's refusal says its answer may have been lost: the relay is gone (or lost
    its store), or the attempt was claimed already (by this job's earlier ask, whose answer never
    came: it goes back to the queue once its confirmation is overdue)."""
    if exc.code in (ErrorCode.UNREACHABLE, ErrorCode.INTERNAL):
        return True
    return exc.code == ErrorCode.STALE_ATTEMPT and f"attempt {attempt} (starting)" in exc.message


async def _run(
    relay_url: Endpoint,
    record: RunRecord,
    manifest: Manifest,
    control: ControlClient,
    place: _PoolPlace,
    python: str,
    say: Callable[[str], None],
    env: dict[str, str] | None = None,
    *,
    scheduled: bool = False,
    node: int = 0,
) -> int | None:
    """One claimed attempt, its blobs fetched over ``control`` (or a new control connection, if
    that one is lost) into the worker's cache. ``scheduled``: a scheduler's job (its backend
    reports how the job ended)."""
    async with _fetcher(relay_url, control) as fetch:
        return await run_shim(
            relay_url,
            record,
            manifest,
            runs_dir=place.runs_dir,
            fetch=fetch,
            cache=place.work_dir / "blobs",
            env=env,
            python=python,
            on_event=say,
            say_when_stopped=not scheduled,
            allow_tunnels=place.allow_tunnels,
            housing=place.housing,
            node=node,
        )


@asynccontextmanager
async def _fetcher(relay_url: Endpoint, control: ControlClient) -> AsyncIterator[Fetch]:
    """Blob reads that survive a lost control connection: a new one is opened (with the attempt's
    worker token) and the read tried again, a few times with a growing pause."""
    async with AsyncExitStack() as stack:
        current = [control]

        async def fetch(digest: str, offset: int = 0) -> tuple[int, bytes]:
            pause = 0.2
            for attempt in range(FETCH_TRIES):
                try:
                    return await current[0].read_blob(digest, offset)
                except RelayError as exc:
                    if exc.code != ErrorCode.UNREACHABLE or attempt == FETCH_TRIES - 1:
                        raise
                await trio.sleep(pause)
                pause = min(pause * 2, 5.0)
                try:
                    current[0] = await stack.enter_async_context(
                        open_control(relay_url, client="tether-worker blobs")
                    )
                except RelayError:
                    continue
            raise AssertionError("unreachable")

        yield fetch
