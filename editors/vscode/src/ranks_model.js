'use strict';
// The Ranks view's decisions, without VS Code (unit-tested): how the report `tether stacks RUN
// --json` prints (docs/cli.md, "tether stacks --json") reads as a tree of groups (the processes in
// the same place, in the same state) and their processes, and which debug session shows which
// process.

/** "train.py:40 step": where a class of processes is (its innermost frame). */
function topFrame(frames) {
  const top = (frames || [])[frames ? frames.length - 1 : 0];
  return top ? `${top.file}:${top.line} ${top.function}` : '';
}

/** "rank 3", or tether's name of a process that is not a rank ("main process", "worker 1 of rank 0"). */
function shortName(process) {
  if (process.rank !== null && process.rank !== undefined) return `rank ${process.rank}`;
  return String(process.name || `pid ${process.pid}`).replace(/\s*\(pid \d+\)$/, '');
}

function stateOf(process) {
  if (process.error) return `stack unreadable: ${process.error}`;
  if (process.state === 'paused') return process.why ? `paused: ${process.why}` : 'paused';
  return 'running';
}

/**
 * The view's tree: one group per class (and per reason stacks could not be read), each with its
 * processes, ranks first. A group: {id, label: "ranks 0-2,4-7 (paused: breakpoint)",
 * description: "train.py:40 step", tooltip (its frames, outermost first), icon, pids, ranks,
 * children}; a child: {id, label: "rank 3", description: "pid 4242 · paused: breakpoint",
 * tooltip, icon, pid, rank, paused}.
 */
function groups(report) {
  const byPid = new Map((report.processes || []).map((p) => [p.pid, p]));
  const classes = [...(report.classes || []), ...(report.unreadable || [])];
  return classes.map((cls) => {
    const members = cls.pids.map((pid) => byPid.get(pid) || { pid, name: `pid ${pid}`, rank: null, state: 'running' });
    const where = topFrame(cls.frames);
    const paused = cls.state.startsWith('paused');
    const unreadable = cls.state.startsWith('stack unreadable');
    const frames = (cls.frames || []).map((f) => `${f.file}:${f.line} ${f.function}`);
    return {
      id: `group:${cls.pids.join(',')}`,
      label: unreadable ? `${cls.label}: ${cls.state}` : `${cls.label} (${cls.state})`,
      description: where,
      tooltip: [`${cls.label} (${cls.state})`, ...frames.map((f, i) => `${'  '.repeat(i)}${f}`)].join('\n'),
      icon: unreadable ? 'warning' : paused ? 'debug-pause' : 'play-circle',
      pids: cls.pids,
      ranks: members.filter((p) => p.rank !== null && p.rank !== undefined).map((p) => p.rank),
      children: members.map((p) => ({
        id: `process:${p.pid}`,
        label: shortName(p),
        description: `pid ${p.pid} · ${stateOf(p)}`,
        tooltip: `${p.name}: ${stateOf(p)}${p.where ? ` at ${p.where}` : ''}`,
        icon: p.error ? 'warning' : p.state === 'paused' ? 'debug-pause' : 'play-circle',
        pid: p.pid,
        rank: p.rank === undefined ? null : p.rank,
        paused: p.state === 'paused',
      })),
    };
  });
}

/** The line above the tree: "4 ranks and 1 other process in 2 places, 4 paused". */
function summary(report) {
  const processes = report.processes || [];
  const ranks = processes.filter((p) => p.rank !== null && p.rank !== undefined).length;
  const others = processes.length - ranks;
  const paused = processes.filter((p) => p.state === 'paused').length;
  const places = (report.classes || []).length;
  const parts = [];
  if (ranks) parts.push(`${ranks} rank${ranks === 1 ? '' : 's'}`);
  if (others) parts.push(`${others} ${ranks ? 'other ' : ''}process${others === 1 ? '' : 'es'}`);
  const what = parts.join(' and ') || 'no Python process';
  return `${what} in ${places} place${places === 1 ? '' : 's'}${paused ? `, ${paused} paused` : ''}`;
}

/**
 * The debug session (of `sessions`: {id, name, configuration, parentSession}) that shows process
 * `pid`: a child session names it (`subProcessId`, or "(pid N)" in its name); the main process
 * is the run's root session. Undefined if VS Code has none for it.
 */
function sessionFor(sessions, process) {
  const named = (s) => s.configuration?.subProcessId === process.pid || new RegExp(`\\(pid ${process.pid}\\)`).test(s.name || '');
  const found = sessions.find(named);
  if (found) return found;
  if (/^main process/.test(process.label || process.name || '')) return sessions.find((s) => !s.parentSession);
  return undefined;
}

/** The process a choice in the view stands for: a process, or a group's first (ranks first). */
function chosenProcess(item) {
  return item.children ? item.children[0] : item;
}

/**
 * The session "Continue all ranks" and "Evaluate on all ranks" talk to: the focused one if it is
 * one of the run's and its process is paused, else the session of the first paused process that
 * has one, else the root session (a continue to a running process would move nothing).
 */
function groupSession(sessions, tree, focused) {
  const paused = tree.flatMap((g) => g.children).filter((c) => c.paused);
  const mine = focused && sessions.find((s) => s.id === focused.id);
  if (mine && paused.some((c) => sessionFor([mine], c) === mine)) return mine;
  for (const group of tree) {
    for (const child of group.children) {
      if (!child.paused) continue;
      const session = sessionFor(sessions, child);
      if (session) return session;
    }
  }
  return sessions.find((s) => !s.parentSession) || sessions[0];
}

/** The text "Evaluate on all ranks" sends to a rank's debug console (the worker's prefix). */
function allRanksExpression(expression) {
  const text = String(expression || '').trim();
  return text ? `@all ${text}` : '';
}

/** What a refused custom request means for the user, in one line (an adapter that does not know
 * it yet; of a debugger's traceback, its last line: the error). */
function refusedText(command, err) {
  const lines = String(err?.message || err || '').split('\n').map((l) => l.trim()).filter(Boolean);
  const said = lines.length ? lines[lines.length - 1] : 'failed';
  if (/unknown|unrecognized|not supported|unsupported|no handler/i.test(said)) {
    return `tether: this tether's adapter does not answer "${command}" yet (update tether): ${said}`;
  }
  return `tether: ${command}: ${said}`;
}

module.exports = { groups, summary, sessionFor, chosenProcess, groupSession, allRanksExpression, refusedText, topFrame };
