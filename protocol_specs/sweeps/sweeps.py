"""Sweeps: many runs of one command over a search space, each trial a run of its own. Sans-I/O.

Theory of operation
-------------------
``tether sweep --param lr=log:1e-5:1e-2 --param bs=16,32 --trials 64 --parallel 8 -- python
train.py --lr {lr} --bs {bs}`` submits a :class:`SweepSpec`: the parameters (:func:`parse_param`),
how many trials and how many at once, the search (``random``, ``grid``, ``tpe``), the objective
(a metric and a direction, ``loss:min``), early stopping (``asha``, ``median``), and the run
template (a :class:`~protocol_specs.runs.spec.RunSpec` whose command names parameters as ``{name}``).
One snapshot serves every trial.

The relay keeps a :class:`SweepRecord` and one :class:`Trial` per trial in its store, and drives
each unfinished sweep (``relay/sweeps.py``): it reads its running trials' metrics, asks the search
for the next parameters and the pruner whether a trial goes on (``protocol_specs/sweeps/search.py``:
Optuna's samplers and pruners, over a study rebuilt from the stored trials, so that nothing lives
only in a relay's memory), launches trials as runs while fewer than ``parallel`` are active, and
ends the sweep when every trial ended. A pruned trial is told to stop (``tether.should_stop()``)
and cancelled ``stop_grace`` seconds later if it is still running. A trial's value is the last
value of the objective its run reported.
"""

from __future__ import annotations

import json
import math
import re
import string
from enum import StrEnum
from itertools import product
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, field_validator, model_validator

from ..runs.metrics import NAME
from ..runs.runs import RunState
from ..runs.spec import RunSpec

__all__ = [
    "FAILURE_CHARS",
    "MAX_FLOAT",
    "MAX_GRID",
    "MAX_INT",
    "MAX_INT_CHOICE",
    "MAX_STEPS",
    "MAX_TRIALS",
    "Objective",
    "Param",
    "SweepRecord",
    "SweepSpec",
    "SweepState",
    "Trial",
    "TrialState",
    "best_of",
    "ended",
    "observed",
    "parse_objective",
    "parse_param",
    "round_failed",
]

#: most trials one sweep runs, and most points a grid may have (the search lists them)
MAX_TRIALS = 10_000
MAX_GRID = 100_000
#: most points of a grid a parameter range may expand to
_GRID_RANGE = 1000
#: the largest bound of an int range (either sign): 2**53, up to which every integer is a float
#: (a range's bounds are kept as floats, and Optuna's samplers draw integers through floats)
MAX_INT = 2**53
#: the largest bound of a float range (either sign): the samplers compute with the range's width
#: and its midpoint (``high - low``, ``low + high``), which must stay finite (beyond about
#: 9e307 they overflow: every round of such a sweep failed)
MAX_FLOAT = 1e300
#: the largest integer choice (either sign): what msgpack carries (int64)
MAX_INT_CHOICE = 2**63 - 1
_PARAM_NAME = re.compile(r"^[A-Za-z_][A-Za-z0-9_]{0,63}$")

Choice = int | float | str


