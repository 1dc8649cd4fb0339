"""The relay's control RPC: one handler per request frame (``dispatch.py``'s table), by concern:
``blobs.py``, ``runs.py`` (runs and sweeps), ``workers.py`` (claims, dispatches, reports),
``tokens.py`` (tokens and the web view's login); ``context.py``: what every handler works with."""

from .context import Rooms
from .dispatch import Control

__all__ = ["Control", "Rooms"]
