"""Sweeps: the spaces users write, the sweep spec's checks (at submit, not after a queue wait),
trial runs, and the search and pruning through Optuna over stored trials."""

from __future__ import annotations

import math

import msgpack
import pytest
from hypothesis import given
from hypothesis import settings as hypothesis_settings
from hypothesis import strategies as st
from pydantic import ValidationError

from protocol_specs.runs.runs import RunState
from protocol_specs.runs.spec import RunSpec
from protocol_specs.sweeps.search import ask, prune
from protocol_specs.sweeps.sweeps import (
    FAILURE_CHARS,
    MAX_FLOAT,
    MAX_INT,
    SweepRecord,
    SweepSpec,
    SweepState,
    Trial,
    TrialState,
    best_of,
    ended,
    observed,
    parse_objective,
    parse_param,
    round_failed,
)
from protocol_specs.wire import wire


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


# --- what the relay and the samplers can hold -------------------------------------------------------


@pytest.mark.parametrize(
    ("text", "said"),
    [
        ("x=int:0:1e300", r"x: an int range's bounds are within ±9007199254740992 \(2\*\*53\)"),
        ("x=int:-1e17:0", r"x: an int range's bounds are within ±9007199254740992"),
        ("x=-1.7e308:1.7e308", r"x: a range's bounds are within ±1e300 .* -1.7e\+308:1.7e\+308"),
        ("x=log:1e-3:1e301", r"x: a range's bounds are within ±1e300"),
        ("x=1,100000000000000000000000", r"x: an integer choice is within ±\(2\*\*63 - 1\)"),
    ],
)
def test_spaces_beyond_what_the_relay_and_the_samplers_hold_are_refused_at_submit(
    text: str, said: str
) -> None:
    sweep = spec(text, run=run("t", "{x}"))  # a stored sweep of such a space is still read
    with pytest.raises(ValueError, match=said):
        sweep.check_limits()
    raw = {"t": "submit_sweep", "rid": 3, "spec": sweep.model_dump(mode="json")}
    if "100000000000000000000000" in text:  # msgpack cannot even carry it: a frame never will
        return
    with pytest.raises(wire.WireError) as refused:  # a crafted frame: the relay checks it again
        wire.decode_frame(msgpack.packb(raw))
    assert refused.value.code == wire.ErrorCode.BAD_SPEC
    assert "\n" not in refused.value.message and "Value error" not in refused.value.message
    assert refused.value.message.startswith("invalid 'submit_sweep' frame: ")
    assert refused.value.message.endswith(str(refused.value.message).split("spec: ", 1)[1])


def test_an_int_bound_past_2_53_is_refused_before_a_float_rounds_it() -> None:
    with pytest.raises(ValueError, match=r"within ±9007199254740992"):
        parse_param("x=int:0:9007199254740993")  # as a float, 2**53 exactly
    assert parse_param("x=int:-9007199254740992:9007199254740992").high == MAX_INT
    with pytest.raises(ValueError, match="finite numbers"):
        parse_param("x=inf:1")


_BOUND = st.one_of(
    st.floats(-MAX_FLOAT, MAX_FLOAT, allow_nan=False, allow_subnormal=True),
    st.sampled_from([-MAX_FLOAT, MAX_FLOAT, 0.0, 5e-324, -5e-324, 1.0]),
)


@st.composite
def _spaces(draw: st.DrawFn) -> str:
    kind = draw(st.sampled_from(["float", "log", "int", "intlog"]))
    if kind.startswith("int"):
        low = draw(st.integers(1 if kind == "intlog" else -MAX_INT, MAX_INT - 1))
        high = draw(st.integers(low + 1, MAX_INT))
        return f"x=int:{'log:' if kind == 'intlog' else ''}{low}:{high}"
    low, high = sorted(draw(st.lists(_BOUND, min_size=2, max_size=2, unique=True)))
    if kind == "log":
        if high <= 0:
            low, high = 1e-300, 1e300
        low = max(low, 5e-324)
        if low >= high:
            low = high / 2
    return f"x={'log:' if kind == 'log' else ''}{low!r}:{high!r}"


@hypothesis_settings(max_examples=30, deadline=None)
@given(space=_spaces(), search=st.sampled_from(["random", "tpe"]))
def test_every_space_within_the_limits_is_sampled_into_what_the_relay_holds(
    space: str, search: str
) -> None:
    """Past TPE's ten random trials too, and with the median pruner reading the trials."""
    sweep = spec(
        space,
        search=search,
        objective=parse_objective("loss:min"),
        early_stop="median",
        run=run("t", "{x}"),
    )
    sweep.check_limits()
    param = sweep.params[0]
    trials: list[Trial] = []
    for n in range(12):
        params, system = ask(sweep, trials, n)
        x = params["x"]
        assert param.low <= x <= param.high and math.isfinite(x)
        msgpack.packb(params)
        value = float(n % 5)
        trials.append(
            Trial(n=n, run=f"r{n}", params=params, system=system, state=TrialState.COMPLETE,
                  value=value, values=[(0, value), (1, value)])
        )  # fmt: skip
    running = Trial(n=12, run="r12", params=params)
    prune(sweep, [*trials, running], 12, [(0, 9.0), (1, 9.0)])


def test_a_sampler_that_gives_what_the_relay_cannot_hold_fails_the_round() -> None:
    """A sweep stored before the limits were checked at submit (read as it was stored)."""
    huge = spec("x=int:0:1e300", run=run("t", "{x}"))
    with pytest.raises(ValueError, match=r"the sampler gave x an integer beyond"):
        ask(huge, [], 0)
    with pytest.raises(OverflowError):
        ask(spec("x=-1.7e308:1.7e308", run=run("t", "{x}")), [], 0)


def test_a_failed_round_fails_the_sweep_with_one_line() -> None:
    record = SweepRecord(id="s1", spec=spec("lr=1,2"), owner="alice", updated_at=1.0)
    error = OverflowError("Range exceeds valid bounds\n  and more\n" + "x" * 1000)
    failed = round_failed(record, error, 5.0)
    assert failed.state is SweepState.FAILED and failed.finished and failed.updated_at == 5.0
    assert failed.detail.startswith("a round failed: OverflowError: Range exceeds valid bounds and")
    assert "\n" not in failed.detail and len(failed.detail) == FAILURE_CHARS
    assert round_failed(record, RuntimeError(), 5.0).detail == "a round failed: RuntimeError"
    cancelled = record.model_copy(update={"state": SweepState.CANCELLED, "detail": "by alice"})
    assert round_failed(cancelled, error, 5.0) == cancelled  # ended meanwhile: as it ended
