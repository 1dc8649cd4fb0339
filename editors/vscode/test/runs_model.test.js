'use strict';
const test = require('node:test');
const assert = require('node:assert');
const { row, newlyPaused } = require('../src/runs_model');

const record = (over) => ({ id: 'a1b2c3d4e5f6', state: 'running', attempt: 1, paused_at: '', ides: [], detail: '', exit_code: null, spec: { command: ['python', 'train.py'], name: '', backend: 'local', debug: true }, ...over });

test('a row says the state, where it is paused, and what can be done', () => {
  const paused = row(record({ state: 'paused', paused_at: 'train.py:18 in step' }));
  assert.strictEqual(paused.description, 'paused at train.py:18 in step');
  assert.strictEqual(paused.contextValue, 'tetherRun.active.attachable');
  assert.strictEqual(paused.icon, 'debug-pause');
  const queued = row(record({ state: 'queued', detail: 'slurm job 42 submitted', spec: { command: ['python'], name: 'exp', backend: 'slurm', debug: true } }));
  assert.strictEqual(queued.label, 'exp (a1b2c3d4)');
  assert.strictEqual(queued.description, 'queued: slurm job 42 submitted');
  assert.match(queued.tooltip, /on slurm/);
  const done = row(record({ state: 'succeeded', exit_code: 0, ides: [] }));
  assert.strictEqual(done.contextValue, 'tetherRun.ended');
  assert.strictEqual(done.description, 'succeeded (exit code 0)');
  assert.match(row(record({ ides: ['x'] })).description, /IDE attached/);
});

test('each pause with no IDE attached is told once, those found paused at startup too', () => {
  const seen = new Set();
  const old = record({ id: 'old', state: 'paused', paused_at: 'a.py:1' });
  assert.deepStrictEqual(newlyPaused([old], seen).map((r) => r.id), ['old']);
  const fresh = record({ id: 'new', state: 'paused', paused_at: 'uncaught ValueError at b.py:2 in f' });
  const watched = record({ id: 'w', state: 'paused', paused_at: 'c.py:3', ides: ['ide'] });
  assert.deepStrictEqual(newlyPaused([old, fresh, watched], seen).map((r) => r.id), ['new']);
  assert.deepStrictEqual(newlyPaused([old, fresh], seen), []);
  const again = record({ id: 'new', state: 'paused', paused_at: 'b.py:9' });
  assert.deepStrictEqual(newlyPaused([again], seen).map((r) => r.id), ['new']);
  assert.strictEqual(row(fresh).description, 'paused: uncaught ValueError at b.py:2 in f');
});

test('"Download outputs" offers the runs that name outputs and copies all of them', () => {
  const { withOutputs, downloadArgv } = require('../src/runs_model');
  const named = record({ id: 'b2', spec: { command: ['python'], name: 'train', backend: 'local', debug: false, outputs: ['out/', '*.csv'] } });
  const picks = withOutputs([record({ id: 'a1' }), named]);
  assert.deepStrictEqual(picks.map((p) => p.run), ['b2']);
  assert.strictEqual(picks[0].label, 'train');
  assert.strictEqual(picks[0].detail, 'out/  *.csv');
  assert.deepStrictEqual(downloadArgv('b2', '/tmp/dl'), ['cp', 'b2:', '/tmp/dl']);
});
