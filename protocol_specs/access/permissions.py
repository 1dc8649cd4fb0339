"""Who may do what on a relay: one table, one function that reads it.

Theory of operation
-------------------
Every action a relay connection can take is a row of :data:`PERMISSIONS`: opening a connection
in each role, each control frame, each kind of entry published on a run connection. Every kind of
credential is a column (:class:`Actor`): a user token's ``runs``, ``admin`` and ``backend`` scopes,
a worker token (one run, one attempt), and a ticket (claims one run's attempt, nothing else). A cell
is a :class:`Rule`:

- ``yes``: allowed;
- ``own``: a user's own runs (their tokens, their blobs); another user's run is answered
  ``no_such_run``, exactly as a run that does not exist, so nobody learns which runs exist;
- ``attempt``: a worker token's (or ticket's) own run at its own attempt; another run is
  ``forbidden``, an attempt that is over ``stale_attempt`` (a zombie worker injects nothing into
  the next attempt);
- ``no``: ``forbidden``.

A token with several scopes may do what any of them allows. :func:`authorize` is the only place
the relay decides; what an allowed request then gets is scoped by the handler (a user's
``list_runs`` lists their runs; ``have_blobs`` answers for the blobs they uploaded).

``SECURITY.md`` carries the table as :func:`permissions_markdown` renders it, one column per kind
of token a test connects with (``tests/integration/test_permissions.py`` walks every cell against
a live relay).
"""

from __future__ import annotations

from enum import StrEnum

from ..runs.runs import RunRecord
from .auth import Principal, Refusal, Scope

__all__ = [
    "LINK_ACTS",
    "PERMISSIONS",
    "SCOPED_ACTS",
    "WORKER_OWN_ACTS",
    "Act",
    "Actor",
    "Holder",
    "Rule",
    "authorize",
    "expected",
    "permissions_markdown",
]


class Act(StrEnum):
    """Everything a connection to the relay may ask for."""

    OPEN_IDE = "open an `ide` connection"
    OPEN_WORKER = "open a `worker` connection"
    OPEN_LOGS = "open a `logs` connection"
    OPEN_TUNNEL = "`open_tunnel`, open a `tunnel` connection"
    OPEN_CONTROL = "open a `control` connection"
    HAVE_BLOBS = "`have_blobs`"
    PUT_BLOB = "`put_blob`"
    GET_BLOB = "`get_blob`"
    SUBMIT = "`submit`"
    RERUN = "`rerun`"
    CANCEL = "`cancel`"
    PREEMPT = "`preempt` (`tether preempt`, `pause`; a worker: a scheduler's warning)"
    RESUME = "`resume` a suspended run"
    GET_RUN = "`get_run`"
    LIST_RUNS = "`list_runs`"
    GET_AUDIT = "`get_audit`"
    CLAIM_NEXT = "`claim` the next queued run"
    CLAIM_RUN = "`claim` a named run's attempt"
    CONFIRM = "`confirm` a claim (its answer arrived)"
    DISPATCH = "`dispatch`"
    REPORT = "`report`"
    CREATE_TOKEN = "`create_token` for oneself, `runs` scope"
    CREATE_ANY_TOKEN = "`create_token` for others or with `admin`/`backend`"
    LIST_TOKENS = "`list_tokens`"
    REVOKE_TOKEN = "`revoke_token`"
    WEB_LOGIN = "`web_login`: a one-time link into the web view"
    PUBLISH_DAP = "publish a DAP entry"
    PUBLISH_PRESENCE = "publish a presence entry"
    PUBLISH_STATUS = "publish a status entry"
    SUBMIT_SWEEP = "`submit_sweep`"
    GET_SWEEP = "`get_sweep`"
    CANCEL_SWEEP = "`cancel_sweep`"
    LIST_SWEEPS = "`list_sweeps`"
    CLAIM_PAUSE = "`claim_pause`: may the program pause where --debug-when was met"
    PUBLISH_LOG = "publish a log entry"
    PUBLISH_METRIC = "publish a metric entry"
    PUBLISH_CONTROL = "publish a control entry"
    PUBLISH_TUNNEL = "publish a tunnel entry (on a tunnel's link)"
    PUBLISH_GROUP = "publish a rank group's entry (a run across nodes)"
    HEARTBEAT = "`heartbeat`, `received` on a run connection"
    GET_RUN_BLOB = "`get_blob` naming a run: a blob its checkpoints or outputs name"
    PUT_CHECKPOINT = "`put_checkpoint`"
    GET_CHECKPOINTS = "`get_checkpoints`"
    PUT_OUTPUTS = "`put_outputs`"
    GET_OUTPUTS = "`get_outputs`"


