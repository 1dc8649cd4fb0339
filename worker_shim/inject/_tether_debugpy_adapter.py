"""Runs debugpy's adapter process guarded (only the run's processes and its worker may connect:
``_tether_guard.py``; without the guard it does not start), with one fix: ``TCP_NODELAY`` on its
sockets.

debugpy's adapter is a process of its own that the program's debugpy starts (``python DIR
--for-server ...``, ``DIR`` being where ``debugpy.adapter`` is); the shim is its client. After a
``next`` it writes the response, then the ``stopped`` event, as two sends on a socket without
``TCP_NODELAY``: Nagle's algorithm holds the event until the response is acknowledged, and the
shim's kernel delays that acknowledgement (up to 40 ms on Linux), so every step's ``stopped`` came
that much late (``shared/research/latency-wan.md``: 55-57 ms through tether with VS Code's client,
44 ms with stock debugpy). The cure is on the writer: every socket debugpy's adapter makes
(``debugpy.common.sockets._new_sock``, debugpy 1.8.22: its listeners and its client sockets;
Linux hands ``TCP_NODELAY`` on to the sockets a listener accepts) gets ``TCP_NODELAY``.

How it runs: tether's boot script (``_tether_debugpy_boot.py``) points debugpy at the run's
debugpy home (``worker_shim.program.python_command.debugpy_home``), the directory holding the
worker's ``debugpy`` (a link) and this file as ``__main__.py`` (a link), so ``python HOME ...`` runs
this, with ``HOME`` first on the module search path; this then runs ``debugpy.adapter`` as its
``__main__``, with the same arguments. Defensive like the boot script: if debugpy is not as this was
written against, nothing is patched, a note goes to stderr (the run's log), and the adapter runs as
stock.
"""

import importlib.util
import os
import runpy
from typing import Any


def _beside(name: str) -> Any:
    """The tether script ``name`` (``_tether_debugpy_boot``...), loaded from beside the file this
    one links to; ``ImportError`` if it is not there."""
    here = os.path.dirname(os.path.realpath(__file__))
    spec = importlib.util.spec_from_file_location(name, os.path.join(here, f"{name}.py"))
    if spec is None or spec.loader is None:
        raise ImportError(f"tether's {name}.py is missing")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def _patch_sockets() -> str | None:
    """``TCP_NODELAY`` on every socket debugpy's adapter makes; ``None`` when done, else why not.
    The wrapper is the boot script's."""
    from debugpy.common import sockets

    original: Any = getattr(sockets, "_new_sock", None)
    if not callable(original):
        return "debugpy.common.sockets._new_sock is missing"
    sockets._new_sock = _beside("_tether_debugpy_boot").nodelay(original)
    return None


def _guard() -> str | None:
    """Only the run's processes and its worker may connect to this adapter's ports
    (``_tether_guard.py``); ``None`` when done, else why not."""
    return _beside("_tether_guard").guard_debugpy()  # type: ignore[no-any-return]


def main() -> None:
    try:
        refused = _guard()
    except Exception as exc:
        refused = f"{type(exc).__name__}: {exc}"
    if refused is not None:  # unguarded, any local user could take the program: do not serve
        import sys

        print(f"tether: debugpy's adapter does not start: {refused}", file=sys.stderr)
        sys.exit(1)
    try:
        why_not = _patch_sockets()
    except Exception as exc:  # anything unexpected: run as stock debugpy
        why_not = f"{type(exc).__name__}: {exc}"
    if why_not is not None:
        import sys

        import debugpy

        print(
            f"tether: debugpy {debugpy.__version__}'s adapter is not as tether knows it (1.8.22): "
            f"{why_not}; running it without the TCP_NODELAY fix (each step ~40 ms slower)",
            file=sys.stderr,
        )
    runpy.run_module("debugpy.adapter", run_name="__main__", alter_sys=True)


if __name__ == "__main__":
    main()
