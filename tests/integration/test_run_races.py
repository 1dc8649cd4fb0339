"""Run-record updates racing each other: every interleaving keeps one history.

The same run is driven by concurrent tasks of one relay and by two relays (two registries on one
store): a cancel, claims, their confirmations and releases (by their relay, or by a sweep past
their deadline), a worker's start, pauses and exits, lease expiries and lost scheduler jobs, about
the run's first and second attempt, with a random number of extra checkpoints before
each store call (seeded: each case replays the same way). Every change a registry reports as
applied is recorded with the record it was decided on. The check: the changes form one chain from
the submitted record to the stored one (each applied to the record the previous one left, none
lost, none applied twice to the same version), each step allowed by the state machine.

A store that writes blindly (no compare-and-set) fails the same check: the test can fail.
"""

from __future__ import annotations

import random
import time
from collections.abc import Awaitable, Callable
from typing import Any

import pytest
import trio

from protocol_specs.runs.runs import TRANSITIONS, RunEvent, RunRecord, RunState
from protocol_specs.runs.spec import RunSpec
from protocol_specs.session.session import StatusEvent
from protocol_specs.snapshots.snapshots import Manifest
from protocol_specs.wire import wire
from relay.config import RelayConfig
from relay.runs import claiming
from relay.runs.registry import Change, Registry
from relay.store import MemoryStore, Store, keys

SPEC = RunSpec(command=["python", "train.py"], workdir="/w", max_retries=1, retry_backoff=0.0)
CONFIG = RelayConfig(lease=30.0)


class _Jittery:
    """A store that yields to the scheduler a random number of times before each call."""

    def __init__(self, inner: Store, rng: random.Random) -> None:
        self._inner = inner
        self._rng = rng

    def __getattr__(self, name: str) -> Any:
        target = getattr(self._inner, name)
        if name == "blocking_reader" or not callable(target):
            return target

        async def call(*args: Any, **kwargs: Any) -> Any:
            for _ in range(self._rng.randint(0, 3)):
                await trio.lowlevel.checkpoint()
            return await target(*args, **kwargs)

        return call


class _Blind(_Jittery):
    """Writes whatever the version: the read-modify-write the registry had before."""

    async def set_versioned(self, key: str, field: str, value: bytes, version: int) -> bool:
        await trio.lowlevel.checkpoint()
        _, now = await self._inner.get_versioned(key, field)
        return await self._inner.set_versioned(key, field, value, now)


class _Recording(Registry):
    def __init__(
        self, store: Any, changes: list[Change], clock: Callable[[], float] = time.time
    ) -> None:
        super().__init__(store, CONFIG, clock=clock)
        self.changes = changes

    async def update(self, run_id: str, decide: Callable[[RunRecord], RunRecord]) -> Change | None:
        change = await super().update(run_id, decide)
        if change is not None and change.after is not change.before:  # (else nothing written)
            self.changes.append(change)
        return change


def _operations(
    registry: Registry, run: str, rng: random.Random
) -> list[Callable[[], Awaitable[object]]]:
    """A random handful of what users, workers, pools and sweeps do to one run."""

    def report(event: str, attempt: int) -> Callable[[], Awaitable[object]]:
        frame = wire.Report(rid=1, run=run, attempt=attempt, event=event, job="7", detail="x")
        return lambda: registry.report(frame)

    async def release() -> object:
        record = await registry.load(run)
        return None if record is None else await registry.release(record, "gone")

    async def confirm() -> object:
        record = await registry.load(run)
        last = record.attempts[-1] if record is not None and record.attempts else None
        return None if last is None else await claiming.confirm(registry, run, last.n, last.claim)

    choices: list[Callable[[int], Callable[[], Awaitable[object]]]] = [
        lambda a: lambda: registry.cancel(run, "cancelled by the user"),
        lambda a: lambda: registry.claimed(run, f"w{a}"),
        lambda a: release,
        lambda a: confirm,
        lambda a: lambda: registry.transition(run, RunEvent.START, about=a),
        lambda a: lambda: registry.transition(run, RunEvent.PAUSE, about=a, paused_at="x.py:1"),
        lambda a: lambda: registry.transition(run, RunEvent.RESUME, about=a),
        lambda a: lambda: registry.transition(run, RunEvent.EXIT_OK, about=a, exit_code=0),
        lambda a: lambda: registry.attempt_ended(run, RunEvent.EXIT_ERROR, about=a, exit_code=1),
        lambda a: lambda: registry.attempt_ended(run, RunEvent.LEASE_EXPIRED, about=a),
        lambda a: report("lost", a),
        lambda a: report("job", a),
    ]
    return [rng.choice(choices)(rng.choice((1, 1, 2))) for _ in range(rng.randint(3, 9))]


