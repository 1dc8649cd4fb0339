'use strict';
// The "Ranks" view (in Run and Debug, while a tether session is active): every process of the
// debugged run grouped by where it is, from `tether stacks RUN --json` (ranks_model.js decides
// the tree). Asked again when a session of the run stops or continues (debounced) and by its
// refresh button. Choosing a process (or a group: its first) shows its session's place; a rank
// with no session yet is asked of the adapter (`tetherFocus`). "Continue all ranks" continues
// one rank's session (the worker moves the whole group); "Evaluate on all ranks..." sends
// `@all EXPR` to the focused rank's debug console.
const vscode = require('vscode');
const cli = require('./cli');
const { relayOptions } = require('./launch');
const model = require('./ranks_model');

// stops and continues of several ranks come together: one `tether stacks` for them
const DEBOUNCE_MS = 400;

function rootOf(session) {
  while (session.parentSession) session = session.parentSession;
  return session;
}

/** The top frame of the session's stopped thread ({top}), or why there is none ({error}: a
 * running process has no frame to show). */
async function topFrameOf(session) {
  let error;
  try {
    const { threads } = await session.customRequest('threads');
    for (const thread of threads || []) {
      try {
        const got = await session.customRequest('stackTrace', { threadId: thread.id, startFrame: 0, levels: 1 });
        const top = got?.stackFrames?.[0];
        if (top) return { top };
      } catch (err) {
        error = err.message; // a thread that is not stopped
      }
    }
  } catch (err) {
    error = err.message;
  }
  return { error: error || 'no stopped thread' };
}

class RanksView {
  constructor(context, { trace, settings, folder }) {
    this.trace = trace;
    this.settings = settings;
    this.folder = folder;
    this.tree = [];
    this.sessions = new Map(); // id -> a tether session (of any run)
    this.changed = new vscode.EventEmitter();
    this.onDidChangeTreeData = this.changed.event;
    this.output = vscode.window.createOutputChannel('tether ranks');
    this.view = vscode.window.createTreeView('tetherRanks', { treeDataProvider: this, showCollapseAll: true });
    const command = (name, fn) => vscode.commands.registerCommand(name, fn);
    context.subscriptions.push(
      this.view,
      this.output,
      command('tether.ranks.refresh', () => this.refresh()),
      command('tether.ranks.focus', (item) => this.focus(item)),
      command('tether.ranks.continueAll', () => this.continueAll()),
      command('tether.ranks.evaluateAll', () => this.evaluateAll()),
      vscode.debug.registerDebugAdapterTrackerFactory('tether', this),
      vscode.debug.onDidStartDebugSession((s) => this.started(s)),
      vscode.debug.onDidTerminateDebugSession((s) => this.ended(s)),
      this.view.onDidChangeVisibility(() => this.view.visible && this.stale && this.soon()),
      { dispose: () => clearTimeout(this.timer) },
    );
  }

  // --- which run: the one of the active tether session (else of any) ------------------------------

  run() {
    const active = vscode.debug.activeDebugSession;
    const chosen = active && this.sessions.has(active.id) ? active : [...this.sessions.values()][0];
    return chosen && rootOf(chosen).configuration;
  }

  runSessions() {
    const config = this.run();
    return [...this.sessions.values()].filter((s) => rootOf(s).configuration === config);
  }

  started(session) {
    if (session.type !== 'tether') return;
    this.sessions.set(session.id, session);
    vscode.commands.executeCommand('setContext', 'tether.debugging', true);
    this.soon();
  }

  ended(session) {
    if (!this.sessions.delete(session.id)) return;
    if (!this.sessions.size) {
      vscode.commands.executeCommand('setContext', 'tether.debugging', false);
      this.show([], '');
      return;
    }
    this.soon();
  }

  // a stop or a continue in any of the run's sessions: the view is asked again, soon
  createDebugAdapterTracker() {
    return {
      onDidSendMessage: (m) => {
        if (m.type === 'event' && (m.event === 'stopped' || m.event === 'continued')) this.soon();
      },
    };
  }

  /** Ask again shortly; while the view is hidden, once it is shown (each ask samples every
   * process of the run on the worker). */
  soon() {
    clearTimeout(this.timer);
    if (!this.view.visible) {
      this.stale = true;
      return;
    }
    this.timer = setTimeout(() => this.refresh(), DEBOUNCE_MS);
  }

  // --- asking: one `tether stacks` at a time, once more if asked meanwhile ------------------------

  async refresh() {
    clearTimeout(this.timer);
    if (this.busy) {
      this.again = true;
      return this.busy;
    }
    this.busy = this.ask().finally(() => {
      this.busy = undefined;
      if (this.again) {
        this.again = false;
        this.soon();
      }
    });
    return this.busy;
  }

