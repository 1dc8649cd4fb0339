"""A real single-node Slurm cluster (munged + slurmctld + slurmd) in a temporary directory.

For tests that need ``sbatch``/``squeue``/``scontrol``/``scancel`` to behave like the real thing::

    reason = slurm_available()
    if reason:
        pytest.skip(reason)
    with SlurmCluster(tmp_path) as cluster:
        job_id = cluster.run("sbatch", "--parsable", "--wrap", "hostname").strip()
        cluster.wait_job_state(job_id, {"COMPLETED"})
        subprocess.run([...], env={**os.environ, **cluster.env})  # your own clients

Everything lives under the given directory: the munge key, socket, seed and log, the generated
``slurm.conf``, the state and spool directories, pid and log files. Nothing is written to ``/etc``
and the system's munge/slurm services are neither used nor touched: slurm is pointed at the private
munged through ``AuthInfo=socket=...`` and clients find the config through ``SLURM_CONF``
(:attr:`SlurmCluster.env`).

The daemons run in the foreground (``munged -F``, ``slurmctld -D``, ``slurmd -D``) as children of
this process, so :meth:`SlurmCluster.stop` ends them by PID: SIGTERM, a grace period, then SIGKILL.
Before that it cancels any jobs still in the queue (slurmd leaves running jobs alone when it stops)
and, as a fallback, kills job processes that still carry this cluster's ``SLURM_CONF`` together
with their ``slurmstepd``. ``stop()`` is idempotent and safe after a failed ``start()``.

Several nodes: given :class:`netns.Nodes` (``tests/netns.py``), the cluster has one Slurm node per
network namespace, ``node0`` .. ``nodeN-1``, each its own slurmd (``ip netns exec NS slurmd -D -N
nodeK``, ``NodeAddr`` the namespace's address) with a loopback of its own; slurmctld stays in this
namespace on the bridge's address. munged's socket is a file, so every namespace shares it::

    with open_nodes(2) as nodes, SlurmCluster(tmp_path, nodes=nodes) as cluster:
        cluster.run("sbatch", "--nodes", "2", "--wrap", "srun hostname -I")

Timing knobs that matter for tests (see :class:`SlurmCluster`): ``scontrol requeue`` keeps the job
PENDING (``Reason=BeginTime``) for ``cred_expire + 1`` seconds before it may start again (Slurm's
default ``cred_expire`` is 120 s; here it defaults to 10 s), and the main/backfill schedulers run
every second so a job whose begin time has passed starts promptly.

The daemons need root (``SlurmUser=root``; slurmd must switch to the job's user), so
:func:`slurm_available` reports a skip reason when not root or when a binary is missing.
"""

from __future__ import annotations

import contextlib
import os
import re
import shutil
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Callable, Iterable, Sequence
from pathlib import Path
from types import TracebackType
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from netns import Nodes

CLIENT_BINARIES = ("sbatch", "squeue", "scontrol", "scancel", "sinfo")
DAEMON_BINARIES = ("munged", "slurmctld", "slurmd")

# Daemons live in sbin, which a non-login root shell (or a CI runner) may not have on its PATH.
_EXTRA_PATH = ("/usr/sbin", "/usr/local/sbin", "/sbin")

# Environment variables that change what Slurm clients do (output formats, defaults, an enclosing
# allocation). Dropped from the environment of commands run through SlurmCluster.run.
_CLIENT_ENV_PREFIXES = ("SLURM_", "SBATCH_", "SALLOC_", "SRUN_", "SQUEUE_", "SINFO_", "SCANCEL_")

_STOP_GRACE_S = 10.0
_FIELD_RE = re.compile(r"(?:^|\s)([A-Za-z][A-Za-z0-9:/_]*)=")


def find_binary(name: str) -> str | None:
    """``name`` on the PATH, or in the usual sbin directories."""
    search = os.pathsep.join([os.environ.get("PATH", os.defpath), *_EXTRA_PATH])
    return shutil.which(name, path=search)


