"""The web view's HTML: every page and fragment as a function of plain data (no I/O).

Everything shown is escaped here (:func:`h`); the pages load one stylesheet and one script from
``/ui/static`` and carry no inline script or style, so the Content-Security-Policy forbids every
other. The fragments a live page replaces (:func:`run_row`, :func:`run_summary`) are the same
functions the first render used: a pushed row is the row a reload would show.
"""

from __future__ import annotations

import json
import time
from collections.abc import Sequence
from html import escape
from urllib.parse import urlencode

from protocol_specs.access.auth import Principal
from protocol_specs.runs.resources import short_duration
from protocol_specs.runs.runs import RunRecord, RunState
from protocol_specs.runs.text import shown_state
from protocol_specs.snapshots.snapshots import Manifest, ManifestEntry
from protocol_specs.text_width import clip
from protocol_specs.web.web import ListQuery, file_path, run_path, sweep_path
from protocol_specs.wire.wire import AuditEntry

from .assets import VERSION
from .debug_view import DebugView
from .listing import Page

__all__ = [
    "debug_section",
    "error_page",
    "file_page",
    "files_page",
    "h",
    "layout",
    "login_page",
    "run_page",
    "run_row",
    "run_summary",
    "runs_page",
    "stamp",
]

#: the adapter port ``tether attach`` serves by default (``adapter.cli.settings``)
ADAPTER_PORT = 5678
#: files a snapshot's list shows at once (a filter narrows it), lines a file's viewer shows
FILES_SHOWN = 2000
LINES_SHOWN = 20_000


def h(text: object) -> str:
    return escape(str(text), quote=True)


ago = short_duration


def stamp(at: float, now: float, *, suffix: str = " ago") -> str:
    if not at:
        return "-"
    full = time.strftime("%Y-%m-%d %H:%M:%S UTC", time.gmtime(at))
    iso = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(at))
    return f'<time datetime="{iso}" title="{full}">{ago(now - at)}{suffix}</time>'


def layout(
    title: str, body: str, *, who: Principal | None = None, csrf: str = "", live: str = ""
) -> str:
    user = ""
    if who is not None:
        role = " (admin)" if who.admin else ""
        user = (
            '<a href="/ui">Runs</a><a href="/ui/sweeps">Sweeps</a>'
            f'<span class="who">{h(who.user)}{role}</span>'
            '<button type="button" class="link" data-post="/ui/logout" '
            'data-then="/ui/login">Log out</button>'
        )
    meta = f'<meta name="tether-csrf" content="{h(csrf)}">' if csrf else ""
    live_attr = f' data-live="{h(live)}"' if live else ""
    return (
        '<!doctype html><html lang="en"><head><meta charset="utf-8">'
        '<meta name="viewport" content="width=device-width, initial-scale=1">'
        f'<title>{h(title)} · tether</title>{meta}<link rel="icon" href="data:,">'
        f'<link rel="stylesheet" href="/ui/static/app.css?v={VERSION}">'
        f'<script src="/ui/static/app.js?v={VERSION}" defer></script></head>'
        f'<body{live_attr}><header class="top"><a class="brand" href="/ui">tether</a>'
        f'<span class="live-dot" title="live updates" hidden></span>'
        f"<nav>{user}</nav></header><main>{body}</main></body></html>"
    )


def error_page(status: int, message: str, who: Principal | None = None) -> str:
    body = (
        f'<section class="card error"><h1>{status}</h1><p>{h(message)}</p>'
        '<p><a href="/ui">All runs</a></p></section>'
    )
    return layout(str(status), body, who=who)


