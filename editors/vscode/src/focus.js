'use strict';
// "tether: Focus on ranks...": the ranks the tether debug sessions control and show, chosen during
// the session. The command sends the adapter's custom request `tetherFocus` {ranks: [..] | null}
// to the active tether debug session (any session of the run: the main one or a rank's); the
// adapter offers a session for each focused rank at once, and only those ranks get breakpoints.
// The syntax is the CLI's (`tether attach RUN --ranks 0-3,7`); an empty answer is every rank.

const MAX_RANKS = 4096;

// '0-3,7' -> [0, 1, 2, 3, 7]; '' or 'all' -> null (no focus); throws Error with one line
function parseRanks(text) {
  const trimmed = (text || '').trim();
  if (trimmed === '' || trimmed === 'all') return null;
  const ranks = new Set();
  for (const part of trimmed.split(',')) {
    const m = /^\s*(\d+)\s*(?:-\s*(\d+)\s*)?$/.exec(part);
    if (!m) throw new Error(`${JSON.stringify(part.trim())}: give ranks like 3, 0-3 or 0-3,7`);
    const low = Number(m[1]);
    const high = m[2] === undefined ? low : Number(m[2]);
    if (high < low || high - low >= MAX_RANKS) throw new Error(`${JSON.stringify(part.trim())}: a range goes up, ${MAX_RANKS} at most`);
    for (let r = low; r <= high; r++) ranks.add(r);
    if (ranks.size > MAX_RANKS) throw new Error(`at most ${MAX_RANKS} ranks`);
  }
  return [...ranks].sort((a, b) => a - b);
}

// what the user is told once the adapter answered
function describeAnswer(body) {
  const ranks = body && Array.isArray(body.ranks) ? body.ranks : null;
  const offered = body && Array.isArray(body.offered) ? body.offered : [];
  const focus = ranks === null ? 'every rank' : `ranks ${ranks.join(',')}`;
  return offered.length ? `tether: focus on ${focus}; opened ${offered.join(', ')}` : `tether: focus on ${focus}`;
}

function register(context, vscode) {
  context.subscriptions.push(vscode.commands.registerCommand('tether.focus', async () => {
    const session = vscode.debug.activeDebugSession;
    if (!session || session.type !== 'tether') {
      vscode.window.showErrorMessage('tether: no tether debug session is active; start or attach to a run first.');
      return;
    }
    const text = await vscode.window.showInputBox({
      title: 'tether: Focus on ranks',
      prompt: 'Ranks to control and show, e.g. 3 or 0-3,7 (empty: every rank)',
      validateInput: (value) => { try { parseRanks(value); return null; } catch (e) { return e.message; } },
    });
    if (text === undefined) return; // dismissed
    try {
      const body = await session.customRequest('tetherFocus', { ranks: parseRanks(text) });
      vscode.window.showInformationMessage(describeAnswer(body));
    } catch (e) {
      vscode.window.showErrorMessage(`tether: ${e.message || e}`);
    }
  }));
}

module.exports = { parseRanks, describeAnswer, register };
