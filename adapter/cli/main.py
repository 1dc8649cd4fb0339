"""``tether``'s entry point: parse, run the command under trio, and turn every way it can end into
an exit code and at most one line for the user (Ctrl-C, SIGTERM/SIGHUP, a closed pipe, a relay's
refusal, an internal error: its traceback goes to a crash log)."""

from __future__ import annotations

import argparse
import logging
import os
import signal
import sys
import time
from collections.abc import Sequence
from contextlib import suppress
from typing import Any

import trio

from .errors import leaves, relay_error
from .parser import build_parser
from .quiet_start import release
from .runs import FOLLOWING, SERVING
from .settings import tether_home

__all__ = ["main"]


def main(argv: Sequence[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    level = [logging.WARNING, logging.INFO, logging.DEBUG][min(args.verbose, 2)]
    logging.basicConfig(level=level, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    # never its debug log: it prints frames, and a hello frame carries the token
    logging.getLogger("websockets").setLevel(max(level, logging.WARNING))
    release()
    try:
        return int(trio.run(_until_stopped, args))
    except KeyboardInterrupt:
        return _interrupted()
    except BaseException as exc:  # the last word: never a traceback for the user
        return _failed(exc)


def _interrupted() -> int:
    """Ctrl-C: what goes on without this process (a run whose adapter it served, or whose output
    it followed)."""
    if SERVING:
        run = SERVING[-1]
        print(
            f"\ntether: stopped serving run {run}'s adapter; the run goes on. "
            f"`tether attach {run}` serves it again, `tether cancel {run}` stops it.",
            file=sys.stderr,
        )
    elif FOLLOWING:
        run = FOLLOWING[-1]
        print(
            f"\ntether: stopped following run {run}; the run goes on. "
            f"`tether logs -f {run}` follows it again, `tether cancel {run}` stops it.",
            file=sys.stderr,
        )
    return 130


def _failed(exc: BaseException) -> int:
    """One line for the user, whatever went wrong; an unexpected error's traceback goes to a crash
    log (and to the terminal with -vv)."""
    errors = leaves(exc)
    if all(isinstance(e, SystemExit) for e in errors):
        raise errors[0]
    if all(isinstance(e, KeyboardInterrupt) for e in errors):
        return _interrupted()
    if all(isinstance(e, BrokenPipeError) for e in errors):  # `tether ls | head`
        with suppress(OSError):
            os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        return 141
    refusal = relay_error(exc)
    if refusal is not None:
        print(f"tether: {refusal.message}", file=sys.stderr)
        return 1
    import traceback

    where = tether_home() / "crash.log"
    first = next(e for e in errors if not isinstance(e, SystemExit | KeyboardInterrupt))
    try:
        where.parent.mkdir(parents=True, exist_ok=True)
        with open(where, "a") as log:
            log.write(
                f"--- {time.strftime('%Y-%m-%d %H:%M:%S')} tether {' '.join(sys.argv[1:2])}\n"
            )
            traceback.print_exception(exc, file=log)
        said = f"; details in {where}"
    except OSError:
        said = ""
    if logging.getLogger().isEnabledFor(logging.DEBUG):
        traceback.print_exception(exc)
    print(f"tether: internal error ({type(first).__name__}: {first}){said}", file=sys.stderr)
    return 70


#: commands that hold programs and a relay: Ctrl-C stops them as SIGTERM does, by cancelling,
#: never by a KeyboardInterrupt raised wherever their code happens to be (a relay's handler that
#: dies of it closes its links before the stack could say what became of its runs)
_STOPPED_BY_CANCEL_ON_CTRL_C = frozenset({"up", "worker"})


async def _drained(nursery: trio.Nursery, signals: Any) -> bool:
    """A stopping worker pool (``tether up``, ``tether worker``): its running attempts preempt
    themselves (each run's ``--preempt-grace``) and are queued again without using a retry; True
    once they ended, False at a second signal (stop at once)."""
    from worker_shim.program.preempt import ATTEMPTS

    if not len(ATTEMPTS):
        ATTEMPTS.stopping = True
        return True
    print(
        f"\ntether: stopping: preempting {len(ATTEMPTS)} running attempt(s); they are queued "
        "again (Ctrl-C again stops at once)",
        file=sys.stderr,
        flush=True,
    )
    done = trio.Event()

    async def drain() -> None:
        await ATTEMPTS.drain()
        done.set()

    nursery.start_soon(drain)
    async with trio.open_nursery() as waiting:

        async def second() -> None:
            async for _ in signals:
                waiting.cancel_scope.cancel()
                return

        waiting.start_soon(second)
        await done.wait()
        waiting.cancel_scope.cancel()
    return done.is_set()


async def _until_stopped(args: argparse.Namespace) -> int:
    """Run the command; SIGTERM or SIGHUP (systemd, a container runtime, a closed terminal) stop it
    the way Ctrl-C does: everything it started is stopped and cleaned up (``tether up``'s server
    included), and it exits with 128 + the signal's number."""
    result: list[int] = []
    stopped: list[int] = []
    watched = [signal.SIGTERM, signal.SIGHUP]
    if getattr(args, "cmd", "") in _STOPPED_BY_CANCEL_ON_CTRL_C:
        watched.append(signal.SIGINT)
    async with trio.open_nursery() as nursery:

        async def watch() -> None:
            with trio.open_signal_receiver(*watched) as signals:
                async for signum in signals:
                    stopped.append(signum)
                    if (
                        len(stopped) == 1
                        and getattr(args, "cmd", "") in _STOPPED_BY_CANCEL_ON_CTRL_C
                    ):
                        if await _drained(nursery, signals):
                            nursery.cancel_scope.cancel()
                            return
                    nursery.cancel_scope.cancel()
                    return

        nursery.start_soon(watch)
        result.append(int(await args.fn(args)))
        nursery.cancel_scope.cancel()
    return 128 + stopped[0] if stopped else result[0]
