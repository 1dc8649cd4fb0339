"""A server's guard: ``python -m relay.embedded.guard SERVER ARGS...`` runs the server as its child
and makes it end with whoever started the guard, however that one ends.

The starter (``relay/embedded/server.py``) keeps the write end of the guard's stdin. The guard stops
the server (SIGTERM, then SIGKILL after :data:`STOP_TIMEOUT`) when

- its stdin reaches end of file: the starter exited, cleanly or not (a SIGKILL included: the
  kernel closes its end of the pipe), or
- it gets SIGTERM, SIGHUP or SIGINT (the starter stopping it on purpose).

It exits with the server's status when the server exits. One thread, no trio: the guard does
nothing else, and a process of its own cannot be left behind by a thread of its starter's.
"""

from __future__ import annotations

import os
import select
import signal
import subprocess
import sys
import time
from types import FrameType

__all__ = ["STOP_TIMEOUT", "main"]

STOP_TIMEOUT = 10.0


def main(argv: list[str]) -> int:
    if not argv:
        print("usage: python -m relay.embedded.guard SERVER [ARGS...]", file=sys.stderr)
        return 2
    server = subprocess.Popen(argv, stdin=subprocess.DEVNULL)
    stopping: list[float] = []

    def stop(_signum: int = 0, _frame: FrameType | None = None) -> None:
        if not stopping and server.poll() is None:
            stopping.append(time.monotonic())
            server.terminate()

    for signum in (signal.SIGTERM, signal.SIGHUP, signal.SIGINT):
        signal.signal(signum, stop)
    watching = True
    while server.poll() is None:
        if stopping and time.monotonic() - stopping[0] > STOP_TIMEOUT:
            server.kill()
        try:
            ready, _, _ = select.select([0] if watching else [], [], [], 0.2)
        except InterruptedError:  # a signal: handled above; look again
            continue
        if ready and not os.read(0, 4096):
            watching = False  # the starter is gone
            stop()
    return server.wait() if server.returncode is None else server.returncode


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
