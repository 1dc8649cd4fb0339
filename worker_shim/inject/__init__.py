"""The scripts tether injects into the user's program: run by path on the program's own
interpreter or in debugpy's adapter process, so each is standalone and stdlib-only and loads its
siblings from beside itself (the worker imports ``_tether_guard`` as well: ``program/loopback.py``).

- ``_tether_debugpy_boot.py``: debugpy's command line with pydevd's socket made ``TCP_NODELAY``;
  the attachable mode of a plain run (``--tether-attach``);
- ``_tether_debugpy_adapter.py``: debugpy's adapter process, guarded, with ``TCP_NODELAY``;
- ``_tether_breakpoint.py``: ``breakpoint()`` stops in every debugged process, children too;
- ``_tether_values.py``: a value described where it is (``tether eval``, ``@all``), loaded lazily
  by ``_tether_breakpoint.rank_value``;
- ``_tether_guard.py``: only the run's processes and its worker may connect to the debugger;
- ``_tether_launch.py``: the main process of a command that is not Python;
- ``_tether_sitecustomize.py``: what each Python process below that command imports first (and
  every Python process of a debug run with children: ``PYTHONPATH``);
- ``_tether_collectives.py``: loaded by it: ``torch.distributed`` process groups get a long
  timeout from their creation, so a paused rank does not end the job.

On a worker that isolates they are published read-only for programs of other uids
(``worker_shim/program/identity.py``'s ``Runtime``). :data:`SCRIPTS` is where they are installed.
"""

from pathlib import Path

#: the directory of the ``_tether_*.py`` scripts, where the worker is installed
SCRIPTS = Path(__file__).resolve().parent
