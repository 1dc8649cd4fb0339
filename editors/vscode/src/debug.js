'use strict';
// The `tether` debug type: a configuration is resolved (launch.js), then `tether debug` (launch),
// `tether rerun` or `tether attach` is started to serve the run's adapter on 127.0.0.1, and VS
// Code speaks DAP to it like to any debug adapter. The launch is answered as an attach by the
// adapter (the `tetherRun` it names is the run the extension submitted). The program's other
// processes arrive as `startDebugging` requests naming the same adapter: VS Code opens them as
// child sessions of the launch's; the serving process stops once every session it serves ended.
const fs = require('fs');
const path = require('path');
const vscode = require('vscode');
const { resolve, serveArgv, runArgv } = require('./launch');
const cli = require('./cli');

// a session must start this soon after its adapter is served, or the adapter is stopped (VS Code
// dropped the session: the launch request failed, or "already running" was answered No)
const START_GRACE_MS = 30000;

/**
 * The interpreter the workspace works with: the one selected in the Python extension (when it is
 * installed), else the folder's .venv/bin/python; undefined for none (the command's `python`).
 */
async function workspacePython(folder, where) {
  try {
    const python = vscode.extensions.getExtension('ms-python.python');
    const api = python && (python.isActive ? python.exports : await python.activate());
    const chosen = await api?.environments?.getActiveEnvironmentPath?.(folder?.uri);
    if (chosen?.path && path.isAbsolute(chosen.path)) return chosen.path;
  } catch {
    // no Python extension, or an API it does not have: the folder's venv, if any
  }
  const local = where && path.join(where, '.venv', 'bin', 'python');
  return local && fs.existsSync(local) ? local : undefined;
}

function rootOf(session) {
  while (session.parentSession) session = session.parentSession;
  return session;
}

class Debugging {
  constructor(context, { output, trace, settings, showLogs }) {
    this.output = output;
    this.trace = trace;
    this.settings = settings;
    this.showLogs = showLogs;
    // token -> {child, run, launched, sessions: Set of session ids, started}
    this.served = new Map();
    this.nextToken = 1;
    context.subscriptions.push(
      vscode.debug.registerDebugConfigurationProvider('tether', this),
      vscode.debug.registerDebugAdapterDescriptorFactory('tether', this),
      vscode.debug.registerDebugAdapterTrackerFactory('tether', this),
      vscode.debug.onDidStartDebugSession((session) => this.started(session)),
      vscode.debug.onDidTerminateDebugSession((session) => this.ended(session)),
      { dispose: () => this.stopAll() },
    );
  }

  folderPath(folder) {
    const first = (vscode.workspace.workspaceFolders || [])[0];
    return (folder || first || {}).uri?.fsPath;
  }

  command(folder) {
    return cli.tetherPath(this.settings().get('path'), folder);
  }

  // --- vscode.DebugConfigurationProvider ------------------------------------------------------

  resolveDebugConfiguration(folder, config) {
    if (!config.type && !config.request && !config.name) {
      // F5 with no launch.json: the Python file in the editor, as the Python extension does
      const file = vscode.window.activeTextEditor?.document.fileName;
      if (!file || !file.endsWith('.py')) return this.refuse(new Error('open a Python file to run, or add a tether configuration to launch.json'));
      return { type: 'tether', request: 'launch', name: 'tether: current file', program: file };
    }
    return config;
  }

  async resolveDebugConfigurationWithSubstitutedVariables(folder, config, token) {
    if (config.subProcessId !== undefined && config.connect) return config; // a child process's
    const where = this.folderPath(folder);
    let resolved;
    try {
      resolved = resolve(config, { folder: where, python: await workspacePython(folder, where) });
      if (resolved.request === 'attach' && !resolved.run) {
        resolved.run = await this.pickRun(where);
        if (!resolved.run) return undefined; // dismissed
      }
      if (config.noDebug && resolved.request === 'launch' && !resolved.rerunOf) return await this.runPlain(resolved, where);
      const served = await this.serve(resolved, where, token);
      return served && { ...resolved, tetherRun: served.run, tetherPort: served.port, tetherServe: served.token };
    } catch (err) {
      return this.refuse(err);
    }
  }

  /** Start `tether` serving the adapter; {run, port, token}, or undefined if cancelled. */
  async serve(resolved, where, cancel) {
    const argv = serveArgv(resolved);
    this.trace({ ext: 'serve', argv });
    const what = resolved.request === 'attach' ? `attaching to run ${resolved.run}` : resolved.rerunOf ? `rerunning ${resolved.rerunOf}` : `submitting ${resolved.program || resolved.module || resolved.command.join(' ')}`;
    let stopped = false;
    const served = await vscode.window.withProgress(
      { location: vscode.ProgressLocation.Notification, title: `tether: ${what}`, cancellable: true },
      (_progress, cancelled) => {
        const started = cli.serve(this.command(where), argv, { cwd: where, log: (line) => this.output.appendLine(line) });
        const stop = () => {
          stopped = true; // the user cancelled: Ctrl-C (a run already submitted stays queued)
          started.child.kill('SIGINT');
        };
        cancelled.onCancellationRequested(stop);
        cancel?.onCancellationRequested(stop);
        return started.ready;
      },
    ).catch((err) => {
      if (stopped) return undefined;
      throw err;
    });
    if (!served) return undefined;
    if (served.port === null) throw new Error(`run ${served.run} is not a debug run: it was resubmitted without the debugger`);
    const token = this.nextToken++;
    this.adopt(token, served, resolved.request === 'launch' && !resolved.rerunOf ? served.run : '');
    return { ...served, token };
  }

