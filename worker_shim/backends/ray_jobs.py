"""The Ray backend: each attempt of a run queued for ``ray`` becomes a Ray Job.

Theory of operation
-------------------
``tether backend ray --address http://HEAD:8265`` runs anywhere that reaches the cluster's
dashboard. It speaks the Ray Jobs REST API (what ``ray job submit`` and ``JobSubmissionClient``
speak; no Ray installation is needed where the backend runs, and no version of Ray has to match
the cluster's). For each attempt it is handed (``worker_shim/backends/scheduler.py``):

1. it submits a job (:func:`job_request`) whose entrypoint is tether's worker for that run and
   attempt, holding the run's resources: ``entrypoint_num_cpus``, ``entrypoint_num_gpus``,
   ``entrypoint_memory`` and ``entrypoint_resources`` (custom resources). Ray keeps the job
   ``PENDING`` until a node has them; ``tether ls`` shows the run ``queued`` with the job's id.
2. The worker's credential is a *ticket* (``protocol_specs/access/auth.py``), in the job's environment
   (``TETHER_TOKEN``): Ray shows every job's entrypoint and runtime environment to every client of
   the dashboard, and a ticket is only good for claiming the attempt once the backend saw the job
   running (3.), until the attempt started.
   The claim answers with the worker token, which stays in the worker's memory.
3. Every ``poll`` seconds it asks for each job's status (``worker_shim/backends/job_watch.py``
   decides): ``STOPPED``, ``FAILED`` or ``SUCCEEDED`` while the attempt was not finished is a lost
   attempt, retried as the run says; a job Ray failed because it waited longer than the cluster's
   ``RAY_JOB_START_TIMEOUT_SECONDS`` is submitted again for the same attempt (nothing ran); a job
   whose run was cancelled is stopped; a job seen running while its attempt waits for its worker
   is reported ``running`` (its ticket may claim from then on). Ray has no time limits: a job
   running longer than the run's ``--time`` is stopped and its attempt lost, as Slurm's
   ``TIMEOUT`` is.

Logs go through tether's own stream, as on every backend; Ray's job log holds the worker's own
lines only.
"""

from __future__ import annotations

import json
import logging
import math
import os
import secrets
import shlex
from typing import Any

import trio

from protocol_specs.runs.runs import RunRecord
from relay.client import endpoint

from ..program.sched_warnings import MARGIN
from .job_watch import Phase, Seen
from .scheduler import SchedulerBackend, SchedulerError, SchedulerRefused

__all__ = ["RayBackend", "RayJobs", "RayRefused", "job_request", "ray_stop_wait_for", "seen_of"]

log = logging.getLogger("tether.backend")

_PHASES = {
    "PENDING": Phase.PENDING,
    "RUNNING": Phase.RUNNING,
    "STOPPED": Phase.ENDED,
    "SUCCEEDED": Phase.ENDED,
    "FAILED": Phase.ENDED,
}
#: Ray's ``error_type`` for a job that waited longer than ``RAY_JOB_START_TIMEOUT_SECONDS``
GAVE_UP = "JOB_SUPERVISOR_ACTOR_START_TIMEOUT"


class RayRefused(SchedulerRefused):
    """Ray answered that the request is bad (HTTP 400: a runtime environment it cannot take, a
    resource name it refuses): asking again would not help. Anything else (no answer, a 5xx, an
    authentication refused while a token rotates) is asked again, patiently."""


