"""Where and as whom one attempt's processes live: its directories, its uid, its environment.

An attempt has its run directory (the snapshot, the program's working directory) and a private
directory of tether's for the program (``/tmp/tether-XXXX``: short, for the unix sockets' paths):
the sockets the program connects to (the attach line, metrics), debugpy's home, the launcher's
``sitecustomize`` and the ``tether`` module, and, for a program with a uid of its own, its
``HOME``, ``TMPDIR`` and the directory debugpy's adapter writes its endpoints to.

On a worker that isolates (``worker_shim/program/identity.py``) the private directory is root's,
mode 0711 (the program can reach what it is told the path of, list nothing); its sockets are handed
to the program's uid (mode 0600), and so are the run directory, its home and its temporary directory
(0700 each). The worker never follows a path the program could have changed: what it reads there
(the endpoints file) is opened with ``O_NOFOLLOW | O_NONBLOCK`` and must be a small regular file.
Elsewhere everything is the worker's, mode 0700, as before.

The private directory goes when the attempt ends; the run directory stays (the pool keeps its newest
runs': ``worker_shim/backends/housekeeping.py``), and so does its uid's lease.
"""

from __future__ import annotations

import json
import os
import shutil
import stat
import tempfile
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from dataclasses import dataclass
from pathlib import Path

import trio

from protocol_specs.runs.runs import RunRecord

from .identity import Isolation, ProgramUser, Runtime, passed_env, search_path, spawn_options
from .reaper import MARK_ENV, attempt_mark
from .uid_leases import UidLeases

__all__ = [
    "RAY_JOB_CONFIG",
    "WORKER_ONLY_ENV",
    "Housing",
    "Quarters",
    "hand_over_tree",
    "open_quarters",
    "program_env",
    "read_private",
]

#: the uids besides the program's own that may connect to its debugger (``_tether_guard.py``)
PEERS_ENV = "TETHER_DEBUG_PEERS"
#: the most bytes read from a file in the program's reach
READ_LIMIT = 64 * 1024


@dataclass(frozen=True)
class Quarters:
    """One attempt's places and identity (see the module's docstring)."""

    run_dir: Path
    private: Path
    user: ProgramUser | None
    runtime: Runtime
    mark: str

    @property
    def endpoints(self) -> Path:
        """Where debugpy's adapter writes its endpoints (a directory the program may write in)."""
        return self.private / "endpoints" / "endpoints.json"

    def spawn(self) -> dict[str, object]:
        """The options that start a process as the attempt's user."""
        return spawn_options(self.user)

    def env(self, inherited: dict[str, str], run: dict[str, str]) -> dict[str, str]:
        """The environment of the attempt's processes: ``inherited`` (the worker's, without its
        credentials; only :data:`~worker_shim.program.identity.PASSED_ENV` of it for a program with
        a uid of its own), then ``run`` (the run's own variables and the worker's additions), then
        what tether sets: the mark its processes are found by, the uid of the worker its debugger
        lets in, and for a uid of its own, its ``HOME``, ``TMPDIR`` and name."""
        base = inherited if self.user is None else passed_env(inherited)
        env = {**base, **run, MARK_ENV: self.mark, PEERS_ENV: str(os.geteuid())}
        if self.user is not None:
            home, tmp = str(self.private / "home"), str(self.private / "tmp")
            env.update(HOME=home, TMPDIR=tmp, TMP=tmp, TEMP=tmp)
            env.update(USER=self.user.name, LOGNAME=self.user.name)
            # the directories it may not search would only turn "command not found" into
            # "permission denied" (an execvp that met one says EACCES)
            env["PATH"] = search_path(env, self.user)
        return env

    def hand_over(self, path: Path, mode: int = 0o600) -> None:
        """``path`` (made here, by the worker) becomes the attempt's user's, with ``mode``."""
        if self.user is not None:
            os.chown(path, self.user.uid, self.user.gid, follow_symlinks=False)
            os.chmod(path, mode)

    def own_dir(self, name: str) -> Path:
        """A directory ``name`` in the private directory that the attempt's user may write in."""
        path = self.private / name
        path.mkdir(mode=0o700, exist_ok=True)
        self.hand_over(path, 0o700)
        return path


def hand_over_tree(root: Path, user: ProgramUser) -> None:
    """``root`` and everything in it (links themselves, never what they point to) become
    ``user``'s. Done before the program starts: nothing of its can race the walk."""
    os.chown(root, user.uid, user.gid, follow_symlinks=False)
    for where, dirs, files in os.walk(root):
        for name in [*dirs, *files]:
            os.chown(os.path.join(where, name), user.uid, user.gid, follow_symlinks=False)


def read_private(path: Path) -> bytes | None:
    """A file in the program's reach, read without trusting it: no link followed, no FIFO waited
    on, a regular file of at most :data:`READ_LIMIT` bytes; ``None`` if it is not that (yet)."""
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK)
    except OSError:
        return None
    try:
        st = os.fstat(fd)
        if not stat.S_ISREG(st.st_mode) or st.st_size > READ_LIMIT:
            return None
        return os.read(fd, READ_LIMIT)
    except OSError:
        return None
    finally:
        os.close(fd)