class Actor(StrEnum):
    """The columns: what a credential is, for the relay."""

    USER = "runs"  #: a user token's ``runs`` scope
    ADMIN = "admin"  #: a user token's ``admin`` scope
    BACKEND = "backend"  #: a user token's ``backend`` scope (worker pools, scheduler backends)
    WORKER = "worker"  #: a worker token (one run, one attempt)
    TICKET = "ticket"  #: a ticket: claims one run's attempt, once its job runs


class Rule(StrEnum):
    YES = "yes"
    OWN = "own"  #: a user's own runs (others' are answered as missing)
    ATTEMPT = "attempt"  #: a worker token's own run, at its own attempt
    NO = "no"


Y, OWN, A, N = Rule.YES, Rule.OWN, Rule.ATTEMPT, Rule.NO
_COLUMNS = (Actor.USER, Actor.ADMIN, Actor.BACKEND, Actor.WORKER, Actor.TICKET)
_ROWS: dict[Act, tuple[Rule, Rule, Rule, Rule, Rule]] = {
    #                            runs admin backend worker ticket
    Act.OPEN_IDE: (OWN, Y, N, N, N),
    Act.OPEN_WORKER: (N, N, N, A, N),
    Act.OPEN_LOGS: (OWN, Y, N, N, N),
    Act.OPEN_TUNNEL: (OWN, Y, N, N, N),
    Act.OPEN_CONTROL: (Y, Y, Y, Y, Y),
    # a worker uploads its run's checkpoints and outputs (counted as the run owner's blobs)
    Act.HAVE_BLOBS: (OWN, Y, N, A, N),
    Act.PUT_BLOB: (Y, Y, N, A, N),
    Act.GET_BLOB: (N, Y, Y, A, N),
    Act.SUBMIT: (Y, Y, N, N, N),
    Act.RERUN: (OWN, Y, N, N, N),
    Act.CANCEL: (OWN, Y, N, N, N),
    # a worker token preempts its own attempt: a scheduler warned its worker
    Act.PREEMPT: (OWN, Y, N, A, N),
    Act.RESUME: (OWN, Y, N, N, N),
    # a scheduler backend follows the runs it launched jobs for (it is handed every queued run)
    Act.GET_RUN: (OWN, Y, Y, N, N),
    Act.LIST_RUNS: (OWN, Y, N, N, N),
    Act.GET_AUDIT: (OWN, Y, N, N, N),
    Act.CLAIM_NEXT: (N, Y, Y, N, N),
    Act.CLAIM_RUN: (N, Y, Y, A, A),
    # the claimer (a pool, on its connection) or the worker token the claim's answer carried
    Act.CONFIRM: (N, Y, Y, A, N),
    Act.DISPATCH: (N, Y, Y, N, N),
    Act.REPORT: (N, Y, Y, N, N),
    Act.CREATE_TOKEN: (Y, Y, N, N, N),
    Act.CREATE_ANY_TOKEN: (N, Y, N, N, N),
    Act.LIST_TOKENS: (OWN, Y, N, N, N),
    Act.REVOKE_TOKEN: (OWN, Y, N, N, N),
    Act.WEB_LOGIN: (Y, Y, N, N, N),
    Act.SUBMIT_SWEEP: (Y, Y, N, N, N),
    Act.GET_SWEEP: (OWN, Y, N, N, N),
    Act.CANCEL_SWEEP: (OWN, Y, N, N, N),
    Act.LIST_SWEEPS: (OWN, Y, N, N, N),
    Act.CLAIM_PAUSE: (N, N, N, A, N),
    # a user's run connection is an IDE's, a worker token's a worker's: the roles decide these
    Act.PUBLISH_DAP: (OWN, Y, N, A, N),
    Act.PUBLISH_PRESENCE: (OWN, Y, N, N, N),
    Act.PUBLISH_STATUS: (N, N, N, A, N),
    Act.PUBLISH_LOG: (N, N, N, A, N),
    Act.PUBLISH_METRIC: (N, N, N, A, N),
    Act.PUBLISH_CONTROL: (N, N, N, N, N),
    Act.PUBLISH_TUNNEL: (OWN, Y, N, A, N),
    Act.PUBLISH_GROUP: (N, N, N, A, N),
    Act.HEARTBEAT: (OWN, Y, N, A, N),
    Act.GET_RUN_BLOB: (OWN, Y, N, N, N),
    Act.PUT_CHECKPOINT: (N, N, N, A, N),
    Act.GET_CHECKPOINTS: (OWN, Y, N, A, N),
    Act.PUT_OUTPUTS: (N, N, N, A, N),
    Act.GET_OUTPUTS: (OWN, Y, N, N, N),
}