  async ask() {
    this.stale = false;
    const config = this.run();
    if (!config?.tetherRun) return this.show([], '');
    const argv = ['stacks', config.tetherRun, '--json', ...relayOptions(config)];
    try {
      const report = cli.parseJson(await cli.run(this.command(), argv, { cwd: this.folder(), timeoutMs: 45000 }));
      this.report = report;
      this.show(model.groups(report), model.summary(report));
    } catch (err) {
      this.show(this.tree, `tether stacks: ${err.message}`);
    }
  }

  command() {
    return cli.tetherPath(this.settings().get('path'), this.folder());
  }

  show(tree, message) {
    this.tree = tree;
    this.view.message = message || undefined;
    this.trace({ ext: 'ranks', run: this.run()?.tetherRun, groups: tree.map((g) => ({ label: g.label, where: g.description, ranks: g.ranks, processes: g.children.length })), message: message || undefined });
    this.changed.fire();
  }

  // --- vscode.TreeDataProvider --------------------------------------------------------------------

  getChildren(element) {
    return element ? element.children || [] : this.tree;
  }

  getTreeItem(element) {
    // groups closed: 64 ranks in a handful of places stay a handful of rows
    const open = element.children ? vscode.TreeItemCollapsibleState.Collapsed : vscode.TreeItemCollapsibleState.None;
    const item = new vscode.TreeItem(element.label, open);
    item.id = element.id;
    item.description = element.description;
    item.tooltip = element.tooltip;
    item.iconPath = new vscode.ThemeIcon(element.icon);
    item.contextValue = element.children ? 'tetherRankGroup' : 'tetherRank';
    item.command = { command: 'tether.ranks.focus', title: 'Focus', arguments: [element] };
    return item;
  }

  // --- the actions --------------------------------------------------------------------------------

  /** The process's session, shown: its top frame in the editor and the Call Stack view (VS Code
   * lets no extension select a session: vscode#336976); a rank with none is asked for. */
  async focus(item) {
    const process = model.chosenProcess(item);
    const sessions = this.runSessions();
    const session = model.sessionFor(sessions, process);
    if (!session) return this.askFor(process, sessions);
    const { top, error } = await topFrameOf(session);
    const at = top?.source?.path ? `${top.source.path}:${top.line}` : undefined;
    this.trace({ ext: 'ranks focus', process: process.label, session: session.name, at, error });
    vscode.window.setStatusBarMessage(`tether: ${process.label} is the session "${session.name}" in the Call Stack`, 8000);
    try {
      if (at) {
        const where = new vscode.Range(Math.max(0, top.line - 1), 0, Math.max(0, top.line - 1), 0);
        await vscode.window.showTextDocument(vscode.Uri.file(top.source.path), { selection: where, preview: true });
      }
      await vscode.commands.executeCommand('workbench.debug.action.focusCallStackView');
    } catch (err) {
      this.trace({ ext: 'ranks focus failed', process: process.label, error: err.message });
    }
  }

  async askFor(process, sessions) {
    const root = sessions.find((s) => !s.parentSession);
    if (process.rank === null || process.rank === undefined || !root) {
      vscode.window.showInformationMessage(`tether: ${process.label} has no debug session in this window`);
      return;
    }
    try {
      await root.customRequest('tetherFocus', { ranks: [process.rank], add: true });
      this.trace({ ext: 'ranks focus asked', rank: process.rank });
    } catch (err) {
      const text = model.refusedText('tetherFocus', err);
      this.trace({ ext: 'ranks focus refused', rank: process.rank, text });
      vscode.window.showWarningMessage(text);
    }
  }

  /** A continue to one rank's session (VS Code's own Continue, so its views follow): the worker
   * continues every rank of the group with it, each session told. */
  async continueAll() {
    const session = model.groupSession(this.runSessions(), this.tree, vscode.debug.activeDebugSession);
    if (!session) return vscode.window.showInformationMessage('tether: no tether session to continue');
    this.trace({ ext: 'ranks continue', session: session.name });
    await vscode.commands.executeCommand('workbench.action.debug.continue', undefined, { sessionId: session.id });
    this.soon();
  }

  async evaluateAll() {
    const session = model.groupSession(this.runSessions(), this.tree, vscode.debug.activeDebugSession);
    if (!session) return vscode.window.showInformationMessage('tether: no tether session to evaluate in');
    const typed = await vscode.window.showInputBox({ prompt: 'Evaluate on every paused rank', placeHolder: 'loss.item()' });
    const expression = model.allRanksExpression(typed);
    if (!expression) return;
    let text;
    try {
      const frameId = (await topFrameOf(session)).top?.id;
      const answer = await session.customRequest('evaluate', { expression, context: 'repl', ...(frameId !== undefined ? { frameId } : {}) });
      text = String(answer?.result ?? '');
    } catch (err) {
      text = model.refusedText('evaluate', err);
    }
    this.output.appendLine(`> ${expression}   (in ${session.name})`);
    this.output.appendLine(text);
    this.output.show(true);
    this.trace({ ext: 'ranks eval', session: session.name, expression, result: text });
  }
}

module.exports = { RanksView };
