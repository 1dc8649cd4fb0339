"""A run's processes end with its worker, however the worker ends.

Theory of operation
-------------------
Every process a worker starts for a run (the program, debugpy's adapter, the program's children
at any depth, the commands of ``tether exec``) carries ``TETHER_MARK=<worker>/<attempt>`` in its
environment, which children inherit; on a root worker each run's processes also run as a uid of
their own (``worker_shim/program/identity.py``). That is how they are found again, whatever
sessions, process groups or parents they made for themselves (debugpy's adapter calls ``setsid`` and
forks twice; a daemon does the same):

- when an attempt ends, the worker ends its program's process group, then kills every process still
  marked with the attempt (:func:`kill_marked`);
- when the worker stops on purpose (SIGTERM, SIGHUP, Ctrl-C), each attempt ends that way before it
  reports;
- when the worker dies without a word (SIGKILL, the OOM killer), its **guard** does it: a process
  of its own (``python -m worker_shim.program.reaper``, its own session, so a terminal's signals do
  not reach it) that the worker starts first and keeps the only write end of a pipe to. The guard
  waits for that pipe's end of file, which the kernel delivers when the worker is gone, however it
  went, then kills every process marked with the worker and, on a root worker, every process of
  the uids leased to the worker's run directories (``worker_shim/program/uid_leases.py``), and
  exits. A worker that stops cleanly closes the pipe last, after its own cleanup: the guard then
  finds nothing to do.

A program that clears its environment and runs as the worker's own uid (a worker that is not root)
can escape the mark; under a uid of its own nothing escapes (``SECURITY.md``).
"""

from __future__ import annotations

import argparse
import contextlib
import os
import signal
import sys
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path

import trio

__all__ = ["MARK_ENV", "attempt_mark", "kill_marked", "main", "open_guard"]

#: the variable every process of a run carries: ``<worker>/<attempt>``
MARK_ENV = "TETHER_MARK"
#: how long a stopping worker waits for its guard to finish the sweep
GUARD_WAIT = 30.0
_POLL = 0.02
#: where ``worker_shim`` is, for the guard's ``python -m``
_PACKAGES = str(Path(__file__).resolve().parents[2])


def attempt_mark(worker: str, run_id: str, attempt: int) -> str:
    return f"{worker}/{run_id}-{attempt}"


def kill_marked(mark: str) -> list[int]:
    """SIGKILL every live process (but this one) whose ``TETHER_MARK`` is ``mark`` or starts
    with ``mark + "/"``; their pids. A pid is pinned (``pidfd``) before its check, so a process
    that died meanwhile and whose pid went to another is never hit."""
    exact = f"{MARK_ENV}={mark}".encode()
    try:
        names = os.listdir("/proc")
    except OSError:  # no procfs: nothing to find
        return []
    found = []
    for name in names:
        if not name.isdigit() or int(name) == os.getpid():
            continue
        pid = int(name)
        if not _mark_matches(pid, exact):
            continue
        found.append(pid)
        _kill_pinned(pid, exact)
    return found


def _mark_matches(pid: int, exact: bytes) -> bool:
    try:
        with open(f"/proc/{pid}/environ", "rb") as f:
            values = f.read().split(b"\0")
    except OSError:
        return False
    return any(v == exact or v.startswith(exact + b"/") for v in values)


def _kill_pinned(pid: int, exact: bytes) -> None:
    try:
        pidfd = os.pidfd_open(pid)
    except AttributeError:  # no pidfd_open (not Linux): the scan was a moment ago
        with contextlib.suppress(OSError):
            os.kill(pid, signal.SIGKILL)
        return
    except OSError:  # gone already
        return
    try:
        if _mark_matches(pid, exact):  # the pidfd pins the process this check reads
            signal.pidfd_send_signal(pidfd, signal.SIGKILL)
    except OSError:
        pass
    finally:
        os.close(pidfd)


def sweep(mark: str, leases: Path | None, runs_dir: Path | None, uids: range | None) -> int:
    """Kill every process of the worker ``mark`` (and of the uids leased to directories under
    ``runs_dir``) until none is left (bounded); how many were killed."""
    from .identity import ProgramUser
    from .uid_leases import UidLeases, reap

    killed = 0
    for _ in range(50):
        found = kill_marked(mark)
        killed += len(found)
        if not found:
            break
    if leases is not None and runs_dir is not None and uids is not None:
        for user, holder in UidLeases(leases, uids).leased():
            if holder.runs_dir == runs_dir:
                reap(ProgramUser(user.uid))
    return killed


def main(argv: list[str] | None = None) -> int:
    """The guard: wait for standard input's end (the worker gone), then :func:`sweep`."""
    parser = argparse.ArgumentParser(prog="python -m worker_shim.program.reaper")
    parser.add_argument("--mark", required=True)
    parser.add_argument("--leases", type=Path)
    parser.add_argument("--runs-dir", type=Path)
    parser.add_argument("--uids")
    args = parser.parse_args(argv)
    for sig in (signal.SIGINT, signal.SIGHUP):
        signal.signal(sig, signal.SIG_IGN)
    stopping = []
    signal.signal(signal.SIGTERM, lambda _n, _f: stopping.append(True))
    while not stopping:
        try:
            if not os.read(0, 4096):
                break
        except InterruptedError:
            continue
        except OSError:
            break
    uids = None
    if args.uids:
        from .identity import parse_uids

        uids = parse_uids(args.uids)
    killed = sweep(args.mark, args.leases, args.runs_dir, uids)
    if killed:
        print(f"tether worker's guard: its worker is gone; ended {killed} of its runs' processes",
              file=sys.stderr, flush=True)  # fmt: skip
    return 0


@asynccontextmanager
async def open_guard(
    mark: str, *, leases: Path | None = None, runs_dir: Path | None = None,
    uids: range | None = None,
) -> AsyncIterator[None]:  # fmt: skip
    """Run the worker ``mark``'s guard while the block runs; on the way out (however it ends)
    close its pipe and wait for its sweep (bounded, shielded)."""
    argv = [sys.executable, "-m", "worker_shim.program.reaper", "--mark", mark]
    if leases is not None and runs_dir is not None and uids is not None:
        argv += ["--leases", str(leases), "--runs-dir", str(runs_dir)]
        argv += ["--uids", f"{uids.start}-{uids.stop - 1}"]
    read, write = os.pipe()
    try:
        guard = await trio.lowlevel.open_process(
            argv, stdin=read, start_new_session=True, cwd="/",
            env={**os.environ, "PYTHONPATH": _PACKAGES},
        )  # fmt: skip
    finally:
        os.close(read)
    os.set_inheritable(write, False)
    try:
        yield
    finally:
        os.close(write)  # the guard sweeps (nothing, after a clean stop) and exits
        with trio.CancelScope(shield=True), trio.move_on_after(GUARD_WAIT):
            await guard.wait()
        if guard.returncode is None:
            with contextlib.suppress(OSError):
                guard.kill()


if __name__ == "__main__":
    sys.exit(main())
