"""Who a run's program runs as: on a worker that serves more than one user, an OS user of its own.

Theory of operation
-------------------
A program runs with the rights of its process's uid, whatever is taken out of its environment: as
the worker's uid it can read the worker's ``/proc/PID/environ`` and memory (the worker's token),
its configuration and its store's socket, and every other run's files and processes. So a worker
that runs as root (a pool on a shared GPU node, as ``slurmd`` runs) runs each run's program, and
the commands users run in it (``tether exec``/``shell``), as a uid of the run's own (all its
attempts there), leased from a range no account uses (:data:`DEFAULT_UIDS`;
``worker_shim/program/uid_leases.py``), with a group of the same number and no other: the kernel
then keeps it out of everything the worker and the other runs have. Why uids rather than user
namespaces: a process in a user namespace keeps its uid outside it, and so its rights over the
worker's processes; a separate uid is what the kernel checks everywhere (files, ``/proc``, ptrace,
signals, sockets' owners), needs no namespace support, and lets the GPU device files work as they do
for any user.

What such a program can reach: its run directory (its own, mode 0700), a home and a temporary
directory of its own (``HOME``, ``TMPDIR``), what any user of the host can (an interpreter on
``PATH``, world-readable files, the network), and tether's debugger runtime, which the worker
publishes read-only (:class:`Runtime`): debugpy and the scripts tether puts in the program. What it
cannot: the worker's environment, memory, files and credentials, the store's socket, another run's
directory, environment or processes, and the debugger ports of another run (``_tether_guard.py``).
Its environment is the run's plus the worker's non-secret system variables (:data:`PASSED_ENV`),
never the worker's whole environment.

A worker that is not root cannot give a program another uid: its programs run as itself, so it
serves only its own user's runs (:attr:`Isolation.own_only`) unless its operator accepts the risk
(``--any-user``; ``SECURITY.md``). It says which at start (:meth:`Isolation.describe`).
"""

from __future__ import annotations

import fnmatch
import hashlib
import os
import shutil
import stat
import sys
import sysconfig
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from ..inject import SCRIPTS

__all__ = [
    "DEFAULT_RUNS_ROOT",
    "DEFAULT_UIDS",
    "PASSED_ENV",
    "UNREACHABLE_HINT",
    "Isolation",
    "ProgramUser",
    "Runtime",
    "parse_uids",
    "passed_env",
    "search_path",
    "spawn_options",
]

#: the uids a root worker leases to runs' programs by default (no account, no process may use one)
DEFAULT_UIDS = range(60000, 61000)
#: where a root worker keeps its runs' directories: every directory on the way must be reachable by
#: the programs' uids (a data directory under ``/root`` is not), so not in the worker's own
DEFAULT_RUNS_ROOT = Path("/var/lib/tether/runs")
#: the worker's environment variables an isolated program gets (the rest may be the operator's)
PASSED_ENV = (
    "PATH", "LANG", "LANGUAGE", "LC_*", "TZ", "TERM", "LD_LIBRARY_PATH", "CUDA_*", "NVIDIA_*",
    "NCCL_*", "OMP_NUM_THREADS", "MKL_NUM_THREADS", "SSL_CERT_FILE", "SSL_CERT_DIR",
    "REQUESTS_CA_BUNDLE", "http_proxy", "https_proxy", "no_proxy", "HTTP_PROXY", "HTTPS_PROXY",
    "NO_PROXY", "PYTHONUNBUFFERED", "PYTHONDONTWRITEBYTECODE", "PYTHONHASHSEED", "PYTHONIOENCODING",
)  # fmt: skip


