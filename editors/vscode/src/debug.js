'use strict';
// The `tether` debug type: a configuration is resolved (launch.js), then `tether debug` (launch),
// `tether rerun` or `tether attach` is started to serve the run's adapter on 127.0.0.1, and VS
// Code speaks DAP to it like to any debug adapter. The launch is answered as an attach by the
// adapter (the `tetherRun` it names is the run the extension submitted). The program's other
// processes arrive as `startDebugging` requests naming the same adapter: VS Code opens them as
// child sessions in this window; they need nothing served.
const vscode = require('vscode');
const { resolve, serveArgv } = require('./launch');
const cli = require('./cli');

class Debugging {
  constructor(context, { output, trace, settings }) {
    this.output = output;
    this.trace = trace;
    this.settings = settings;
    this.served = new Map(); // token -> the `tether` process serving a session's adapter
    this.nextToken = 1;
    context.subscriptions.push(
      vscode.debug.registerDebugConfigurationProvider('tether', this),
      vscode.debug.registerDebugAdapterDescriptorFactory('tether', this),
      vscode.debug.registerDebugAdapterTrackerFactory('tether', this),
      vscode.debug.onDidTerminateDebugSession((session) => this.ended(session)),
      { dispose: () => this.stopAll() },
    );
  }

  folderPath(folder) {
    const first = (vscode.workspace.workspaceFolders || [])[0];
    return (folder || first || {}).uri?.fsPath;
  }

  // --- vscode.DebugConfigurationProvider ------------------------------------------------------

  resolveDebugConfiguration(folder, config) {
    if (!config.type && !config.request && !config.name) {
      const editor = vscode.window.activeTextEditor;
      return { type: 'tether', request: 'launch', name: 'tether: current file', program: editor ? editor.document.fileName : '' };
    }
    return config;
  }

  async resolveDebugConfigurationWithSubstitutedVariables(folder, config) {
    if (config.tetherPort) return config; // served already: a child process's session, a rerun
    const where = this.folderPath(folder);
    let resolved;
    try {
      resolved = resolve(config, { folder: where, file: vscode.window.activeTextEditor?.document.fileName });
      if (resolved.request === 'attach' && !resolved.run) {
        resolved.run = await this.pickRun(where);
        if (!resolved.run) return undefined; // dismissed
      }
    } catch (err) {
      return this.refuse(err);
    }
    const command = cli.tetherPath(this.settings().get('path'), where);
    const argv = serveArgv(resolved);
    this.trace({ ext: 'serve', argv });
    const what = resolved.request === 'attach' ? `attaching to run ${resolved.run}` : resolved.rerunOf ? `rerunning ${resolved.rerunOf}` : `submitting ${resolved.program || resolved.module || resolved.command.join(' ')}`;
    try {
      const served = await vscode.window.withProgress(
        { location: vscode.ProgressLocation.Notification, title: `tether: ${what}` },
        () => cli.serve(command, argv, { cwd: where, log: (line) => this.output.appendLine(line) }),
      );
      if (served.port === null) return this.refuse(new Error(`run ${served.run} is not a debug run: it was resubmitted without the debugger`));
      const token = this.nextToken++;
      this.served.set(token, served.child);
      served.child.on('close', () => this.served.delete(token));
      this.trace({ ext: 'served', run: served.run, port: served.port });
      this.output.appendLine(`tether: run ${served.run}: adapter on 127.0.0.1:${served.port}`);
      return { ...resolved, tetherRun: served.run, tetherPort: served.port, tetherServe: token };
    } catch (err) {
      return this.refuse(err);
    }
  }

  refuse(err) {
    const message = `tether: ${err.message}`;
    this.trace({ ext: 'refused', message });
    vscode.window.showErrorMessage(message);
    return undefined; // the launch is abandoned, nothing else is opened
  }

  async pickRun(folder) {
    const command = cli.tetherPath(this.settings().get('path'), folder);
    const records = JSON.parse(await cli.run(command, ['ls', '--json', '-n', '50'], { cwd: folder }));
    const open = records.filter((r) => ['queued', 'starting', 'running', 'paused'].includes(r.state));
    if (!open.length) throw new Error('no run of yours is queued, running or paused');
    const items = open.map((r) => ({ label: r.spec.name || r.id, description: r.state === 'paused' ? `paused at ${r.paused_at}` : r.state, detail: r.spec.command.join(' '), run: r.id }));
    const chosen = await vscode.window.showQuickPick(items, { placeHolder: 'The run to debug' });
    return chosen?.run;
  }

  // --- vscode.DebugAdapterDescriptorFactory ---------------------------------------------------

  createDebugAdapterDescriptor(session) {
    const config = session.configuration;
    const port = config.connect?.port ?? config.tetherPort;
    if (!port) throw new Error('tether: this session has no adapter to talk to (start it from a tether configuration)');
    return new vscode.DebugAdapterServer(port, config.connect?.host || '127.0.0.1');
  }

  // --- vscode.DebugAdapterTrackerFactory: the DAP traffic in the trace file -------------------

  createDebugAdapterTracker(session) {
    const name = session.name;
    return {
      onWillReceiveMessage: (message) => this.trace({ session: name, to: 'adapter', message }),
      onDidSendMessage: (message) => this.trace({ session: name, to: 'ide', message }),
    };
  }

  // --- the served processes ---------------------------------------------------------------------

  ended(session) {
    const token = session.configuration.tetherServe;
    if (session.parentSession || !token) return; // a child's session: the main one's adapter serves
    const child = this.served.get(token);
    this.trace({ ext: 'ended', session: session.name, run: session.configuration.tetherRun });
    // the IDE is gone: stop serving (Ctrl-C); the run goes on unless the session cancelled it
    if (child && child.exitCode === null) child.kill('SIGINT');
  }

  stopAll() {
    for (const child of this.served.values()) if (child.exitCode === null) child.kill('SIGINT');
  }
}

module.exports = { Debugging };
