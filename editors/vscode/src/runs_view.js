'use strict';
// The "tether runs" view (in Run and Debug): the user's runs from `tether ls --json`, asked
// again every `tether.refreshSeconds`; attach, cancel, rerun and logs on each; and a
// notification when a run pauses with no IDE attached.
const vscode = require('vscode');
const cli = require('./cli');
const { readyLine } = require('./launch');
const { row, newlyPaused, stateText, withOutputs, downloadArgv } = require('./runs_model');

class RunsView {
  constructor(context, { trace, settings, folder }) {
    this.trace = trace;
    this.settings = settings;
    this.folder = folder;
    this.records = [];
    this.error = '';
    this.seenPaused = new Set();
    this.logs = new Map(); // run id -> {channel, child}
    this.changed = new vscode.EventEmitter();
    this.onDidChangeTreeData = this.changed.event;
    this.view = vscode.window.createTreeView('tetherRuns', { treeDataProvider: this, showCollapseAll: false });
    const command = (name, fn) => vscode.commands.registerCommand(name, fn);
    context.subscriptions.push(
      this.view,
      command('tether.runs.refresh', () => this.refresh()),
      command('tether.runs.attach', (item) => this.attach(item.run)),
      command('tether.runs.cancel', (item) => this.cancel(item.run)),
      command('tether.runs.rerun', (item) => this.rerun(item.run)),
      command('tether.runs.logs', (item) => this.showLogs(item.run)),
      command('tether.runs.outputs', (item) => this.downloadOutputs(item?.run)),
      this.view.onDidChangeVisibility(() => this.view.visible && this.refresh()),
      vscode.debug.onDidStartDebugSession(() => this.refresh()),
      vscode.debug.onDidTerminateDebugSession(() => this.refresh()),
      { dispose: () => this.stop() },
    );
    this.refresh();
  }

  command() {
    return cli.tetherPath(this.settings().get('path'), this.folder());
  }

  schedule(ms) {
    clearTimeout(this.timer);
    this.timer = setTimeout(() => this.refresh(), ms);
  }

  /** Every `tether.refreshSeconds` while the view is shown; three times slower (15 s at least)
   * when it is not, still soon enough to tell of a run that paused with no IDE. One `tether ls`
   * at a time. */
  interval() {
    const seconds = Math.max(1, this.settings().get('refreshSeconds') || 5);
    return 1000 * (this.view.visible ? seconds : Math.max(15, 3 * seconds));
  }

  async refresh() {
    clearTimeout(this.timer);
    if (this.busy) return this.busy;
    this.busy = this.ask().finally(() => {
      this.busy = undefined;
      this.schedule(this.interval());
    });
    return this.busy;
  }

  async ask() {
    try {
      const out = await cli.run(this.command(), ['ls', '--json', '-n', '50'], { cwd: this.folder() });
      this.records = cli.parseJson(out);
      this.error = '';
    } catch (err) {
      this.error = err.message;
    }
    const rows = this.records.map(row);
    const shown = JSON.stringify([rows, this.error]);
    if (shown !== this.shown) {
      this.shown = shown;
      this.view.message = this.error ? `tether ls: ${this.error}` : this.records.length ? undefined : 'No runs yet: start a tether configuration (F5) to submit one.';
      this.trace({ ext: 'runs', rows, error: this.error || undefined });
      this.changed.fire();
    }
    this.tellPaused();
  }

  tellPaused() {
    const paused = newlyPaused(this.records, this.seenPaused);
    if (!this.settings().get('notifyPaused')) return;
    for (const record of paused) {
      const name = record.spec.name || record.id;
      const text = `tether: run ${name} is ${stateText(record)}, with no IDE attached.`;
      this.trace({ ext: 'notified', run: record.id, text });
      vscode.window.showWarningMessage(text, 'Attach', 'Show logs').then((choice) => {
        if (choice === 'Attach') this.attach(record.id);
        if (choice === 'Show logs') this.showLogs(record.id);
      });
    }
  }

  // --- vscode.TreeDataProvider ------------------------------------------------------------------

  getChildren(element) {
    return element ? [] : this.records.map((record) => ({ run: record.id, record }));
  }

  getTreeItem(element) {
    const shown = row(element.record);
    const item = new vscode.TreeItem(shown.label, vscode.TreeItemCollapsibleState.None);
    item.id = shown.id;
    item.description = shown.description;
    item.tooltip = shown.tooltip;
    item.contextValue = shown.contextValue;
    item.iconPath = new vscode.ThemeIcon(shown.icon);
    return item;
  }

