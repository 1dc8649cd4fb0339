'use strict';
// What a `tether` debug configuration means, decided without VS Code (unit-tested with node's own
// test runner): defaults from the workspace, checks with one clear message each, and the
// `tether` command line that submits the run (or finds it) and serves the adapter for it.
const path = require('path');

const BACKENDS = ['local', 'slurm', 'ray'];
const PROCESSES = ['stopped', 'all', 'main'];
const STOPS = ['all', 'one'];
const UNATTENDED = ['wait', 'continue', 'terminate', 'suspend'];

// configuration key -> `tether debug` option taking one value
const ONE = {
  backend: '--backend',
  gpus: '--gpus',
  cpus: '--cpus',
  nodes: '--nodes',
  gpusPerNode: '--gpus-per-node',
  cpusPerNode: '--cpus-per-node',
  mem: '--mem',
  time: '--time',
  partition: '--partition',
  runName: '--name',
  maxRetries: '--max-retries',
  preemptGrace: '--preempt-grace',
  processes: '--processes',
  ranks: '--ranks',
  stop: '--stop',
  debugWhen: '--debug-when',
  keepCheckpoints: '--keep-checkpoints',
  onUnattendedStop: '--on-unattended-stop',
  unattendedFallback: '--unattended-fallback',
  fromCheckpoint: '--from-checkpoint',
};
// configuration key -> an option repeated for each item
const MANY = { tags: '--tag', metrics: '--metric', resources: '--resource', outputs: '--outputs' };
// options of every command that talks to the relay
const RELAY = { profile: '--profile', relay: '--relay' };

class ConfigError extends Error {}

function isStrings(value) {
  return Array.isArray(value) && value.every((v) => typeof v === 'string');
}

function check(ok, message) {
  if (!ok) throw new ConfigError(message);
}

/**
 * The configuration with its defaults filled in, or a ConfigError saying what is wrong.
 * `where.folder`: the workspace folder's path, or undefined; `where.python`: the workspace's
 * interpreter, if one was found. Variables (${file},
 * ${workspaceFolder}) are substituted by VS Code before this runs.
 */
function resolve(config, where) {
  const out = { ...config };
  out.type = 'tether';
  check(out.request === 'launch' || out.request === 'attach', '"request" must be "launch" or "attach".');
  for (const key of ['profile', 'relay']) {
    check(out[key] === undefined || typeof out[key] === 'string', `"${key}" must be a string.`);
  }
  if (out.justMyCode === undefined) out.justMyCode = true;
  if (out.request === 'attach') {
    check(out.run === undefined || typeof out.run === 'string', '"run" must be a run id, a prefix of one, or a run name.');
    // left out or left empty (docs/editors.md's and the snippet's "run": ""): pick one from a list
    if (out.run !== undefined && out.run.trim() === '') delete out.run;
    else if (out.run !== undefined) out.run = out.run.trim();
    return out;
  }
  if (out.rerunOf !== undefined) {
    check(typeof out.rerunOf === 'string' && out.rerunOf !== '', '"rerunOf" must be a run id.');
    return out;
  }
  const workdir = out.workdir || out.cwd || where.folder;
  check(typeof workdir === 'string' && workdir !== '', 'Open a folder (the workdir to snapshot), or set "workdir".');
  check(path.isAbsolute(workdir) || where.folder, '"workdir" must be an absolute path here (no folder is open).');
  out.workdir = path.resolve(where.folder || '/', workdir);
  const given = ['program', 'module', 'command'].filter((k) => out[k] !== undefined);
  check(given.length === 1, 'Give one of "program", "module" or "command".');
  if (out.program !== undefined) {
    check(typeof out.program === 'string' && out.program !== '', '"program" must be a path.');
    const full = path.resolve(out.workdir, out.program);
    const inside = path.relative(out.workdir, full);
    const outside = inside === '..' || inside.startsWith(`..${path.sep}`) || path.isAbsolute(inside) || inside === '';
    check(!outside, `"program" (${out.program}) must be inside the workdir (${out.workdir}): only the workdir is snapshotted.`);
    out.program = inside.split(path.sep).join('/');
  }
  check(out.module === undefined || (typeof out.module === 'string' && out.module !== ''), '"module" must be a module name.');
  check(out.command === undefined || (isStrings(out.command) && out.command.length > 0), '"command" must be a list of strings.');
  check(out.args === undefined || isStrings(out.args), '"args" must be a list of strings.');
  check(out.python === undefined || (typeof out.python === 'string' && out.python !== ''), '"python" must be a command.');
  // the interpreter the workspace works with (the Python extension's, else its .venv), as the
  // Python extension would run the program: the CLI names it by its path (`--local-env`)
  if (out.python === undefined && out.command === undefined && where.python) out.python = where.python;
  check(out.backend === undefined || BACKENDS.includes(out.backend), `"backend" must be one of ${BACKENDS.join(', ')}.`);
  check(out.processes === undefined || PROCESSES.includes(out.processes), `"processes" must be one of ${PROCESSES.join(', ')}.`);
  check(out.stop === undefined || STOPS.includes(out.stop), `"stop" must be one of ${STOPS.join(', ')}.`);
  check(out.onUnattendedStop === undefined || UNATTENDED.includes(out.onUnattendedStop), `"onUnattendedStop" must be one of ${UNATTENDED.join(', ')}.`);
  const fallbacks = UNATTENDED.slice(0, 3);
  check(out.unattendedFallback === undefined || fallbacks.includes(out.unattendedFallback), `"unattendedFallback" must be one of ${fallbacks.join(', ')}.`);
  for (const key of ['gpus', 'cpus', 'nodes', 'gpusPerNode', 'cpusPerNode', 'maxRetries', 'keepCheckpoints']) {
    check(out[key] === undefined || (Number.isInteger(out[key]) && out[key] >= 0), `"${key}" must be a whole number.`);
  }
  if (out.nodes > 1) {
    for (const key of ['gpus', 'cpus']) {
      check(out[key] === undefined, `"${key}" with "nodes" ${out.nodes} is ambiguous: give "${key}PerNode" (each node gets that many).`);
    }
  }
  for (const key of ['mem', 'time', 'partition', 'runName', 'ranks', 'debugWhen']) {
    check(out[key] === undefined || typeof out[key] === 'string', `"${key}" must be a string.`);
  }
  for (const key of [...Object.keys(MANY), 'tetherArgs']) {
    check(out[key] === undefined || isStrings(out[key]), `"${key}" must be a list of strings.`);
  }
  check(out.env === undefined || (typeof out.env === 'object' && !Array.isArray(out.env) && Object.values(out.env).every((v) => typeof v === 'string')), '"env" must map names to strings.');
  return out;
}

