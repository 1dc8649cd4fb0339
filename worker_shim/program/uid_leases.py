"""Uids leased to runs' programs, host-wide, and the end of every process of one.

Theory of operation
-------------------
A root worker gives each run a uid of its own from a range (``worker_shim/program/identity.py``),
the same for all its attempts there (a retry may use what the attempt before it left, in a mounted
directory). The uid owns the run's attempt directories for as long as one is kept (the pool's
tunnels are served there after the run ended), so the lease lasts as long: it is a file
``<leases>/<uid>`` naming the worker's runs directory and the run, created with ``O_EXCL`` (two
workers of the host never take one uid), and removed when the run's last directory is
(:meth:`UidLeases.release`). A uid is taken, and never leased, when an account has it, when a
process runs as it (real, effective, saved or filesystem uid), or when a lease names a run with a
directory still there; a lease whose directories are gone, with no process of its uid left, is
stale: a worker that crashed before tidying. Which uid to take among the free ones is
:func:`pick` (sans-I/O): the next after a random point, so that a uid just released is not the
next one leased (what its program may have left in world-writable places is removed on release,
but a new program need not meet what was missed).

Ending every process of a uid (:func:`reap`) needs no list of them: a process running as that uid
that calls ``kill(-1, SIGKILL)`` kills every process of it but itself (Linux: in one pass with the
task list locked, so nothing forks its way out), whatever sessions, groups or parents they have.
It is ``sh -c 'kill -KILL -1'`` started as the uid (``/bin/sh`` is on every host; the worker's
interpreter may not be usable by the uid), repeated until ``/proc`` lists none of it.

Plain filesystem and ``/proc`` work, synchronous: the worker runs it in a thread.
"""

from __future__ import annotations

import contextlib
import os
import pwd
import random
import shutil
import subprocess
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path

from .identity import ProgramUser, spawn_options

__all__ = ["Lease", "UidLeases", "pick", "processes_of", "reap", "remove_leftovers"]

#: world-writable places a program may leave files in that outlive it
SHARED_PLACES = (Path("/tmp"), Path("/var/tmp"), Path("/dev/shm"))
#: how many rounds of ``kill -1`` a reap tries before it gives up (a process stuck in the kernel)
REAP_ROUNDS = 50


def pick(uids: range, taken: set[int], start: int) -> int | None:
    """The first uid of ``uids`` from index ``start`` on (wrapping round) that is not ``taken``."""
    count = len(uids)
    for step in range(count):
        uid = uids[(start + step) % count]
        if uid not in taken:
            return uid
    return None


def processes_of(uids: Iterable[int] | None = None) -> dict[int, list[int]]:
    """The pids running as each uid (any of real, effective, saved, filesystem), from ``/proc``;
    only the uids asked for (``None``: all). Zombies are not counted."""
    wanted = None if uids is None else set(uids)
    found: dict[int, list[int]] = {}
    try:
        names = os.listdir("/proc")
    except OSError:
        return found
    for name in names:
        if not name.isdigit():
            continue
        try:
            with open(f"/proc/{name}/status") as f:
                status = f.read()
        except OSError:
            continue
        if "\nState:\tZ" in status:  # a zombie runs nothing: its parent has yet to wait for it
            continue
        line = next((ln for ln in status.splitlines() if ln.startswith("Uid:")), "")
        for uid in {int(w) for w in line.split()[1:] if w.isdigit()}:
            if wanted is None or uid in wanted:
                found.setdefault(uid, []).append(int(name))
    return found


def reap(user: ProgramUser) -> bool:
    """Kill every process running as ``user``; whether none is left."""
    for _ in range(REAP_ROUNDS):
        if not processes_of([user.uid]):
            return True
        with contextlib.suppress(OSError, subprocess.SubprocessError):
            subprocess.run(
                ["/bin/sh", "-c", "kill -KILL -1 2>/dev/null; exit 0"],
                stdin=subprocess.DEVNULL,
                stdout=subprocess.DEVNULL,
                stderr=subprocess.DEVNULL,
                timeout=10,
                check=False,
                **spawn_options(user),
            )
    return not processes_of([user.uid])


def remove_leftovers(user: ProgramUser, places: Iterable[Path] = SHARED_PLACES) -> list[Path]:
    """Remove what ``user`` left at the top of world-writable places (files, directories, POSIX
    shared memory in ``/dev/shm``); what was removed. Deleting trees of theirs is safe as root:
    ``shutil.rmtree`` never follows a link."""
    removed = []
    for place in places:
        try:
            entries = list(os.scandir(place))
        except OSError:
            continue
        for entry in entries:
            try:
                if entry.stat(follow_symlinks=False).st_uid != user.uid:
                    continue
                if entry.is_dir(follow_symlinks=False):
                    shutil.rmtree(entry.path)
                else:
                    os.unlink(entry.path)
                removed.append(Path(entry.path))
            except OSError:
                continue
    return removed


