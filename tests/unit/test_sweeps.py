"""Sweeps: the spaces users write, the sweep spec's checks (at submit, not after a queue wait),
trial runs, and the search and pruning through Optuna over stored trials."""

from __future__ import annotations

import math

import pytest
from pydantic import ValidationError

from protocol_specs.runs import RunSpec, RunState
from protocol_specs.search import ask, prune
from protocol_specs.sweeps import (
    SweepSpec,
    Trial,
    TrialState,
    best_of,
    ended,
    observed,
    parse_objective,
    parse_param,
)


def run(*command: str) -> RunSpec:
    return RunSpec(command=list(command), workdir="/w", debug=False)


def spec(*params: str, **fields: object) -> SweepSpec:
    return SweepSpec(
        params=[parse_param(p) for p in params],
        run=fields.pop("run", run("python", "train.py", "--lr", "{lr}")),  # type: ignore[arg-type]
        **fields,  # type: ignore[arg-type]
    )


@pytest.mark.parametrize(
    ("text", "kind", "low", "high", "log", "choices"),
    [
        ("lr=log:1e-5:1e-2", "float", 1e-5, 1e-2, True, []),
        ("dropout=0:0.5", "float", 0.0, 0.5, False, []),
        ("layers=int:2:8", "int", 2, 8, False, []),
        ("width=int:log:16:1024", "int", 16, 1024, True, []),
        ("bs=16,32,64", "choice", 0, 0, False, [16, 32, 64]),
        ("opt=adam,sgd", "choice", 0, 0, False, ["adam", "sgd"]),
        ("lr=1e-3,0.01", "choice", 0, 0, False, [0.001, 0.01]),
        ("seed=7", "choice", 0, 0, False, [7]),
    ],
)
def test_spaces_users_write(
    text: str, kind: str, low: float, high: float, log: bool, choices: list[object]
) -> None:
    param = parse_param(text)
    assert (param.kind, param.low, param.high, param.log, param.choices) == (
        kind, low, high, log, choices,
    )  # fmt: skip
    assert parse_param(f"{param.name}={param.describe()}") == param  # what status shows reads back


@pytest.mark.parametrize(
    ("text", "said"),
    [
        ("lr", "give NAME=SPACE"),
        ("lr=", "give NAME=SPACE"),
        ("lr=log:0:1", "log range needs a low above 0"),
        ("lr=1:0.5", "low < high"),
        ("n=int:1.5:3", "whole bounds"),
        ("n=int:a:b", "bounds are numbers"),
        ("x=1,1", "distinct choices"),
        ("2x=1,2", "invalid parameter name"),
    ],
)
def test_bad_spaces_are_said_at_once(text: str, said: str) -> None:
    with pytest.raises(ValueError, match=said):
        parse_param(text)


def test_the_spec_checks_what_cannot_work() -> None:
    with pytest.raises(ValidationError, match=r"names \{bs\}, which is no --param"):
        spec("lr=1,2", run=run("python", "t.py", "{lr}", "{bs}"))
    with pytest.raises(ValidationError, match="a grid needs a list of values for lr"):
        spec("lr=0.1:1", search="grid")
    with pytest.raises(ValidationError, match="tpe search needs an --objective"):
        spec("lr=0.1:1", search="tpe")
    with pytest.raises(ValidationError, match="needs an --objective"):
        spec("lr=0.1:1", early_stop="asha")
    with pytest.raises(ValidationError, match="given twice"):
        spec("lr=1,2", "lr=3,4")
    with pytest.raises(ValueError, match="min or max"):
        parse_objective("loss:lowest")
    with pytest.raises(ValidationError, match="--debug-others pause needs a --debug-when"):
        spec("lr=1,2", debug_others="pause")
    with pytest.raises(ValidationError, match="no format spec, conversion, attribute or index"):
        spec("lr=1,2", run=run("python", "t.py", "{lr:>300000000}"))
    for word in ("{lr!r}", "{lr.real}", "{lr[0]}"):
        with pytest.raises(ValidationError, match="nothing more"):
            spec("lr=1,2", run=run("python", "t.py", word))
    with pytest.raises(ValidationError, match="more than 100,000"):
        spec(*(f"p{i}=int:0:99" for i in range(3)), search="grid", run=run("t"))
    with pytest.raises(ValidationError, match="Attribute is not allowed"):
        RunSpec(command=["python", "t.py"], workdir="/w", debug_when="loss.real > 0")


