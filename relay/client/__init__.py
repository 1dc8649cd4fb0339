"""The relay's client, used by the CLI, the adapter, the worker shim and the benchmarks.

It speaks the wire protocol (:mod:`protocol_specs.wire.wire`) and imports nothing of the relay server:

- :mod:`.connect`: where a relay is (:class:`Endpoint`), one welcomed connection
  (:func:`open_connection`), and :class:`RelayError`, the one exception for every failure.
- :mod:`.control`: :func:`open_control` gives a :class:`ControlClient` (blobs, submit, rerun,
  cancel, list, get, claim, dispatch, tokens, audit, report).
- :mod:`.logs`: :func:`follow_logs` yields a run's output and attempt markers, reconnecting as needed.
- :mod:`.link`: :func:`open_run_link` gives a :class:`RunLink` bound to one run in the ``ide`` or
  ``worker`` role, around the sans-I/O :class:`protocol_specs.link.link.LinkState`.
"""

from __future__ import annotations

from .connect import Endpoint, RelayError, Target, endpoint, open_connection, relay_error_of
from .control import ControlClient, open_control
from .files import FilesError, HashCache, Sent, download, upload_dir
from .link import FLUSH_TIMEOUT, LinkPolicy, RunLink, open_run_link, tunnel_steps
from .logs import follow_logs

__all__ = [
    "FLUSH_TIMEOUT",
    "ControlClient",
    "Endpoint",
    "FilesError",
    "HashCache",
    "LinkPolicy",
    "RelayError",
    "RunLink",
    "Sent",
    "Target",
    "download",
    "endpoint",
    "follow_logs",
    "open_connection",
    "open_control",
    "open_run_link",
    "relay_error_of",
    "tunnel_steps",
    "upload_dir",
]
