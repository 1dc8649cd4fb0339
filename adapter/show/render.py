"""What the CLI shows: the runs table, a run's status, the tokens table, the audit trail, sizes
and ages, timed status lines and upload progress, the IDE's launch.json entry, and the program's
output on this terminal (whole lines, :class:`~protocol_specs.runs.lines.LineJoiner`). Pure text, no
I/O but the terminal's."""

from __future__ import annotations

import json
import sys
import time
from collections.abc import Sequence
from typing import Any

from protocol_specs.access.auth import TokenInfo
from protocol_specs.checkpoints.book import size_text
from protocol_specs.runs.lines import LineJoiner
from protocol_specs.runs.metrics import format_value
from protocol_specs.runs.resources import Resources, short_duration
from protocol_specs.runs.runs import RunRecord
from protocol_specs.runs.spec import RunSpec
from protocol_specs.runs.text import shown_state
from protocol_specs.sweeps.sweeps import SweepRecord, SweepState, Trial
from protocol_specs.text_width import clip, columns
from protocol_specs.wire.wire import AuditEntry

__all__ = [
    "Clock",
    "Progress",
    "Terminal",
    "age",
    "audit_lines",
    "ended_text",
    "launch_json",
    "metrics_text",
    "mib",
    "node_lines",
    "node_rows",
    "runs_table",
    "status_text",
    "sweep_text",
    "sweeps_table",
    "tokens_table",
    "unattended_text",
]


def mib(n: float) -> str:
    return f"{n / (1024 * 1024):.1f} MiB"


class Clock:
    """Prints status lines with the time since the command started."""

    def __init__(self, prefix: str, *, stream: Any = None) -> None:
        self.start = time.monotonic()
        self.prefix = prefix
        #: where the lines go (default stdout; ``tether run`` keeps stdout for the run id)
        self.stream = stream

    def say(self, text: str) -> None:
        line = f"[{time.monotonic() - self.start:7.2f}s] {self.prefix}{text}"
        print(line, file=self.stream or sys.stdout, flush=True)


class Progress:
    """One line of progress: redrawn in place on a terminal, a few lines elsewhere."""

    def __init__(self, clock: Clock, what: str) -> None:
        self.clock = clock
        self.what = what
        self.tty = (clock.stream or sys.stdout).isatty()
        self.shown = -1

    def __call__(self, done: int, total: int) -> None:
        if total < 4 * 1024 * 1024:
            return  # over in a moment: the summary line says what was sent
        pct = int(done * 100 / total)
        step = pct if self.tty else pct // 25 * 25
        if step == self.shown:
            return
        self.shown = step
        text = f"{self.what}: {mib(done)} of {mib(total)} ({pct}%)"
        if self.tty:
            end = "\n" if done >= total else ""
            print(
                f"\r[{time.monotonic() - self.clock.start:7.2f}s] {text}",
                end=end,
                file=self.clock.stream or sys.stdout,
                flush=True,
            )
        else:
            self.clock.say(text)


def ended_text(run_id: str, status: str | None, exit_code: int | None, detail: str = "") -> str:
    """How a served run ended: ``run X ended (exited, exit code 3)``; without an exit code (it
    could not start, was cancelled or lost) the reason instead, never ``None``."""
    why = f", exit code {exit_code}" if exit_code is not None else (f": {detail}" if detail else "")
    return f"run {run_id} ended ({status or 'unknown'}{why})"


def unattended_text(spec: RunSpec) -> str:
    """One line, said at submit: what happens to the run if nobody comes (no IDE attached when
    it waits for one or pauses), and the options that choose it."""
    policy, seconds = spec.on_unattended_stop, spec.unattended_timeout
    unit, size = next((u, n) for u, n in (("h", 3600), ("m", 60), ("s", 1)) if seconds % n == 0
                      or n == 1)  # fmt: skip
    after = f"{seconds / size:g}{unit}"
    when = (
        "waits for an IDE or pauses with none attached"
        if spec.debug and spec.wait_for_ide
        else "pauses with no IDE attached" + ("" if spec.debug else " (a crash, post-mortem)")
    )
    does = {
        "wait": "it stays so until an IDE attaches, keeping its slot and GPUs",
        "continue": f"it goes on {after} later",
        "terminate": f"it ends {after} later, freeing its slot",
        "suspend": f"{after} later its tether.on_suspend saves a checkpoint and it is suspended, "
        "freeing its slot (tether resume continues it)",
    }[policy]
    flags = f"--on-unattended-stop {policy}" + (
        "" if policy == "wait" else f" --unattended-timeout {after}"
    )
    if policy == "suspend":
        flags += f" --unattended-fallback {spec.unattended_fallback}"
    return f"if nobody comes: when the run {when}, {does} ({flags})"