def login_page(message: str = "", current: str = "") -> str:
    """The login form; with a ``tether ui`` link's code, a button that uses it (never used
    without a click: a link someone else sent logs you in as them); ``current``: who is
    logged in already."""
    note = f'<p class="flash" role="alert">{h(message)}</p>' if message else ""
    if current:
        note += (
            f'<p class="who-now">You are logged in as <b>{h(current)}</b> '
            '(<a href="/ui">your runs</a>); logging in again replaces that session.</p>'
        )
    body = (
        '<section class="card login"><h1>Log in</h1>'
        '<div id="with-link" hidden><p>This link from <code>tether ui</code> logs you in once, '
        "as whoever made it.</p>"
        '<button type="button" id="use-link">Log in with this link</button></div>'
        "<p>Paste a tether token (<code>tether token create</code>), or open the link "
        "<code>tether ui</code> prints.</p>"
        f'{note}<form id="login" autocomplete="off">'
        '<label for="token">Token</label>'
        '<input id="token" name="token" type="password" placeholder="tthu_…" required '
        'spellcheck="false" autocomplete="off">'
        '<button type="submit">Log in</button>'
        '<p class="flash" id="login-error" role="alert" hidden></p></form></section>'
    )
    return layout("Log in", body)


# --- the runs list --------------------------------------------------------------------------------


def _state_badge(record: RunRecord) -> str:
    state = record.state.value
    label = shown_state(record)
    if record.silent_for:
        label = f"{state} (worker silent {ago(record.silent_for)})"
    return f'<span class="badge s-{h(state)}">{h(label)}</span>'


def _where(record: RunRecord) -> str:
    where = record.where()
    if record.state is RunState.FAILED and record.detail and record.exit_code is not None:
        where = f"exit {record.exit_code}: {clip(record.detail, 80)}"
    return h(where)


def _duration(record: RunRecord, now: float) -> str:
    started = next((a.started_at for a in record.attempts if a.started_at), None)
    if started is None:
        return "-"
    end = record.updated_at if record.finished else now
    return ago(end - started)


def run_row(record: RunRecord, now: float) -> str:
    spec = record.spec
    last = record.attempts[-1] if record.attempts else None
    job = f' <span class="dim">job {h(last.job)}</span>' if last and last.job else ""
    ide = '<span class="ide" title="an IDE is attached">IDE</span>' if record.ides else ""
    tags = "".join(f'<span class="tag">{h(t)}</span>' for t in spec.tags)
    return (
        f'<tr id="run-{h(record.id)}" data-state="{h(record.state.value)}">'
        f'<td class="id"><a href="{run_path(record.id)}">{h(record.id)}</a></td>'
        f'<td class="name">{h(clip(spec.display_name(), 80))}{tags}</td>'
        f"<td>{h(record.owner)}</td>"
        f'<td class="state">{_state_badge(record)}<div class="where">{_where(record)}</div></td>'
        f"<td>{h(spec.backend)}{job}</td>"
        f"<td>{record.attempt}/{spec.max_retries + 1}</td>"
        f"<td>{stamp(record.created_at, now)}</td>"
        f"<td>{_duration(record, now)}</td>"
        f"<td>{ide}</td></tr>"
    )


