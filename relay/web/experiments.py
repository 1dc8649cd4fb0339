"""The web view's experiments: a run's metric charts, and a sweep's page (its trials, the best one,
the objective of every trial on one chart). HTML as a function of plain data; the charts are
``protocol_specs/web/charts.py``'s SVG."""

from __future__ import annotations

from collections.abc import Sequence

from protocol_specs.access.auth import Principal
from protocol_specs.runs.metrics import Point, format_value
from protocol_specs.sweeps.sweeps import SweepRecord, Trial
from protocol_specs.web.charts import PALETTE, line_chart
from protocol_specs.web.web import run_path, sweep_path

from .pages import h, layout, stamp

__all__ = ["CHARTS", "metrics_section", "sweep_page", "sweeps_page"]

#: metrics charted on a run's page (the others are listed with their last value)
CHARTS = 8


def metrics_section(points: Sequence[Point]) -> str:
    """A run's metrics: a chart per metric (the first :data:`CHARTS`), its last value beside."""
    if not points:
        return ""
    series: dict[str, list[tuple[int, float]]] = {}
    for step, _at, values in points:
        for name, value in values.items():
            series.setdefault(name, []).append((step, value))
    charts = []
    for i, (name, line) in enumerate(series.items()):
        last = format_value(line[-1][1])
        if i >= CHARTS:
            charts.append(f'<p class="dim">{h(name)}: {h(last)} ({len(line)} points)</p>')
            continue
        chart = line_chart(name, {name: line}, colours={name: PALETTE[i % len(PALETTE)]})
        charts.append(
            f'<figure class="metric"><figcaption>{h(name)} <span class="dim">last {h(last)}, '
            f"{len(line)} points</span></figcaption>{chart}</figure>"
        )
    return f'<section class="metrics"><h2>Metrics</h2><div class="charts">{"".join(charts)}</div></section>'


def sweep_page(
    sweep: SweepRecord, trials: Sequence[Trial], who: Principal, csrf: str, now: float
) -> str:
    spec = sweep.spec
    objective = spec.objective
    counts = ", ".join(f"{n} {state}" for state, n in sorted(sweep.counts.items())) or "none yet"
    params = " ".join(f"{p.name}={p.describe()}" for p in spec.params)
    facts = [
        ("State", h(sweep.state.value) + (f": {h(sweep.detail)}" if sweep.detail else "")),
        ("Command", f"<code>{h(' '.join(spec.run.command))}</code>"),
        ("Parameters", f"<code>{h(params)}</code>"),
        (
            "Search",
            h(f"{spec.search}, {spec.total()} trials, {spec.parallel} at once")
            + (h(f", objective {objective}") if objective else "")
            + (h(f", early stop {spec.early_stop}") if spec.early_stop != "none" else ""),
        ),
        ("Trials", h(f"{counts}; {sweep.launched} of {spec.total()} launched")),
        ("Submitted", h(f"{int(now - sweep.created_at)} s ago by {sweep.owner}")),
    ]
    if spec.run.debug_when:
        said = sweep.debugged or "no trial met it yet"
        link = (
            f' · <a href="{run_path(sweep.debugged_run)}">its run</a>' if sweep.debugged_run else ""
        )
        facts.append(("Debug when", f"<code>{h(spec.run.debug_when)}</code>: {h(said)}{link}"))
    best = next((t for t in trials if t.n == sweep.best), None)
    if best is not None and objective is not None:
        facts.append(
            (
                "Best",
                f'trial {best.n} (<a href="{run_path(best.run)}">{h(best.run)}</a>): '
                f"{h(objective.metric)} {h(format_value(best.value or 0.0))} "
                f"<code>{h(_params(best))}</code>",
            )
        )
    chart = ""
    if objective is not None:
        # the best last: drawn on top of the others
        order = sorted((t for t in trials if t.values), key=lambda t: t.n == sweep.best)
        series = {f"#{t.n}": list(t.values) for t in order}
        colours = {f"#{t.n}": "#d1d5db" for t in trials}
        if best is not None:
            colours[f"#{best.n}"] = PALETTE[0]
        chart = (
            f'<figure class="metric"><figcaption>{h(objective.metric)} of every trial '
            '<span class="dim">(the best in colour)</span></figcaption>'
            f"{line_chart(objective.metric, series, colours=colours)}</figure>"
        )
    rows = "".join(_trial_row(t, sweep) for t in trials)
    metric = h(objective.metric) if objective else "value"
    body = (
        f'<section class="card"><h1><span class="dim">sweep</span> {h(sweep.id)} '
        f"<small>{h(spec.name)}</small></h1>"
        '<dl class="facts">' + "".join(f"<dt>{k}</dt><dd>{v}</dd>" for k, v in facts) + "</dl>"
        f"{chart}</section>"
        f'<section><h2>Trials</h2><table class="runs"><thead><tr><th>#</th><th>run</th>'
        f"<th>state</th><th>{metric}</th><th>steps</th><th>parameters</th></tr></thead>"
        f"<tbody>{rows}</tbody></table></section>"
    )
    return layout(f"sweep {sweep.id}", body, who=who, csrf=csrf)