def job_request(
    record: RunRecord,
    ticket: str,
    *,
    submission_id: str,
    python: str,
    relay: str,
    ca_file: str = "",
    work_dir: str = "",
    allow_tunnels: bool = True,
) -> dict[str, Any]:
    """The body of ``POST /api/jobs/`` for ``record``'s attempt (no secret but the ticket, and
    that in the environment, not on the command line)."""
    res = record.spec.resources
    argv = [
        python, "-m", "adapter.cli", "worker",
        "--run", record.id, "--attempt", str(record.attempt),
    ]  # fmt: skip
    if work_dir:
        argv += ["--work-dir", work_dir]
    if not allow_tunnels:
        argv.append("--no-shell")
    if res.nodes == 1:  # its worker preempts the attempt when Ray stops the job
        argv += ["--scheduler", "ray"]
    if res.nodes > 1:
        argv = [*_driver(record, python), *argv]
    env = {"TETHER_RELAY": relay, "TETHER_TOKEN": ticket}
    if res.nodes == 1:
        # Ray's job supervisor (which reads it from the job's runtime environment) waits this
        # long between its SIGTERM and its SIGKILL: the run's grace, and the worker's margin
        env["RAY_JOB_STOP_WAIT_TIME_S"] = str(ray_stop_wait_for(record.spec.preempt_grace))
    if ca_file:
        env["TETHER_CA_FILE"] = ca_file
    body: dict[str, Any] = {
        "entrypoint": shlex.join(argv),
        "submission_id": submission_id,
        "runtime_env": {"env_vars": env},
        "metadata": {
            "tether_run": record.id,
            "tether_attempt": str(record.attempt),
            "tether_owner": record.owner,
            "name": record.spec.name or f"tether run {record.id}",
        },
    }
    if res.nodes > 1:  # the nodes' tasks hold the resources (a placement group), the driver none
        return body
    body["entrypoint_num_cpus"] = res.cpus
    if res.gpus:
        body["entrypoint_num_gpus"] = res.gpus
    if res.memory_mb:
        body["entrypoint_memory"] = res.memory_mb * 2**20
    if res.custom:
        body["entrypoint_resources"] = dict(res.custom)
    return body


def ray_stop_wait_for(preempt_grace: float) -> int:
    """``RAY_JOB_STOP_WAIT_TIME_S`` for a run: its grace plus :data:`MARGIN` (an int: Ray's
    ``int()`` of it), so the program has its whole grace after ``ray job stop``."""
    return math.ceil(preempt_grace + MARGIN)


def _driver(record: RunRecord, python: str) -> list[str]:
    """The entrypoint's head for a run over nodes (``worker_shim/backends/ray_nodes.py``): the
    worker's command follows its ``--``."""
    res = record.spec.resources
    driver = [python, "-m", "worker_shim.backends.ray_nodes", "--nodes", str(res.nodes)]
    driver += ["--cpus", f"{res.cpus:g}"]
    if res.gpus:
        driver += ["--gpus", f"{res.gpus:g}"]
    if res.memory_mb:
        driver += ["--memory", str(res.memory_mb * 2**20)]
    if res.custom:
        driver += ["--resources", json.dumps(dict(res.custom), sort_keys=True)]
    return [*driver, "--"]


def seen_of(info: dict[str, Any] | None) -> Seen:
    """A job as ``GET /api/jobs/{id}`` described it (``None``: Ray does not know it)."""
    if info is None:
        return Seen(Phase.GONE)
    status = str(info.get("status") or "")
    error = str(info.get("error_type") or "")
    message = " ".join(str(info.get("message") or "").split()).split(". ")[0][:200]
    detail = status + (f" ({message})" if message and status in ("FAILED", "STOPPED") else "")
    if status == "FAILED" and error == GAVE_UP:
        return Seen(Phase.GAVE_UP, detail)
    return Seen(_PHASES.get(status, Phase.RUNNING), detail)


