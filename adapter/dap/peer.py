"""Who is on the other end of a loopback connection: the adapter serves its own OS user only.

The adapter listens on 127.0.0.1, but on a shared host (a Slurm login node has many users)
loopback is not private: any local user can connect, and a debugger connection runs code in the
program. On Linux the kernel lists every TCP socket with its owner's uid in ``/proc/net/tcp`` (and
``tcp6``); the adapter finds the *peer's* socket there (its local address is our remote address and
the other way round) and refuses the connection unless that uid is its own.

Where this holds: Linux (and WSL 2). Elsewhere (macOS, the BSDs, Windows) there is no such table
and :func:`refusal` lets every local connection in; ``SECURITY.md`` says so.
"""

from __future__ import annotations

import ipaddress
import os
import sys

__all__ = ["listener_of", "peer_uid", "refusal", "socket_owner"]

Address = tuple[str, int]


def _parse(field: str) -> Address | None:
    """``0100007F:1F90`` (IPv4) or 32 hex digits (IPv6), each 32-bit word in host (little-endian)
    order, then the port in hex."""
    host, _, port = field.partition(":")
    try:
        raw = bytes.fromhex(host)
        number = int(port, 16)
    except ValueError:
        return None
    if len(raw) not in (4, 16):
        return None
    packed = b"".join(raw[i : i + 4][::-1] for i in range(0, len(raw), 4))
    ip = ipaddress.ip_address(packed)
    if isinstance(ip, ipaddress.IPv6Address) and ip.ipv4_mapped is not None:
        ip = ip.ipv4_mapped
    return str(ip), number


def _normal(address: Address) -> Address:
    ip = ipaddress.ip_address(address[0].split("%")[0])
    if isinstance(ip, ipaddress.IPv6Address) and ip.ipv4_mapped is not None:
        ip = ip.ipv4_mapped
    return str(ip), int(address[1])


def socket_owner(table: str, local: Address, remote: Address) -> int | None:
    """The uid owning the socket whose local and remote addresses are these, in the text of
    ``/proc/net/tcp`` or ``/proc/net/tcp6``; ``None`` if no row matches."""
    want = (_normal(local), _normal(remote))
    for line in table.splitlines()[1:]:
        cols = line.split()
        if len(cols) < 8:
            continue
        if (_parse(cols[1]), _parse(cols[2])) == want:
            try:
                return int(cols[7])
            except ValueError:
                return None
    return None


def peer_uid(ours: Address, theirs: Address) -> int | None:
    """The uid of the process on the other end of our connection ``ours`` -> ``theirs`` (Linux;
    ``None`` where it cannot be told). Reads two small procfs files: a few hundred microseconds,
    once per connection, so a blocking read in the accepting task is fine."""
    for name in ("/proc/net/tcp", "/proc/net/tcp6"):
        try:
            with open(name) as f:
                owner = socket_owner(f.read(), local=theirs, remote=ours)
        except OSError:
            continue
        if owner is not None:
            return owner
    return None


def refusal(ours: Address, theirs: Address) -> str | None:
    """Why a connection must be refused (``"from uid 1001, another OS user ..."``), or ``None``
    to serve it."""
    if not sys.platform.startswith("linux"):
        return None  # no socket table to ask: documented in SECURITY.md
    mine = os.geteuid()
    owner = peer_uid(ours, theirs)
    if owner is None:
        return (
            f"from {theirs[0]}:{theirs[1]}, whose owner cannot be determined (this adapter "
            f"serves uid {mine} only)"
        )
    if owner != mine:
        return f"from uid {owner}, another OS user (this adapter serves uid {mine} only)"
    return None


def listener_of(port: int) -> str:
    """Who listens on ``127.0.0.1:port`` (Linux): ``"process 1234 (tether debug ...)"``, ``"uid
    1001"`` for another user's, or ``""`` where it cannot be told."""
    inode, uid = "", -1
    for name in ("/proc/net/tcp", "/proc/net/tcp6"):
        try:
            with open(name) as f:
                rows = f.read().splitlines()[1:]
        except OSError:
            continue
        for row in rows:
            cols = row.split()
            local = _parse(cols[1]) if len(cols) > 9 else None
            if local is not None and local[1] == port and cols[3] == "0A":  # LISTEN
                inode, uid = cols[9], int(cols[7])
                break
        if inode:
            break
    if not inode:
        return ""
    needle = f"socket:[{inode}]"
    try:
        pids = [p for p in os.listdir("/proc") if p.isdigit()]
    except OSError:
        pids = []
    for pid in pids:
        try:
            fds = os.listdir(f"/proc/{pid}/fd")
            if any(os.readlink(f"/proc/{pid}/fd/{fd}") == needle for fd in fds):
                with open(f"/proc/{pid}/cmdline", "rb") as f:
                    words = f.read().split(b"\0")
                command = " ".join(w.decode(errors="replace") for w in words if w)[:80]
                return f"process {pid} ({command})"
        except OSError:
            continue
    return f"uid {uid}" if uid >= 0 else ""
