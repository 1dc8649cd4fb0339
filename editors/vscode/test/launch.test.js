'use strict';
// node --test: the configuration's meaning, with no VS Code
const test = require('node:test');
const assert = require('node:assert');
const { resolve, serveArgv, runArgv, readyLine, failure, ConfigError } = require('../src/launch');

const where = { folder: '/home/me/proj', file: '/home/me/proj/train.py' };

test('the workdir defaults to the folder, a relative one is under it', () => {
  const c = resolve({ request: 'launch', name: 'n', program: '/home/me/proj/sub/t.py', workdir: 'sub' }, where);
  assert.deepStrictEqual([c.workdir, c.program], ['/home/me/proj/sub', 't.py']);
  assert.strictEqual(resolve({ request: 'launch', name: 'n', program: '..data.py' }, where).program, '..data.py');
  assert.throws(() => resolve({ request: 'launch', name: 'n', program: 'a.py', workdir: 'rel' }, {}), /absolute path here/);
});

test('Run Without Debugging submits the same run with `tether run`', () => {
  const c = resolve({ request: 'launch', name: 'n', program: 'train.py', gpus: 2, processes: 'all', ranks: '0', args: ['--x'] }, where);
  assert.deepStrictEqual(runArgv(c), ['run', '--workdir', '/home/me/proj', '--gpus', '2', '--', 'python', 'train.py', '--x']);
});

test('a launch becomes `tether debug` serving on any free port, the program relative to the workdir', () => {
  const c = resolve({ type: 'tether', request: 'launch', name: 'n', program: '/home/me/proj/src/train.py', args: ['--lr', '3e-4'], gpus: 1, backend: 'slurm', mem: '32G', tags: ['a', 'b'], env: { SEED: '1' }, runName: 'exp', tetherArgs: ['--max-retries', '2'] }, where);
  assert.deepStrictEqual(serveArgv(c), [
    'debug', '--workdir', '/home/me/proj', '--backend', 'slurm', '--gpus', '1', '--mem', '32G', '--name', 'exp',
    '--tag', 'a', '--tag', 'b', '--env', 'SEED=1', '--max-retries', '2', '--port', '0', '--json', '-q',
    '--', 'python', 'src/train.py', '--lr', '3e-4',
  ]);
});

test('"stop" becomes --stop, for the debug run and the run without debugging', () => {
  const c = resolve({ request: 'launch', name: 'n', program: 'train.py', stop: 'one' }, where);
  assert.deepStrictEqual(serveArgv(c).slice(0, 5), ['debug', '--workdir', '/home/me/proj', '--stop', 'one']);
  assert.deepStrictEqual(runArgv(c).slice(0, 5), ['run', '--workdir', '/home/me/proj', '--stop', 'one']);
});

test('"nodes" and the per-node resources become --nodes, --gpus-per-node, --cpus-per-node', () => {
  const c = resolve({ request: 'launch', name: 'n', program: 'train.py', nodes: 2, gpusPerNode: 4, cpusPerNode: 8 }, where);
  assert.deepStrictEqual(serveArgv(c).slice(0, 9), ['debug', '--workdir', '/home/me/proj', '--nodes', '2', '--gpus-per-node', '4', '--cpus-per-node', '8']);
  assert.throws(() => resolve({ request: 'launch', name: 'n', program: 'a.py', nodes: 2, gpus: 1 }, where), /"gpus" with "nodes" 2 is ambiguous: give "gpusPerNode"/);
  assert.throws(() => resolve({ request: 'launch', name: 'n', program: 'a.py', nodes: 1.5 }, where), /"nodes" must be a whole number/);
});

test('"keepCheckpoints" and "fromCheckpoint" become --keep-checkpoints, --from-checkpoint', () => {
  const c = resolve({ request: 'launch', name: 'n', program: 'train.py', keepCheckpoints: 5, fromCheckpoint: 'r1:300' }, where);
  assert.deepStrictEqual(serveArgv(c).slice(0, 7), ['debug', '--workdir', '/home/me/proj', '--keep-checkpoints', '5', '--from-checkpoint', 'r1:300']);
  assert.throws(() => resolve({ request: 'launch', name: 'n', program: 'a.py', keepCheckpoints: 'all' }, where), /"keepCheckpoints" must be a whole number/);
});

test('"onUnattendedStop" and "unattendedFallback" become their options', () => {
  const c = resolve({ request: 'launch', name: 'n', program: 'a.py', onUnattendedStop: 'suspend', unattendedFallback: 'terminate' }, where);
  assert.deepStrictEqual(serveArgv(c).slice(0, 7), ['debug', '--workdir', '/home/me/proj', '--on-unattended-stop', 'suspend', '--unattended-fallback', 'terminate']);
  assert.throws(() => resolve({ request: 'launch', name: 'n', program: 'a.py', unattendedFallback: 'suspend' }, where), /"unattendedFallback" must be one of wait, continue, terminate/);
});

test('module, command, python, profile and relay', () => {
  const m = resolve({ request: 'launch', name: 'n', module: 'pkg.train', python: '/opt/env/bin/python', profile: 'gpu' }, where);
  assert.deepStrictEqual(serveArgv(m).slice(0, 5), ['debug', '--workdir', '/home/me/proj', '--profile', 'gpu']);
  assert.deepStrictEqual(serveArgv(m).slice(-3), ['/opt/env/bin/python', '-m', 'pkg.train']);
  const t = resolve({ request: 'launch', name: 'n', command: ['torchrun', '--nproc-per-node', '2', 'train.py'], args: ['--x'] }, where);
  assert.deepStrictEqual(serveArgv(t).slice(-6), ['--', 'torchrun', '--nproc-per-node', '2', 'train.py', '--x']);
});

