'use strict';
// The `tether` command line, as the extension runs it: one-shot commands (JSON out) and the
// long-lived ones that serve a run's DAP adapter on 127.0.0.1 (`debug`, `attach`, `rerun`).
const { spawn } = require('child_process');
const fs = require('fs');
const path = require('path');
const { readyLine, failure } = require('./launch');

/** The `tether` executable: the setting, else the workspace's .venv, else PATH. */
function tetherPath(setting, folder) {
  if (setting) return setting;
  if (folder) {
    const local = path.join(folder, '.venv', 'bin', 'tether');
    if (fs.existsSync(local)) return local;
  }
  return 'tether';
}

function lines(stream, each) {
  let rest = '';
  stream.setEncoding('utf8');
  stream.on('data', (chunk) => {
    const parts = (rest + chunk).split('\n');
    rest = parts.pop();
    parts.forEach(each);
  });
  stream.on('end', () => rest && each(rest));
}

function notFound(command, err) {
  return err.code === 'ENOENT'
    ? `the tether command was not found (${command}): install tether (pip install tether) or set "tether.path"`
    : `could not run ${command}: ${err.message}`;
}

/** Run `tether ARGV` to its end: its stdout, or an Error with what it said. */
function run(command, argv, { cwd, timeoutMs = 60000 } = {}) {
  return new Promise((resolve, reject) => {
    const child = spawn(command, argv, { cwd, stdio: ['ignore', 'pipe', 'pipe'] });
    let out = '';
    let err = '';
    const timer = setTimeout(() => child.kill('SIGTERM'), timeoutMs);
    child.stdout.on('data', (d) => (out += d));
    child.stderr.on('data', (d) => (err += d));
    child.on('error', (e) => {
      clearTimeout(timer);
      reject(new Error(notFound(command, e)));
    });
    child.on('close', (code) => {
      clearTimeout(timer);
      if (code === 0) resolve(out);
      else reject(new Error(failure(err, code)));
    });
  });
}

/**
 * Start `tether ARGV` that serves an adapter; resolves {run, port, child} once it prints its
 * ready line, rejects with what it said if it ends before (a bad option, a refused submit).
 * `log(line)` gets everything else it prints, as it comes.
 */
function serve(command, argv, { cwd, log }) {
  return new Promise((resolve, reject) => {
    const child = spawn(command, argv, { cwd, stdio: ['ignore', 'pipe', 'pipe'] });
    let stderr = '';
    let ready = false;
    lines(child.stdout, (line) => {
      const said = !ready && readyLine(line);
      if (said) {
        ready = true;
        resolve({ run: said.run, port: said.port, child });
      } else if (line) log(line);
    });
    lines(child.stderr, (line) => {
      stderr += `${line}\n`;
      if (line) log(line);
    });
    child.on('error', (e) => !ready && reject(new Error(notFound(command, e))));
    child.on('close', (code) => !ready && reject(new Error(failure(stderr, code))));
  });
}

module.exports = { tetherPath, run, serve, lines };