def runs_page(
    page: Page,
    query: ListQuery,
    who: Principal,
    csrf: str,
    now: float,
    message: str = "",
    *,
    since: str = "0",
) -> str:
    options = "".join(
        f'<option value="{s.value}"{" selected" if query.states == {s} else ""}>{s.value}</option>'
        for s in RunState
    )
    owner = (
        f'<label>Owner <input name="owner" value="{h(query.owner)}" size="10"></label>'
        if who.admin
        else ""
    )
    filters = (
        '<form class="filters" method="get" action="/ui">'
        f'<label>State <select name="state"><option value="">any</option>{options}</select>'
        f"</label>{owner}"
        f'<label>Tag <input name="tag" value="{h(query.tag)}" size="12"></label>'
        '<button type="submit">Filter</button>'
        + ('<a href="/ui">Clear</a>' if query != ListQuery() else "")
        + "</form>"
    )
    rows = "".join(run_row(r, now) for r in page.runs)
    if not rows:
        rows = '<tr class="empty"><td colspan="9">No runs here.</td></tr>'
    pager = []
    if query.start:
        pager.append(f'<a href="{h(query.link(start=0))}">Newest</a>')
    if page.next_start is not None:
        pager.append(f'<a rel="next" href="{h(query.link(start=page.next_start))}">Older</a>')
    note = f'<p class="flash" role="alert">{h(message)}</p>' if message else ""
    body = (
        f'<div class="bar"><h1>Runs</h1>{filters}</div>{note}'
        '<table class="runs"><thead><tr><th>Run</th><th>Name</th><th>Owner</th><th>State</th>'
        "<th>Backend</th><th>Attempt</th><th>Submitted</th><th>Duration</th><th>IDE</th></tr>"
        f'</thead><tbody id="runs" data-first="{int(query.start == 0)}">{rows}</tbody></table>'
        f'<nav class="pager">{" ".join(pager)}</nav>'
    )
    params = query.link(start=0).partition("?")[2]
    live = f"/ui/live?{params}{'&' if params else ''}{urlencode({'since': since})}"
    return layout("Runs", body, who=who, csrf=csrf, live=live)


# --- one run --------------------------------------------------------------------------------------


def _facts(record: RunRecord, now: float) -> str:
    spec = record.spec
    resources = [f"{name} {amount}" for name, amount in spec.resources.parts()]
    rows = [
        ("Command", f"<code>{h(' '.join(spec.command))}</code>"),
        ("Mode", f"{'debug' if spec.debug else 'run'} on {h(spec.backend)}"),
        ("Resources", h(", ".join(resources))),
        (
            "Snapshot",
            f'<a href="{run_path(record.id)}/files">{record.files} files</a>, '
            f"{record.size / 1048576:.1f} MiB · from <code>{h(spec.workdir)}</code> "
            f'<span class="dim">{h(record.snapshot[:12])}</span>',
        ),
        ("Submitted", f"{stamp(record.created_at, now)} by {h(record.owner or '?')}"),
        ("Retries", f"attempt {record.attempt} of at most {spec.max_retries + 1}"),
    ]
    if spec.tags:
        rows.append(("Tags", "".join(f'<span class="tag">{h(t)}</span>' for t in spec.tags)))
    if spec.env:
        env = " ".join(f"{k}={v}" for k, v in sorted(spec.env.items()))
        rows.append(("Environment", f"<code>{h(env)}</code>"))
    if record.rerun_of:
        rows.append(("Rerun of", f'<a href="{run_path(record.rerun_of)}">{h(record.rerun_of)}</a>'))
    if record.trial:
        sweep, _, n = record.trial.partition("#")
        rows.append(("Sweep", f'trial {h(n)} of <a href="{sweep_path(sweep)}">{h(sweep)}</a>'))
    return '<dl class="facts">' + "".join(f"<dt>{k}</dt><dd>{v}</dd>" for k, v in rows) + "</dl>"


def _attempts(record: RunRecord, now: float) -> str:
    rows = []
    for a in record.attempts:
        # the current attempt is in the run's own state (paused, waiting for an IDE...)
        outcome = a.outcome or (shown_state(record) if a.n == record.attempt else "waiting")
        code = "" if a.exit_code is None else str(a.exit_code)
        where = a.worker or (f"job {a.job}" if a.job else "")
        if a.job and a.worker:
            where += f" (job {a.job})"
        rows.append(
            f"<tr><td>#{a.n}</td><td>{h(where or '-')}</td>"
            f"<td>{stamp(a.queued_at, now)}</td><td>{stamp(a.started_at or 0, now)}</td>"
            f"<td>{stamp(a.ended_at or 0, now)}</td>"
            f'<td><span class="badge s-{h(outcome.split()[0])}">{h(outcome)}</span></td><td>{h(code)}</td>'
            f'<td class="detail">{h(clip(a.detail, 200))}</td></tr>'
        )
    return (
        '<table class="attempts"><thead><tr><th>#</th><th>Where</th><th>Queued</th>'
        "<th>Started</th><th>Ended</th><th>Outcome</th><th>Exit</th><th>Detail</th></tr></thead>"
        f"<tbody>{''.join(rows)}</tbody></table>"
    )


