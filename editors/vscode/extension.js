'use strict';
// tether for VS Code: the `tether` debug type (launch submits a run and debugs it when it starts;
// attach debugs an existing run), the "tether runs" view and the "Ranks" view. Everything goes through the
// `tether` command line, so the config file, profiles and tokens are the CLI's own.
const fs = require('fs');
const vscode = require('vscode');
const { Debugging } = require('./src/debug');
const { RunsView } = require('./src/runs_view');
const focus = require('./src/focus');
const { RanksView } = require('./src/ranks_view');

function activate(context) {
  const settings = () => vscode.workspace.getConfiguration('tether');
  const output = vscode.window.createOutputChannel('tether');
  const trace = (event) => {
    const file = settings().get('traceFile');
    if (file) fs.appendFileSync(file, `${JSON.stringify({ t: Date.now() / 1000, ...event })}\n`);
  };
  const folder = () => (vscode.workspace.workspaceFolders || [])[0]?.uri.fsPath;
  context.subscriptions.push(output);
  const runs = new RunsView(context, { trace, settings, folder });
  new RanksView(context, { trace, settings, folder });
  new Debugging(context, { output, trace, settings, showLogs: (run) => runs.showLogs(run) });
  focus.register(context, vscode);
  trace({ ext: 'activated' });
}

function deactivate() {}

module.exports = { activate, deactivate };