def test_a_grid_runs_at_most_its_size_and_int_ranges_are_listed() -> None:
    grid = spec("lr=1e-3,1e-2", "layers=int:2:4", search="grid", trials=100)
    assert grid.grid_size() == 6 and grid.total() == 6
    assert spec("lr=1e-3,1e-2", search="grid", trials=1).total() == 1
    assert spec("lr=0.1:1", trials=64).total() == 64


def test_a_trials_run_has_its_parameters_in_the_command_and_the_environment() -> None:
    sweep = spec(
        "lr=log:1e-5:1e-2",
        "opt=adam,sgd",
        run=run("python", "t.py", "--lr={lr}", "--opt", "{opt}", "{{literal}}"),
        name="lr-search",
    )
    trial = sweep.trial_spec("s1", 3, {"lr": 0.00012, "opt": "sgd"})
    assert trial.command == ["python", "t.py", "--lr=0.00012", "--opt", "sgd", "{literal}"]
    assert trial.env["TETHER_TRIAL"] == "3" and trial.env["TETHER_SWEEP"] == "s1"
    assert trial.env["TETHER_PARAMS"] == '{"lr": 0.00012, "opt": "sgd"}'
    assert trial.name == "lr-search#3" and "sweep:s1" in trial.tags


def test_the_best_trial_is_the_best_completed_value_and_nan_never_wins() -> None:
    objective = parse_objective("loss:min")
    trials = [
        Trial(n=0, run="r0", params={}, state=TrialState.COMPLETE, value=0.5),
        Trial(n=1, run="r1", params={}, state=TrialState.PRUNED, value=0.1),
        Trial(n=2, run="r2", params={}, state=TrialState.COMPLETE, value=math.nan),
        Trial(n=3, run="r3", params={}, state=TrialState.COMPLETE, value=0.2),
    ]
    best = best_of(objective, trials)
    assert best is not None and best.n == 3
    best = best_of(parse_objective("loss:max"), trials)
    assert best is not None and best.n == 0


# --- the search over stored trials -----------------------------------------------------------------


def test_the_same_sweep_asks_for_the_same_parameters() -> None:
    sweep = spec("lr=log:1e-5:1e-2", "bs=16,32", trials=5, seed=7)
    first = [ask(sweep, [], n)[0] for n in range(3)]
    again = [ask(sweep, [], n)[0] for n in range(3)]
    assert first == again
    assert all(1e-5 <= p["lr"] <= 1e-2 and p["bs"] in (16, 32) for p in first)
    assert len({p["lr"] for p in first}) == 3  # each trial number its own draw


def test_a_grid_asks_each_point_once_even_rebuilt_from_the_store() -> None:
    sweep = spec("lr=1e-3,1e-2", "bs=16,32,64", search="grid", run=run("t", "{lr}", "{bs}"))
    trials: list[Trial] = []
    for n in range(6):
        params, system = ask(sweep, trials, n)  # a new study each time, from the trials
        trials.append(Trial(n=n, run=f"r{n}", params=params, system=system))
    assert sorted((t.params["lr"], t.params["bs"]) for t in trials) == sorted(
        (lr, bs) for lr in (1e-3, 1e-2) for bs in (16, 32, 64)
    )