@dataclass(frozen=True)
class ProgramUser:
    """The uid (and group of the same number) an attempt's processes run as."""

    uid: int

    @property
    def gid(self) -> int:
        return self.uid

    @property
    def name(self) -> str:
        """What ``USER`` and ``LOGNAME`` say (the uid has no account)."""
        return f"tether-{self.uid}"

    def can_run(self, path: str | os.PathLike[str]) -> bool:
        """Whether this user may execute the file ``path``: every directory on its way (links
        followed from where they are) searchable by it, the file executable by it. Decided from
        the permission bits: the uid is in no group but its own, so they say it all (save ACLs
        naming it, which nobody writes)."""
        return _usable(Path(path), self.uid, self.gid, need=0o1, directory=False)

    def can_read(self, path: str | os.PathLike[str]) -> bool:
        """Whether this user may read the file ``path`` (as :meth:`can_run`)."""
        return _usable(Path(path), self.uid, self.gid, need=0o4, directory=False)

    def can_enter(self, path: str | os.PathLike[str]) -> bool:
        """Whether this user may reach the directory ``path`` and search it."""
        return _usable(Path(path), self.uid, self.gid, need=0o1, directory=True)


#: what a program that its uid may not start is told to do
UNREACHABLE_HINT = (
    "this worker runs each program as a uid of its own, which may not go where the worker's "
    "user keeps it (a directory under /root, say): use an interpreter every user may run "
    "(/usr/bin/python3, /opt/conda/bin/python...), or, on a machine that is yours alone, start "
    "the worker with --no-isolation"
)


def spawn_options(user: ProgramUser | None) -> dict[str, Any]:
    """What ``subprocess.Popen`` (and trio's ``open_process``) takes to start a process as
    ``user`` (nothing: as the worker)."""
    if user is None:
        return {}
    return {"user": user.uid, "group": user.gid, "extra_groups": []}


def _usable(path: Path, uid: int, gid: int, *, need: int, directory: bool) -> bool:
    end = _lookup(Path(os.path.abspath(path)), uid, gid, 0)
    if end is None:
        return False
    try:
        st = end.stat()
    except OSError:
        return False
    if directory != stat.S_ISDIR(st.st_mode):
        return False
    return _allows(st, uid, gid, need)


def _lookup(path: Path, uid: int, gid: int, links: int) -> Path | None:
    """Walk ``path`` as the kernel would for ``uid``: each directory searched must let it search,
    each link is followed from where it is; the path reached, or ``None`` if the walk is refused."""
    current = Path(path.anchor)
    parts = path.parts[1:]
    for i, part in enumerate(parts):
        try:
            if not _allows(current.stat(), uid, gid, 0o1):
                return None
        except OSError:
            return None
        step = current / part
        if step.is_symlink():
            if links >= 40:
                return None
            target = Path(os.path.normpath(current / os.readlink(step)))
            return _lookup(Path(target, *parts[i + 1 :]), uid, gid, links + 1)
        current = step
    return current


def _allows(st: os.stat_result, uid: int, gid: int, bit: int) -> bool:
    if st.st_uid == uid:
        return bool(st.st_mode & (bit << 6))
    if st.st_gid == gid:
        return bool(st.st_mode & (bit << 3))
    return bool(st.st_mode & bit)


def search_path(env: dict[str, str], user: ProgramUser | None) -> str:
    """``env``'s ``PATH`` as ``user`` searches it: without the directories it may not enter
    (where it would find nothing it can run)."""
    path = env.get("PATH", os.defpath)
    if user is None:
        return path
    return os.pathsep.join(d for d in path.split(os.pathsep) if d and user.can_enter(d))


def passed_env(inherited: dict[str, str]) -> dict[str, str]:
    """The worker's variables an isolated program gets (:data:`PASSED_ENV`)."""
    return {
        name: value
        for name, value in inherited.items()
        if any(fnmatch.fnmatchcase(name, pattern) for pattern in PASSED_ENV)
    }


def parse_uids(text: str) -> range:
    """``60000-60999`` as a range; ``ValueError`` says what is wrong with it."""
    first, dash, last = text.partition("-")
    if not (dash and first.strip().isdecimal() and last.strip().isdecimal()):
        raise ValueError(f"{text!r} is not a range of uids (example: 60000-60999)")
    low, high = int(first), int(last)
    if not 1000 <= low <= high < 2**31 - 1:
        raise ValueError(f"{text!r}: uids from 1000 on, the first not after the last")
    if low <= 65534 <= high:
        raise ValueError(f"{text!r} includes 65534 (nobody)")
    return range(low, high + 1)