def launch_json(port: int, run_id: str) -> str:
    """The VS Code ``launch.json`` entry that attaches to the adapter on ``port``."""
    entry = {
        "name": f"tether: run {run_id}",
        "type": "debugpy",
        "request": "attach",
        "connect": {"host": "127.0.0.1", "port": port},
        "justMyCode": True,
    }
    return json.dumps(entry, indent=2)


class Terminal:
    """The program's stdout and stderr on ours, whole lines at a time (:class:`LineJoiner`, one
    per node); stderr in red when both go to one terminal; the lines of a multi-node run's nodes
    1, 2, ... after ``[node K]``."""

    def __init__(self) -> None:
        self.joiners: dict[int, LineJoiner] = {}
        self.at_start: dict[int, bool] = {}
        self.mark = sys.stdout.isatty() and sys.stderr.isatty()
        #: the node and stream whose line is open on the terminal (none: at a line's start)
        self.open: tuple[int, str] | None = None

    def write(self, stream: str, data: bytes, node: int = 0) -> None:
        joiner = self.joiners.setdefault(node, LineJoiner())
        self._show(node, joiner.feed(stream, data))

    def end(self) -> None:
        for node, joiner in self.joiners.items():
            self._show(node, joiner.flush())

    def _show(self, node: int, pieces: list[tuple[str, bytes]]) -> None:
        for stream, data in pieces:
            if not data:
                continue
            if self.open is not None and self.open[0] != node:  # another node's line: end it
                self._write(self.open[1], b"\n")
                self.at_start[self.open[0]] = True
            if node:
                data, self.at_start[node] = node_lines(node, data, self.at_start.get(node, True))
            self._write(stream, data)
            self.open = None if data.endswith(b"\n") else (node, stream)

    def _write(self, stream: str, data: bytes) -> None:
        sink = sys.stdout.buffer if stream == "stdout" else sys.stderr.buffer
        if stream == "stderr" and self.mark:
            data = b"\x1b[31m" + data + b"\x1b[0m"
        sink.write(data)
        sink.flush()


def node_lines(node: int, data: bytes, at_start: bool) -> tuple[bytes, bool]:
    """``data`` of node ``node`` with ``[node K] `` before each line it starts (``at_start``: its
    first byte starts one); and whether the next byte will."""
    prefix = f"[node {node}] ".encode()
    out = bytearray()
    parts = data.split(b"\n")
    for i, part in enumerate(parts):
        if i:
            out += b"\n"
            at_start = True
        if part:
            out += prefix + part if at_start else part
            at_start = False
        elif at_start and i < len(parts) - 1:  # an empty line
            out += prefix.rstrip()
    return bytes(out), at_start


def age(seconds: float) -> str:
    return short_duration(seconds)


def _state(record: RunRecord) -> str:
    """The state, and whether its worker went silent (its host may be down: the lease decides),
    or the program waits for an IDE before its first line."""
    if record.silent_for:
        return f"{record.state.value} (worker silent {age(record.silent_for)})"
    return shown_state(record)


def _display_name(spec: RunSpec) -> str:
    return spec.display_name()


def _processes(record: RunRecord) -> str:
    """A live debug run's processes: how many are alive (the main one too), how many paused."""
    if record.finished or not any(record.processes):
        return ""
    rows = record.processes.values()
    alive = 1 + sum(1 for key, row in record.processes.items() if key and row.state != "exited")
    paused = sum(1 for row in rows if row.state == "paused")
    return f"{alive}" + (f" ({paused} paused)" if paused else "")