class RayJobs:
    """The Ray Jobs REST API of one cluster's dashboard (``httpx``, from the ``ray`` extra)."""

    def __init__(self, address: str, headers: dict[str, str] | None = None) -> None:
        try:
            import httpx
        except ImportError:
            raise SystemExit(
                "tether backend ray needs the ray extra: pip install 'tether[ray]'"
            ) from None
        self.address = address_of(address)
        token = os.environ.get("RAY_AUTH_TOKEN", "")
        auth = {"Authorization": f"Bearer {token}"} if token else {}
        self._http = httpx.AsyncClient(
            base_url=self.address, headers={**auth, **(headers or {})}, timeout=30.0
        )
        self._errors = (httpx.HTTPError, OSError)

    async def _call(self, method: str, path: str, **kwargs: Any) -> Any:
        """Ray's JSON answer; ``None`` when Ray says the job named does not exist."""
        try:
            reply = await self._http.request(method, path, **kwargs)
        except self._errors as exc:
            raise SchedulerError(f"no answer from Ray at {self.address}: {exc}") from None
        said = " ".join(reply.text.split())[-300:]
        if reply.status_code == 404 and "does not exist" in said:
            return None
        if reply.status_code >= 400:
            error = RayRefused if reply.status_code == 400 else SchedulerError
            raise error(f"Ray answered HTTP {reply.status_code} to {method} {path}: {said}")
        try:
            return reply.json()
        except ValueError:
            raise SchedulerError(f"Ray's answer to {method} {path} is not JSON") from None

    async def version(self) -> str:
        got = await self._call("GET", "/api/version")
        if not isinstance(got, dict) or "ray_version" not in got:
            raise SchedulerError(f"{self.address} is not a Ray dashboard (no /api/version)")
        return str(got["ray_version"])

    async def submit(self, request: dict[str, Any]) -> None:
        await self._call("POST", "/api/jobs/", json=request)

    async def info(self, submission_id: str) -> dict[str, Any] | None:
        got = await self._call("GET", f"/api/jobs/{submission_id}")
        return got if isinstance(got, dict) else None

    async def stop(self, submission_id: str) -> None:
        await self._call("POST", f"/api/jobs/{submission_id}/stop")


def address_of(address: str) -> str:
    """The dashboard's base URL: ``http://HEAD:8265``; a bare ``HEAD:8265`` is taken as http."""
    address = address.strip().rstrip("/")
    if "://" not in address:
        address = f"http://{address}"
    scheme = address.split("://", 1)[0]
    if scheme not in ("http", "https"):
        raise SystemExit(
            f"tether backend ray: --address is the dashboard's http(s) URL "
            f"(http://HEAD:8265), not {address!r}"
        )
    return address


class RayBackend(SchedulerBackend):
    name = "ray"
    scheduler = "Ray"
    tickets = True
    limits_time = False  # Ray has no time limits: the watch keeps the runs' own

    def __init__(self, *args: Any, jobs: RayJobs, work_dir: str = "", **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.api = jobs
        self.work_dir = work_dir

    async def launch(self, record: RunRecord, token: str, *, patience: float) -> str:
        submission_id = f"tether-{record.id}-{record.attempt}-{secrets.token_hex(3)}"
        request = job_request(
            record,
            token,
            submission_id=submission_id,
            python=self.python,
            relay=self.worker_relay,
            ca_file=endpoint(self.relay).ca_file or "",
            work_dir=self.work_dir,
            allow_tunnels=self.allow_tunnels,
        )
        deadline = trio.current_time() + patience
        backoff = 1.0
        while True:
            try:
                await self.api.submit(request)
                return submission_id
            except RayRefused:
                raise
            except SchedulerError as exc:
                # the request may have reached Ray and only its answer been lost: a job of this
                # id is then ours (asking for it anew would be refused as a duplicate)
                if await self._known(submission_id):
                    return submission_id
                if trio.current_time() + backoff > deadline:
                    raise
                log.warning("ray backend: %s; submitting again in %.0f s", exc, backoff)
                await trio.sleep(backoff)
                backoff = min(backoff * 2, 30.0)

    async def _known(self, submission_id: str) -> bool:
        try:
            return await self.api.info(submission_id) is not None
        except SchedulerError:
            return False

    async def look(self, jobs: list[str]) -> dict[str, Seen]:
        return {job: seen_of(await self.api.info(job)) for job in jobs}

    async def cancel(self, job: str) -> None:
        await self.api.stop(job)