def _processes(record: RunRecord) -> str:
    if not record.processes:
        return ""
    rows = "".join(
        f"<tr><td>{h(row.title)}</td><td>{h(row.pid or '-')}</td>"
        f'<td><span class="badge s-{h(row.state)}">{h(row.state)}</span></td>'
        f"<td>{h(row.where or ('exit ' + str(row.exit_code) if row.exit_code is not None else ''))}"
        "</td></tr>"
        for row in record.processes.values()
    )
    return (
        "<h3>Processes</h3><table><thead><tr><th>Process</th><th>PID</th><th>State</th>"
        f"<th>Where</th></tr></thead><tbody>{rows}</tbody></table>"
    )


def run_summary(record: RunRecord, now: float) -> str:
    """The part of a run's page that changes with its record (replaced live)."""
    actions = []
    if not record.finished:
        actions.append(
            f'<button type="button" class="danger" data-post="{run_path(record.id)}/cancel" '
            'data-confirm="Cancel this run?">Cancel</button>'
        )
    actions.append(
        f'<button type="button" data-post="{run_path(record.id)}/rerun" data-follow="1">'
        "Rerun</button>"
    )
    ide = ""
    if record.ides:
        ide = f'<span class="ide" title="{len(record.ides)} attached">IDE attached</span>'
    where = _where(record)
    paused = f'<p class="paused">{where}</p>' if where else ""
    return (
        f'<section id="summary" data-state="{h(record.state.value)}">'
        f'<div class="bar"><h1><span class="dim">run</span> {h(record.id)} '
        f"<small>{h(clip(record.spec.display_name(), 100))}</small></h1>"
        f'<div class="actions">{"".join(actions)}</div></div>'
        f'<p class="status">{_state_badge(record)} {ide}</p>{paused}'
        f"{_facts(record, now)}<h2>Attempts</h2>{_attempts(record, now)}{_processes(record)}"
        "</section>"
    )


def _attach(record: RunRecord) -> str:
    launch = json.dumps(
        {
            "name": f"tether: run {record.id}",
            "type": "debugpy",
            "request": "attach",
            "connect": {"host": "127.0.0.1", "port": ADAPTER_PORT},
            "justMyCode": True,
        },
        indent=2,
    )
    nvim = (
        "require('dap').run({\n"
        "  type = 'python', request = 'attach', name = 'tether',\n"
        f"  connect = {{ host = '127.0.0.1', port = {ADAPTER_PORT} }},\n"
        "})"
    )
    return (
        '<section class="attach"><h2>Debug it</h2>'
        f"<p>On your machine: <code>tether attach {h(record.id)}</code>, then attach your IDE "
        f"to 127.0.0.1:{ADAPTER_PORT}.</p>"
        '<div class="snippets"><figure><figcaption><span>VS Code <code>launch.json</code></span>'
        '<button type="button" class="link" data-copy="launch">Copy</button></figcaption>'
        f'<pre id="launch">{h(launch)}</pre></figure>'
        "<figure><figcaption>nvim-dap"
        '<button type="button" class="link" data-copy="nvim">Copy</button></figcaption>'
        f'<pre id="nvim">{h(nvim)}</pre></figure></div></section>'
    )


