"""A Ctrl-C while ``tether`` is still loading ends it quietly.

Importing the command's modules (trio, pydantic, the parser's tree) takes a few hundred
milliseconds, before :func:`adapter.cli.main.main` can catch anything: a Ctrl-C then would print
Python's ``KeyboardInterrupt`` traceback. So the package installs :func:`hold` before it imports
them, and ``main`` calls :func:`release` once it catches ``KeyboardInterrupt`` itself.

Stdlib only, and nothing at import time but what :func:`hold` does when called.
"""

from __future__ import annotations

import os
import signal
import sys
import threading
from types import FrameType

__all__ = ["hold", "release"]


def _leave(signum: int, frame: FrameType | None) -> None:
    # nothing has started yet: nothing to stop or say; a shell prints the newline it needs
    os._exit(128 + signum)


def _starting_tether() -> bool:
    """This process is the ``tether`` command starting (its console script, or ``python -m
    adapter.cli``: while ``-m`` imports the package, ``sys.argv[0]`` is ``"-m"``), not a program
    that imports ``adapter.cli`` (a test run)."""
    first = sys.argv[0] if sys.argv else ""
    return first == "-m" or os.path.basename(first) == "tether"


def hold() -> None:
    """Ctrl-C exits at once with 130 while ``tether`` starts, where Python's own handler is in
    place (not where it is ignored, as for a command started in the background)."""
    if not _starting_tether() or threading.current_thread() is not threading.main_thread():
        return
    if signal.getsignal(signal.SIGINT) is signal.default_int_handler:
        signal.signal(signal.SIGINT, _leave)


def release() -> None:
    """Python's own handler again (``KeyboardInterrupt``), if :func:`hold` put ours in place."""
    if threading.current_thread() is not threading.main_thread():
        return
    if signal.getsignal(signal.SIGINT) is _leave:
        signal.signal(signal.SIGINT, signal.default_int_handler)