@dataclass(frozen=True)
class Lease:
    """Whose a leased uid is: the run ``run`` of the worker whose run directories are in
    ``runs_dir`` (its attempts there: ``<runs_dir>/<run>-<attempt>``)."""

    runs_dir: Path
    run: str

    @classmethod
    def of(cls, run_dir: Path) -> Lease:
        """The lease an attempt's directory ``<runs_dir>/<run>-<attempt>`` comes under."""
        return cls(run_dir.parent, run_dir.name.rpartition("-")[0] or run_dir.name)

    def directories(self) -> list[Path]:
        """The run's attempts' directories still there."""
        try:
            return [
                p for p in self.runs_dir.glob(f"{self.run}-*")
                if p.name.rpartition("-")[2].isdigit() and p.is_dir() and not p.is_symlink()
            ]  # fmt: skip
        except OSError:
            return []

    def text(self) -> str:
        return f"{self.runs_dir}\n{self.run}\n"

    @classmethod
    def parse(cls, text: str) -> Lease | None:
        lines = text.splitlines()
        if len(lines) != 2 or not lines[1] or not os.path.isabs(lines[0]):
            return None
        return cls(Path(lines[0]), lines[1])


class UidLeases:
    """The leases of ``uids`` kept in the directory ``where`` (made 0700 here: root's only). A
    run keeps one uid for all its attempts on the worker, so that an attempt may use what the one
    before it left (in a mounted directory, say)."""

    def __init__(self, where: Path, uids: range) -> None:
        self.where = where
        self.uids = uids

    def __repr__(self) -> str:
        return f"<UidLeases {self.uids.start}-{self.uids.stop - 1} in {self.where}>"

    def _file(self, uid: int) -> Path:
        return self.where / str(uid)

    def holder(self, uid: int) -> Lease | None:
        """Whose ``uid``'s lease is, or ``None`` (no lease)."""
        try:
            return Lease.parse(self._file(uid).read_text())
        except (OSError, ValueError):
            return None

    def leased(self) -> list[tuple[ProgramUser, Lease]]:
        """Every lease of the range kept here."""
        try:
            names = os.listdir(self.where)
        except OSError:
            return []
        found = []
        for name in sorted(names):
            if name.isdigit() and int(name) in self.uids:
                holder = self.holder(int(name))
                if holder is not None:
                    found.append((ProgramUser(int(name)), holder))
        return found

    def lease(self, run_dir: Path) -> ProgramUser:
        """The uid of the attempt whose directory is ``run_dir``: its run's, if an attempt before
        had one here, else a free one; ``RuntimeError`` when every uid of the range is taken."""
        self.where.mkdir(mode=0o700, parents=True, exist_ok=True)
        wanted = Lease.of(run_dir)
        for user, holder in self.leased():
            if holder == wanted:
                return user
        for _ in range(8):  # another worker may take the one picked: pick again
            running = processes_of(self.uids)
            taken = set(running) | _accounts()
            for user, other in self.leased():
                if other.directories() or user.uid in running:
                    taken.add(user.uid)
            chosen = pick(self.uids, taken, random.randrange(len(self.uids)))
            while chosen is not None and _has_account(chosen):  # one NSS does not enumerate
                taken.add(chosen)
                chosen = pick(self.uids, taken, random.randrange(len(self.uids)))
            if chosen is None:
                break
            uid = chosen
            stale = self.holder(uid) is not None
            if stale:
                with contextlib.suppress(FileNotFoundError):
                    self._file(uid).unlink()
            try:
                fd = os.open(self._file(uid), os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
            except FileExistsError:
                continue
            with os.fdopen(fd, "w") as f:
                f.write(wanted.text())
            user = ProgramUser(uid)
            if stale:
                remove_leftovers(user)
            return user
        raise RuntimeError(
            f"no free uid for the run's program: all of {self.uids.start}-{self.uids.stop - 1} "
            "are leased, in use or have accounts (widen --run-uids, or keep fewer runs)"
        )

    def owner(self, run_dir: Path) -> ProgramUser | None:
        """The leased uid that owns ``run_dir`` (its run's lease), or ``None``."""
        try:
            uid = run_dir.stat().st_uid
        except OSError:
            return None
        if uid in self.uids and self.holder(uid) == Lease.of(run_dir):
            return ProgramUser(uid)
        return None

    def release(self, run_dir: Path) -> None:
        """``run_dir`` is gone: if it was its run's last directory here, the run's uid's processes
        end, what it left in shared places is removed, and its lease ends."""
        lease = Lease.of(run_dir)
        for user, holder in self.leased():
            if holder == lease and not holder.directories():
                reap(user)
                remove_leftovers(user)
                if self.holder(user.uid) == lease:
                    with contextlib.suppress(FileNotFoundError):
                        self._file(user.uid).unlink()


def _accounts() -> set[int]:
    """The uids the host's accounts have (what ``getpwall`` lists: local and NSS ones that it
    enumerates)."""
    try:
        return {entry.pw_uid for entry in pwd.getpwall()}
    except OSError:
        return set()


def _has_account(uid: int) -> bool:
    try:
        pwd.getpwuid(uid)
    except KeyError:
        return False
    return True
