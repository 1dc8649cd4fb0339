"""Runs debugpy's command line (``python -m debugpy ...``) with one fix: no 40 ms stall per message.

Run as a script: ``python _tether_debugpy_boot.py --listen 127.0.0.1:0 --wait-for-client ... target``.

pydevd writes every message as two ``sendall`` calls (header, then body) on a socket without
``TCP_NODELAY``, so Nagle's algorithm holds the body until the header is acknowledged, and the
receiver (debugpy's own adapter process) delays that acknowledgement by about 40 ms on Linux: every
DAP round trip costs ~44 ms before any work (``shared/research/perf-notes.md``). This script sets
``TCP_NODELAY`` on pydevd's socket by wrapping ``start_client``, the one function that creates it,
then hands over to debugpy's own ``cli.main()`` unchanged.

It is defensive: if debugpy's internals are not what this was written against (debugpy 1.8.22),
nothing is patched and debugpy runs exactly as ``python -m debugpy`` would.
"""

import socket
import sys
from collections.abc import Callable
from typing import Any


def _patch_pydevd() -> bool:
    try:
        import pydevd  # put on sys.path by debugpy.server.api
        from _pydevd_bundle import pydevd_comm
        from _pydevd_bundle.pydevd_dont_trace_files import DONT_TRACE, PYDEV_FILE
    except ImportError:
        return False
    # like debugpy's own files, this one is the debugger's: never traced, never in a stack trace
    DONT_TRACE[__file__.replace("\\", "/").rsplit("/", 1)[-1]] = PYDEV_FILE
    create: Callable[[str, int], Any] | None = getattr(pydevd_comm, "start_client", None)
    if create is None or getattr(pydevd, "start_client", None) is not create:
        return False

    def start_client(host: str, port: int) -> Any:
        assert create is not None
        sock = create(host, port)
        try:
            sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        except (OSError, AttributeError):
            pass
        return sock

    pydevd_comm.start_client = start_client
    pydevd.start_client = start_client
    return True


def main() -> None:
    # this script's directory must not be importable by the user's program
    del sys.path[0]
    from debugpy.server import api, cli  # noqa: F401  (imports pydevd, vendored)

    _patch_pydevd()
    cli.main()  # type: ignore[no-untyped-call]


if __name__ == "__main__":
    main()
