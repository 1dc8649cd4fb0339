"""Only the run's own processes and its worker may connect to the debugger's ports.

debugpy listens on loopback TCP in three places, none of them private on a shared host: the
program's listener for its adapter's endpoints (``debugpy.server.api.listen``), and the adapter's
listeners for its client (the worker) and for the program's pydevd (``debugpy.adapter``). Each
takes the first connection that comes: a process of another OS user that connects first (the port
is listed in the world-readable ``/proc/net/tcp``) would get the program's debugger, that is, run
code as the run's user. This module makes every listener debugpy creates accept only connections
whose socket belongs to an allowed uid: the process's own (the program, its adapter, its children)
and the worker's (``TETHER_DEBUG_PEERS``, set by the worker). Any other connection is closed before
debugpy sees it, and said on stderr (the run's log, which the run's owner reads with ``tether
logs``): the port stays open for the worker, which the race cannot keep out.

How: ``debugpy.common.sockets.create_server`` (every listener of debugpy's, the adapter's included,
is made there: debugpy 1.8.22, and every 1.x since 1.0) is wrapped to return a listener whose
``accept`` looks up the peer's socket in ``/proc/net/tcp`` (its local address is our remote address
and the other way round: the kernel lists each socket's owner). Where that table does not exist
(not Linux) nothing is refused: ``SECURITY.md`` says so. If debugpy is not as this was written
against, :func:`guard` says why and the caller refuses to start the debugger: unguarded is not an
option.

Standalone and stdlib-only: it runs on the program's interpreter (``_tether_debugpy_boot.py``) and
in debugpy's adapter process (``_tether_debugpy_adapter.py``), which load it from beside themselves.
``adapter/dap/peer.py`` answers the same question for tether's own adapter, with a reader of the
same table of its own: the adapter's floor imports nothing of the worker's, and this file imports
nothing of tether's.
"""

import os
import socket
import sys

#: the uids besides the process's own that may connect (the worker's), comma-separated
PEERS_ENV = "TETHER_DEBUG_PEERS"

_TABLES = ("/proc/net/tcp", "/proc/net/tcp6")


def allowed_uids() -> "set[int]":
    """The process's own uid and the worker's (from :data:`PEERS_ENV`)."""
    allowed = {os.geteuid()}
    for word in os.environ.get(PEERS_ENV, "").split(","):
        if word.strip().isdecimal():
            allowed.add(int(word))
    return allowed


def parse_address(field: str) -> "tuple[bytes, int] | None":
    """``0100007F:1F90`` (IPv4) or 32 hex digits (IPv6) as (packed address, port); each 32-bit
    word of the address is in host (little-endian) order in the table."""
    host, _, port = field.partition(":")
    try:
        raw = bytes.fromhex(host)
        number = int(port, 16)
    except ValueError:
        return None
    if len(raw) not in (4, 16):
        return None
    packed = b"".join(raw[i : i + 4][::-1] for i in range(0, len(raw), 4))
    if len(packed) == 16 and packed[:12] == b"\0" * 10 + b"\xff\xff":  # IPv4-mapped
        packed = packed[12:]
    return packed, number


def _packed(address: "tuple[str, int]") -> "tuple[bytes, int]":
    host = address[0].split("%")[0]
    try:
        packed = socket.inet_pton(socket.AF_INET6 if ":" in host else socket.AF_INET, host)
    except OSError:
        return b"", int(address[1])
    if len(packed) == 16 and packed[:12] == b"\0" * 10 + b"\xff\xff":
        packed = packed[12:]
    return packed, int(address[1])


def owner_in(table: str, local: "tuple[str, int]", remote: "tuple[str, int]") -> "int | None":
    """The uid owning the socket with these local and remote addresses, in the text of
    ``/proc/net/tcp`` or ``tcp6``; ``None`` if no row has them."""
    want = (_packed(local), _packed(remote))
    for line in table.splitlines()[1:]:
        cols = line.split()
        if len(cols) < 8:
            continue
        if (parse_address(cols[1]), parse_address(cols[2])) == want:
            try:
                return int(cols[7])
            except ValueError:
                return None
    return None


def listener_owners(table: str, port: int) -> "set[int]":
    """The uids of the sockets listening on loopback (or every address) at ``port``, in the text
    of ``/proc/net/tcp`` or ``tcp6``."""
    reachable = {socket.inet_aton("127.0.0.1"), bytes(4), bytes(16), bytes(15) + b"\1"}
    owners = set()
    for line in table.splitlines()[1:]:
        cols = line.split()
        if len(cols) < 8 or cols[3] != "0A":  # LISTEN
            continue
        local = parse_address(cols[1])
        if local is not None and local[1] == port and local[0] in reachable:
            try:
                owners.add(int(cols[7]))
            except ValueError:
                continue
    return owners


def peer_uid(conn: socket.socket) -> "int | None":
    """The uid whose socket is at the other end of the accepted loopback connection ``conn``
    (``None``: not found, as when the peer already went)."""
    try:
        ours, theirs = conn.getsockname()[:2], conn.getpeername()[:2]
    except OSError:
        return None
    for name in _TABLES:
        try:
            with open(name) as f:
                owner = owner_in(f.read(), local=theirs, remote=ours)
        except OSError:
            continue
        if owner is not None:
            return owner
    return None


def refusal(conn: socket.socket, allowed: "set[int]") -> "str | None":
    """Why ``conn`` must be closed unserved, or ``None`` to hand it to debugpy."""
    if not os.path.exists(_TABLES[0]):
        return None  # no socket table to ask (not Linux): SECURITY.md says so
    owner = peer_uid(conn)
    if owner in allowed:
        return None
    who = "a process whose owner cannot be told" if owner is None else f"uid {owner}"
    return f"refused a connection to the debugger from {who} (not this run's, nor its worker's)"


class GuardedListener(socket.socket):
    """A listening socket whose :meth:`accept` returns only allowed peers' connections."""

    __slots__ = ()
    allowed: "set[int]" = set()

    def accept(self) -> "tuple[socket.socket, object]":
        while True:
            conn, address = super().accept()
            why = refusal(conn, type(self).allowed)
            if why is None:
                return conn, address
            try:
                sys.stderr.write(f"tether: {why}\n")
                sys.stderr.flush()
            except (OSError, ValueError):
                pass
            conn.close()


def guard(sockets_module: object) -> "str | None":
    """Make every listener ``sockets_module`` (``debugpy.common.sockets``) creates from now on a
    :class:`GuardedListener`; ``None`` when done, else why not (the caller refuses to debug)."""
    create_server = getattr(sockets_module, "create_server", None)
    if not callable(create_server):
        return "debugpy.common.sockets.create_server is missing"
    if getattr(create_server, "tether_guarded", False):
        return None
    allowed = allowed_uids()

    class Listener(GuardedListener):
        __slots__ = ()

    Listener.allowed = allowed

    def guarded(*args: object, **kwargs: object) -> socket.socket:
        sock = create_server(*args, **kwargs)
        if type(sock) is not socket.socket:
            sock.close()
            raise RuntimeError(f"debugpy made a {type(sock).__name__}, not a socket: not guarded")
        sock.__class__ = Listener
        return sock

    guarded.tether_guarded = True  # type: ignore[attr-defined]
    sockets_module.create_server = guarded  # type: ignore[attr-defined]
    return None


def guard_debugpy() -> "str | None":
    """:func:`guard` on the imported debugpy's sockets module; ``None`` when done, else why not."""
    try:
        from debugpy.common import sockets
    except ImportError as exc:
        return f"cannot import debugpy.common.sockets ({exc})"
    return guard(sockets)
