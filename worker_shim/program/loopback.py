"""Connections the worker makes on loopback for a run go only to that run's own listeners.

A port the worker connects to may come from the program (debugpy's adapter port, which a plain run's
program says on its attach line; a forwarded port a user names): a program could name another run's
debugger, which lets the worker in (``_tether_guard.py``), and the worker would hand that run to this
run's IDE. So the worker looks up who owns the socket listening on the port (the kernel lists each
socket's owner in ``/proc/net/tcp``) before it connects and again once connected, and keeps the
connection only if both times that is the uid the run's processes run as; nothing is sent before
the second look. (The socket that accepted the connection is no help: until the listener's owner
accepts it, the kernel lists it as root's.) Where the table cannot be read (not Linux) the check is
skipped (``SECURITY.md``).
"""

from __future__ import annotations

import os

import trio

from ..inject._tether_guard import listener_owners

__all__ = ["NotTheRuns", "connect_owned", "owners_of_port"]

_TABLES = ("/proc/net/tcp", "/proc/net/tcp6")
_HAS_TABLE = os.path.exists(_TABLES[0])


class NotTheRuns(OSError):
    """The port's listener belongs to another uid than the run's."""


def owners_of_port(port: int) -> set[int]:
    """The uids listening on loopback at ``port`` (empty: nobody, or nobody can tell)."""
    owners: set[int] = set()
    for name in _TABLES:
        try:
            with open(name) as f:
                owners |= listener_owners(f.read(), port)
        except OSError:
            continue
    return owners


async def _check(port: int, uid: int) -> None:
    owners = await trio.to_thread.run_sync(owners_of_port, port)
    if owners and owners != {uid}:
        who = ", ".join(f"uid {o}" for o in sorted(owners))
        raise NotTheRuns(f"port {port} is not the run's: its listener belongs to {who}")


async def connect_owned(port: int, uid: int, host: str = "127.0.0.1") -> trio.SocketStream:
    """A connection to ``host:port`` whose listener belongs to ``uid``; else :class:`NotTheRuns`
    (nothing sent; a connection made closed unused)."""
    if _HAS_TABLE:
        await _check(port, uid)
    stream = await trio.open_tcp_stream(host, port)
    if _HAS_TABLE:
        try:
            await _check(port, uid)
        except NotTheRuns:
            await stream.aclose()
            raise
    return stream
