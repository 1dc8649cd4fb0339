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
    let late = false;
    const timer = setTimeout(() => {
      late = true;
      child.kill('SIGTERM');
    }, timeoutMs);
    child.stdout.on('data', (d) => (out += d));
    child.stderr.on('data', (d) => (err += d));
    child.on('error', (e) => {
      clearTimeout(timer);
      reject(new Error(notFound(command, e)));
    });
    child.on('close', (code) => {
      clearTimeout(timer);
      if (late) reject(new Error(`tether ${argv[0]} did not answer within ${timeoutMs / 1000} s (is the relay reachable?)`));
      else if (code === 0) resolve(out);
      else reject(new Error(failure(err, code)));
    });
  });
}

/** JSON that `tether ... --json` printed, or an Error saying it was not. */
function parseJson(text) {
  try {
    return JSON.parse(text.slice(Math.max(0, text.search(/[[{]/))));
  } catch {
    throw new Error(`tether printed something that is not JSON: ${text.trim().slice(0, 200)}`);
  }
}

/**
 * Start `tether ARGV` that serves an adapter: {child, ready}; `ready` resolves {run, port, child}
 * once it prints its ready line, or rejects with what it said if it ends before (a bad option, a
 * refused submit). `log(line)` gets everything else it prints, as it comes.
 */
function serve(command, argv, { cwd, log }) {
  const child = spawn(command, argv, { cwd, stdio: ['ignore', 'pipe', 'pipe'] });
  const ready = new Promise((resolve, reject) => {
    let stderr = '';
    let served = false;
    lines(child.stdout, (line) => {
      const said = !served && readyLine(line);
      if (said) {
        served = true;
        resolve({ run: said.run, port: said.port, child });
      } else if (line) log(line);
    });
    lines(child.stderr, (line) => {
      stderr += `${line}\n`;
      if (line) log(line);
    });
    child.on('error', (e) => !served && reject(new Error(notFound(command, e))));
    child.on('close', (code, signal) => !served && reject(new Error(signal ? `tether stopped (${signal}) before serving the run` : failure(stderr, code))));
  });
  return { child, ready };
}

module.exports = { tetherPath, run, serve, lines, parseJson };