@dataclass(frozen=True)
class Isolation:
    """A worker's rule for whom its programs run as, decided when it starts."""

    #: the uids leased to programs; ``None``: programs run as the worker's own user
    uids: range | None = None
    #: where run directories go when programs have uids of their own (``None``: the work dir's)
    runs_root: Path | None = None
    #: a worker whose programs run as itself serves one tether user's runs only
    own_only: bool = False
    #: that user (``""``: the user of the worker's token, known once it reached the relay)
    owner: str = ""

    @classmethod
    def decide(
        cls,
        *,
        user: str = "",
        uids: range | None = None,
        runs_root: Path | None = None,
        isolate: bool | None = None,
        any_user: bool = False,
    ) -> Isolation:
        """The rule for a worker that serves ``user`` (``""``: its token's user): programs under
        uids of their own when it runs as root (unless ``isolate`` is False), else as itself,
        serving ``user``'s runs only unless ``any_user``. ``isolate=True`` where it cannot be
        done is a ``ValueError``."""
        root = hasattr(os, "geteuid") and os.geteuid() == 0
        if isolate and not root:
            raise ValueError(
                "programs can run as uids of their own only when the worker runs as root "
                f"(it runs as uid {os.geteuid()})"
            )
        if isolate is None:
            isolate = root and sys.platform.startswith("linux")
        if isolate:
            return cls(
                uids=uids or DEFAULT_UIDS,
                runs_root=runs_root
                or Path(os.environ.get("TETHER_RUNS_ROOT") or DEFAULT_RUNS_ROOT),
            )
        return cls(own_only=not any_user, owner=user)

    @property
    def isolating(self) -> bool:
        return self.uids is not None

    def runs_dir(self, work_dir: Path) -> Path:
        """Where this worker's run directories and logs go: ``work_dir/runs``, or (isolating) a
        directory of its own under the runs root, reachable (not readable) by any uid."""
        if self.runs_root is None:
            return work_dir / "runs"
        key = hashlib.sha256(str(work_dir.resolve()).encode()).hexdigest()[:16]
        return self.runs_root / key

    def describe(self) -> str:
        """One line for the worker's start: whom its programs run as, and whose runs it serves."""
        if self.uids is not None:
            return (
                f"each run's program runs as a uid of its own ({self.uids.start}-"
                f"{self.uids.stop - 1}), its directory under {self.runs_root}"
            )
        me = os.geteuid() if hasattr(os, "geteuid") else "?"
        if self.own_only:
            whose = f"{self.owner}'s" if self.owner else "its token's user's"
            return (
                f"programs run as this worker's own user (uid {me}), which cannot keep one "
                f"user's program from another's: it runs only {whose} runs (run it as root to "
                "give each program a uid of its own, or pass --any-user: SECURITY.md)"
            )
        return (
            f"programs run as this worker's own user (uid {me}), every user's (--any-user): "
            "each program can read the others' and the worker's (SECURITY.md)"
        )

    def refusal(self, owner: str, token_user: str) -> str | None:
        """Why a run of ``owner``'s is not run here (``token_user``: whose token the worker
        holds), or ``None``."""
        me = self.owner or token_user
        if not self.own_only or owner == me:
            return None
        return (
            f"this worker runs programs as its own OS user and so runs only {me}'s runs (a "
            "program of another user's could read theirs); its operator can run it as root "
            "(each program then gets a uid of its own) or pass --any-user (see SECURITY.md)"
        )


#: tether's files a program loads, besides debugpy (``python_command``, ``metrics``)
_SCRIPTS = (
    "_tether_debugpy_boot.py",
    "_tether_debugpy_adapter.py",
    "_tether_breakpoint.py",
    "_tether_collectives.py",
    "_tether_guard.py",
    "_tether_launch.py",
    "_tether_sitecustomize.py",
    "_tether_values.py",
)