class Param(BaseModel):
    """One parameter of the search space: a float or int range (``log``: sampled on a log
    scale), or a list of choices."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    name: str
    kind: Literal["float", "int", "choice"]
    low: float = 0.0
    high: float = 0.0
    log: bool = False
    choices: list[Choice] = Field(default_factory=list, max_length=1000)

    @field_validator("name")
    @classmethod
    def _name(cls, value: str) -> str:
        if not _PARAM_NAME.fullmatch(value):
            raise ValueError(f"invalid parameter name {value!r} (letters, digits, _)")
        return value

    @model_validator(mode="after")
    def _range(self) -> Param:
        if self.kind == "choice":
            if not self.choices or len(set(map(repr, self.choices))) != len(self.choices):
                raise ValueError(f"{self.name}: give distinct choices, e.g. {self.name}=16,32")
            for choice in self.choices:
                if isinstance(choice, str) and ("\x00" in choice or len(choice) > 1000):
                    raise ValueError(f"{self.name}: a choice is at most 1000 characters, no NUL")
                if isinstance(choice, float) and not math.isfinite(choice):
                    raise ValueError(f"{self.name}: a choice is a finite number or a word")
            return self
        if not (math.isfinite(self.low) and math.isfinite(self.high)):
            raise ValueError(f"{self.name}: a range's bounds are finite numbers")
        if self.low >= self.high:
            raise ValueError(f"{self.name}: a range needs low < high")
        if self.log and self.low <= 0:
            raise ValueError(f"{self.name}: a log range needs a low above 0")
        if self.kind == "int" and not (self.low.is_integer() and self.high.is_integer()):
            raise ValueError(f"{self.name}: an int range needs whole bounds")
        return self

    def check_limits(self) -> None:
        """``ValueError`` (one line, naming the parameter) if the space is beyond what the relay
        and the samplers hold: checked at submit (by the CLI, and by the relay as the
        ``submit_sweep`` frame arrives), not when a stored sweep is read (one a relay took before
        these checks fails its first round instead: :func:`round_failed`)."""
        if self.kind == "choice":
            if any(isinstance(c, int) and abs(c) > MAX_INT_CHOICE for c in self.choices):
                raise ValueError(
                    f"{self.name}: an integer choice is within ±(2**63 - 1), what the relay "
                    "can store"
                )
            return
        bound = max(abs(self.low), abs(self.high))
        if self.kind == "int" and bound > MAX_INT:
            raise ValueError(
                f"{self.name}: an int range's bounds are within ±{MAX_INT} (2**53), not "
                f"{self.describe()}"
            )
        if bound > MAX_FLOAT:
            raise ValueError(
                f"{self.name}: a range's bounds are within ±1e300 (beyond, the samplers' "
                f"arithmetic overflows), not {self.describe()}"
            )

    def grid(self) -> list[Choice] | None:
        """The values a grid takes: the choices, or every int of an int range (``None``: a float
        range, which no grid can list)."""
        if self.kind == "choice":
            return list(self.choices)
        if self.kind == "int" and self.high - self.low < _GRID_RANGE:
            return list(range(int(self.low), int(self.high) + 1))
        return None

    def describe(self) -> str:
        if self.kind == "choice":
            return ",".join(str(c) for c in self.choices)
        prefix = {"float": "", "int": "int:"}[self.kind] + ("log:" if self.log else "")
        return f"{prefix}{_num(self.low)}:{_num(self.high)}"


def _num(x: float) -> str:
    return str(int(x)) if x.is_integer() and abs(x) < 1e15 else repr(x)


def parse_param(text: str) -> Param:
    """``lr=log:1e-5:1e-2`` (float, log scale), ``dropout=0:0.5`` (float), ``layers=int:2:8``,
    ``width=int:log:16:1024``, ``bs=16,32,64`` or ``opt=adam,sgd`` (choices; one value is a
    choice too); ``ValueError`` saying what is wrong."""
    name, sep, spec = text.partition("=")
    if not sep or not spec:
        raise ValueError(f"--param {text!r}: give NAME=SPACE, e.g. lr=log:1e-5:1e-2 or bs=16,32")
    name = name.strip()
    parts = spec.split(":")
    kind = "float"
    log = False
    if parts[0] == "int":
        kind, parts = "int", parts[1:]
    if parts and parts[0] == "log":
        log, parts = True, parts[1:]
    if len(parts) == 2 and (
        kind == "int" or log or (_is_number(parts[0]) and _is_number(parts[1]))
    ):
        try:
            low, high = float(parts[0]), float(parts[1])
        except ValueError:
            raise ValueError(f"--param {text!r}: a range's bounds are numbers") from None
        if kind == "int" and any(abs(_whole(part)) > MAX_INT for part in parts):
            # said before the float rounds it to 2**53
            raise ValueError(
                f"--param {text!r}: an int range's bounds are within ±{MAX_INT} (2**53)"
            )
        return Param(name=name, kind=kind, low=low, high=high, log=log)  # type: ignore[arg-type]
    if kind == "int" or log:
        raise ValueError(f"--param {text!r}: a range is LOW:HIGH, e.g. {name}=int:2:8")
    return Param(name=name, kind="choice", choices=[_choice(c) for c in spec.split(",")])


def _whole(text: str) -> int:
    """``text`` as an integer if it is written as one (else 0: checked as a float)."""
    try:
        return int(text)
    except ValueError:
        return 0


def _is_number(text: str) -> bool:
    try:
        float(text)
    except ValueError:
        return False
    return True


def _choice(text: str) -> Choice:
    text = text.strip()
    for cast in (int, float):
        try:
            return cast(text)
        except ValueError:
            pass
    return text


class Objective(BaseModel):
    model_config = ConfigDict(frozen=True, extra="forbid")

    metric: str
    direction: Literal["min", "max"] = "min"

    @field_validator("metric")
    @classmethod
    def _metric(cls, value: str) -> str:
        if not NAME.fullmatch(value):
            raise ValueError(f"invalid metric name {value!r}")
        return value

    def better(self, a: float, b: float) -> bool:
        """Whether ``a`` is better than ``b`` (NaN is never better)."""
        if math.isnan(a):
            return False
        if math.isnan(b):
            return True
        return a < b if self.direction == "min" else a > b

    def __str__(self) -> str:
        return f"{self.metric}:{self.direction}"


def parse_objective(text: str) -> Objective:
    """``loss:min``, ``acc:max``, or ``loss`` (min)."""
    metric, _, direction = text.partition(":")
    if direction not in ("", "min", "max"):
        raise ValueError(f"--objective {text!r}: the direction is min or max, e.g. loss:min")
    return Objective(metric=metric, direction=direction or "min")  # type: ignore[arg-type]


class SweepSpec(BaseModel):
    """What the user submitted (validated by the CLI and again by the relay)."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    params: list[Param] = Field(min_length=1, max_length=64)
    trials: int = Field(default=10, ge=1, le=MAX_TRIALS)
    parallel: int = Field(default=1, ge=1, le=1000)
    search: Literal["random", "grid", "tpe"] = "random"
    objective: Objective | None = None
    early_stop: Literal["none", "asha", "median"] = "none"
    #: the trials' run: its command names parameters as ``{name}`` (``{{`` for a brace)
    run: RunSpec
    name: str = Field(default="", max_length=200)
    #: the search's seed: the same sweep asks for the same parameters
    seed: int = Field(default=0, ge=0, lt=2**32)
    #: seconds a pruned trial has to stop by itself before it is cancelled
    stop_grace: float = Field(default=30.0, ge=0, le=24 * 3600)
    #: while the trial that met ``run.debug_when`` is paused, the others go on (``continue``) or
    #: are held (``pause``: their programs stopped, and no new trial launched)
    debug_others: Literal["continue", "pause"] = "continue"

    @model_validator(mode="after")
    def _consistent(self) -> SweepSpec:
        names = [p.name for p in self.params]
        if len(set(names)) != len(names):
            raise ValueError("a parameter is given twice")
        for word in self.run.command:
            for used in _placeholders(word):
                if used not in names:
                    raise ValueError(
                        f"the command names {{{used}}}, which is no --param "
                        f"(parameters: {', '.join(names)})"
                    )
        if self.search == "grid":
            for param in self.params:
                if param.grid() is None:
                    raise ValueError(
                        f"a grid needs a list of values for {param.name} (e.g. "
                        f"{param.name}=1e-4,1e-3), not the float range {param.describe()}"
                    )
            if self.grid_size() > MAX_GRID:
                raise ValueError(
                    f"the grid has {self.grid_size():,} points, more than {MAX_GRID:,}: fewer "
                    "values, or --search random or tpe"
                )
        if self.search == "tpe" and self.objective is None:
            raise ValueError("tpe search needs an --objective to learn from (e.g. loss:min)")
        if self.debug_others == "pause" and not self.run.debug_when:
            raise ValueError("--debug-others pause needs a --debug-when condition")
        if self.early_stop != "none" and self.objective is None:
            raise ValueError(f"--early-stop {self.early_stop} needs an --objective (e.g. loss:min)")
        return self

    def check_limits(self) -> None:
        """Each parameter's :meth:`Param.check_limits` (a ``ValueError`` naming the first
        beyond them)."""
        for param in self.params:
            param.check_limits()

    def grid_size(self) -> int:
        size = 1
        for param in self.params:
            size *= len(param.grid() or ())
        return size

    def total(self) -> int:
        """How many trials the sweep runs: ``trials``, at most the grid's size."""
        return min(self.trials, self.grid_size()) if self.search == "grid" else self.trials

    def grid_points(self) -> list[dict[str, Choice]]:
        names = [p.name for p in self.params]
        return [dict(zip(names, values, strict=True)) for values in product(*self._grids())]

    def _grids(self) -> list[list[Choice]]:
        return [p.grid() or [] for p in self.params]

    def trial_spec(self, sweep: str, n: int, params: dict[str, Any]) -> RunSpec:
        """Trial ``n``'s run: the command with its parameters in, and ``TETHER_PARAMS``,
        ``TETHER_TRIAL``, ``TETHER_SWEEP`` for ``tether.params()``; validated as any run."""
        values = {k: _text(v) for k, v in params.items()}
        command = [_substituted(word, values) for word in self.run.command]
        env = {
            **self.run.env,
            "TETHER_PARAMS": json.dumps(params),
            "TETHER_TRIAL": str(n),
            "TETHER_SWEEP": sweep,
        }
        label = self.name or sweep
        tags = [*self.run.tags, f"sweep:{sweep}"][:32]
        return RunSpec.model_validate(
            {
                **self.run.model_dump(),
                "command": command,
                "env": env,
                "name": f"{label}#{n}"[:200],
                "tags": tags,
            }
        )