def sweeps_page(sweeps: Sequence[SweepRecord], who: Principal, csrf: str, now: float) -> str:
    """``/ui/sweeps``: the user's sweeps (an admin's: everyone's), newest first, each linking to
    its page."""
    rows = "".join(_sweep_row(s, now, owner=who.admin) for s in sweeps)
    owner = "<th>owner</th>" if who.admin else ""
    table = (
        f'<table class="runs"><thead><tr><th>sweep</th><th>name</th>{owner}<th>state</th>'
        "<th>trials</th><th>best</th><th>submitted</th></tr></thead>"
        f"<tbody>{rows}</tbody></table>"
        if sweeps
        else '<p class="dim">No sweeps yet: <code>tether sweep --param lr=log:1e-5:1e-2 -- '
        "python train.py --lr {lr}</code> starts one.</p>"
    )
    body = f"<section><h1>Sweeps</h1>{table}</section>"
    return layout("sweeps", body, who=who, csrf=csrf)


def _sweep_row(sweep: SweepRecord, now: float, *, owner: bool) -> str:
    spec = sweep.spec
    done = sum(sweep.counts.get(k, 0) for k in ("complete", "pruned", "failed"))
    best = "-"
    if sweep.best is not None and spec.objective is not None:
        best = f"#{sweep.best} {spec.objective.metric} {format_value(sweep.best_value or 0.0)}"
    name = spec.name or " ".join(spec.run.command)
    return (
        f'<tr><td><a href="{sweep_path(sweep.id)}">{h(sweep.id)}</a></td>'
        f"<td>{h(name[:60])}</td>" + (f"<td>{h(sweep.owner)}</td>" if owner else "") + "<td>"
        f'<span class="state {h(sweep.state.value)}">{h(sweep.state.value)}</span></td>'
        f"<td>{done}/{spec.total()}</td><td>{h(best)}</td>"
        f"<td>{stamp(sweep.created_at, now)}</td></tr>"
    )


def _trial_row(trial: Trial, sweep: SweepRecord) -> str:
    best = " ★" if trial.n == sweep.best else ""
    state = (
        trial.run_state if trial.state.value == "running" and trial.run_state else trial.state.value
    )
    state += " (held)" if trial.suspended else ""
    value = "-" if trial.value is None else format_value(trial.value)
    return (
        f"<tr><td>{trial.n}{best}</td>"
        f'<td><a href="{run_path(trial.run)}">{h(trial.run)}</a></td>'
        f'<td><span class="state {h(trial.state.value)}">{h(state)}</span></td>'
        f"<td>{h(value)}</td><td>{len(trial.values)}</td><td><code>{h(_params(trial))}</code></td></tr>"
    )


def _params(trial: Trial) -> str:
    return " ".join(
        f"{k}={format_value(v) if isinstance(v, float) else v}" for k, v in trial.params.items()
    )
