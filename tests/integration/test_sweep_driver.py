"""The relay's sweep driver (``relay/sweeps.py``) on the fake store and real servers: the sweeps
cap, one driver at a time with a lease another process takes over once it lapsed, a cancel that
waits for a round and leaves no trial running, an ended sweep's keys expiring, and a sweep whose
round raises failing once, with one line."""

from __future__ import annotations

import logging

import pytest

from protocol_specs.access.auth import Principal, Scope
from protocol_specs.runs.runs import RunState
from protocol_specs.runs.spec import RunSpec
from protocol_specs.snapshots.snapshots import Manifest
from protocol_specs.sweeps.sweeps import SweepRecord, SweepSpec, SweepState, parse_param
from protocol_specs.wire import wire
from relay.config import RelayConfig
from relay.runs.registry import Registry
from relay.store import Store, keys
from relay.sweeps import LEASE, ROUND, Sweeps


def spec(trials: int = 4, parallel: int = 2) -> SweepSpec:
    run = RunSpec(command=["python", "t.py", "{lr}"], workdir="/w", debug=False)
    return SweepSpec(params=[parse_param("lr=1,2,3,4")], trials=trials, parallel=parallel, run=run)


def drivers(store: Store, now: list[float], **config: float) -> tuple[Sweeps, Sweeps]:
    settings = RelayConfig(**config)  # type: ignore[arg-type]
    registry = Registry(store, settings, clock=lambda: now[0])
    one = Sweeps(registry, settings, holder="relay-a", clock=lambda: now[0])
    two = Sweeps(registry, settings, holder="relay-b", clock=lambda: now[0])
    return one, two


async def test_a_user_has_at_most_so_many_unfinished_sweeps(store: Store) -> None:
    one, _ = drivers(store, [1000.0], max_active_sweeps=1)
    first = await one.create(spec(), Manifest(), "alice")
    assert isinstance(first, SweepRecord) and first.launched == 2
    refused = await one.create(spec(), Manifest(), "alice")
    assert isinstance(refused, wire.Error) and "1 unfinished sweeps" in refused.message
    assert isinstance(await one.create(spec(), Manifest(), "bob"), SweepRecord)
    await one.cancel(first.id, "enough")
    assert isinstance(await one.create(spec(), Manifest(), "alice"), SweepRecord)


async def test_one_driver_at_a_time_and_another_takes_over_a_lapsed_lease(store: Store) -> None:
    now = [1000.0]
    one, two = drivers(store, now)
    made = await one.create(spec(), Manifest(), "alice")
    assert isinstance(made, SweepRecord)
    assert not await two._hold(made.id)  # relay-a drives it
    now[0] += LEASE + 1  # relay-a went away
    assert await two._hold(made.id)
    assert not await one._hold(made.id)


async def test_a_cancel_leaves_no_trial_running_and_the_ended_sweep_expires(store: Store) -> None:
    one, _ = drivers(store, [1000.0], retention=3600)
    made = await one.create(spec(), Manifest(), "alice")
    assert isinstance(made, SweepRecord)
    cancelled = await one.cancel(made.id, "by alice")
    assert cancelled is not None and cancelled.state is SweepState.CANCELLED
    trials = await one.trials(made.id)
    assert len(trials) == 2 and all(t.ended for t in trials)
    for trial in trials:
        run = await one.registry.load(trial.run)
        assert run is not None and run.state is RunState.CANCELLED
    await one.step(made.id)  # a round after the cancel launches nothing more
    assert len(await one.trials(made.id)) == 2
    assert made.id not in await store.zrange_desc(keys.ACTIVE_SWEEPS, 100)
    for key in (keys.sweep(made.id), keys.sweep_trials(made.id)):
        ttl = await store.ttl(key)
        assert ttl is not None and 0 < ttl <= 3600, key


async def test_a_finished_sweep_leaves_the_driven_ones(store: Store) -> None:
    now = [1000.0]
    one, _ = drivers(store, now)
    made = await one.create(spec(trials=1, parallel=1), Manifest(), "alice")
    assert isinstance(made, SweepRecord)
    [trial] = await one.trials(made.id)
    await one.registry.cancel(trial.run, "as if it ended")  # its run ends (cancelled: failed)
    await one.step(made.id)
    record = await one.load(made.id)
    assert record is not None and record.state is SweepState.FINISHED
    assert record.counts == {"failed": 1}
    assert made.id not in await store.zrange_desc(keys.ACTIVE_SWEEPS, 100)


async def test_a_sweep_whose_round_raises_fails_with_one_line_logged_once(
    store: Store, caplog: pytest.LogCaptureFixture
) -> None:
    """A space a relay took before spaces were checked at submit: every draw overflows."""
    now = [1000.0]
    one, _ = drivers(store, now)
    run = RunSpec(command=["python", "t.py", "{x}"], workdir="/w", debug=False)
    extreme = SweepSpec(params=[parse_param("x=-1.7e308:1.7e308")], trials=4, run=run)
    with caplog.at_level(logging.INFO, logger="tether.relay"):
        made = await one.create(extreme, Manifest(), "alice")
        assert isinstance(made, SweepRecord)
        for _ in range(3):  # the rounds after: it is no longer driven
            now[0] += ROUND
            await one._round(made.id)
    assert made.state is SweepState.FAILED and made.launched == 0
    assert made.detail == "a round failed: OverflowError: Range exceeds valid bounds"
    said = [r for r in caplog.records if r.levelno >= logging.WARNING]
    assert [r.getMessage() for r in said] == [f"sweep {made.id} failed: a round raised"]
    assert said[0].exc_info is not None  # its traceback, once
    assert made.id not in await store.zrange_desc(keys.ACTIVE_SWEEPS, 100)
    assert made.id not in await store.zrange_desc(keys.user_active_sweeps("alice"), 100)
    alice = Principal(token="t1", kind="user", user="alice", scopes=frozenset({Scope.RUNS}))
    info = await one.answer(wire.GetSweep(rid=1, sweep=made.id), alice)
    assert isinstance(info, wire.SweepInfo) and info.sweep.detail == made.detail
    [listed] = await one.newest(10, "alice")
    assert listed.state is SweepState.FAILED


async def test_a_failed_sweep_cancels_its_running_trials(store: Store) -> None:
    """A trial the store holds in a shape the search cannot read (its value no longer one of
    the choices) makes the next launch raise."""
    now = [1000.0]
    one, _ = drivers(store, now)
    made = await one.create(spec(trials=4, parallel=2), Manifest(), "alice")
    assert isinstance(made, SweepRecord) and made.launched == 2
    first, second = await one.trials(made.id)
    garbled = second.model_copy(update={"params": {"lr": "not one of them"}})
    await store.hset(keys.sweep_trials(made.id), {"1": garbled.model_dump_json()})
    await one.registry.cancel(first.run, "as if it ended")  # room for the next trial
    now[0] += ROUND
    await one._round(made.id)
    record = await one.load(made.id)
    assert record is not None and record.state is SweepState.FAILED
    assert record.detail.startswith("a round failed: ValueError: ")
    run = await one.registry.load(second.run)
    assert run is not None and run.state is RunState.CANCELLED
    assert run.detail == f"sweep {made.id} failed"
    assert [t.ended for t in await one.trials(made.id)] == [True, True]