function relayOptions(config) {
  const argv = [];
  for (const [key, flag] of Object.entries(RELAY)) if (config[key] !== undefined) argv.push(flag, config[key]);
  return argv;
}

/** The program's command line on the worker. */
function programCommand(config) {
  if (config.command) return [...config.command, ...(config.args || [])];
  const python = config.python || 'python';
  const target = config.module !== undefined ? ['-m', config.module] : [config.program];
  return [python, ...target, ...(config.args || [])];
}

/**
 * The `tether` arguments that serve the adapter for this (resolved) configuration, printing one
 * JSON line {"run", "port"} when it is ready: `debug` submits, `rerun` reruns, `attach` finds.
 */
function serveArgv(config) {
  const serving = ['--port', '0', '--json', '-q'];
  if (config.request === 'attach') return ['attach', config.run, ...relayOptions(config), ...serving];
  if (config.rerunOf !== undefined) return ['rerun', config.rerunOf, ...relayOptions(config), ...serving];
  const argv = ['debug', '--workdir', config.workdir, ...relayOptions(config)];
  for (const [key, flag] of Object.entries(ONE)) if (config[key] !== undefined) argv.push(flag, String(config[key]));
  for (const [key, flag] of Object.entries(MANY)) for (const item of config[key] || []) argv.push(flag, item);
  for (const [name, value] of Object.entries(config.env || {})) argv.push('--env', `${name}=${value}`);
  argv.push(...(config.tetherArgs || []), ...serving, '--', ...programCommand(config));
  return argv;
}

/** The `tether run` arguments for Run Without Debugging: the same run, no debugger, its id out. */
function runArgv(config) {
  const argv = serveArgv({ ...config, processes: undefined, ranks: undefined });
  const end = argv.indexOf('--port');
  return ['run', ...argv.slice(1, end), ...argv.slice(argv.indexOf('--'))];
}

/** The ready line of a serving `tether` ({"run", "port"}), or undefined for any other line. */
function readyLine(line) {
  if (!line.startsWith('{')) return undefined;
  try {
    const said = JSON.parse(line);
    return typeof said.run === 'string' && 'port' in said ? said : undefined;
  } catch {
    return undefined;
  }
}

/** What the user is told when `tether` ends without serving: its own last error line
 * ("tether: ...", argparse's "tether debug: error: ..."), without the prefix. */
function failure(stderr, code) {
  const prefix = /^tether(\s[\w-]+)?:\s*(error:\s*)?/;
  const lines = stderr.split('\n').map((l) => l.trim()).filter(Boolean);
  const said = lines.filter((l) => prefix.test(l));
  const text = said.length ? said[said.length - 1].replace(prefix, '') : lines.slice(-3).join(' ');
  return text || `tether exited with code ${code} before serving the run.`;
}

module.exports = { ConfigError, resolve, serveArgv, runArgv, programCommand, readyLine, failure, relayOptions };