def slurm_available() -> str | None:
    """None if a :class:`SlurmCluster` can run here, else why not (a pytest skip reason)."""
    if not sys.platform.startswith("linux"):
        return f"Slurm test cluster needs Linux (this is {sys.platform})"
    missing = [b for b in (*CLIENT_BINARIES, *DAEMON_BINARIES) if find_binary(b) is None]
    if missing:
        return f"Slurm/munge binaries not found: {', '.join(missing)}"
    if os.geteuid() != 0:
        return "Slurm test cluster needs root (slurmd launches jobs as their user; SlurmUser=root)"
    return None


def short_hostname() -> str:
    """This host's name as slurmctld and slurmd see it (``gethostname()`` up to the first dot)."""
    return socket.gethostname().split(".", 1)[0]


def free_tcp_port() -> int:
    """A TCP port nobody listens on right now (the usual bind-to-0 race applies)."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("", 0))
        return int(s.getsockname()[1])


def parse_scontrol_record(line: str) -> dict[str, str]:
    """``Key=Value Key=Value ...`` (one record of ``scontrol -o show ...``) as a dict.

    Values may contain spaces; a value runs until the next `` Key=``.
    """
    matches = list(_FIELD_RE.finditer(line))
    fields: dict[str, str] = {}
    for i, m in enumerate(matches):
        end = matches[i + 1].start() if i + 1 < len(matches) else len(line)
        fields[m.group(1)] = line[m.end() : end].strip()
    return fields


class SlurmCommandError(RuntimeError):
    """A Slurm client command exited non-zero."""

    def __init__(self, argv: list[str], returncode: int, stdout: str, stderr: str) -> None:
        super().__init__(
            f"{' '.join(argv)} exited {returncode}: {stderr.strip() or stdout.strip()}"
        )
        self.argv = argv
        self.returncode = returncode
        self.stdout = stdout
        self.stderr = stderr


class SlurmCluster:
    """munged + slurmctld + slurmd with a one-node ``debug`` partition, all under ``root``.

    ``cpus`` / ``real_memory_mb`` default to what ``slurmd -C`` reports; ``cpus`` may be set higher
    than the machine has (``SlurmdParameters=config_overrides``) to run more jobs at once. Jobs
    that do not ask for memory get ``def_mem_per_cpu_mb`` per CPU, so memory rarely limits how
    many jobs run. ``cred_expire`` (seconds, at least 5) is the job credential lifetime and also
    how long a requeued job stays PENDING (``Reason=BeginTime``) before it may start again
    (``cred_expire + 1``; Slurm's default of 120 s would make requeue tests wait two minutes).
    """

    def __init__(
        self,
        root: str | os.PathLike[str],
        *,
        cluster_name: str = "tether",
        partition: str = "debug",
        cpus: int | None = None,
        real_memory_mb: int | None = None,
        def_mem_per_cpu_mb: int = 100,
        cred_expire: int = 10,
        start_timeout: float = 30.0,
        nodes: Nodes | None = None,
    ) -> None:
        if cred_expire < 5:
            # slurm ignores smaller values ("AuthInfo=cred_expire=3 invalid") and uses 120
            raise ValueError(f"cred_expire must be at least 5 seconds, not {cred_expire}")
        self.root = Path(root).resolve()
        self.cluster_name = cluster_name
        self.partition = partition
        self.nodename = short_hostname()
        #: the namespaces the nodes run in (None: one node, this host, as before)
        self.nodes = nodes
        #: the Slurm nodes' names (``node0``.. with ``nodes``; else this host's name)
        self.nodenames = [f"node{k}" for k in range(len(nodes.names))] if nodes else [self.nodename]
        self.cpus = cpus
        self.real_memory_mb = real_memory_mb
        self.def_mem_per_cpu_mb = def_mem_per_cpu_mb
        self.cred_expire = cred_expire
        self.start_timeout = start_timeout
        self.conf_path = self.root / "slurm.conf"
        self.munge_socket = self.root / "munge" / "munge.sock"
        self.ctld_port = 0
        self.slurmd_port = 0
        self.start_seconds: float | None = None
        self._procs: dict[str, subprocess.Popen[bytes]] = {}
        self._logs: list[Path] = []

    # -- public API ----------------------------------------------------------------------------

    @property
    def env(self) -> dict[str, str]:
        """Variables to merge into a client's environment so it talks to this cluster."""
        return {"SLURM_CONF": str(self.conf_path)}

    @property
    def pids(self) -> dict[str, int]:
        """PIDs of the daemons this cluster started (``munged``, ``slurmctld``, ``slurmd``; with
        several nodes ``slurmd-node0``, ``slurmd-node1``, ...)."""
        return {name: p.pid for name, p in self._procs.items()}

    def client_env(self) -> dict[str, str]:
        """``os.environ`` without inherited Slurm client settings, plus :attr:`env`."""
        base = {k: v for k, v in os.environ.items() if not k.startswith(_CLIENT_ENV_PREFIXES)}
        return {**base, **self.env}

    def run(self, *argv: str, check: bool = True, timeout: float = 30.0) -> str:
        """Run a Slurm client command (``sbatch``, ``squeue``, ...) against this cluster.

        Returns stdout. Raises :class:`SlurmCommandError` on a non-zero exit when ``check``.
        """
        args = list(argv)
        exe = find_binary(args[0])
        if exe is not None:
            args[0] = exe
        proc = subprocess.run(
            args,
            env=self.client_env(),
            capture_output=True,
            text=True,
            timeout=timeout,
            check=False,
        )
        if check and proc.returncode != 0:
            raise SlurmCommandError(list(argv), proc.returncode, proc.stdout, proc.stderr)
        return proc.stdout

    def job_info(self, job_id: str | int) -> dict[str, str] | None:
        """``scontrol show job`` as a dict, or None once Slurm has forgotten the job."""
        try:
            out = self.run("scontrol", "-o", "show", "job", str(job_id))
        except SlurmCommandError as e:
            if "Invalid job id" in e.stderr:
                return None
            raise
        line = out.strip().splitlines()[0] if out.strip() else ""
        return parse_scontrol_record(line) if line else None

    def job_state(self, job_id: str | int) -> str | None:
        """The job's ``JobState`` (``PENDING``, ``RUNNING``, ``COMPLETED``, ...), or None."""
        info = self.job_info(job_id)
        return info.get("JobState") if info else None

    def wait_job_state(
        self, job_id: str | int, states: Iterable[str], timeout: float = 30.0
    ) -> dict[str, str]:
        """Poll until the job's state is one of ``states``; return its ``scontrol`` record."""
        wanted = set(states)
        deadline = time.monotonic() + timeout
        last: dict[str, str] | None = None
        while True:
            last = self.job_info(job_id)
            if last is not None and last.get("JobState") in wanted:
                return last
            if time.monotonic() > deadline:
                seen = last.get("JobState") if last else "unknown to slurmctld"
                raise TimeoutError(
                    f"job {job_id} not in {sorted(wanted)} after {timeout:.0f}s (state: {seen})"
                )
            time.sleep(0.2)

    def log_tail(self, lines: int = 40) -> str:
        """The last ``lines`` lines of every daemon log and captured output, for error messages."""
        chunks = []
        for path in self._logs:
            if path.is_file():
                text = path.read_text(errors="replace").splitlines()[-lines:]
                chunks.append(f"--- {path.name} ---\n" + "\n".join(text))
        return "\n".join(chunks) or "(no daemon logs)"

    # -- lifecycle -----------------------------------------------------------------------------

    def __enter__(self) -> SlurmCluster:
        self.start()
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.stop()

    def start(self) -> None:
        """Start munged, slurmctld and slurmd; return once the node is ``idle``.

        Raises RuntimeError (with the daemons' log tails) if the cluster does not come up within
        ``start_timeout`` seconds; whatever was started is stopped again first.
        """
        if self._procs:
            raise RuntimeError("SlurmCluster already started")
        reason = slurm_available()
        if reason:
            raise RuntimeError(reason)
        t0 = time.monotonic()
        deadline = t0 + self.start_timeout
        try:
            self._start_munged(deadline)
            self._write_config()
            self._spawn("slurmctld", ["slurmctld", "-D", "-f", str(self.conf_path)])
            self._wait_for(self._ctld_up, deadline, "slurmctld to answer 'scontrol ping'")
            if self.nodes is None:
                self._spawn(
                    "slurmd", ["slurmd", "-D", "-f", str(self.conf_path), "-N", self.nodename]
                )
            else:
                for k, name in enumerate(self.nodenames):
                    (self.root / f"spool-{name}").mkdir(exist_ok=True, mode=0o700)
                    argv = ["slurmd", "-D", "-f", str(self.conf_path), "-N", name]
                    # only the network namespace: `ip netns exec` remounts /sys, and slurmd
                    # wants the cgroup mounts under it
                    enter = ["nsenter", f"--net=/run/netns/{self.nodes.names[k]}"]
                    self._spawn(f"slurmd-{name}", argv, prefix=enter)
            for name in self.nodenames:
                self._wait_for(
                    lambda name=name: self._node_idle(name), deadline, f"node {name} to become idle"
                )
        except BaseException as e:
            tail = self.log_tail()
            self.stop()
            if isinstance(e, RuntimeError | subprocess.SubprocessError | OSError):
                raise RuntimeError(f"Slurm test cluster failed to start: {e}\n{tail}") from e
            raise
        self.start_seconds = time.monotonic() - t0

    def stop(self) -> None:
        """Cancel leftover jobs, then stop the daemons by PID. Idempotent."""
        procs, self._procs = self._procs, {}
        if not procs:
            return
        slurmds = [name for name in procs if name.startswith("slurmd")]
        if _alive(procs.get("slurmctld")) and slurmds and all(_alive(procs[n]) for n in slurmds):
            with contextlib.suppress(Exception):
                self._cancel_all_jobs()
        for name in (*slurmds, "slurmctld"):
            if name in procs:
                _terminate(procs[name])
        self._kill_stray_job_processes()
        if "munged" in procs:
            _terminate(procs["munged"])

    # -- internals -----------------------------------------------------------------------------

    def _add_log(self, path: Path) -> None:
        if path not in self._logs:
            self._logs.append(path)

    def _spawn(
        self, name: str, argv: list[str], prefix: Sequence[str] = ()
    ) -> subprocess.Popen[bytes]:
        exe = find_binary(argv[0])
        if exe is None:
            raise RuntimeError(f"{argv[0]} not found")
        out = self.root / "log" / f"{name}.stderr"
        self._add_log(out)
        with out.open("ab") as f:
            proc = subprocess.Popen(
                [*prefix, exe, *argv[1:]],
                stdin=subprocess.DEVNULL,
                stdout=f,
                stderr=subprocess.STDOUT,
                env=self.client_env(),
                start_new_session=True,  # a ^C in the test run reaches us, not the daemons
            )
        self._procs[name] = proc
        return proc

    def _start_munged(self, deadline: float) -> None:
        for sub in ("log", "run", "state", "spool"):
            (self.root / sub).mkdir(parents=True, exist_ok=True, mode=0o700)
        munge_dir = self.root / "munge"
        # munged warns unless everyone may traverse to its socket; the key itself stays 0400
        munge_dir.mkdir(exist_ok=True, mode=0o755)
        key = munge_dir / "munge.key"
        if not key.exists():
            fd = os.open(key, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o400)
            with os.fdopen(fd, "wb") as f:
                f.write(os.urandom(1024))
        log = self.root / "log" / "munged.log"
        self._add_log(log)
        self._spawn(
            "munged",
            [
                "munged",
                "--foreground",  # stays our child: stopped by PID; logs go to stderr
                "--force",  # root, and tolerate group-writable temp dirs / a stale socket
                f"--key-file={key}",
                f"--socket={self.munge_socket}",
                f"--pid-file={self.root / 'run' / 'munged.pid'}",
                f"--log-file={log}",
                f"--seed-file={munge_dir / 'munged.seed'}",
            ],
        )
        self._wait_for(self.munge_socket.exists, deadline, "munged to create its socket")

    def _node_resources(self) -> tuple[int, int]:
        cpus, mem = self.cpus, self.real_memory_mb
        if cpus is None or mem is None:
            probed: dict[str, str] = {}
            exe = find_binary("slurmd")
            if exe is not None:
                with contextlib.suppress(subprocess.SubprocessError, OSError):
                    out = subprocess.run(
                        [exe, "-C"], capture_output=True, text=True, timeout=15, check=False
                    ).stdout
                    probed = parse_scontrol_record(out.splitlines()[0] if out else "")
            if cpus is None:
                cpus = int(probed.get("CPUs") or os.cpu_count() or 1)
            if mem is None:
                mem = int(probed.get("RealMemory") or 1024)
        return cpus, mem

    def _write_config(self) -> None:
        self.ctld_port = free_tcp_port()
        self.slurmd_port = free_tcp_port()
        while self.slurmd_port == self.ctld_port:
            self.slurmd_port = free_tcp_port()
        cpus, mem = self._node_resources()
        r, log, run = self.root, self.root / "log", self.root / "run"
        self._add_log(log / "slurmctld.log")
        if self.nodes is None:
            self._add_log(log / "slurmd.log")
            ctld_addr = "127.0.0.1"
            node_lines = [
                f"NodeName={self.nodename} NodeAddr=127.0.0.1 NodeHostname={self.nodename} "
                f"CPUs={cpus} RealMemory={mem} State=UNKNOWN"
            ]
        else:
            for name in self.nodenames:
                self._add_log(log / f"slurmd-{name}.log")
            ctld_addr = self.nodes.bridge_address  # what the namespaces reach this one at
            node_lines = [
                f"NodeName={name} NodeAddr={addr} NodeHostname={self.nodename} "
                f"CPUs={cpus} RealMemory={mem} State=UNKNOWN"
                for name, addr in zip(self.nodenames, self.nodes.addresses, strict=True)
            ]
        # several slurmd: each its own spool, pid and log file (%n: its node's name)
        per_node = "-%n" if self.nodes is not None else ""
        lines = [
            f"ClusterName={self.cluster_name}",
            # The address in brackets spares us a resolvable hostname (containers often lack one).
            f"SlurmctldHost={self.nodename}({ctld_addr})",
            f"SlurmctldPort={self.ctld_port}",
            f"SlurmdPort={self.slurmd_port}",
            "AuthType=auth/munge",
            "CredType=cred/munge",
            # socket= applies to auth/munge and cred/munge; cred_expire also delays requeued jobs
            f"AuthInfo=socket={self.munge_socket},cred_expire={self.cred_expire}",
            "SlurmUser=root",
            "SlurmdUser=root",
            f"StateSaveLocation={r / 'state'}",
            f"SlurmdSpoolDir={r / 'spool'}{per_node}",
            f"SlurmctldPidFile={run / 'slurmctld.pid'}",
            f"SlurmdPidFile={run / 'slurmd'}{per_node}.pid",
            f"SlurmctldLogFile={log / 'slurmctld.log'}",
            f"SlurmdLogFile={log / 'slurmd'}{per_node}.log",
            "SlurmctldDebug=info",
            "SlurmdDebug=info",
            # no cgroups: works in containers and without systemd
            "ProctrackType=proctrack/linuxproc",
            "TaskPlugin=task/none",
            "JobAcctGatherType=jobacct_gather/none",
            "AccountingStorageType=accounting_storage/none",
            "MpiDefault=none",
            "MailProg=/bin/true",
            "SelectType=select/cons_tres",
            "SelectTypeParameters=CR_Core_Memory",
            "SchedulerType=sched/backfill",
            # start jobs whose BeginTime passed (e.g. requeued ones) within ~1 s, not 30-60 s
            "SchedulerParameters=sched_interval=1,bf_interval=1",
            "SlurmdParameters=config_overrides",
            "ReturnToService=2",
            "MinJobAge=300",
            "JobRequeue=1",
            "KillWait=5",
            f"DefMemPerCPU={self.def_mem_per_cpu_mb}",
            *node_lines,
            f"PartitionName={self.partition} Nodes={','.join(self.nodenames)} Default=YES "
            "MaxTime=INFINITE State=UP",
        ]
        self.conf_path.write_text("\n".join(lines) + "\n")

    def _ctld_up(self) -> bool:
        out = self.run("scontrol", "ping", check=False, timeout=10)
        return "is UP" in out

    def _node_idle(self, name: str) -> bool:
        state = self.run("sinfo", "-h", "-N", "-n", name, "-o", "%T", check=False, timeout=10)
        state = state.strip()
        if state in ("idle", "mixed", "allocated"):
            return True
        if state.startswith(("down", "drain")):
            self.run("scontrol", "update", f"nodename={name}", "state=resume", check=False)
        return False

    def _wait_for(self, ready: Callable[[], bool], deadline: float, what: str) -> None:
        while True:
            for name, proc in self._procs.items():
                if proc.poll() is not None:
                    raise RuntimeError(
                        f"{name} exited with {proc.returncode} while waiting for {what}"
                    )
            if ready():
                return
            if time.monotonic() > deadline:
                raise RuntimeError(f"timed out after {self.start_timeout:g}s waiting for {what}")
            time.sleep(0.1)

    def _cancel_all_jobs(self) -> None:
        ids = self.run("squeue", "-h", "-o", "%i", timeout=10).split()
        if not ids:
            return
        self.run("scancel", *ids, check=False, timeout=10)
        deadline = time.monotonic() + _STOP_GRACE_S
        while time.monotonic() < deadline:
            states = self.run("squeue", "-h", "-o", "%T", timeout=10).split()
            if not states:
                return
            time.sleep(0.2)

    def _kill_stray_job_processes(self) -> None:
        """SIGKILL job processes of this cluster that outlived slurmd, and their slurmstepd."""
        marker = f"SLURM_CONF={self.conf_path}".encode()
        victims: set[int] = set()
        for entry in Path("/proc").iterdir():
            if not entry.name.isdigit() or int(entry.name) == os.getpid():
                continue
            try:
                environ = (entry / "environ").read_bytes().split(b"\0")
                if marker not in environ or not any(
                    v.startswith(b"SLURM_JOB_ID=") for v in environ
                ):
                    continue
                victims.add(int(entry.name))
                ppid = int((entry / "stat").read_text().rsplit(")", 1)[1].split()[1])
                parent_cmd = Path(f"/proc/{ppid}/cmdline").read_bytes()
                if parent_cmd.startswith(b"slurmstepd"):
                    victims.add(ppid)
            except (OSError, ValueError, IndexError):
                continue
        for pid in victims:
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.kill(pid, signal.SIGKILL)


def _alive(proc: subprocess.Popen[bytes] | None) -> bool:
    return proc is not None and proc.poll() is None


def _terminate(proc: subprocess.Popen[bytes], grace: float = _STOP_GRACE_S) -> None:
    """SIGTERM, wait up to ``grace`` seconds, then SIGKILL; reaps the process."""
    if proc.poll() is not None:
        return
    with contextlib.suppress(ProcessLookupError):
        proc.send_signal(signal.SIGTERM)
    try:
        proc.wait(timeout=grace)
    except subprocess.TimeoutExpired:
        with contextlib.suppress(ProcessLookupError):
            proc.kill()
        proc.wait()