def runs_table(records: Sequence[RunRecord], now: float) -> str:
    """``tether ls``: one row per run; a PROCS column when a run debugs child processes."""
    procs = any(_processes(r) for r in records)
    metrics = any(r.metrics for r in records)
    rows = [
        (
            *("ID", "NAME", "STATE", "BACKEND", "AGE", "ATTEMPT"),
            *(("PROCS",) * procs),
            *(("METRICS",) * metrics),
            "WHERE",
        )
    ]
    for r in records:
        tries = f"{r.attempt}/{r.spec.max_retries + 1}"
        rows.append(
            (
                r.id,
                clip(_display_name(r.spec), 28),
                _state(r),
                r.spec.backend,
                age(now - r.created_at),
                tries,
                *((_processes(r),) * procs),
                *((clip(metrics_text(r.metrics), 30),) * metrics),
                clip(r.where(), 72),
            )
        )
    widths = [max(columns(row[i]) for row in rows) for i in range(len(rows[0]))]
    return "\n".join(
        "  ".join(cell + " " * (widths[i] - columns(cell)) for i, cell in enumerate(row)).rstrip()
        for row in rows
    )


def metrics_text(values: dict[str, float], most: int = 2) -> str:
    """A run's last metrics in a few words, by name: ``acc 0.91  loss 0.4213`` (the first
    ``most``)."""
    return "  ".join(f"{k} {format_value(values[k])}" for k in sorted(values)[:most])


def files_lines(record: RunRecord) -> list[str]:
    """``tether status``'s lines for the run's checkpoints and outputs, when it has any."""
    lines = []
    last = record.checkpoint
    if last is not None and record.checkpoints:
        lines.append(
            f"checkpoints: {record.checkpoints} kept, latest step {last.step} "
            f"(attempt {last.attempt}), {size_text(record.checkpoint_bytes)}"
        )
    if record.outputs:
        files = "file" if record.outputs == 1 else "files"
        lines.append(f"outputs: {record.outputs} {files}, {size_text(record.outputs_bytes)}")
    return lines


def status_text(record: RunRecord, now: float) -> str:
    spec = record.spec
    res = spec.resources
    lines = [
        f"run        {record.id}{f'  ({spec.name})' if spec.name else ''}",
        f"state      {_state(record)}{f': {record.detail}' if record.detail else ''}",
        f"command    {' '.join(spec.command)}",
        f"mode       {'debug' if spec.debug else 'run'} on {spec.backend}",
        f"snapshot   {record.snapshot[:12]} ({record.files} files, {mib(record.size)}) "
        f"from {spec.workdir}",
        "resources  " + _resources(res),
        f"submitted  {age(now - record.created_at)} ago"
        + (f" by {record.owner}" if record.owner else ""),
    ]
    if spec.env:
        lines.append("env        " + " ".join(f"{k}={v}" for k, v in sorted(spec.env.items())))
    if record.paused_at:
        lines.append(f"paused at  {record.paused_at}")
    if record.queued_why:
        lines.append(f"waiting    {record.queued_why}")
    if record.trial:
        lines.append(
            f"trial      {record.trial} (tether sweep status {record.trial.split('#')[0]})"
        )
    if record.metrics:
        lines.append(f"metrics    {metrics_text(record.metrics, 8)} (tether metrics {record.id})")
    lines += files_lines(record)
    if record.silent_for:
        lines.append(
            f"worker     silent for {age(record.silent_for)}: its host may be down or cut off; "
            "the run is marked lost (or retried) when its lease runs out"
        )
    if record.rerun_of:
        lines.append(f"rerun of   {record.rerun_of}")
    if spec.tags:
        lines.append(f"tags       {', '.join(spec.tags)}")
    preempted = sum(1 for a in record.attempts if a.outcome == "preempted")
    most = spec.max_retries + 1 + preempted  # a preempted attempt uses no retry
    more = f" ({preempted} preempted, using no retry)" if preempted else ""
    lines.append(f"attempts   {record.attempt} of at most {most}{more}")
    for a in record.attempts:
        parts = [f"  #{a.n}"]
        if a.worker:
            parts.append(f"on {a.worker}")
        if a.job:
            parts.append(f"job {a.job}")
        if a.started_at:
            parts.append(f"started {age(now - a.started_at)} ago")
        if a.preempt and not a.outcome:
            parts.append(
                f"preempted: {'suspends' if a.preempt == 'suspend' else 'retried'} when it ends"
            )
        if a.outcome:
            code = f" (exit {a.exit_code})" if a.exit_code is not None else ""
            parts.append(f"-> {a.outcome}{code}")
        if a.detail and a.outcome not in ("", "succeeded"):
            parts.append(f": {clip(a.detail, 100)}")
        lines.append(" ".join(parts))
        if a.run_dir:
            lines.append(f"     files in {a.run_dir} (on {a.worker or 'its worker'})")
        lines += node_rows(a.nodes)
    children = {key: row for key, row in record.processes.items() if key}
    if children:
        lines.append(f"processes  {len(children)} besides the main one (this attempt)")
        for row in children.values():
            state = row.state + (f" at {row.where}" if row.where else "")
            if row.exit_code is not None:
                state += f" (exit {row.exit_code})"
            lines.append(f"  {row.title}: {state}")
    return "\n".join(lines)