def debug_section(view: DebugView, record: RunRecord) -> str:
    """Breakpoints with whether each is verified, and where each process is stopped with its
    stack (replaced live when the run pauses or goes on)."""
    parts = []
    for process, stop in view.stops.items():
        row = record.processes.get(process)
        title = row.title if row else ("main process" if not process else f"process {process}")
        frames = "".join(
            f"<tr><td>{i}</td><td><code>{h(f.get('name', ''))}</code></td>"
            f"<td>{_source_link(record, str(f.get('path', '')), f.get('line'))}</td></tr>"
            for i, f in enumerate(stop.stack)
        )
        stack = (
            '<table class="stack"><thead><tr><th>#</th><th>Frame</th><th>Where</th></tr></thead>'
            f"<tbody>{frames}</tbody></table>"
            if frames
            else ""
        )
        parts.append(
            f'<div class="stop"><h3>{h(title)} stopped '
            f'<span class="dim">({h(stop.reason or "paused")})</span></h3>'
            f'<p class="paused">{h(stop.where)}</p>{stack}</div>'
        )
    if view.breakpoints:
        rows = "".join(
            f"<tr><td>{_source_link(record, b.path, b.line, b.where)}</td>"
            f"<td><code>{h(b.condition)}</code></td>"
            f'<td><span class="badge bp-{b.state}">{b.state}</span></td>'
            f'<td class="detail">{h(b.message)}</td></tr>'
            for b in view.breakpoints
        )
        parts.append(
            '<h3>Breakpoints</h3><table class="breakpoints"><thead><tr><th>Where</th>'
            "<th>Condition</th><th>State</th><th>Detail</th></tr></thead>"
            f"<tbody>{rows}</tbody></table>"
        )
    extra = []
    if view.functions:
        extra.append("functions: " + ", ".join(view.functions))
    if view.exceptions:
        extra.append("exceptions: " + ", ".join(view.exceptions))
    if extra:
        parts.append(f'<p class="dim">Also breaking on {h("; ".join(extra))}.</p>')
    if not view.complete:
        parts.append('<p class="dim">The session is long: only its start was read here.</p>')
    if not parts:
        parts.append('<p class="dim">No breakpoints, and no process is stopped.</p>')
    return f'<section id="debug"><h2>Debugger</h2>{"".join(parts)}</section>'


def _source_link(record: RunRecord, path: str, line: object, label: str = "") -> str:
    """``path:line`` (or ``label``), linked to the snapshot's copy when the path is one of its
    (relative)."""
    text = f"<code>{h(label or f'{path}:{line}')}</code>"
    if not path or path.startswith(("/", "<")) or ":\\" in path:
        return text
    return f'<a href="{h(file_path(record.id, path, line if isinstance(line, int) else 0))}">{text}</a>'


def files_page(
    record: RunRecord, manifest: Manifest, who: Principal, csrf: str, query: str = ""
) -> str:
    shown = [e for e in manifest.entries if query in e.path][:FILES_SHOWN]
    rows = "".join(
        f'<tr><td><a href="{h(file_path(record.id, e.path))}"><code>{h(e.path)}</code></a></td>'
        f"<td>{_size(e.size) if e.kind == 'file' else '→ ' + h(e.target)}</td>"
        f"<td><code>{e.mode:o}</code></td></tr>"
        for e in shown
    )
    more = len([e for e in manifest.entries if query in e.path]) - len(shown)
    note = f'<p class="dim">{more} more: narrow the filter.</p>' if more > 0 else ""
    body = (
        f'<div class="bar"><h1><a href="{run_path(record.id)}">run {h(record.id)}</a> '
        f"<small>snapshot: {len(manifest.entries)} files</small></h1>"
        '<form class="filters" method="get">'
        f'<input name="q" value="{h(query)}" placeholder="Filter paths" aria-label="Filter">'
        '<button type="submit">Filter</button></form></div>'
        '<table class="files"><thead><tr><th>Path</th><th>Size</th><th>Mode</th></tr></thead>'
        f"<tbody>{rows}</tbody></table>{note}"
    )
    return layout(f"run {record.id}: files", body, who=who, csrf=csrf)


