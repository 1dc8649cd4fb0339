"""Which run a request means: its id, a unique prefix of one of the user's runs' ids (4 characters
or more, like git's), or a name only one of their newest runs has (``--name``). A user's prefixes
and names are looked for among their own runs only (an admin's: everyone's), so they never name
another user's run; whether the one found may be acted on is the permission table's to say."""

from __future__ import annotations

from protocol_specs.access.auth import Principal
from protocol_specs.runs.runs import RunRecord

from ..store import keys
from .registry import Registry

__all__ = ["MIN_PREFIX", "NAME_SCAN", "PREFIX_SCAN", "Ambiguous", "named_run"]

#: the shortest run id prefix that names a run, and how many of the newest runs it is looked in
MIN_PREFIX = 4
PREFIX_SCAN = 10_000
#: how many of a user's newest runs a name is looked for in
NAME_SCAN = 200


class Ambiguous(Exception):
    """The words name several runs (the message says which, and what to give instead)."""


async def named_run(registry: Registry, who: Principal, words: str) -> RunRecord | None:
    """The run ``words`` names for ``who`` (``None``: none does); :class:`Ambiguous` if
    several."""
    record = await registry.load(words)
    if record is None and who.kind == "user" and words:
        if len(words) >= MIN_PREFIX:
            record = await _by_prefix(registry, who, words)
        if record is None:
            record = await _by_name(registry, who, words)
    return record


async def _by_name(registry: Registry, who: Principal, name: str) -> RunRecord | None:
    """The one run among the user's newest :data:`NAME_SCAN` named ``name``."""
    key = keys.RUNS if who.admin else keys.user_runs(who.user)
    found = []
    for run_id in await registry.store.zrange_desc(key, NAME_SCAN):
        record = await registry.load(run_id)
        if record is not None and record.spec.name == name:
            found.append(record)
    if len(found) > 1:
        ids = ", ".join(r.id for r in found[:3])
        raise Ambiguous(f"{len(found)} runs are named {name!r} ({ids}...): give an id")
    return found[0] if found else None


async def _by_prefix(registry: Registry, who: Principal, prefix: str) -> RunRecord | None:
    key = keys.RUNS if who.admin else keys.user_runs(who.user)
    found = [i for i in await registry.store.zrange_desc(key, PREFIX_SCAN) if i.startswith(prefix)]
    if len(found) > 1:
        raise Ambiguous(
            f"{len(found)} runs start with {prefix!r} ({', '.join(found[:3])}...): "
            "give more of the id"
        )
    return await registry.load(found[0]) if found else None
