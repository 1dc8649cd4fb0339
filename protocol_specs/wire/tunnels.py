"""Tunnels: a command, a shell or a port forward into a run's worker, through the relay.

Theory of operation
-------------------
The GPU node dials out to the relay and accepts nothing inbound, so ``ssh`` is usually not an
option. A *tunnel* carries bytes between the user's terminal and the worker the way a run's DAP
traffic goes, with the same guarantees (exactly once, in order, across link drops and relay
restarts):

1. The user's side asks on a ``control`` connection: ``open_tunnel {run, spec, key}``
   (:class:`TunnelSpec`: ``exec`` a command, a ``shell`` on a terminal, ``forward`` a port;
   ``key``: the request's random name, sent again unchanged if the answer is lost). The relay
   checks that the run is the caller's (or the caller is an admin), that a worker runs it now,
   and the per-run limit (:data:`MAX_TUNNELS`); records it in the run's audit trail; writes a
   ``control`` entry ``{action: tunnel, detail: <id>, data: <spec>, attempt}`` into
   ``to_worker``; and answers ``tunnel {run, tunnel: <id>}``. The same request asked again finds
   the same tunnel: what it runs starts exactly once (``protocol_specs/wire/tunnel_open.py``).
2. The user's side opens a ``tunnel`` connection (a ``TunnelLink`` naming the id): it publishes
   into the tunnel's ``up`` stream and receives its ``down`` stream. The worker, on the control
   entry, opens a ``worker`` connection (a ``WorkerTunnelLink`` naming it): the reverse. Both are run links
   (``relay/client/link.py``): numbered publishes, cursors, reconnects that lose nothing.
3. Both sides write :class:`~protocol_specs.wire.stream_entries.TunnelEntry` steps. Up: ``data``
   (``fd`` 0: the command's stdin, the terminal's keys, the forwarded connection's bytes),
   ``eof``, ``resize``, ``signal``. Down: ``data`` (``fd`` 1 and 2), ``eof``, and one ``exit``
   (``code``; ``detail`` when the worker could not or would not: the tunnel is over). ``data``
   entries are transient: deleted once the reader said it received them.

A worker may refuse tunnels (``tether worker --no-shell``): its ``exit`` says so. The tunnel's
keys expire :data:`LINGER` seconds after its ``exit`` (and with the run's, when it ends).
"""

from __future__ import annotations

from typing import Literal

from pydantic import BaseModel, Field, model_validator

from .base import FROZEN

__all__ = ["CHUNK", "LINGER", "MAX_TUNNELS", "TunnelSpec"]

#: tunnels a run may have open at once
MAX_TUNNELS = 16
#: how long a tunnel's streams stay after its ``exit`` (a late reader still gets the end)
LINGER = 300.0
#: the most bytes one ``data`` entry carries
CHUNK = 64 * 1024


class TunnelSpec(BaseModel):
    """What a tunnel runs on the worker, in the run's directory with the run's environment."""

    model_config = FROZEN
    #: ``stacks``: the Python stacks of the run's processes, as JSON on stdout (``tether stacks``)
    #: ``eval``: ``expression`` evaluated in every paused rank, as JSON on stdout (``tether eval``)
    kind: Literal["exec", "shell", "forward", "stacks", "eval"]
    #: ``exec``: the command (a program and its arguments, no shell)
    argv: list[str] = Field(default_factory=list, max_length=4096)
    #: ``exec``: the user's side sends the command's stdin (else it gets an empty one)
    stdin: bool = False
    #: ``shell``: the terminal's size and type
    cols: int = Field(default=80, ge=1, le=10_000)
    rows: int = Field(default=24, ge=1, le=10_000)
    term: str = Field(default="xterm-256color", max_length=64)
    #: ``forward``: the TCP port on the worker's loopback
    port: int = Field(default=0, ge=0, le=65535)
    #: ``exec``, ``shell``: in this process's directory with its environment (a pid of the run's:
    #: a torchrun rank's ``RANK``, ``LOCAL_RANK``, ``CUDA_VISIBLE_DEVICES``); "": the run's
    process: str = Field(default="", pattern=r"^[0-9]{0,10}$")
    #: ``eval``: the expression, and the ranks to evaluate it in (empty: every paused rank)
    expression: str = Field(default="", max_length=64 * 1024)
    ranks: list[int] = Field(default_factory=list, max_length=4096)
    #: the node whose worker serves it (a run that spans nodes: ``resources.nodes``); 0 otherwise
    node: int = Field(default=0, ge=0, le=63)

    @model_validator(mode="after")
    def _complete(self) -> TunnelSpec:
        if self.kind == "exec" and not self.argv:
            raise ValueError("exec needs a command")
        if self.kind == "eval" and not self.expression.strip():
            raise ValueError("eval needs an expression")
        if self.kind == "forward" and not self.port:
            raise ValueError("forward needs a port (1-65535)")
        if any(len(arg) > 64 * 1024 for arg in self.argv):
            raise ValueError("a command argument is longer than 64 KiB")
        return self

    def describe(self) -> str:
        """For the audit trail and the worker's log: ``exec: nvidia-smi -L``, ``shell``,
        ``forward 6006``, ``shell on node 1``."""
        of = f" (as process {self.process})" if self.process else ""
        return self._what(of) + (f" on node {self.node}" if self.node else "")

    def _what(self, of: str) -> str:
        if self.kind == "exec":
            return "exec: " + " ".join(self.argv)[:500] + of
        if self.kind == "forward":
            return f"forward {self.port}"
        if self.kind == "stacks":
            return "stacks"
        if self.kind == "eval":
            return "eval: " + " ".join(self.expression.split())[:500]
        return "shell" + of