def _pieces(word: str) -> list[tuple[str, str | None]]:
    """``word`` as (text, the parameter after it or None): ``--lr={lr}`` is ``[("--lr=", "lr")]``.
    Only ``{name}``: no format spec, no conversion, no attribute or index (``{{`` is a brace)."""
    try:
        parsed = list(string.Formatter().parse(word))
    except ValueError as exc:
        raise ValueError(f"the command word {word!r}: {exc} (write {{{{ for a brace)") from None
    pieces: list[tuple[str, str | None]] = []
    for text, field, spec, conversion in parsed:
        if field is not None and (spec or conversion or not _PARAM_NAME.fullmatch(field)):
            raise ValueError(
                f"the command word {word!r}: name a parameter as {{name}}, nothing more "
                "(no format spec, conversion, attribute or index)"
            )
        pieces.append((text, field))
    return pieces


def _placeholders(word: str) -> list[str]:
    return [field for _text, field in _pieces(word) if field is not None]


def _substituted(word: str, values: dict[str, str]) -> str:
    if "{" not in word and "}" not in word:
        return word
    return "".join(
        text + (values[field] if field is not None else "") for text, field in _pieces(word)
    )


def _text(value: Any) -> str:
    """A parameter as the command gets it (``0.001``, ``32``, ``adam``)."""
    if isinstance(value, float):
        return repr(value)
    return str(value)


