"""Sweeps in the relay: their records and trials in the store, and the loop that drives each
unfinished sweep (the decisions are ``protocol_specs/sweeps/sweeps.py`` and ``protocol_specs/sweeps/search.py``).

Every relay process runs :meth:`Sweeps.drive_forever`; a sweep is driven by one process at a time,
the holder of its lease (``keys.sweep_lease``, a compare-and-set value renewed each round, taken
over once it expired: a relay killed mid-sweep is replaced within :data:`LEASE` seconds). A round
(:meth:`Sweeps.step`) reads the sweep and its trials from the store, and for each trial whose run
has not ended reads its new metrics (after the trial's cursor), asks the pruner about the
objective's new values, tells a pruned trial's program to stop and cancels it once its grace is
over, and records how an ended run's trial came out; then it launches trials while fewer than
``parallel`` are active; then it ends the sweep when every trial ended. Each change is written
before what follows from it: a trial is recorded with its run's id before the run is submitted,
so a relay that dies between the two submits it on the next round (a run id is never reused).
A round that raises anything but the store's errors (which are retried next round) fails the
sweep, saying why in one line (``protocol_specs.sweeps.sweeps.round_failed``), logged once.
"""

from __future__ import annotations

import logging
import math
import secrets
import time
from collections.abc import Callable
from functools import partial

import trio

from protocol_specs.access.auth import Principal
from protocol_specs.access.permissions import Act, authorize
from protocol_specs.runs.runs import RunRecord, RunState
from protocol_specs.runs.text import shown_state
from protocol_specs.snapshots.snapshots import Manifest
from protocol_specs.sweeps.search import ask, prune
from protocol_specs.sweeps.sweeps import (
    SweepRecord,
    SweepSpec,
    SweepState,
    Trial,
    TrialState,
    best_of,
    ended,
    observed,
    round_failed,
)
from protocol_specs.wire import wire
from protocol_specs.wire.wire import ErrorCode, StreamName

from .config import RelayConfig
from .runs.metrics import points_after
from .runs.registry import RECORD_FIELD, Registry, snapshot_fields
from .snapshots.trees import Rooted
from .store import StoreError, keys

__all__ = ["LEASE", "ROUND", "Sweeps"]

log = logging.getLogger("tether.relay")

#: seconds between two rounds of a sweep
ROUND = 1.0
#: seconds a relay holds a sweep's lease without renewing it
LEASE = 5.0


def new_sweep_id() -> str:
    return f"s{int(time.time()):x}{secrets.token_hex(2)}"


