"""The search and the early stopping of a sweep, by Optuna's samplers and pruners. Sans-I/O (no
store, no clock): each call rebuilds an in-memory Optuna study from the sweep's stored trials
(``protocol_specs/sweeps/sweeps.py``), asks it one thing, and gives back what to store. So Optuna is a
library of algorithms here, not a second database: the relay's store stays the only truth, and a
relay restart (or another relay taking the sweep over) loses nothing.

- :func:`ask`: the next trial's parameters (``random``: :class:`~optuna.samplers.RandomSampler`,
  ``tpe``: :class:`~optuna.samplers.TPESampler`, ``grid``:
  :class:`~optuna.samplers.GridSampler`, each seeded by the sweep's seed and the trial's number:
  the same sweep asks for the same parameters).
- :func:`prune`: whether a running trial stops, given the objective's new values
  (``asha``: :class:`~optuna.pruners.SuccessiveHalvingPruner`, ``median``:
  :class:`~optuna.pruners.MedianPruner`, with Optuna's defaults). ASHA keeps its rungs in the trials'
  system attributes, which :func:`prune` hands back to be stored with the trial.

Optuna is imported on first use (it takes a few hundred milliseconds); the relay calls these in a
thread.
"""

from __future__ import annotations

import math
import warnings
from typing import TYPE_CHECKING, Any

from .sweeps import MAX_INT_CHOICE, SweepSpec, Trial, TrialState

if TYPE_CHECKING:
    import optuna

__all__ = ["ask", "prune"]


def ask(spec: SweepSpec, trials: list[Trial], n: int) -> tuple[dict[str, Any], dict[str, Any]]:
    """Trial ``n``'s parameters, and the system attributes its sampler set (a grid's point)."""
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        study = _study(spec, trials, n)
        trial = study.ask(fixed_distributions=_distributions(spec))
        params = {name: _held(name, _plain(value)) for name, value in trial.params.items()}
        return params, dict(study._storage.get_trial_system_attrs(trial._trial_id))


def prune(
    spec: SweepSpec, trials: list[Trial], n: int, values: list[tuple[int, float]]
) -> tuple[bool, dict[str, Any]]:
    """Whether trial ``n`` (running) stops, given the objective's new ``values`` (step, value),
    in step order; and its system attributes after (what the pruner keeps)."""
    import optuna

    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        study = _study(spec, trials, n)
        index = next(i for i, t in enumerate(trials) if t.n == n)
        trial_id = study.trials[index]._trial_id
        trial = optuna.trial.Trial(study, trial_id)
        stop = False
        for step, value in values:
            trial.report(value, step)
            if trial.should_prune():
                stop = True
                break
        return stop, dict(study._storage.get_trial_system_attrs(trial_id))


def _study(spec: SweepSpec, trials: list[Trial], n: int) -> optuna.Study:
    import optuna

    optuna.logging.set_verbosity(optuna.logging.WARNING)
    seed = (spec.seed * 1_000_003 + n) % 2**32
    sampler: optuna.samplers.BaseSampler
    if spec.search == "grid":
        space = {p.name: p.grid() or [] for p in spec.params}
        sampler = optuna.samplers.GridSampler(space, seed=spec.seed)
    elif spec.search == "tpe":
        sampler = optuna.samplers.TPESampler(seed=seed)
    else:
        sampler = optuna.samplers.RandomSampler(seed=seed)
    pruner: optuna.pruners.BasePruner = {
        "asha": optuna.pruners.SuccessiveHalvingPruner,
        "median": optuna.pruners.MedianPruner,
        "none": optuna.pruners.NopPruner,
    }[spec.early_stop]()
    maximize = spec.objective is not None and spec.objective.direction == "max"
    study = optuna.create_study(
        sampler=sampler, pruner=pruner, direction="maximize" if maximize else "minimize"
    )
    distributions = _distributions(spec)
    for trial in sorted(trials, key=lambda t: t.n):
        study.add_trial(_frozen(trial, distributions))
    return study


def _frozen(trial: Trial, distributions: dict[str, Any]) -> optuna.trial.FrozenTrial:
    import optuna

    State = optuna.trial.TrialState
    state = {
        TrialState.RUNNING: State.RUNNING,
        TrialState.COMPLETE: State.COMPLETE,
        TrialState.PRUNED: State.PRUNED,
        TrialState.FAILED: State.FAIL,
    }[trial.state]
    value = None
    if state is State.COMPLETE:
        value = trial.value if trial.value is not None and math.isfinite(trial.value) else None
        if value is None:  # no usable value: nothing to learn from it
            state = State.FAIL
    known = {k: v for k, v in trial.params.items() if k in distributions}
    return optuna.trial.create_trial(
        state=state,
        value=value,
        params=known,
        distributions={k: distributions[k] for k in known},
        intermediate_values={step: v for step, v in trial.values if math.isfinite(v)},
        system_attrs=dict(trial.system),
    )


def _distributions(spec: SweepSpec) -> dict[str, Any]:
    from optuna.distributions import (
        CategoricalDistribution,
        FloatDistribution,
        IntDistribution,
    )

    out: dict[str, Any] = {}
    for p in spec.params:
        if spec.search == "grid" or p.kind == "choice":
            out[p.name] = CategoricalDistribution(p.grid() or [])
        elif p.kind == "int":
            out[p.name] = IntDistribution(int(p.low), int(p.high), log=p.log)
        else:
            out[p.name] = FloatDistribution(p.low, p.high, log=p.log)
    return out


def _held(name: str, value: Any) -> Any:
    """``value`` if the relay can store and send it (a finite float, an int64); else a
    ``ValueError`` (a space checked at submit never gives one: a sweep stored before those
    checks fails with it)."""
    if isinstance(value, float) and not math.isfinite(value):
        raise ValueError(f"the sampler gave {name} = {value}, which is no finite number")
    if isinstance(value, int) and abs(value) > MAX_INT_CHOICE:
        raise ValueError(f"the sampler gave {name} an integer beyond ±(2**63 - 1)")
    return value


def _plain(value: Any) -> Any:
    """A parameter as JSON keeps it (numpy's numbers as Python's)."""
    if hasattr(value, "item"):
        return value.item()
    return value
