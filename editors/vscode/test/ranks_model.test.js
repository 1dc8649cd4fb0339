'use strict';
const test = require('node:test');
const assert = require('node:assert');
const { groups, summary, sessionFor, chosenProcess, groupSession, allRanksExpression, refusedText } = require('../src/ranks_model');

const frame = (file, line, fn) => ({ file, line, function: fn, path: `/w/${file}` });
const proc = (pid, rank, over = {}) => ({ pid, name: rank === null ? `main process (pid ${pid})` : `rank ${rank} (pid ${pid})`, rank, state: 'running', why: '', where: '', threads: [], error: '', ...over });
// what `tether stacks --json` prints for a launcher and four ranks, rank 2 at a breakpoint and the
// others paused by the group
const REPORT = {
  run: 'abc123',
  processes: [
    proc(11, 0, { state: 'paused', why: 'pause' }),
    proc(12, 1, { state: 'paused', why: 'pause' }),
    proc(13, 2, { state: 'paused', why: 'breakpoint', where: 'ranks4_worker.py:51 in main' }),
    proc(14, 3, { state: 'paused', why: 'pause' }),
    proc(10, null),
    proc(15, null, { name: 'worker 1 of rank 0 (pid 15)', error: 'py-spy failed' }),
  ],
  classes: [
    { label: 'ranks 0-1,3', pids: [11, 12, 14], state: 'paused: pause', frames: [frame('ranks4_worker.py', 60, '<module>'), frame('ranks4_worker.py', 40, 'main')] },
    { label: 'rank 2', pids: [13], state: 'paused: breakpoint', frames: [frame('ranks4_worker.py', 60, '<module>'), frame('ranks4_worker.py', 51, 'main')] },
    { label: 'main process (pid 10)', pids: [10], state: 'running', frames: [frame('ranks_launcher.py', 20, 'main')] },
  ],
  tree: [],
  unreadable: [{ label: 'worker 1 of rank 0 (pid 15)', pids: [15], state: 'stack unreadable: py-spy failed', frames: [] }],
};

test('a group per class: its ranks, state and top frame; one child per process', () => {
  const tree = groups(REPORT);
  assert.deepStrictEqual(tree.map((g) => [g.label, g.description, g.icon]), [
    ['ranks 0-1,3 (paused: pause)', 'ranks4_worker.py:40 main', 'debug-pause'],
    ['rank 2 (paused: breakpoint)', 'ranks4_worker.py:51 main', 'debug-pause'],
    ['main process (pid 10) (running)', 'ranks_launcher.py:20 main', 'play-circle'],
    ['worker 1 of rank 0 (pid 15): stack unreadable: py-spy failed', '', 'warning'],
  ]);
  assert.deepStrictEqual(tree[0].ranks, [0, 1, 3]);
  assert.deepStrictEqual(tree[0].children.map((c) => [c.label, c.description, c.rank, c.paused]), [
    ['rank 0', 'pid 11 · paused: pause', 0, true],
    ['rank 1', 'pid 12 · paused: pause', 1, true],
    ['rank 3', 'pid 14 · paused: pause', 3, true],
  ]);
  assert.strictEqual(tree[1].children[0].tooltip, 'rank 2 (pid 13): paused: breakpoint at ranks4_worker.py:51 in main');
  assert.strictEqual(tree[1].tooltip, 'rank 2 (paused: breakpoint)\nranks4_worker.py:60 <module>\n  ranks4_worker.py:51 main');
  assert.deepStrictEqual(tree[2].children.map((c) => [c.label, c.rank]), [['main process', null]]);
  assert.strictEqual(tree[3].children[0].icon, 'warning');
  assert.strictEqual(new Set(tree.flatMap((g) => [g.id, ...g.children.map((c) => c.id)])).size, 10); // ids unique
  assert.strictEqual(summary(REPORT), '4 ranks and 2 other processes in 3 places, 4 paused');
  assert.strictEqual(summary({ processes: [proc(10, null)], classes: [{}] }), '1 process in 1 place');
  assert.deepStrictEqual(groups({}), []);
});

test('a process is shown by the session that names its pid; the main process by the root session', () => {
  const root = { id: 'r', name: 'tether: train', configuration: { tetherRun: 'abc123' } };
  const two = { id: 'c2', name: 'rank 2 (pid 13)', configuration: { subProcessId: 13 }, parentSession: root };
  const zero = { id: 'c0', name: 'rank 0 (pid 11)', configuration: {}, parentSession: root };
  const sessions = [root, two, zero];
  const tree = groups(REPORT);
  assert.strictEqual(sessionFor(sessions, tree[1].children[0]), two); // by subProcessId
  assert.strictEqual(sessionFor(sessions, tree[0].children[0]), zero); // by its name
  assert.strictEqual(sessionFor(sessions, tree[0].children[1]), undefined); // rank 1: none yet
  assert.strictEqual(sessionFor(sessions, tree[2].children[0]), root);
  assert.strictEqual(sessionFor(sessions, { pid: 113, label: 'rank 9' }), undefined); // not pid 13's
  // a group stands for its first process
  assert.strictEqual(chosenProcess(tree[0]).label, 'rank 0');
  assert.strictEqual(chosenProcess(tree[0].children[2]).label, 'rank 3');
  // the group's actions go to the focused session, else a paused rank's, else the root
  assert.strictEqual(groupSession(sessions, tree, two), two);
  assert.strictEqual(groupSession(sessions, tree, { id: 'elsewhere' }), zero);
  assert.strictEqual(groupSession(sessions, tree, root), zero); // the launcher runs: not it
  assert.strictEqual(groupSession([root], tree, undefined), root);
});

test('"Evaluate on all ranks" sends the @all prefix; a refused request says what it means', () => {
  assert.strictEqual(allRanksExpression('  loss.item() '), '@all loss.item()');
  assert.strictEqual(allRanksExpression('   '), '');
  assert.match(refusedText('tetherFocus', new Error('Unknown request: tetherFocus')), /does not answer "tetherFocus" yet/);
  assert.strictEqual(refusedText('evaluate', new Error('name x is not defined')), 'tether: evaluate: name x is not defined');
  const traceback = 'Traceback (most recent call last):\n  File "<string>", line 1\n    @all marker\n    ^^^^^^\nSyntaxError: invalid syntax\n';
  assert.strictEqual(refusedText('evaluate', new Error(traceback)), 'tether: evaluate: SyntaxError: invalid syntax');
});
