"""Nodes for tests: network namespaces on one machine, each with a loopback of its own.

A multi-node run needs hosts whose ``127.0.0.1`` are apart: a process on node 1 must not reach
node 0's debugpy on its loopback, as on two real machines. :func:`open_nodes` makes ``count``
network namespaces, each joined by a veth to a bridge in this (the relay's) namespace::

    relay's namespace: bridge 10.213.X.1/24
      ├─ veth ── node 0's namespace: lo, eth0 10.213.X.10
      └─ veth ── node 1's namespace: lo, eth0 10.213.X.11

A command runs on node K behind :attr:`Nodes.prefix` (``ip netns exec NAME``). Everything is
removed on the way out, the namespaces' processes killed first. Needs root and ``ip``
(:func:`why_not` says why they are missing; a test skips with that reason, or fails under
``TETHER_REQUIRE_NETNS=1``, as CI sets).
"""

from __future__ import annotations

import os
import secrets
import shutil
import signal
import subprocess
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass

__all__ = ["Nodes", "open_nodes", "why_not"]


def _ip(*args: str, check: bool = True) -> str:
    done = subprocess.run(["ip", *args], capture_output=True, text=True, check=False)
    if check and done.returncode != 0:
        raise RuntimeError(f"ip {' '.join(args)}: {done.stderr.strip()}")
    return done.stdout


def why_not() -> str:
    """Why namespaces cannot be made here (``""``: they can)."""
    if os.geteuid() != 0:
        return "network namespaces need root"
    if shutil.which("ip") is None:
        return "network namespaces need iproute2's ip"
    probe = f"tether-probe-{secrets.token_hex(3)}"
    try:
        _ip("netns", "add", probe)
    except RuntimeError as exc:
        return f"cannot make a network namespace: {exc}"
    _ip("netns", "del", probe, check=False)
    return ""


@dataclass(frozen=True)
class Nodes:
    """The nodes made: their namespaces, their addresses, the bridge's (the relay's side)."""

    names: list[str]
    addresses: list[str]
    bridge_address: str

    def prefix(self, node: int) -> list[str]:
        """What runs a command on ``node``."""
        return ["ip", "netns", "exec", self.names[node]]


def _free_subnet() -> int:
    taken = _ip("-4", "-o", "addr")
    for _ in range(64):
        x = secrets.randbelow(250) + 2
        if f" 10.213.{x}." not in taken:
            return x
    raise RuntimeError("no free 10.213.X.0/24 subnet for the test's nodes")


def _kill_inside(name: str) -> None:
    for pid in _ip("netns", "pids", name, check=False).split():
        try:
            os.kill(int(pid), signal.SIGKILL)
        except (ProcessLookupError, ValueError):
            pass


@contextmanager
def open_nodes(count: int) -> Iterator[Nodes]:
    """``count`` namespaces bridged to this one (see the module's docstring)."""
    tag = secrets.token_hex(2)
    bridge = f"tb{tag}"
    x = _free_subnet()
    names: list[str] = []
    _ip("link", "add", bridge, "type", "bridge")
    try:
        _ip("addr", "add", f"10.213.{x}.1/24", "dev", bridge)
        _ip("link", "set", bridge, "up")
        addresses = []
        for k in range(count):
            name, outer, inner = f"tether-{tag}-{k}", f"tv{tag}{k}", f"tp{tag}{k}"
            _ip("netns", "add", name)
            names.append(name)
            _ip("link", "add", outer, "type", "veth", "peer", "name", inner)
            _ip("link", "set", inner, "netns", name)
            _ip("link", "set", outer, "master", bridge)
            _ip("link", "set", outer, "up")
            _ip("-n", name, "link", "set", "lo", "up")
            _ip("-n", name, "link", "set", inner, "name", "eth0")
            address = f"10.213.{x}.{10 + k}"
            _ip("-n", name, "addr", "add", f"{address}/24", "dev", "eth0")
            _ip("-n", name, "link", "set", "eth0", "up")
            addresses.append(address)
        yield Nodes(names, addresses, f"10.213.{x}.1")
    finally:
        for name in names:
            _kill_inside(name)
            _ip("netns", "del", name, check=False)
        _ip("link", "del", bridge, check=False)
