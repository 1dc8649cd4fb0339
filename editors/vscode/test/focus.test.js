'use strict';
// node --test: the focus command's parsing and message, with no VS Code
const test = require('node:test');
const assert = require('node:assert');
const { parseRanks, describeAnswer } = require('../src/focus');

test('ranks are written as the CLI writes them', () => {
  assert.deepStrictEqual(parseRanks('0-3,7'), [0, 1, 2, 3, 7]);
  assert.deepStrictEqual(parseRanks(' 7 , 3 '), [3, 7]);
  assert.deepStrictEqual(parseRanks('5,5-6'), [5, 6]);
});

test('empty or "all" is every rank (no focus)', () => {
  assert.strictEqual(parseRanks(''), null);
  assert.strictEqual(parseRanks('  '), null);
  assert.strictEqual(parseRanks('all'), null);
});

test('anything else is one clear line', () => {
  assert.throws(() => parseRanks('a'), /give ranks like 3, 0-3 or 0-3,7/);
  assert.throws(() => parseRanks('3-1'), /a range goes up/);
  assert.throws(() => parseRanks('0-99999'), /4096 at most/);
  assert.throws(() => parseRanks('1,,2'), /give ranks like/);
});

test('the answer says the focus and the sessions opened', () => {
  assert.strictEqual(describeAnswer({ ranks: [7], offered: ['rank 7 (pid 12)'] }), 'tether: focus on ranks 7; opened rank 7 (pid 12)');
  assert.strictEqual(describeAnswer({ ranks: null, offered: [] }), 'tether: focus on every rank');
});
