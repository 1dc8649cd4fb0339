"""What a run link is: the ``link`` of a run connection's ``hello``, one of five kinds.

Theory of operation
-------------------
A run connection (role ``ide``, ``worker`` or ``tunnel``) is one of five kinds, and each kind has
the options that mean something for it and no others:

========================= ======== =================================================================
kind                      role     what it is
========================= ======== =================================================================
:class:`IdeLink`          ide      an adapter's link: reads ``to_ide``, publishes ``to_worker``;
                                   ``history``: first the run's ``to_worker`` entries
                                   (after ``hello.history_cursor``); ``early``: see below
:class:`WorkerLink`       worker   the worker of the run's current attempt: reads ``to_worker``,
                                   publishes ``to_ide``, its heartbeats renew the attempt's lease;
                                   ``early``
:class:`AfterLink`        worker   a worker that keeps an ended attempt's directory and serves the
                                   run's tunnels there: reads ``to_worker`` from its end on,
                                   publishes nothing, its heartbeats hold the run's tunnels
:class:`TunnelLink`       tunnel   the user's end of tunnel ``tunnel``: reads its ``down`` stream,
                                   publishes its ``up`` one
:class:`WorkerTunnelLink` worker   the worker's end of tunnel ``tunnel``: the reverse
========================= ======== =================================================================

``early``: the peer takes a live entry before Redis has stored it (a ``deliver`` without a cursor,
then a ``commit``; ``protocol_specs/link/link.py``). Every kind answers the same questions (``role``,
``tunnel``, ``history``, ``early``), so code that only needs them reads them; a kind without an
option has it fixed (a class attribute), and a frame that sets it is malformed. So a link that
does not exist (an IDE naming a tunnel, a tunnel serving an ended attempt) cannot be built, sent
or decoded; the ``hello`` checks only that its role is its link's (:func:`link_problem`). Code
that decides by kind ``match``es on the class or on :class:`LinkKind`.
"""

from __future__ import annotations

from enum import StrEnum
from typing import Annotated, ClassVar, Literal

from pydantic import BaseModel, Field

from .base import FROZEN, Role

__all__ = [
    "RUN_ROLES",
    "AfterLink",
    "AnyLink",
    "IdeLink",
    "Link",
    "LinkKind",
    "TunnelLink",
    "WorkerLink",
    "WorkerTunnelLink",
    "link_problem",
]

#: the roles of run connections, each opened with a :data:`Link`
RUN_ROLES = frozenset({Role.IDE, Role.WORKER, Role.TUNNEL})


class LinkKind(StrEnum):
    """The kinds of run link (see the module docstring); the ``kind`` key of a ``hello.link``."""

    IDE = "ide"
    WORKER = "worker"
    AFTER = "after"
    TUNNEL = "tunnel"
    WORKER_TUNNEL = "worker_tunnel"


#: a tunnel's id, as the relay names it (``protocol_specs/wire/tunnel_open.py``)
_TunnelId = Annotated[str, Field(min_length=1, max_length=64)]


class IdeLink(BaseModel):
    """An adapter's link to a run."""

    model_config = FROZEN
    kind: Literal[LinkKind.IDE] = LinkKind.IDE
    #: first deliver the run's ``to_worker`` entries after ``hello.history_cursor``
    history: bool = False
    early: bool = False
    role: ClassVar[Role] = Role.IDE
    tunnel: ClassVar[str] = ""


class WorkerLink(BaseModel):
    """The link of the worker that runs the run's current attempt."""

    model_config = FROZEN
    kind: Literal[LinkKind.WORKER] = LinkKind.WORKER
    early: bool = False
    #: the node of a multi-node run it runs (0: the one that claimed the attempt; see
    #: ``protocol_specs/runs/nodes.py``)
    node: int = Field(default=0, ge=0, le=63)
    role: ClassVar[Role] = Role.WORKER
    tunnel: ClassVar[str] = ""
    history: ClassVar[bool] = False


class AfterLink(BaseModel):
    """A worker that keeps an ended attempt's directory and serves the run's tunnels there."""

    model_config = FROZEN
    kind: Literal[LinkKind.AFTER] = LinkKind.AFTER
    role: ClassVar[Role] = Role.WORKER
    tunnel: ClassVar[str] = ""
    history: ClassVar[bool] = False
    early: ClassVar[bool] = False


class TunnelLink(BaseModel):
    """The user's end of a tunnel."""

    model_config = FROZEN
    kind: Literal[LinkKind.TUNNEL] = LinkKind.TUNNEL
    tunnel: _TunnelId
    role: ClassVar[Role] = Role.TUNNEL
    history: ClassVar[bool] = False
    early: ClassVar[bool] = False


class WorkerTunnelLink(BaseModel):
    """The worker's end of a tunnel."""

    model_config = FROZEN
    kind: Literal[LinkKind.WORKER_TUNNEL] = LinkKind.WORKER_TUNNEL
    tunnel: _TunnelId
    role: ClassVar[Role] = Role.WORKER
    history: ClassVar[bool] = False
    early: ClassVar[bool] = False


AnyLink = IdeLink | WorkerLink | AfterLink | TunnelLink | WorkerTunnelLink
#: a ``hello``'s ``link`` on the wire: a map whose ``kind`` says which
Link = Annotated[AnyLink, Field(discriminator="kind")]


def link_problem(role: Role, link: AnyLink | None) -> str | None:
    """Why a ``hello`` of ``role`` may not name ``link``, or ``None``: a run connection names a
    link of its own role, and no other connection names one."""
    if link is None:
        return f"{_a(role.value)} connection names its link" if role in RUN_ROLES else None
    if role not in RUN_ROLES:
        return f"{_a(role.value)} connection is not a run link"
    if link.role is not role:
        return f"{_a(link.kind.value)} link is opened as {link.role.value!r}, not {role.value!r}"
    return None


def _a(word: str) -> str:
    return f"{'an' if word[0] in 'aeiou' else 'a'} {word}"