@asynccontextmanager
async def open_quarters(
    run_dir: Path, *, user: ProgramUser | None, runtime: Runtime, mark: str
) -> AsyncIterator[Quarters]:
    """The attempt's private directory, made for ``user`` (``None``: the worker's own), removed
    when the block ends (shielded)."""
    private = Path(tempfile.mkdtemp(prefix="tether-"))
    try:
        quarters = Quarters(run_dir, private, user, runtime, mark)
        if user is not None:
            os.chmod(private, 0o711)
            for name in ("home", "tmp", "endpoints"):
                quarters.own_dir(name)
        else:
            (private / "endpoints").mkdir(mode=0o700)
        yield quarters
    finally:
        with trio.CancelScope(shield=True):
            await trio.to_thread.run_sync(shutil.rmtree, private, True)


class Housing:
    """A worker's rule for its runs' places and identities: its :class:`Isolation`, the runtime
    its programs load (the installed one, or a copy published for uids of their own), the uid
    leases, and the mark its processes carry (``worker_shim/program/reaper.py``)."""

    def __init__(self, isolation: Isolation | None = None, *, mark: str = "") -> None:
        self.isolation = isolation or Isolation()
        self.mark = mark or f"w{os.getpid()}-{os.urandom(4).hex()}"
        self.runtime = Runtime.installed()
        self.leases: UidLeases | None = None
        root = self.isolation.runs_root
        if self.isolation.uids is not None and root is not None:
            self.leases = UidLeases(root / ".uids", self.isolation.uids)

    def __repr__(self) -> str:
        return f"<Housing {self.isolation!r} mark={self.mark}>"

    def prepare(self, work_dir: Path) -> Path:
        """Make the runs directory (and, isolating, publish the runtime); its path."""
        runs = self.isolation.runs_dir(work_dir)
        if self.leases is None:
            runs.mkdir(mode=0o700, parents=True, exist_ok=True)
            return runs
        from .identity import _reachable_dir

        _reachable_dir(runs)
        assert self.isolation.runs_root is not None
        self.runtime = Runtime.installed().publish(self.isolation.runs_root)
        return runs

    def lease(self, run_dir: Path) -> ProgramUser | None:
        """The uid ``run_dir``'s attempt runs as (leased now, and ``run_dir`` handed to it), or
        ``None`` on a worker that does not isolate. Synchronous: run it in a thread."""
        if self.leases is None:
            return None
        user = self.leases.lease(run_dir)
        hand_over_tree(run_dir, user)
        return user

    def owner(self, run_dir: Path) -> ProgramUser | None:
        """The uid a kept run directory belongs to (``None``: the worker's)."""
        return None if self.leases is None else self.leases.owner(run_dir)

    def release(self, run_dir: Path) -> None:
        """``run_dir`` was removed: if it was its run's last here, its uid's processes end, its
        lease too (synchronous)."""
        if self.leases is not None:
            self.leases.release(run_dir)

    def attempt_mark(self, run_id: str, attempt: int) -> str:
        return attempt_mark(self.mark, run_id, attempt)


#: the worker's own credentials: never handed down to the program it runs
WORKER_ONLY_ENV = frozenset({"TETHER_TOKEN", "TETHER_CONFIG"})


#: a Ray job's configuration (its runtime environment, the worker's ticket among it), which a Ray
#: driver hands on to every task and actor it starts
RAY_JOB_CONFIG = "RAY_JOB_CONFIG_JSON_ENV_VAR"


def program_env(
    record: RunRecord, env: dict[str, str] | None, quarters: Quarters | None = None
) -> dict[str, str]:
    """The program's environment (and its tunnels' commands'): the worker's, without its own
    credentials, the run's (secrets included), then what the worker adds (its GPUs); in
    ``quarters``, what those say (a program with a uid of its own gets only the worker's system
    variables, and a home of its own: :meth:`Quarters.env`)."""
    inherited = {k: v for k, v in os.environ.items() if k not in WORKER_ONLY_ENV}
    if RAY_JOB_CONFIG in inherited:
        inherited[RAY_JOB_CONFIG] = _without_credentials(inherited[RAY_JOB_CONFIG])
    run = {**record.spec.program_env(), **(env or {})}
    if quarters is not None:
        return quarters.env(inherited, run)
    return {**inherited, **run}


def _without_credentials(job_config: str) -> str:
    """A Ray job's configuration without the worker's own variables (one that cannot be read is
    replaced by an empty one rather than handed on)."""
    try:
        config = json.loads(job_config)
        env_vars = (config.get("runtime_env") or {}).get("env_vars") or {}
        for name in WORKER_ONLY_ENV:
            env_vars.pop(name, None)
        return json.dumps(config)
    except (ValueError, AttributeError, TypeError):
        return "{}"
