"""Refusals in a run's audit trail, and how repeats of one are coalesced. Sans-I/O.

Theory of operation
-------------------
Every refusal that names a run that exists goes into that run's audit trail
(``relay/runs/audit.py``; ``tether audit RUN``): a connection to it (``ide``, ``logs``, ``tunnel``,
``worker``), a control request about it (``cancel``, ``rerun``, ``get_run``, ``get_audit``,
``open_tunnel``, a claim or a report), a publish on one of its links, a page or an action of the web
view. The entry (:func:`refused_entry`) names who was refused (their token's id; none for a
connection without a valid token), from where, with which client, what they asked, and the refusal's
code and words. What the refused party is told does not change: another user's run still answers
exactly as a run that does not exist.

A refused party could flood a trail, and the trail keeps only its newest entries: a flood would
push the run's history out of it. So refusals are coalesced, per run, per *refuser* and request
(:func:`refuser`: a user, whatever token of theirs they use; a worker token or ticket; anyone
without a valid token, together): the first refusal in a window of :data:`WINDOW` seconds has an
entry of its own; the others in that window are counted (:class:`Repeats`, kept by the relay
beside the trail). The count is written when the next refusal after the window comes, as one
entry (:func:`repeated`: the last of them, saying how many it stands for), and shown as such when
the trail is read before then. So a refuser adds at most two entries per request and window to a
run's trail, however fast they ask.
"""

from __future__ import annotations

from enum import StrEnum

from pydantic import BaseModel, ConfigDict, Field

from .auth import Principal

__all__ = [
    "WINDOW",
    "AuditEntry",
    "AuditEvent",
    "AuditRole",
    "Repeats",
    "coalesce",
    "refused_entry",
    "refuser",
    "repeated",
]

#: seconds in which one refuser's refusals of one request on one run have one entry (and a count)
WINDOW = 60.0


class AuditRole(StrEnum):
    """Through what an audited act came (an entry's ``role``): a relay connection of one of the
    wire's roles (``protocol_specs.wire.wire.Role``, same words), or the web view."""

    IDE = "ide"
    WORKER = "worker"
    CONTROL = "control"
    LOGS = "logs"
    TUNNEL = "tunnel"
    WEB = "web"


class AuditEvent(StrEnum):
    """What an :class:`AuditEntry` records."""

    SUBMIT = "submit"
    RERUN = "rerun"
    CANCEL = "cancel"
    PREEMPT = "preempt"  #: ``tether preempt`` or ``pause``, or its worker's scheduler warned it
    RESUME = "resume"
    CLAIM = "claim"  #: an attempt handed to a worker or a scheduler
    CONNECT = "connect"  #: a run connection (ide or worker) was admitted
    ATTACH = "attach"  #: an IDE attached through an adapter
    DETACH = "detach"
    LOGS = "logs"  #: someone followed the run's logs
    REFUSED = "refused"  #: a connection to the run was refused
    TUNNEL = "tunnel"  #: a shell, a command or a port forward into the run (detail: which)
    VIEW = "view"  #: someone looked at the run in the web view (detail: at what, if not its page)


class AuditEntry(BaseModel):
    """Who did what to a run, and when: kept per run by the relay, read with ``tether audit``."""

    #: a message of the wire protocol (``GetAudit``'s answer): frozen, no field it does not define
    model_config = ConfigDict(frozen=True, extra="forbid")
    at: float
    #: an :class:`AuditEvent`; a name this version does not know stays a string (trails are kept
    #: for as long as the run, and a newer relay may have written them)
    event: AuditEvent | str = Field(union_mode="left_to_right")
    user: str = ""
    token: str = ""  #: the token's id
    role: str = ""
    source: str = ""  #: the peer's address
    client: str = ""
    detail: str = ""


class Repeats(BaseModel):
    """One refuser's refusals of one request on one run, in the window open now."""

    model_config = ConfigDict(frozen=True, extra="ignore")

    #: when the window opened: its first refusal, which has an entry of its own
    since: float
    #: refusals since then that have no entry of their own
    count: int = 0
    #: the newest of them
    last: AuditEntry | None = None


def refused_entry(
    at: float,
    who: Principal | None,
    *,
    request: str,
    code: str,
    message: str,
    source: str,
    role: AuditRole,
    client: str = "",
    what: str = "",
) -> AuditEntry:
    """The entry of one refusal: ``request`` is what was asked (``cancel``, ``open ide``...),
    ``what`` more about it (a tunnel's command), ``code`` and ``message`` the refusal's."""
    asked = f"{request} ({what})" if what else request
    return AuditEntry(
        at=at,
        event=AuditEvent.REFUSED,
        user=who.user if who is not None else "",
        token=who.token if who is not None else "",
        role=role,
        source=source,
        client=client[:200],
        detail=f"{asked}: {code}: {message}"[:500],
    )


def refuser(who: Principal | None, request: str) -> str:
    """Whose refusals of what are coalesced together: a user's (whatever token: a user may make
    tokens), a worker token's or a ticket's, or those without a valid token (all of them)."""
    if who is None:
        holder = "-"
    elif who.kind == "user":
        holder = f"user:{who.user}"
    else:
        holder = f"{who.kind}:{who.token}"
    return f"{holder} {request}"


def coalesce(
    kept: Repeats | None, entry: AuditEntry, window: float = WINDOW
) -> tuple[list[AuditEntry], Repeats]:
    """A refusal (``entry``) of a refuser and request whose window is ``kept`` (``None``: none
    yet): the entries to append to the trail, and what to keep. Within the window: nothing, and
    one more counted. Else: the last window's count (if any), then this refusal; a new window."""
    if kept is not None and 0 <= entry.at - kept.since < window:
        return [], Repeats(since=kept.since, count=kept.count + 1, last=entry)
    said = repeated(kept) if kept is not None else None
    return [*([said] if said is not None else []), entry], Repeats(since=entry.at)


def repeated(kept: Repeats) -> AuditEntry | None:
    """The entry that stands for the refusals of a window that have none of their own: the last
    of them, saying how many (``None``: there are none)."""
    if kept.count == 0 or kept.last is None:
        return None
    if kept.count == 1:
        return kept.last
    span = max(0.0, kept.last.at - kept.since)
    more = f" (the last of {kept.count} more like it, in the {span:.0f} s after the first)"
    return kept.last.model_copy(update={"detail": kept.last.detail + more})