@dataclass(frozen=True)
class Runtime:
    """Where a program finds tether's debugger runtime: the boot script and its siblings, the
    ``tether`` module programs import, and the worker's ``debugpy`` package."""

    scripts: Path  #: the directory of the ``_tether_*.py`` scripts
    user_module: Path  #: ``tether.py``
    debugpy: Path  #: the ``debugpy`` package's directory
    #: the ``py-spy`` binary (``tether stacks``), None where it is not installed
    pyspy: Path | None = None

    @classmethod
    def installed(cls) -> Runtime:
        """The worker's own files, where they are installed."""
        import debugpy

        return cls(
            scripts=SCRIPTS,
            user_module=Path(__file__).resolve().parents[2] / "tether.py",
            debugpy=Path(debugpy.__file__).resolve().parent,
            pyspy=_installed_pyspy(),
        )

    def script(self, name: str) -> Path:
        return self.scripts / name

    def publish(self, root: Path) -> Runtime:
        """A read-only copy under ``root`` that every uid can read (made once per version of the
        runtime; kept), for programs that cannot reach where the worker is installed."""
        tag = self._tag()
        final = root / ".runtime" / tag
        if (final / "ready").is_file():
            return self._at(final)
        _reachable_dir(root / ".runtime")
        building = root / ".runtime" / f".{tag}.{os.getpid()}"
        shutil.rmtree(building, ignore_errors=True)
        building.mkdir(mode=0o755)
        scripts = building / "scripts"
        scripts.mkdir(mode=0o755)
        for name in _SCRIPTS:
            shutil.copyfile(self.script(name), scripts / name)
        shutil.copyfile(self.user_module, building / "tether.py")
        shutil.copytree(self.debugpy, building / "debugpy", symlinks=True)
        if self.pyspy is not None:
            (building / "bin").mkdir(mode=0o755)
            shutil.copyfile(self.pyspy, building / "bin" / "py-spy")
            os.chmod(building / "bin" / "py-spy", 0o755)
        for where, dirs, files in os.walk(building):
            for name in dirs:
                os.chmod(os.path.join(where, name), 0o755)
            for name in files:
                path = os.path.join(where, name)
                if not os.path.islink(path):
                    os.chmod(path, 0o755 if os.access(path, os.X_OK) else 0o644)
        (building / "ready").touch(mode=0o644)
        try:
            os.rename(building, final)
        except OSError:  # another worker published the same version meanwhile
            shutil.rmtree(building, ignore_errors=True)
        return self._at(final)

    def _at(self, place: Path) -> Runtime:
        pyspy = place / "bin" / "py-spy"
        return Runtime(
            scripts=place / "scripts",
            user_module=place / "tether.py",
            debugpy=place / "debugpy",
            pyspy=pyspy if pyspy.is_file() else None,
        )

    def _tag(self) -> str:
        digest = hashlib.sha256()
        for path in [*(self.script(n) for n in _SCRIPTS), self.user_module]:
            digest.update(path.read_bytes())
        import debugpy

        if self.pyspy is not None:  # a copy made before py-spy was there is not this runtime
            digest.update(b"py-spy %d" % self.pyspy.stat().st_size)
        return f"debugpy-{debugpy.__version__}-{digest.hexdigest()[:16]}"


def _installed_pyspy() -> Path | None:
    """The ``py-spy`` binary installed beside this Python (its scripts directory), else on PATH."""
    beside = Path(sysconfig.get_path("scripts")) / "py-spy"
    if beside.is_file():
        return beside
    found = shutil.which("py-spy")
    return Path(found) if found else None


def _reachable_dir(path: Path) -> None:
    """``path`` and its missing parents, made by this (root) worker: searchable by every uid,
    listable by none but root (0711)."""
    missing = []
    for place in [path, *path.parents]:
        if place.is_dir():
            break
        missing.append(place)
    for place in reversed(missing):
        place.mkdir(mode=0o711, exist_ok=True)
    os.chmod(path, 0o711)
