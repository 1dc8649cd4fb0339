'use strict';
// The runs view's decisions, without VS Code (unit-tested): how a run record from
// `tether ls --json` reads as a row, and which runs just paused with no IDE attached.

const ACTIVE = new Set(['queued', 'starting', 'running', 'paused']);
const ICONS = {
  queued: 'clock',
  starting: 'loading~spin',
  running: 'play-circle',
  paused: 'debug-pause',
  succeeded: 'pass',
  failed: 'error',
  cancelled: 'circle-slash',
  lost: 'warning',
};

function shortCommand(spec) {
  const text = (spec.command || []).join(' ');
  return text.length > 80 ? `${text.slice(0, 77)}...` : text;
}

/** Any unfinished run: whether its program can be debugged (a plain run started
 * `--no-debuggable`, a program that is not Python) the CLI says when asked, in one line. */
function attachable(record) {
  return ACTIVE.has(record.state);
}

/** How the state reads: "paused at train.py:18 in step", "queued (slurm job 42 submitted)". */
function stateText(record) {
  if (record.state === 'paused' && record.paused_at) {
    // "train.py:18 in step" (a breakpoint, a step), "uncaught ValueError at train.py:8 in load"
    return /^\S+:\d+/.test(record.paused_at) ? `paused at ${record.paused_at}` : `paused: ${record.paused_at}`;
  }
  if (record.state === 'queued' && record.detail) return `queued: ${record.detail}`;
  if ((record.state === 'succeeded' || record.state === 'failed') && record.exit_code !== null && record.exit_code !== undefined) {
    return `${record.state} (exit code ${record.exit_code})`;
  }
  return record.state;
}

/** One row of the view. */
function row(record) {
  const spec = record.spec || {};
  const label = spec.name ? `${spec.name} (${record.id.slice(0, 8)})` : record.id;
  const flags = [ACTIVE.has(record.state) ? 'active' : 'ended'];
  if (attachable(record)) flags.push('attachable');
  const ides = (record.ides || []).length;
  const where = spec.backend && spec.backend !== 'local' ? ` on ${spec.backend}` : '';
  const tooltip = [
    `${record.id}${where}: ${stateText(record)}`,
    shortCommand(spec),
    ides ? `${ides} IDE(s) attached` : 'no IDE attached',
  ].join('\n');
  return {
    id: record.id,
    label,
    description: `${stateText(record)}${ides ? ' · IDE attached' : ''}`,
    tooltip,
    contextValue: `tetherRun.${flags.join('.')}`,
    icon: ICONS[record.state] || 'circle-outline',
  };
}

/**
 * The runs that paused with no IDE attached and were not told yet (`seen`: a Set of keys,
 * updated): each pause of each attempt is told once, those found paused at startup too (they
 * are waiting for someone).
 */
function newlyPaused(records, seen) {
  const out = [];
  for (const record of records) {
    if (record.state !== 'paused' || (record.ides || []).length) continue;
    const key = `${record.id}#${record.attempt}@${record.paused_at}`;
    if (seen.has(key)) continue;
    seen.add(key);
    out.push(record);
  }
  return out;
}

/** The run's outputs as a quick pick offers them, newest first: those that name outputs. */
function withOutputs(records) {
  return records
    .filter((r) => (r.spec.outputs || []).length > 0)
    .map((r) => ({ label: r.spec.name || r.id, description: `${r.id} · ${stateText(r)}`, detail: (r.spec.outputs || []).join('  '), run: r.id }));
}

/** `tether cp RUN: FOLDER`: every output of the run, written under FOLDER. */
function downloadArgv(run, folder) {
  return ['cp', `${run}:`, folder];
}

module.exports = { row, stateText, newlyPaused, attachable, withOutputs, downloadArgv };