  // --- the actions --------------------------------------------------------------------------------

  attach(run) {
    const folder = (vscode.workspace.workspaceFolders || [])[0];
    this.trace({ ext: 'attach', run });
    return vscode.debug.startDebugging(folder, { type: 'tether', request: 'attach', name: `tether: run ${run}`, run });
  }

  async cancel(run) {
    const sure = await vscode.window.showWarningMessage(`Cancel run ${run}? Its program is stopped.`, { modal: true }, 'Cancel run');
    if (sure !== 'Cancel run') return;
    try {
      await cli.run(this.command(), ['cancel', run], { cwd: this.folder() });
    } catch (err) {
      vscode.window.showErrorMessage(`tether: ${err.message}`);
    }
    this.refresh();
  }

  rerun(run) {
    const record = this.records.find((r) => r.id === run);
    const folder = (vscode.workspace.workspaceFolders || [])[0];
    this.trace({ ext: 'rerun asked', run, known: Boolean(record), debug: record?.spec.debug });
    if (record && !record.spec.debug) {
      // a plain run is rerun plain: nothing to debug until someone attaches
      return cli.run(this.command(), ['rerun', run, '--json'], { cwd: this.folder() }).then(
        (out) => {
          const again = out.split('\n').map(readyLine).find(Boolean);
          this.trace({ ext: 'rerun', run, as: again?.run });
          vscode.window.showInformationMessage(`tether: run ${run} rerun as ${again?.run}`);
        },
        (err) => {
          this.trace({ ext: 'rerun failed', run, error: err.message });
          vscode.window.showErrorMessage(`tether: ${err.message}`);
        },
      ).finally(() => this.refresh());
    }
    return vscode.debug.startDebugging(folder, { type: 'tether', request: 'launch', name: `tether: rerun of ${run}`, rerunOf: run });
  }

  /** "tether: Download outputs": the run (the item's, else picked from those naming outputs),
   * then a folder; `tether cp RUN: FOLDER` writes them there. */
  async downloadOutputs(run) {
    if (!run) {
      if (!this.records.length) await this.refresh();
      const picks = withOutputs(this.records);
      if (!picks.length) {
        vscode.window.showInformationMessage('tether: none of your runs names outputs (--outputs GLOB, or "outputs" in the launch configuration).');
        return;
      }
      run = (await vscode.window.showQuickPick(picks, { placeHolder: 'The run whose outputs to download' }))?.run;
      if (!run) return;
    }
    const base = this.folder() ? vscode.Uri.file(this.folder()) : undefined;
    const chosen = await vscode.window.showOpenDialog({ canSelectFiles: false, canSelectFolders: true, canSelectMany: false, defaultUri: base, openLabel: 'Download here' });
    if (!chosen || !chosen.length) return;
    const folder = chosen[0].fsPath;
    this.trace({ ext: 'outputs', run, folder });
    try {
      const out = await cli.run(this.command(), downloadArgv(run, folder), { cwd: this.folder(), timeoutMs: 3600000 });
      vscode.window.showInformationMessage(`tether: ${out.trim().replace(/^-- tether: /, '') || `outputs of ${run} downloaded to ${folder}`}`);
    } catch (err) {
      vscode.window.showErrorMessage(`tether: ${err.message}`);
    }
  }

  showLogs(run) {
    let shown = this.logs.get(run);
    if (!shown || shown.failed || shown.child.exitCode !== null) {
      const channel = shown?.channel || vscode.window.createOutputChannel(`tether: ${run}`);
      channel.clear();
      const child = require('child_process').spawn(this.command(), ['logs', run, '-f'], { cwd: this.folder(), stdio: ['ignore', 'pipe', 'pipe'] });
      shown = { channel, child, failed: false };
      child.on('error', (err) => {
        shown.failed = true;
        channel.appendLine(`tether: ${err.message}`);
      });
      cli.lines(child.stdout, (line) => channel.appendLine(line));
      cli.lines(child.stderr, (line) => channel.appendLine(line));
      this.logs.set(run, shown);
    }
    shown.channel.show(true);
  }

  stop() {
    clearTimeout(this.timer);
    for (const { child, channel } of this.logs.values()) {
      if (child.exitCode === null) child.kill();
      channel.dispose();
    }
  }
}

module.exports = { RunsView };