def _resources(res: Resources) -> str:
    """``gpus=1 cpus=4 mem=16384M``; a multi-node run's: ``nodes=2 gpus=1 cpus=4 (per node) ...``."""
    parts = [f"{name}={amount}" for name, amount in res.parts()]
    if res.nodes > 1:
        parts[:2] = [f"nodes={res.nodes}", *parts[:2], "(per node)"]
    return " ".join(parts)


def node_rows(nodes: Sequence[Any]) -> list[str]:
    """An attempt's nodes (``Attempt.nodes``: ``node``, ``host``, ``state``, ``exit_code``), one
    line each, aligned: ``node 1  gpu2  exited (exit 1)``; none for a single-node run."""
    if len(nodes) < 2:
        return []
    width = max(columns(str(row.host or "-")) for row in nodes)
    out = []
    for row in sorted(nodes, key=lambda row: row.node):
        host = clip(str(row.host or "-"), 40)
        state = str(row.state) + (f" (exit {row.exit_code})" if row.exit_code is not None else "")
        out.append(f"     node {row.node}  {host}{' ' * (min(width, 40) - columns(host))}  {state}")
    return out


def _when(at: float) -> str:
    return time.strftime("%Y-%m-%d %H:%M", time.localtime(at)) if at else "-"


def tokens_table(tokens: Sequence[TokenInfo], now: float) -> str:
    rows = [f"{'ID':<17} {'USER':<12} {'SCOPES':<18} {'CREATED':<16} {'STATE':<18} LABEL"]
    for t in tokens:
        state = "active"
        if t.revoked_at:
            state = f"revoked {_when(t.revoked_at)[5:]}"
        elif t.expires_at and t.expires_at <= now:
            state = "expired"
        elif t.expires_at:
            state = f"until {_when(t.expires_at)[:10]}"
        scopes = ",".join(t.scopes)
        rows.append(
            f"{t.id:<17} {t.user:<12} {scopes:<18} {_when(t.created_at):<16} {state:<18} {t.label}"
        )
    return "\n".join(rows)


def audit_lines(entries: Sequence[AuditEntry]) -> list[str]:
    """One line per audit entry, oldest first: when, what, who, as what, from where. What a
    refused party wrote (its client's name) is shown with control characters escaped: it never
    reaches the owner's terminal as escape sequences."""
    lines = []
    for e in entries:
        when = time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(e.at))
        who = f"{e.user or '?'} (token {e.token or '-'})"
        role = f" as {e.role}" if e.role else ""
        detail = f": {e.detail}" if e.detail else ""
        client = f" [{e.client}]" if e.client else ""
        line = f"{when}  {e.event:<8} {who}{role} from {e.source or '?'}{client}{detail}"
        lines.append(_printable(line))
    return lines