class Sweeps:
    def __init__(
        self,
        registry: Registry,
        config: RelayConfig,
        *,
        holder: str,
        clock: Callable[[], float] = time.time,
    ) -> None:
        self.registry = registry
        self.store = registry.store
        self.config = config
        self.holder = holder
        self.clock = clock
        #: one round (or cancel) of a sweep at a time in this process
        self._locks: dict[str, trio.Lock] = {}

    def _lock(self, sweep_id: str) -> trio.Lock:
        return self._locks.setdefault(sweep_id, trio.Lock())

    # --- records ----------------------------------------------------------------------------------

    async def load(self, sweep_id: str) -> SweepRecord | None:
        raw, _ = await self.store.get_versioned(keys.sweep(sweep_id), RECORD_FIELD)
        return SweepRecord.model_validate_json(raw) if raw else None

    async def update(
        self, sweep_id: str, decide: Callable[[SweepRecord], SweepRecord]
    ) -> SweepRecord | None:
        for _ in range(20):
            raw, version = await self.store.get_versioned(keys.sweep(sweep_id), RECORD_FIELD)
            if raw is None:
                return None
            before = SweepRecord.model_validate_json(raw)
            record = decide(before)
            if record == before:  # nothing to write (most rounds)
                return record
            stored = record.model_dump_json().encode()
            if await self.store.set_versioned(keys.sweep(sweep_id), RECORD_FIELD, stored, version):
                return record
        raise StoreError(f"sweep {sweep_id}: too many other writers")

    async def trials(self, sweep_id: str) -> list[Trial]:
        raw = await self.store.hgetall(keys.sweep_trials(sweep_id))
        return sorted((Trial.model_validate_json(v) for v in raw.values()), key=lambda t: t.n)

    async def _put(self, sweep_id: str, trial: Trial) -> None:
        await self.store.hset(keys.sweep_trials(sweep_id), {str(trial.n): trial.model_dump_json()})

    async def create(
        self, spec: SweepSpec, snapshot: Manifest | Rooted, owner: str
    ) -> SweepRecord | wire.Error:
        """Record a sweep on ``snapshot`` and launch its first trials; an error if ``owner``
        has as many unfinished sweeps as the relay allows."""
        cap = self.config.max_active_sweeps
        active = await self.store.zrange_by_score(keys.user_active_sweeps(owner), math.inf, cap)
        if len(active) >= cap:
            return wire.Error(
                code=ErrorCode.TOO_MANY_RUNS,
                message=f"{owner} has {len(active)} unfinished sweeps, the most this relay "
                "allows; wait for one to end or cancel one (tether sweep cancel)",
            )
        now = self.clock()
        fields = snapshot_fields(snapshot)
        record = SweepRecord(
            id=new_sweep_id(), spec=spec, owner=owner, created_at=now, updated_at=now, **fields
        )
        stored = record.model_dump_json().encode()
        while not await self.store.set_versioned(keys.sweep(record.id), RECORD_FIELD, stored, 0):
            record = record.model_copy(update={"id": new_sweep_id()})
            stored = record.model_dump_json().encode()
        if isinstance(snapshot, Manifest):
            await self.store.set_bytes(
                keys.sweep_manifest(record.id), snapshot.model_dump_json().encode()
            )
        await self.store.zadd(keys.SWEEPS, record.id, now)
        await self.store.zadd(keys.user_sweeps(owner), record.id, now)
        await self.store.zadd(keys.user_active_sweeps(owner), record.id, now)
        await self.store.zadd(keys.ACTIVE_SWEEPS, record.id, now)
        await self._round(record.id)
        return await self.load(record.id) or record

    async def newest(self, limit: int, user: str = "") -> list[SweepRecord]:
        """The newest sweeps (``user``'s only); those whose keys expired leave the indexes."""
        found = []
        index = keys.user_sweeps(user) if user else keys.SWEEPS
        for sweep_id in await self.store.zrange_desc(index, limit):
            record = await self.load(sweep_id)
            if record is not None:
                found.append(record)
            else:
                await self.store.zrem(index, sweep_id)
        return found

    async def _ended(self, record: SweepRecord) -> None:
        """A sweep that finished or was cancelled: out of the driven ones, and its keys expire
        with the relay's retention (as its runs' do)."""
        await self.store.zrem(keys.ACTIVE_SWEEPS, record.id)
        await self.store.zrem(keys.user_active_sweeps(record.owner), record.id)
        for key in keys.sweep_keys(record.id):
            await self.store.expire(key, self.config.retention)

    async def cancel(self, sweep_id: str, detail: str) -> SweepRecord | None:
        """Cancel the sweep: no more trials, and the running ones cancelled."""
        async with self._lock(sweep_id):
            return await self._cancel(sweep_id, detail)

    async def _cancel(self, sweep_id: str, detail: str) -> SweepRecord | None:
        now = self.clock()

        def cancelled(record: SweepRecord) -> SweepRecord:
            if record.finished:
                return record
            return record.model_copy(
                update={"state": SweepState.CANCELLED, "updated_at": now, "detail": detail}
            )

        return await self._end(sweep_id, cancelled, detail)

    async def _end(
        self, sweep_id: str, decide: Callable[[SweepRecord], SweepRecord], detail: str
    ) -> SweepRecord | None:
        """End the sweep as ``decide`` says (cancelled, failed): no more trials, and the running
        ones cancelled (``detail``: why, for their runs)."""
        record = await self.update(sweep_id, decide)
        if record is None:
            return None
        for trial in await self.trials(sweep_id):
            if trial.ended:
                continue
            run = await self.registry.cancel(trial.run, detail)
            if run is not None and run.finished:
                await self._put(sweep_id, ended(trial, run.state, record.spec))
        await self._ended(record)
        return await self._settle(sweep_id)

    # --- control requests ---------------------------------------------------------------------------

    async def answer(
        self, frame: wire.GetSweep | wire.CancelSweep | wire.ListSweeps, who: Principal
    ) -> wire.AnyFrame:
        """A control request about sweeps, as ``who`` (a user sees only their own)."""
        act = {
            wire.GetSweep: Act.GET_SWEEP,
            wire.CancelSweep: Act.CANCEL_SWEEP,
            wire.ListSweeps: Act.LIST_SWEEPS,
        }[type(frame)]
        refusal = authorize(who, act)
        if refusal is not None:
            return wire.Error(code=ErrorCode(refusal.code), message=refusal.message, rid=frame.rid)
        if isinstance(frame, wire.ListSweeps):
            found = await self.newest(frame.limit, "" if who.admin else who.user)
            return wire.SweepList(rid=frame.rid, sweeps=[r.redacted() for r in found])
        record = await self.find(frame.sweep, who)
        if record is None:
            return wire.Error(
                code=ErrorCode.NO_SUCH_RUN,
                message=f"no sweep {frame.sweep!r} (or not yours)",
                rid=frame.rid,
            )
        if isinstance(frame, wire.CancelSweep):
            record = await self.cancel(record.id, f"sweep {record.id} cancelled by {who.user}")
            assert record is not None
        trials = await self.trials_as_shown(record.id)
        return wire.SweepInfo(rid=frame.rid, sweep=record.redacted(), trials=trials)

    async def trials_as_shown(self, sweep_id: str) -> list[Trial]:
        """The sweep's trials, each running one with its run's state."""
        return [await self.with_run_state(t) for t in await self.trials(sweep_id)]

    async def with_run_state(self, trial: Trial) -> Trial:
        """``trial`` as answered: its run's state, as the run's own views show it."""
        if trial.ended:
            return trial
        run = await self.registry.load(trial.run)
        return trial if run is None else trial.model_copy(update={"run_state": shown_state(run)})

    async def claim_pause(self, record: RunRecord, frame: wire.ClaimPause) -> wire.PauseClaimed:
        """Whether ``record``'s program may pause where it met ``--debug-when``: any run may; a
        sweep's trial only if it is the first of its sweep to ask (its sweep records which)."""
        if not record.trial:
            return wire.PauseClaimed(rid=frame.rid, pause=True)
        sweep_id, _, n = record.trial.partition("#")
        key = keys.sweep_paused(sweep_id)
        raw, version = await self.store.get_versioned(key, "run")
        if raw is None and await self.store.set_versioned(key, "run", record.id.encode(), version):
            raw = record.id.encode()
            met = " ".join(f"{k}={v:g}" for k, v in frame.values.items())
            said = f"trial {n} ({record.id}) paused at step {frame.step}: {met}"
            await self.update(
                sweep_id,
                lambda r: r.model_copy(update={"debugged": said, "debugged_run": record.id}),
            )
        elif raw is None:
            raw, _ = await self.store.get_versioned(key, "run")
        first = (raw or b"").decode()
        if first == record.id:
            return wire.PauseClaimed(rid=frame.rid, pause=True)
        return wire.PauseClaimed(rid=frame.rid, pause=False, detail=f"{first} paused first")

    async def find(self, sweep: str, who: Principal) -> SweepRecord | None:
        """The sweep ``sweep`` names (its id, a unique prefix of one of the user's, or its
        name), if ``who`` may see it."""
        record = await self.load(sweep)
        if record is None and len(sweep) >= 4:
            candidates = [
                r for r in await self.newest(200, "" if who.admin else who.user)
                if r.id.startswith(sweep) or r.spec.name == sweep
            ]  # fmt: skip
            record = candidates[0] if len(candidates) == 1 else None
        if record is None or not (who.admin or record.owner == who.user):
            return None
        return record

    # --- driving ----------------------------------------------------------------------------------

    async def drive_forever(self, every: float = ROUND) -> None:
        while True:
            try:  # every unfinished sweep, each round (users' caps bound how many)
                active = await self.store.zrange_desc(keys.ACTIVE_SWEEPS, 10**6)
            except StoreError as exc:
                log.warning("sweeps: %s", exc)
                active = []
            for sweep_id in active:
                await self._round(sweep_id)
            driven = set(active)
            self._locks = {k: v for k, v in self._locks.items() if k in driven or v.locked()}
            await trio.sleep(every)

    async def _round(self, sweep_id: str) -> None:
        """One round of one sweep, if this process holds it. The store failing is logged in a
        line and the round tried again next time; any other error would come back every round
        (a sampler raising on the space, say), so the sweep fails with it (:func:`round_failed`:
        one line in its record), logged here once, with its traceback. Either way the other
        sweeps, and the relay, go on."""
        try:
            async with self._lock(sweep_id):
                try:
                    if await self._hold(sweep_id):
                        await self.step(sweep_id)
                except StoreError:
                    raise
                except Exception as error:
                    log.exception("sweep %s failed: a round raised", sweep_id)
                    failed = partial(round_failed, error=error, now=self.clock())
                    await self._end(sweep_id, failed, f"sweep {sweep_id} failed")
        except StoreError as exc:
            log.warning("sweep %s: %s", sweep_id, exc)
        except Exception:  # failing it failed too: said, and tried again next round
            log.exception("sweep %s: a round failed, and so did ending it", sweep_id)

    async def _hold(self, sweep_id: str) -> bool:
        """Take or renew the sweep's lease; whether this process drives it now."""
        raw, version = await self.store.get_versioned(keys.sweep_lease(sweep_id), "holder")
        now = self.clock()
        if raw:
            holder, _, until = raw.decode().rpartition(" ")
            if holder != self.holder and float(until) > now:
                return False
        value = f"{self.holder} {now + LEASE}".encode()
        return await self.store.set_versioned(keys.sweep_lease(sweep_id), "holder", value, version)

    async def step(self, sweep_id: str) -> None:
        """One round of the sweep (see the module's docstring)."""
        record = await self.load(sweep_id)
        if record is None or record.finished:
            await self.store.zrem(keys.ACTIVE_SWEEPS, sweep_id)
            if record is not None:
                await self.store.zrem(keys.user_active_sweeps(record.owner), sweep_id)
            return
        trials = await self.trials(sweep_id)
        for i, trial in enumerate(trials):
            if not trial.ended:
                trials[i] = await self._observe(record, trials, trial)
        spec = record.spec
        holding = spec.debug_others == "pause" and await self._hold_others(record, trials)
        active = sum(1 for t in trials if not t.ended)
        launched = max(record.launched, len(trials))
        while active < spec.parallel and launched < spec.total() and not holding:
            # a long round keeps its lease, and stops if the sweep was cancelled meanwhile
            # (by another relay: this one's cancel waits for the round)
            now_record = await self.load(sweep_id)
            if now_record is None or now_record.finished or not await self._hold(sweep_id):
                return
            trial, submitted = await self._launch(record, trials, launched)
            trials.append(trial)
            launched += 1
            active += 1
            if not submitted:
                break  # the user's runs cap: it is submitted on a later round
        if launched != record.launched:
            record = (
                await self.update(
                    sweep_id, lambda r: r.model_copy(update={"launched": max(r.launched, launched)})
                )
                or record
            )
        if launched >= spec.total() and active == 0:
            done = await self.update(
                sweep_id,
                lambda r: r if r.finished else r.model_copy(
                    update={"state": SweepState.FINISHED, "updated_at": self.clock()}
                ),
            )  # fmt: skip
            if done is not None:
                await self._ended(done)
        await self._settle(sweep_id, trials)

    async def _hold_others(self, record: SweepRecord, trials: list[Trial]) -> bool:
        """While the trial that met ``--debug-when`` is paused, the others' programs are held
        (``suspend``), and let go (``resume``) once it runs again or ended; whether they are
        held now."""
        if not record.debugged_run:
            return False
        debugged = await self.registry.load(record.debugged_run)
        holding = debugged is not None and debugged.state is RunState.PAUSED
        for i, trial in enumerate(trials):
            if trial.ended or trial.run == record.debugged_run or trial.suspended == holding:
                continue
            run = await self.registry.load(trial.run)
            if run is None or run.finished:
                continue
            control = wire.ControlEntry(
                action="suspend" if holding else "resume", detail="debugging", attempt=run.attempt
            )
            await self.store.append(
                keys.stream(run.id, StreamName.TO_WORKER), wire.encode_entry(control)
            )
            trials[i] = trial.model_copy(update={"suspended": holding})
            await self._put(record.id, trials[i])
        return holding

    async def _settle(self, sweep_id: str, trials: list[Trial] | None = None) -> SweepRecord | None:
        """The record's counts and best trial, as the trials are now."""
        trials = trials if trials is not None else await self.trials(sweep_id)
        counts: dict[str, int] = {}
        for trial in trials:
            counts[trial.state.value] = counts.get(trial.state.value, 0) + 1
        record = await self.load(sweep_id)
        best = best_of(record.spec.objective, trials) if record else None

        def settled(r: SweepRecord) -> SweepRecord:
            return r.model_copy(
                update={
                    "counts": counts,
                    "best": best.n if best else None,
                    "best_value": best.value if best else None,
                }
            )

        return await self.update(sweep_id, settled)

    async def _launch(self, record: SweepRecord, trials: list[Trial], n: int) -> tuple[Trial, bool]:
        """Trial ``n``: its parameters, recorded, then its run submitted (whether it was)."""
        params, system = await trio.to_thread.run_sync(ask, record.spec, list(trials), n)
        trial = Trial(n=n, run=f"{record.id}-{n}", params=params, system=system)
        await self._put(record.id, trial)
        return trial, await self._submit(record, trial)

    async def _submit(self, record: SweepRecord, trial: Trial) -> bool:
        """Submit the trial's run (again, if a relay died before it could); False: not now."""
        if await self.registry.load(trial.run) is not None:
            return True
        snapshot: Manifest | Rooted
        if record.tree:
            snapshot = Rooted(record.tree, record.snapshot, record.files, record.size)
        else:
            raw = await self.store.get_bytes(keys.sweep_manifest(record.id))
            snapshot = Manifest.model_validate_json(raw) if raw else Manifest()
        spec = record.spec.trial_spec(record.id, trial.n, trial.params)
        got = await self.registry.submit(
            spec, snapshot, owner=record.owner, run_id=trial.run, trial=f"{record.id}#{trial.n}"
        )
        if isinstance(got, wire.Error):
            log.info("sweep %s: trial %d not submitted: %s", record.id, trial.n, got.message)
            return False
        return True

    async def _observe(self, record: SweepRecord, trials: list[Trial], trial: Trial) -> Trial:
        """The trial after what its run did since the last round."""
        run = await self.registry.load(trial.run)
        if run is None:  # recorded, but its relay died before submitting it
            await self._submit(record, trial)
            return trial
        spec = record.spec
        updated = trial
        new: list[tuple[int, float]] = []
        if spec.objective is not None:
            updated, new = await self._read_metrics(trial, spec.objective.metric)
        if new and spec.early_stop != "none" and updated.state is TrialState.RUNNING:
            others = [updated if t.n == trial.n else t for t in trials]
            stop, system = await trio.to_thread.run_sync(prune, spec, others, trial.n, new)
            updated = updated.model_copy(update={"system": system})
            if stop and not run.finished:
                updated = updated.model_copy(
                    update={"state": TrialState.PRUNED, "stop_at": self.clock()}
                )
                await self._tell_stop(run)
        now = self.clock()
        if (
            updated.stop_at is not None
            and not run.finished
            and now >= updated.stop_at + spec.stop_grace
        ):
            await self.registry.cancel(run.id, f"pruned by sweep {record.id}")
            run = await self.registry.load(run.id) or run
        if run.finished:
            updated = ended(updated, run.state, spec)
        if updated != trial:
            await self._put(record.id, updated)
        return updated

    async def _read_metrics(
        self, trial: Trial, metric: str
    ) -> tuple[Trial, list[tuple[int, float]]]:
        """The trial after its run's metric entries since its cursor (:func:`observed`), and
        the objective's new values (a long backlog is read over several rounds)."""
        points, cursor = await points_after(self.store, trial.run, trial.cursor)
        if cursor == trial.cursor:
            return trial, []
        return observed(trial, points, metric, cursor)

    async def _tell_stop(self, run: RunRecord) -> None:
        control = wire.ControlEntry(action="stop", detail="pruned", attempt=run.attempt)
        await self.store.append(
            keys.stream(run.id, StreamName.TO_WORKER), wire.encode_entry(control)
        )