class TrialState(StrEnum):
    RUNNING = "running"  #: its run is queued or running
    COMPLETE = "complete"  #: its run succeeded and reported the objective (or the sweep has none)
    PRUNED = "pruned"  #: early stopping stopped it
    FAILED = "failed"  #: its run failed, was cancelled or lost, or reported no objective


class Trial(BaseModel):
    """One trial: its parameters, its run, and what the sweep learnt from its metrics."""

    #: a diverged trial's values are NaN: kept as such in its JSON (not ``null``)
    model_config = ConfigDict(frozen=True, extra="ignore", ser_json_inf_nan="constants")

    n: int
    run: str
    params: dict[str, Any]
    state: TrialState = TrialState.RUNNING
    #: the objective's last value (the trial's value once it completed)
    value: float | None = None
    #: the objective's values as ``[step, value]`` in step order (what the pruner looks at), at
    #: most :data:`MAX_STEPS`
    values: list[tuple[int, float]] = Field(default_factory=list)
    #: where in the run's metrics stream the sweep has read to
    cursor: str = "0"
    #: what the pruner keeps between calls (Optuna's trial system attributes)
    system: dict[str, Any] = Field(default_factory=dict)
    #: when the trial was told to stop (pruned); its run is cancelled ``stop_grace`` later
    stop_at: float | None = None
    #: its program is held while another trial is paused for debugging (``debug_others``)
    suspended: bool = False
    #: its run ended (a pruned trial's run may still be stopping), and how
    ended: bool = False
    outcome: str = ""
    #: its run's state as `tether ls` shows it (``run_text.shown_state``), while the trial runs:
    #: set by the relay when it answers, never stored
    run_state: str = ""


#: most steps of the objective a trial keeps for the pruner
MAX_STEPS = 10_000


class SweepState(StrEnum):
    RUNNING = "running"
    FINISHED = "finished"
    CANCELLED = "cancelled"
    #: a round of it failed in a way no retry mends (:func:`round_failed`; ``detail`` says how)
    FAILED = "failed"