def _printable(text: str) -> str:
    """``text`` with every character a terminal would act on (escapes, newlines) escaped."""
    if text.isprintable():
        return text
    return "".join(c if c.isprintable() else repr(c)[1:-1] for c in text)


def _table(rows: Sequence[Sequence[str]]) -> str:
    widths = [max(columns(row[i]) for row in rows) for i in range(len(rows[0]))]
    return "\n".join(
        "  ".join(cell + " " * (widths[i] - columns(cell)) for i, cell in enumerate(row)).rstrip()
        for row in rows
    )


def _value(value: float | None) -> str:
    return "-" if value is None else format_value(value)


def sweeps_table(sweeps: Sequence[SweepRecord], now: float) -> str:
    """``tether sweep ls``: one row per sweep."""
    rows = [("ID", "NAME", "STATE", "TRIALS", "AGE", "BEST")]
    for s in sweeps:
        done = sum(s.counts.get(k, 0) for k in ("complete", "pruned", "failed"))
        objective = s.spec.objective
        best = (
            f"#{s.best} {objective.metric} {_value(s.best_value)}"
            if s.best is not None and objective
            else "-"
        )
        if s.state is SweepState.FAILED:  # why, in the last column (status has it whole)
            best = ("" if best == "-" else f"{best}; ") + clip(s.detail, 60)
        rows.append(
            (
                s.id,
                clip(s.spec.name or " ".join(s.spec.run.command), 28),
                s.state.value,
                f"{done}/{s.spec.total()}",
                age(now - s.created_at),
                best,
            )
        )
    return _table(rows)


def sweep_text(sweep: SweepRecord, trials: Sequence[Trial], now: float, ages: bool = True) -> str:
    """``tether sweep status``: the sweep, its best trial, and a row per trial."""
    spec = sweep.spec
    objective = spec.objective
    counts = ", ".join(f"{n} {state}" for state, n in sorted(sweep.counts.items())) or "none yet"
    when = f", {age(now - sweep.created_at)} ago" if ages else ""
    lines = [
        f"sweep      {sweep.id}{f'  ({spec.name})' if spec.name else ''}: {sweep.state.value}"
        + (f": {sweep.detail}" if sweep.detail else ""),
        f"command    {' '.join(spec.run.command)}",
        "params     " + "  ".join(f"{p.name}={p.describe()}" for p in spec.params),
        f"search     {spec.search}, {spec.total()} trials, {spec.parallel} at once"
        + (f", objective {objective}" if objective else "")
        + (f", early stop {spec.early_stop}" if spec.early_stop != "none" else "")
        + f"{when} by {sweep.owner}",
        f"trials     {counts}; {sweep.launched} of {spec.total()} launched",
    ]
    if spec.run.debug_when:
        lines.append(
            f"debug when {spec.run.debug_when}: "
            + (f"{sweep.debugged} (tether attach {sweep.debugged.split('(')[1].split(')')[0]})"
               if sweep.debugged else "no trial met it yet")
        )  # fmt: skip
    best = next((t for t in trials if t.n == sweep.best), None)
    if best is not None and objective is not None:
        lines.append(
            f"best       trial {best.n} (run {best.run}): {objective.metric} "
            f"{_value(best.value)}  {_params(best.params)}"
        )
    rows = [("TRIAL", "RUN", "STATE", (objective.metric.upper() if objective else "VALUE"),
             "STEPS", "PARAMS")]  # fmt: skip
    for t in trials:
        state = t.state.value + ("" if t.ended or t.state.value == "running" else " (stopping)")
        if t.state.value == "running" and t.run_state:  # its run's, as `tether ls` shows it
            state = t.run_state
        marker = " *" if t.n == sweep.best else ""
        rows.append(
            (f"{t.n}{marker}", t.run, state, _value(t.value), str(len(t.values)), _params(t.params))
        )
    return "\n".join(lines) + ("\n\n" + _table(rows) if trials else "")


def _params(params: dict[str, Any]) -> str:
    return " ".join(
        f"{k}={format_value(v) if isinstance(v, float) else v}" for k, v in params.items()
    )