#: act -> actor -> rule
PERMISSIONS: dict[Act, dict[Actor, Rule]] = {
    act: dict(zip(_COLUMNS, rules, strict=True)) for act, rules in _ROWS.items()
}

_SCOPE_ACTOR = {Scope.RUNS: Actor.USER, Scope.ADMIN: Actor.ADMIN, Scope.BACKEND: Actor.BACKEND}


def _actors(who: Principal) -> list[Actor]:
    if who.kind == "worker":
        return [Actor.WORKER]
    if who.kind == "ticket":
        return [Actor.TICKET]
    return [_SCOPE_ACTOR[scope] for scope in sorted(who.scopes) if scope in _SCOPE_ACTOR]


def authorize(
    who: Principal,
    act: Act,
    run: RunRecord | None = None,
    *,
    about_run: str = "",
    attempt: int | None = None,
) -> Refusal | None:
    """``None`` if ``who`` may do ``act``, else why not.

    ``run``: the run the act is on (``None`` if there is none, or it does not exist while
    ``about_run`` names it); ``attempt``: the attempt a worker's request names, if any. Acts on
    no run (``list_runs``, tokens) with the ``own`` rule are allowed, and scoped by the caller.
    """
    refusals: list[Refusal] = []
    for actor in _actors(who):
        rule = PERMISSIONS[act][actor]
        if rule is Rule.YES:
            return None
        if rule is Rule.OWN:
            if run is None and not about_run:
                return None
            if run is not None and run.owner and run.owner == who.user:
                return None
            target = about_run or (run.id if run is not None else "")
            refusals.append(Refusal("no_such_run", f"no run {target!r} (or not yours)"))
        elif rule is Rule.ATTEMPT:
            refusal = _worker_refusal(who, run, about_run, attempt)
            if refusal is None:
                return None
            refusals.append(refusal)
    if refusals:
        return refusals[0]
    return Refusal("forbidden", f"{_credential(who)} may not {_verb(act)}{_who_may(act)}")


def _worker_refusal(
    who: Principal, run: RunRecord | None, about_run: str, attempt: int | None
) -> Refusal | None:
    target = run.id if run is not None else about_run
    if target != who.run:
        return Refusal("forbidden", f"this {who.kind} token is for run {who.run}, not another run")
    if run is None:
        return Refusal("no_such_run", f"no run {target!r}")
    if who.attempt != run.attempt or (attempt and attempt != who.attempt):
        return Refusal(
            "stale_attempt",
            f"run {run.id} is at attempt {run.attempt}; this token's attempt {who.attempt} is over",
        )
    return None


def _credential(who: Principal) -> str:
    if who.kind != "user":
        return f"a {who.kind} token"
    scopes = ", ".join(sorted(who.scopes)) or "no"
    return f"a token with {scopes} scope{'s' if len(who.scopes) > 1 else ''}"


def _who_may(act: Act) -> str:
    rules = PERMISSIONS[act]
    scopes = [f"{a.value!r}" for a in (Actor.USER, Actor.BACKEND) if rules[a] is not Rule.NO]
    if rules[Actor.ADMIN] is not Rule.NO and not scopes:
        scopes.append(f"{Actor.ADMIN.value!r}")
    if scopes:
        return f"; that needs a token with the {' or '.join(scopes)} scope"
    if rules[Actor.WORKER] is not Rule.NO:
        return "; that needs the worker token of the run's current attempt"
    return ""