class SweepRecord(BaseModel):
    """The relay's record of a sweep (``tether:sweep:{S}``)."""

    model_config = ConfigDict(frozen=True, extra="ignore", ser_json_inf_nan="constants")

    id: str
    spec: SweepSpec
    owner: str = ""
    state: SweepState = SweepState.RUNNING
    created_at: float = 0.0
    updated_at: float = 0.0
    #: the snapshot, as a run record names it (a manifest kept beside the record, or a root tree)
    snapshot: str = ""
    tree: str = ""
    files: int = 0
    size: int = 0
    #: trials launched so far (the next one's number)
    launched: int = 0
    #: the best trial so far, and its value
    best: int | None = None
    best_value: float | None = None
    #: counts by trial state
    counts: dict[str, int] = Field(default_factory=dict)
    detail: str = ""
    #: the trial that paused where ``--debug-when`` was met (``trial 3 (RUN) paused at step
    #: 120: loss=nan``), if one did
    debugged: str = ""
    debugged_run: str = ""

    @property
    def finished(self) -> bool:
        return self.state is not SweepState.RUNNING

    def redacted(self) -> SweepRecord:
        if not self.spec.run.secret_env:
            return self
        spec = self.spec.model_copy(update={"run": self.spec.run.redacted()})
        return self.model_copy(update={"spec": spec})


def best_of(objective: Objective | None, trials: list[Trial]) -> Trial | None:
    """The completed trial with the best value (the lowest number among equals)."""
    best: Trial | None = None
    for trial in sorted(trials, key=lambda t: t.n):
        if trial.state is not TrialState.COMPLETE or trial.value is None or objective is None:
            continue
        if best is None or objective.better(trial.value, best.value):  # type: ignore[arg-type]
            best = trial
    return best


def observed(
    trial: Trial, points: list[tuple[int, float, dict[str, float]]], metric: str, cursor: str
) -> tuple[Trial, list[tuple[int, float]]]:
    """The trial after its run's new ``points`` (read up to ``cursor``): the objective
    ``metric``'s values by step (its last value), and those new values in step order for the
    pruner. A step seen before is not new (a retried attempt starting over): it replaces the
    value kept, and the pruner is shown only the steps past the last one it saw."""
    values, value = dict(trial.values), trial.value
    last = max(values, default=-1)
    new: list[tuple[int, float]] = []
    for step, _at, point in points:
        if metric not in point:
            continue
        value = point[metric]
        if step > last:
            new.append((step, value))
            last = step
        if len(values) < MAX_STEPS or step in values:
            values[step] = value
    steps = sorted(values.items())
    return trial.model_copy(update={"cursor": cursor, "values": steps, "value": value}), new


def ended(trial: Trial, state: RunState, spec: SweepSpec) -> Trial:
    """The trial once its run ended in ``state``: complete (succeeded, with a usable objective if
    the sweep has one), pruned (it was), or failed (and why)."""
    outcome = state.value
    new_state = trial.state
    if new_state is TrialState.RUNNING:
        usable = trial.value is not None and not math.isnan(trial.value)
        if state is RunState.SUCCEEDED and (spec.objective is None or usable):
            new_state = TrialState.COMPLETE
        else:
            new_state = TrialState.FAILED
            if state is RunState.SUCCEEDED and spec.objective is not None:
                outcome = f"succeeded, but reported no usable {spec.objective.metric}"
    return trial.model_copy(update={"state": new_state, "ended": True, "outcome": outcome})


#: the longest a failed sweep's reason is (``detail``: one line)
FAILURE_CHARS = 300


def round_failed(record: SweepRecord, error: BaseException, now: float) -> SweepRecord:
    """The sweep once one of its rounds raised ``error``, which the relay does not retry: the
    store's errors pass (the relay retries those), but anything else (a sampler raising on the
    space, say) would fail every round the same way. So the sweep fails, saying why in one line
    (what ``tether sweep status``, ``sweep ls`` and its page show), and is driven no more. A sweep
    that ended meanwhile stays as it ended."""
    if record.finished:
        return record
    said = " ".join(str(error).split())
    detail = f"a round failed: {type(error).__name__}" + (f": {said}" if said else "")
    if len(detail) > FAILURE_CHARS:
        detail = detail[: FAILURE_CHARS - 3] + "..."
    return record.model_copy(
        update={"state": SweepState.FAILED, "updated_at": now, "detail": detail}
    )