def test_asha_prunes_a_lagging_trial_and_keeps_its_rungs_in_the_trial() -> None:
    sweep = spec("lr=0.1:1", objective=parse_objective("loss:min"), early_stop="asha")
    curve = [(step, 1.0 / (step + 1)) for step in range(1, 30)]
    done: list[Trial] = []
    for i in range(3):  # as the relay drives them: each value shown to the pruner, then ended
        values = [(s, v * (1 + i)) for s, v in curve]
        trial = Trial(n=i, run=f"r{i}", params={"lr": 0.5})
        stop, system = prune(sweep, [*done, trial], i, values)
        assert not stop or i > 0
        done.append(
            trial.model_copy(
                update={"state": TrialState.COMPLETE, "value": values[-1][1],
                        "values": values, "system": system}
            )
        )  # fmt: skip
    lagging = Trial(n=3, run="r3", params={"lr": 0.2})
    stop, system = prune(sweep, [*done, lagging], 3, [(s, v * 10) for s, v in curve[:3]])
    assert stop
    assert any(key.startswith("completed_rung_") for key in system)
    leading = Trial(n=4, run="r4", params={"lr": 0.9})
    stop, system = prune(sweep, [*done, leading], 4, [(s, v * 0.5) for s, v in curve[:3]])
    assert not stop and system  # promoted: its rungs are kept for the next call


def test_median_stops_a_trial_worse_than_the_median_of_completed_ones() -> None:
    sweep = spec("lr=0.1:1", objective=parse_objective("acc:max"), early_stop="median")
    done = [
        Trial(n=i, run=f"r{i}", params={"lr": 0.5}, state=TrialState.COMPLETE, value=0.9,
              values=[(s, 0.1 * s) for s in range(10)])
        for i in range(5)
    ]  # fmt: skip
    worse = Trial(n=5, run="r5", params={"lr": 0.2})
    assert prune(sweep, [*done, worse], 5, [(1, 0.01), (2, 0.02)])[0]
    better = Trial(n=6, run="r6", params={"lr": 0.2})
    assert not prune(sweep, [*done, better], 6, [(1, 0.5), (2, 0.6)])[0]


# --- what a round decides about a trial ------------------------------------------------------------


def test_a_trials_objective_is_folded_from_its_runs_points() -> None:
    trial = Trial(n=0, run="r0", params={})
    points = [(0, 0.0, {"loss": 1.0, "acc": 0.1}), (1, 0.0, {"acc": 0.2}), (1, 0.0, {"loss": 0.5})]
    trial, new = observed(trial, points, "loss", "5-0")
    assert (trial.values, trial.value, trial.cursor, new) == (
        [(0, 1.0), (1, 0.5)], 0.5, "5-0", [(0, 1.0), (1, 0.5)],
    )  # fmt: skip
    # a retried attempt starts over: its steps replace the values, the pruner sees only what is new
    again = [(0, 0.0, {"loss": 0.9}), (1, 0.0, {"loss": 0.4}), (2, 0.0, {"loss": 0.3})]
    trial, new = observed(trial, again, "loss", "9-0")
    assert trial.values == [(0, 0.9), (1, 0.4), (2, 0.3)] and new == [(2, 0.3)]
    assert trial.value == 0.3


@pytest.mark.parametrize(
    ("state", "value", "objective", "became", "outcome"),
    [
        (RunState.SUCCEEDED, 0.5, "loss", TrialState.COMPLETE, "succeeded"),
        (RunState.SUCCEEDED, None, "loss", TrialState.FAILED, "reported no usable loss"),
        (RunState.SUCCEEDED, math.nan, "loss", TrialState.FAILED, "reported no usable loss"),
        (RunState.SUCCEEDED, None, "", TrialState.COMPLETE, "succeeded"),
        (RunState.FAILED, 0.5, "loss", TrialState.FAILED, "failed"),
        (RunState.CANCELLED, 0.5, "loss", TrialState.FAILED, "cancelled"),
    ],
)
def test_how_a_trial_ends_with_its_run(
    state: RunState, value: float | None, objective: str, became: TrialState, outcome: str
) -> None:
    sweep = spec("lr=1,2", objective=parse_objective(objective) if objective else None)
    trial = ended(Trial(n=0, run="r0", params={}, value=value), state, sweep)
    assert trial.ended and trial.state is became and outcome in trial.outcome
    pruned = Trial(n=1, run="r1", params={}, state=TrialState.PRUNED, value=0.9)
    assert ended(pruned, RunState.CANCELLED, sweep).state is TrialState.PRUNED