def _allowed(before: RunRecord, after: RunRecord) -> bool:
    """Whether the state machine has a step from ``before`` to ``after``."""
    if after.attempt == before.attempt + 1:  # retried: the attempt ended, the run queued again
        return after.state is RunState.QUEUED and (before.state, RunEvent.RETRY) in TRANSITIONS
    if after.attempt != before.attempt:
        return False
    if after.state is before.state:  # the scheduler's job id noted, nothing else; or confirmed
        same = after.model_copy(update={"attempts": before.attempts}) == before
        return same or (before.state, RunEvent.CONFIRM) in TRANSITIONS
    return any(TRANSITIONS.get((before.state, event)) is after.state for event in RunEvent)


def _check_one_history(first: RunRecord, changes: list[Change], last: RunRecord) -> None:
    versions = sorted(c.version for c in changes)
    assert versions == list(range(2, 2 + len(changes))), (
        f"versions written {versions}: two changes took one version, or one is missing "
        "(a lost update)"
    )
    current = first
    for change in sorted(changes, key=lambda c: c.version):
        assert change.before == current, (
            f"version {change.version} was decided on a record other than version "
            f"{change.version - 1} ({change.before.state.value} / {current.state.value}): "
            "a lost update"
        )
        assert _allowed(change.before, change.after), (
            f"{change.before.state.value} -> {change.after.state.value}"
        )
        current = change.after
    assert current == last, "the stored record is not the last change applied"


async def _race(store: Store, seed: int, *, blind: bool = False) -> None:
    rng = random.Random(seed)
    wrapped = (_Blind if blind else _Jittery)(store, rng)
    changes: list[Change] = []
    relays = [_Recording(wrapped, changes), _Recording(wrapped, changes)]
    submitted = await relays[0].submit(SPEC, Manifest(), owner="alice")
    assert isinstance(submitted, RunRecord)
    run = submitted.id
    ops = [op for relay in relays for op in _operations(relay, run, rng)]
    late = _Recording(wrapped, changes, clock=lambda: 1e12)  # a relay sweeping past deadlines
    ops += [lambda: claiming.sweep(late)] * rng.randint(0, 2)
    rng.shuffle(ops)
    with trio.fail_after(30):
        async with trio.open_nursery() as nursery:
            for op in ops:
                nursery.start_soon(op)
    last = await relays[0].load(run)
    assert last is not None
    _check_one_history(submitted, changes, last)
    finished = [
        e
        for _, payload in await store.read_after(keys.stream(run, "logs"), "0", count=1000)
        if isinstance(e := wire.decode_entry(payload), wire.StatusEntry)
        and e.event == StatusEvent.FINISHED
    ]
    assert len(finished) == (1 if last.finished else 0), "the finish was settled once"
    # a lease a late claim left behind for a run that ended is ignored by every later sweep
    later = Registry(store, CONFIG, clock=lambda: 1e12)
    await later.sweep()
    assert await later.load(run) == last or not last.finished


@pytest.mark.parametrize("seed", range(300))
async def test_concurrent_updates_of_one_run_keep_one_history(seed: int) -> None:
    await _race(MemoryStore(), seed)


@pytest.mark.redis
@pytest.mark.parametrize("seed", range(40))
async def test_concurrent_updates_keep_one_history_on_a_real_server(
    redis_store: Store, seed: int
) -> None:
    await _race(redis_store, seed)


async def test_the_check_catches_lost_updates() -> None:
    """The read-modify-write the registry had before (a blind write) loses updates: the same
    races fail the check for some seeds."""
    failures = 0
    for seed in range(60):
        try:
            await _race(MemoryStore(), seed, blind=True)
        except AssertionError:
            failures += 1
    assert failures > 0
