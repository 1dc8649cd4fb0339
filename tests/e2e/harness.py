"""The end-to-end process harness for code outside pytest (the benchmarks, ``python -m bench``).

``from tests.e2e.harness import relay_stack, ...`` (with the repository root as the working
directory). The test modules import each other by their own names (``stack``, ``leaks``,
``node_harness``) because pytest puts ``tests/`` and ``tests/e2e/`` on ``sys.path`` for them
(rootdir-relative imports, no ``__init__.py``); this module sets up the same two entries, and is
the one place outside pytest that does, so no caller edits ``sys.path`` itself.
"""

from __future__ import annotations

import sys
from pathlib import Path

_HERE = Path(__file__).resolve().parent
for _entry in (str(_HERE.parent), str(_HERE)):  # as pytest inserts them for tests/ and tests/e2e/
    if _entry not in sys.path:
        sys.path.append(_entry)

from node_harness import (  # noqa: E402
    ensure_node_modules,
    open_vscode_session,
    scenario,
    vscode_attach,
    vscode_initialize,
)
from stack import Proc, admin_token, debug_run, relay_stack, tether, worker  # noqa: E402

__all__ = [
    "Proc",
    "admin_token",
    "debug_run",
    "ensure_node_modules",
    "open_vscode_session",
    "relay_stack",
    "scenario",
    "tether",
    "vscode_attach",
    "vscode_initialize",
    "worker",
]