  adopt(token, served, launched) {
    const entry = { child: served.child, run: served.run, launched, sessions: new Set(), started: false };
    this.served.set(token, entry);
    served.child.on('close', (code) => this.trace({ ext: 'stopped serving', run: served.run, code }));
    this.trace({ ext: 'served', run: served.run, port: served.port });
    this.output.appendLine(`tether: run ${served.run}: adapter on 127.0.0.1:${served.port}`);
    entry.grace = setTimeout(() => {
      if (entry.started || this.served.get(token) !== entry) return;
      this.trace({ ext: 'abandoned', run: served.run });
      this.stop(token);
      // a run submitted for a session VS Code never started would wait for nobody: cancel it
      if (launched) cli.run(this.command(this.folderPath()), ['cancel', launched]).catch(() => {});
    }, START_GRACE_MS);
  }

  /** Ctrl+F5 (Run Without Debugging): submitted as `tether run`, its logs in an output channel. */
  async runPlain(resolved, where) {
    const out = await vscode.window.withProgress(
      { location: vscode.ProgressLocation.Notification, title: 'tether: submitting (without the debugger)' },
      () => cli.run(this.command(where), runArgv(resolved), { cwd: where }),
    );
    const run = out.trim().split('\n').pop();
    this.trace({ ext: 'ran', run });
    this.showLogs(run);
    return undefined; // no debug session
  }

  refuse(err) {
    const message = `tether: ${err.message}`;
    this.trace({ ext: 'refused', message });
    vscode.window.showErrorMessage(message);
    return undefined; // the launch is abandoned, nothing else is opened
  }

  async pickRun(folder) {
    const records = cli.parseJson(await cli.run(this.command(folder), ['ls', '--json', '-n', '50'], { cwd: folder }));
    const open = records.filter((r) => ['queued', 'starting', 'running', 'paused'].includes(r.state));
    if (!open.length) throw new Error('no run of yours is queued, running or paused');
    const items = open.map((r) => ({ label: r.spec.name || r.id, description: r.state === 'paused' ? `paused at ${r.paused_at}` : r.state, detail: r.spec.command.join(' '), run: r.id }));
    const chosen = await vscode.window.showQuickPick(items, { placeHolder: 'The run to debug' });
    return chosen?.run;
  }

  // --- vscode.DebugAdapterDescriptorFactory ---------------------------------------------------

  async createDebugAdapterDescriptor(session) {
    const config = session.configuration;
    if (config.connect?.port) return new vscode.DebugAdapterServer(config.connect.port, config.connect.host || '127.0.0.1');
    if (!config.tetherRun) throw new Error('tether: this session has no run to debug (start it from a tether configuration)');
    const entry = this.served.get(config.tetherServe);
    if (entry && entry.child.exitCode === null && entry.child.signalCode === null) return new vscode.DebugAdapterServer(config.tetherPort, '127.0.0.1');
    // a restart (VS Code reuses the resolved configuration): serve the same run again
    const where = this.folderPath(session.workspaceFolder);
    const started = cli.serve(this.command(where), serveArgv({ ...config, request: 'attach', run: config.tetherRun }), { cwd: where, log: (line) => this.output.appendLine(line) });
    const served = await started.ready;
    this.adopt(config.tetherServe, served, '');
    return new vscode.DebugAdapterServer(served.port, '127.0.0.1');
  }

  // --- vscode.DebugAdapterTrackerFactory: the DAP traffic in the trace file -------------------

  createDebugAdapterTracker(session) {
    const name = session.name;
    return {
      onWillReceiveMessage: (message) => this.trace({ session: name, to: 'adapter', message }),
      onDidSendMessage: (message) => this.trace({ session: name, to: 'ide', message }),
    };
  }

  // --- the served processes: each lives as long as a session it serves ------------------------

  started(session) {
    if (session.type !== 'tether') return;
    const token = rootOf(session).configuration.tetherServe;
    const entry = this.served.get(token);
    if (!entry) return;
    entry.started = true;
    entry.sessions.add(session.id);
  }

  ended(session) {
    if (session.type !== 'tether') return;
    const token = rootOf(session).configuration.tetherServe;
    const entry = this.served.get(token);
    if (!entry) return;
    entry.sessions.delete(session.id);
    this.trace({ ext: 'ended', session: session.name, run: entry.run, left: entry.sessions.size });
    // the last session it served is gone: stop serving (Ctrl-C); the run goes on unless a
    // session cancelled it (Stop), and `tether attach` or the runs view attach again
    if (entry.sessions.size === 0) this.stop(token);
  }

  stop(token) {
    const entry = this.served.get(token);
    if (!entry) return;
    this.served.delete(token);
    clearTimeout(entry.grace);
    if (entry.child.exitCode === null && entry.child.signalCode === null) entry.child.kill('SIGINT');
  }

  stopAll() {
    for (const token of [...this.served.keys()]) this.stop(token);
  }
}

module.exports = { Debugging };