def file_page(
    record: RunRecord, entry: ManifestEntry, text: str | None, who: Principal, csrf: str
) -> str:
    if entry.kind == "symlink":
        content = f'<p class="dim">A symbolic link to <code>{h(entry.target)}</code>.</p>'
    elif text is None:
        why = "too large to show here" if entry.size > 1024 * 1024 else "not text"
        content = f'<p class="dim">{_size(entry.size)}: {why}.</p>'
    else:
        # lines as a debugger counts them (``\n`` only: not ``splitlines``' form feeds and the rest)
        all_lines = text.removesuffix("\n").split("\n")
        lines = "".join(
            f'<span class="line" id="L{n}">{h(line.removesuffix(chr(13)))}</span>\n'
            for n, line in enumerate(all_lines[:LINES_SHOWN], start=1)
        )
        more = len(all_lines) - LINES_SHOWN
        rest = f'<p class="dim">{more:,} more lines: too long to show here.</p>' if more > 0 else ""
        content = f'<pre class="code">{lines}</pre>{rest}'
    body = (
        f'<div class="bar"><h1><a href="{run_path(record.id)}">run {h(record.id)}</a> '
        f'<small><a href="{run_path(record.id)}/files">files</a> / {h(entry.path)}</small></h1>'
        f"</div>{content}"
    )
    return layout(f"{entry.path} · run {record.id}", body, who=who, csrf=csrf)


def _size(n: int) -> str:
    for unit, size in (("GiB", 1 << 30), ("MiB", 1 << 20), ("KiB", 1 << 10)):
        if n >= size:
            return f"{n / size:.1f} {unit}"
    return f"{n} B"


def _audit(entries: Sequence[AuditEntry]) -> str:
    rows = "".join(
        f"<tr><td>{stamp(e.at, time.time())}</td><td>{h(e.event)}</td><td>{h(e.user or '?')}</td>"
        f"<td>{h(e.role)}</td><td>{h(e.source)}</td><td>{h(clip(e.detail, 200))}</td></tr>"
        for e in reversed(entries[-200:])
    )
    return (
        '<table class="audit"><thead><tr><th>When</th><th>What</th><th>Who</th><th>As</th>'
        f"<th>From</th><th>Detail</th></tr></thead><tbody>{rows}</tbody></table>"
    )


def run_page(
    record: RunRecord,
    logs: str,
    audit: Sequence[AuditEntry],
    who: Principal,
    csrf: str,
    now: float,
    *,
    logs_cursor: str,
    since: str = "0",
    debug: DebugView | None = None,
    metrics: str = "",
    ranks: str = "",
    outputs: str = "",
) -> str:
    """``metrics``: the run's charts (``relay/web/experiments.py``), if it reported any;
    ``ranks``: its processes' stacks section (``relay/web/stacks.py``); ``outputs``: its
    outputs' list (``relay/web/outputs.py``)."""
    shown = debug is not None and (record.spec.debug or not debug.empty)
    body = (
        f"{run_summary(record, now)}{metrics}"
        f"{debug_section(debug, record) if shown and debug is not None else ''}{ranks}"
        f"{'' if record.finished else _attach(record)}{outputs}"
        '<section class="logs"><div class="bar"><h2>Logs</h2>'
        '<input id="log-search" type="search" placeholder="Search the log" aria-label="Search">'
        '<label class="follow"><input id="log-follow" type="checkbox" checked> follow</label>'
        f'</div><pre id="log">{h(logs)}</pre></section>'
        f"<section><h2>Audit trail</h2>{_audit(audit)}</section>"
    )
    # ``nl``: whether the log shown ends a line (a status marker pushed next starts a new one)
    nl = int(not logs or logs.endswith("\n"))
    live = "/ui/live?" + urlencode(
        {"run": record.id, "logs": logs_cursor, "nl": nl, "since": since}
    )
    return layout(f"run {record.id}", body, who=who, csrf=csrf, live=live)