test("the workspace's interpreter runs the program unless the configuration names one", () => {
  const venv = { ...where, python: '/home/me/proj/.venv/bin/python' };
  const p = resolve({ request: 'launch', name: 'n', program: 'train.py' }, venv);
  assert.deepStrictEqual(serveArgv(p).slice(-3), ['--', '/home/me/proj/.venv/bin/python', 'train.py']);
  const named = resolve({ request: 'launch', name: 'n', program: 'train.py', python: 'python3' }, venv);
  assert.deepStrictEqual(serveArgv(named).slice(-2), ['python3', 'train.py']);
  const command = resolve({ request: 'launch', name: 'n', command: ['torchrun', 'x.py'] }, venv);
  assert.deepStrictEqual(serveArgv(command).slice(-2), ['torchrun', 'x.py']);
});

test('attach and rerun serve the adapter of an existing run', () => {
  assert.deepStrictEqual(serveArgv(resolve({ request: 'attach', name: 'n', run: 'abcd1234', relay: 'ws://r' }, where)),
    ['attach', 'abcd1234', '--relay', 'ws://r', '--port', '0', '--json', '-q']);
  assert.deepStrictEqual(serveArgv(resolve({ request: 'launch', name: 'n', rerunOf: 'abcd1234' }, where)),
    ['rerun', 'abcd1234', '--port', '0', '--json', '-q']);
});

test('an attach whose "run" is left out or empty picks from a list (docs/editors.md\'s and the snippet\'s "run": "")', () => {
  for (const run of [undefined, '', '  ']) {
    const c = resolve({ type: 'tether', request: 'attach', name: 'n', run }, where);
    assert.strictEqual(c.run, undefined, JSON.stringify(run));
  }
  assert.strictEqual(resolve({ request: 'attach', name: 'n', run: ' lr-sweep ' }, where).run, 'lr-sweep');
});

test('bad configurations are refused with one clear message each', () => {
  const bad = [
    [{ request: 'launch', name: 'n' }, /one of "program", "module" or "command"/],
    [{ request: 'launch', name: 'n', program: 'a.py', module: 'b' }, /one of/],
    [{ request: 'launch', name: 'n', program: '/etc/passwd' }, /must be inside the workdir/],
    [{ request: 'launch', name: 'n', program: '../x.py' }, /must be inside the workdir/],
    [{ request: 'launch', name: 'n', program: 'a.py', gpus: 1.5 }, /"gpus" must be a whole number/],
    [{ request: 'launch', name: 'n', program: 'a.py', gpus: '2' }, /"gpus" must be a whole number/],
    [{ request: 'launch', name: 'n', program: 'a.py', backend: 'k8s' }, /"backend" must be one of local, slurm, ray/],
    [{ request: 'launch', name: 'n', program: 'a.py', args: '--lr 1' }, /"args" must be a list of strings/],
    [{ request: 'launch', name: 'n', program: 'a.py', env: { A: 1 } }, /"env" must map names to strings/],
    [{ request: 'launch', name: 'n', program: 'a.py', processes: 'some' }, /"processes" must be one of/],
    [{ request: 'launch', name: 'n', program: 'a.py', stop: 'each' }, /"stop" must be one of all, one/],
    [{ request: 'attach', name: 'n', run: 7 }, /"run" must be/],
    [{ request: 'restart', name: 'n' }, /"request" must be/],
    [{}, /"request" must be/],
    [{ request: 'launch', name: 'n', program: 'a.py' }, /Open a folder/, { folder: undefined, file: undefined }],
  ];
  for (const [config, message, at] of bad) {
    assert.throws(() => resolve(config, at || where), (err) => err instanceof ConfigError && message.test(err.message), JSON.stringify(config));
  }
});

test('the ready line, and what a failed start says', () => {
  assert.deepStrictEqual(readyLine('{"run": "r1", "port": 4711}'), { run: 'r1', port: 4711 });
  assert.strictEqual(readyLine('[  0.10s] hashing 3 files'), undefined);
  assert.strictEqual(readyLine('{"other": 1}'), undefined);
  assert.strictEqual(readyLine('{broken'), undefined);
  assert.strictEqual(failure('[ 0.1s] hashing\ntether: --gpus: must be at least 0\n', 2), '--gpus: must be at least 0');
  assert.strictEqual(failure('', 3), 'tether exited with code 3 before serving the run.');
  const usage = 'usage: tether debug [-h]\n                    [--ranks LIST]\n                    ...\ntether debug: error: argument --mem: bad\n';
  assert.strictEqual(failure(usage, 2), 'argument --mem: bad');
});

test('"outputs" becomes one --outputs per glob, for the debug run and the run without debugging', () => {
  const c = resolve({ request: 'launch', name: 'n', program: 'train.py', outputs: ['out/', '*.csv'] }, where);
  assert.deepStrictEqual(serveArgv(c).slice(0, 7), ['debug', '--workdir', '/home/me/proj', '--outputs', 'out/', '--outputs', '*.csv']);
  assert.deepStrictEqual(runArgv(c).slice(0, 7), ['run', '--workdir', '/home/me/proj', '--outputs', 'out/', '--outputs', '*.csv']);
  assert.throws(() => resolve({ request: 'launch', name: 'n', program: 'a.py', outputs: 'out/' }, where), /"outputs" must be a list of strings/);
});