def _verb(act: Act) -> str:
    text = act.value.replace("`", "")
    return text if text.startswith(("open", "publish")) else f"send {text}"


# --- the table as tests and SECURITY.md see it ----------------------------------------------------


class Holder(StrEnum):
    """The kinds of token a test connects with: the columns of the rendered table."""

    OWNER = "owner (`runs`)"
    OTHER_USER = "another user (`runs`)"
    ADMIN = "admin"
    BACKEND = "backend"
    WORKER = "worker of this attempt"
    OTHER_WORKER = "worker of another run"
    STALE_WORKER = "worker of an earlier attempt"
    TICKET = "ticket of this attempt"


_HOLDER_ACTOR = {
    Holder.OWNER: Actor.USER,
    Holder.OTHER_USER: Actor.USER,
    Holder.ADMIN: Actor.ADMIN,
    Holder.BACKEND: Actor.BACKEND,
    Holder.WORKER: Actor.WORKER,
    Holder.OTHER_WORKER: Actor.WORKER,
    Holder.STALE_WORKER: Actor.WORKER,
    Holder.TICKET: Actor.TICKET,
}


#: acts on no run whose ``own`` rule scopes the answer: another user's things are not in it
SCOPED_ACTS = frozenset(
    {Act.HAVE_BLOBS, Act.LIST_RUNS, Act.LIST_TOKENS, Act.REVOKE_TOKEN, Act.LIST_SWEEPS}
)


#: acts a worker token does on its own run whatever run the others name: a worker of another run
#: does them on its run (a worker of an earlier attempt is still refused)
WORKER_OWN_ACTS = frozenset({Act.HAVE_BLOBS, Act.PUT_BLOB})


#: acts on a run connection: its holder must have opened one first (an IDE link for a user
#: token, a worker link for a worker token)
LINK_ACTS = frozenset(
    {
        Act.PUBLISH_DAP,
        Act.PUBLISH_PRESENCE,
        Act.PUBLISH_STATUS,
        Act.PUBLISH_LOG,
        Act.PUBLISH_METRIC,
        Act.PUBLISH_CONTROL,
        Act.PUBLISH_TUNNEL,
        Act.PUBLISH_GROUP,
        Act.HEARTBEAT,
    }
)


def expected(act: Act, holder: Holder) -> str:
    """What ``holder`` gets for ``act`` on the owner's run (or blob, or token): ``"ok"``,
    ``"scoped"`` (allowed, but the owner's things are not in the answer) or the refusal's code.
    An act on a run connection answers first what opening the connection does."""
    if act in LINK_ACTS:
        opening = Act.OPEN_WORKER if _HOLDER_ACTOR[holder] is Actor.WORKER else Act.OPEN_IDE
        if (opened := expected(opening, holder)) != "ok":
            return opened
    rule = PERMISSIONS[act][_HOLDER_ACTOR[holder]]
    if rule is Rule.YES:
        return "ok"
    if rule is Rule.OWN:
        if holder is Holder.OWNER:
            return "ok"
        return "scoped" if act in SCOPED_ACTS else "no_such_run"
    if rule is Rule.ATTEMPT:
        if act in WORKER_OWN_ACTS and holder is Holder.OTHER_WORKER:
            return "ok"
        return {
            Holder.WORKER: "ok",
            Holder.OTHER_WORKER: "forbidden",
            Holder.STALE_WORKER: "stale_attempt",
            Holder.TICKET: "ok",
        }[holder]
    return "forbidden"


def permissions_markdown() -> str:
    """The table for ``SECURITY.md`` (a test checks it is there, current)."""
    words = {
        "ok": "yes",
        "scoped": "own only",
        "forbidden": "no",
        "no_such_run": "not found",
        "stale_attempt": "stale",
    }
    head = ["", *(h.value for h in Holder)]
    lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    for act in Act:
        cells = [words[expected(act, holder)] for holder in Holder]
        lines.append(f"| {act.value} | " + " | ".join(cells) + " |")
    return "\n".join(lines) + "\n"
