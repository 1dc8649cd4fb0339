// A scripted, VS Code-shaped debug session against a DAP server on 127.0.0.1, driven by Microsoft's
// DebugClient (@vscode/debugadapter-testsupport 1.68.0, pinned in package.json).
//
//   node vscode_scenario.mjs scenario.json
//
// The scenario format and every step are documented in SCENARIO.md beside this file. In short:
// connect, run VS Code's attach handshake (initialize -> attach without awaiting it -> `initialized`
// -> all setBreakpoints + setFunctionBreakpoints + setExceptionBreakpoints at once -> configurationDone
// -> threads -> the attach response), then run `steps` in order. Every message received from the
// adapter is appended to `record` (JSONL, raw DAP messages); `transcript` (optional) also gets what was
// sent. The result object is printed as the LAST line of stdout (JSON) and written to `resultFile` if
// given. `MARK <name> <json>` lines on stdout come from `mark` steps; a waiting mark resumes when the
// line `go <name>` arrives on stdin. Exit status: 0 = every step passed, 1 = a step failed (the result
// says which and why), 2 = the scenario could not be run at all.
//
// DebugClient's traps (research/dap.md §8) are avoided: events are buffered from the first byte
// (waitForEvent loses earlier ones and has no timeout in port mode), every wait has its own watchdog,
// configurationDone is sent explicitly (configurationSequence is wrong for attach), and reverse
// requests (which DebugClient silently drops) are answered and reported.
//
// Several processes: like VS Code, a `startDebugging` reverse request (or debugpy's `debugpyAttach`
// event) is answered at once and opens a child session: a new connection to the port the
// configuration names, through the same handshake with the same breakpoints. A step's `session`
// picks the session it runs in (default: the main one); `wait_session` waits for a child.

import { randomUUID } from "node:crypto";
import { appendFileSync, readFileSync, writeFileSync } from "node:fs";
import { createRequire } from "node:module";
import { createInterface } from "node:readline";

const require = createRequire(import.meta.url);
const { DebugClient } = require("@vscode/debugadapter-testsupport");

const T0 = performance.now();
// ms since start, to the microsecond (transcripts time single steps of a few ms)
const now = () => Math.round((performance.now() - T0) * 1000) / 1000;
const log = (...args) => process.stderr.write(`[vscode_scenario +${now()}ms] ${args.join(" ")}\n`);

class StepFailure extends Error {}

// DebugClient methods whose single argument is the request's arguments
const TYPED = {
  initialize: "initializeRequest",
  configurationDone: "configurationDoneRequest",
  launch: "launchRequest",
  attach: "attachRequest",
  restart: "restartRequest",
  terminate: "terminateRequest",
  disconnect: "disconnectRequest",
  setBreakpoints: "setBreakpointsRequest",
  setFunctionBreakpoints: "setFunctionBreakpointsRequest",
  setExceptionBreakpoints: "setExceptionBreakpointsRequest",
  continue: "continueRequest",
  next: "nextRequest",
  stepIn: "stepInRequest",
  stepOut: "stepOutRequest",
  pause: "pauseRequest",
  stackTrace: "stackTraceRequest",
  scopes: "scopesRequest",
  variables: "variablesRequest",
  setVariable: "setVariableRequest",
  source: "sourceRequest",
  evaluate: "evaluateRequest",
  stepInTargets: "stepInTargetsRequest",
  gotoTargets: "gotoTargetsRequest",
  completions: "completionsRequest",
  exceptionInfo: "exceptionInfoRequest",
};

// ---------------------------------------------------------------------------------------------
// small helpers

function basename(p) {
  return String(p).split(/[\\/]/).pop();
}

function pathMatches(actual, expected) {
  if (actual === expected) return true;
  if (typeof actual !== "string" || typeof expected !== "string") return false;
  const absolute = expected.startsWith("/") || /^[A-Za-z]:[\\/]/.test(expected);
  return !absolute && (actual.endsWith("/" + expected) || actual.endsWith("\\" + expected));
}

function describe(value) {
  const s = JSON.stringify(value);
  return s === undefined ? "undefined" : s.length > 300 ? s.slice(0, 300) + "..." : s;
}

// Partial deep match: objects match if every expected key matches; arrays element-wise with equal
// length; primitives with ===. Operators: {$contains}, {$regex}, {$gt}, {$lt}, {$exists}, {$len},
// {$path} (path equality with relative suffix match), {$any: [alternatives]}.
function mismatch(actual, expected, where = "$") {
  if (expected !== null && typeof expected === "object" && !Array.isArray(expected)) {
    const ops = Object.keys(expected).filter((k) => k.startsWith("$"));
    if (ops.length > 0) {
      for (const op of ops) {
        const want = expected[op];
        let ok;
        switch (op) {
          case "$contains":
            ok = typeof actual === "string"
              ? actual.includes(want)
              : Array.isArray(actual) && actual.some((a) => mismatch(a, want) === null);
            break;
          case "$regex":
            ok = typeof actual === "string" && new RegExp(want).test(actual);
            break;
          case "$gt":
            ok = typeof actual === "number" && actual > want;
            break;
          case "$lt":
            ok = typeof actual === "number" && actual < want;
            break;
          case "$exists":
            ok = (actual !== undefined && actual !== null) === Boolean(want);
            break;
          case "$len":
            ok = actual != null && actual.length === want;
            break;
          case "$path":
            ok = pathMatches(actual, want);
            break;
          case "$any":
            ok = want.some((alt) => mismatch(actual, alt) === null);
            break;
          default:
            return `${where}: unknown matcher ${op}`;
        }
        if (!ok) return `${where}: expected ${op} ${describe(want)}, got ${describe(actual)}`;
      }
      return null;
    }
    if (actual === null || typeof actual !== "object" || Array.isArray(actual)) {
      return `${where}: expected an object, got ${describe(actual)}`;
    }
    for (const [k, v] of Object.entries(expected)) {
      const m = mismatch(actual[k], v, `${where}.${k}`);
      if (m !== null) return m;
    }
    return null;
  }
  if (Array.isArray(expected)) {
    if (!Array.isArray(actual)) return `${where}: expected an array, got ${describe(actual)}`;
    if (actual.length !== expected.length) {
      return `${where}: expected ${expected.length} items, got ${actual.length}: ${describe(actual)}`;
    }
    for (let i = 0; i < expected.length; i++) {
      const m = mismatch(actual[i], expected[i], `${where}[${i}]`);
      if (m !== null) return m;
    }
    return null;
  }
  return actual === expected ? null : `${where}: expected ${describe(expected)}, got ${describe(actual)}`;
}

function lookup(root, path) {
  const parts = Array.isArray(path) ? path : String(path).split(".");
  let value = root;
  for (const part of parts) {
    if (value === null || value === undefined) break;
    value = value[part];
  }
  if (value === undefined) throw new StepFailure(`$ref ${describe(path)} is undefined`);
  return value;
}

// Replace {"$ref": "label.a.b"} / {"$ref": ["label", "a", 0]} with values from earlier steps.
function resolveRefs(value, labels) {
  if (Array.isArray(value)) return value.map((v) => resolveRefs(v, labels));
  if (value !== null && typeof value === "object") {
    if (Object.keys(value).length === 1 && "$ref" in value) return lookup(labels, value.$ref);
    return Object.fromEntries(Object.entries(value).map(([k, v]) => [k, resolveRefs(v, labels)]));
  }
  return value;
}

function normaliseFrame(f) {
  return {
    id: f.id,
    name: f.name,
    line: f.line,
    column: f.column,
    path: f.source?.path ?? null,
    sourceReference: f.source?.sourceReference ?? 0,
    ...(f.presentationHint !== undefined ? { presentationHint: f.presentationHint } : {}),
  };
}

function normaliseBreakpoint(b) {
  const out = { id: b.id ?? null, verified: b.verified, line: b.line ?? null };
  if (b.message !== undefined) out.message = b.message;
  if (b.source?.path !== undefined) out.path = b.source.path;
  return out;
}

function breakpointArgs(spec) {
  // spec: {path, breakpoints: [line | {line, condition?, hitCondition?, logMessage?, column?}]}
  //    or {path, lines: [line, ...]}
  const items = (spec.breakpoints ?? spec.lines ?? []).map((b) => (typeof b === "number" ? { line: b } : b));
  return {
    source: { name: basename(spec.path), path: spec.path },
    lines: items.map((b) => b.line),
    breakpoints: items,
    sourceModified: spec.sourceModified ?? false,
  };
}

// ---------------------------------------------------------------------------------------------
// one connection to the adapter: the main session (a reconnect makes a new one) or a child session
// opened for a `startDebugging` request / `debugpyAttach` event. Steps run against one Session (the
// main one unless the step says `session`); each has its own event buffer and focus.

class Session {
  constructor(runner, index, port, child = null) {
    this.runner = runner;
    this.index = index;
    this.port = port;
    this.dc = new DebugClient("unused", "unused", "debugpy");
    this.events = []; // {msg, consumed}
    this.responses = new Map(); // request_seq -> response
    this.waiters = new Set();
    this.closed = false;
    this.closedBy = null;
    this.capabilities = {};
    this.firstMessage = runner.messageCount;
    this.messageCount = 0;
    this.outputs = []; // non-telemetry output events, in order
    this.outputCursors = {};
    this.output = {}; // category -> text
    this.eventCounts = {};
    this.reverseRequests = [];
    this.initializeArgs = null;
    // focus, like VS Code's: the thread of the last stop, its frames, their scopes
    this.ctx = { threadId: null, frames: [], frameId: null, scopes: new Map() };
    // child sessions: {number (1-based, in opening order), parent, via, request, configuration}
    this.child = child;
    // breakpoint ids are per adapter connection; the main sessions (across reconnects) share one book
    this.book = child ? { breakpoints: {}, byPath: {} } : runner.mainBook;
    this.settled = child === null; // a child's handshake ended (well or not)
    this.error = null; // why a child's handshake failed
    this.handshakeResult = null;
  }

  // steps receive the Session they run in; these keep the step code's vocabulary
  get s() {
    return this;
  }

  get timeoutMs() {
    return this.runner.timeoutMs;
  }

  get breakpoints() {
    return this.book.breakpoints;
  }

  get breakpointsByPath() {
    return this.book.byPath;
  }

  get name() {
    return this.child?.configuration?.name ?? null;
  }

  get subProcessId() {
    return this.child?.configuration?.subProcessId ?? null;
  }

  title() {
    return this.child ? `child:${this.child.number} ${describe(this.name)} (subProcessId ${this.subProcessId})` : `session ${this.index}`;
  }

  async connect(timeoutMs) {
    const dc = this.dc;
    if (typeof dc.sequence !== "number" || typeof dc.dispatch !== "function" || typeof dc.doSend !== "function") {
      throw new Error("unexpected DebugClient internals (sequence/dispatch/doSend); is the pinned 1.68.0 installed?");
    }
    const originalDispatch = dc.dispatch.bind(dc);
    dc.dispatch = (body) => {
      let msg;
      try {
        msg = JSON.parse(body);
      } catch (err) {
        this.runner.protocolErrors.push(`session ${this.index}: unparsable message: ${describe(body)}`);
        return;
      }
      this.runner.recordReceived(this, msg);
      this.onMessage(msg);
      originalDispatch(body);
    };
    const originalDoSend = dc.doSend.bind(dc);
    dc.doSend = (command, args, clb) => {
      const seq = dc.sequence;
      originalDoSend(command, args, clb);
      const msg = { type: "request", seq, command };
      if (args && Object.keys(args).length > 0) msg.arguments = args;
      this.runner.recordSent(this, msg);
    };
    const started = dc.start(this.port); // port mode: net.createConnection(port, "127.0.0.1")
    const socket = dc._socket;
    let failConnect;
    const connectFailed = new Promise((_, reject) => (failConnect = reject));
    socket.on("error", (err) => {
      log(`session ${this.index}: socket error: ${err.message}`);
      if (!this.connected) failConnect(new StepFailure(`cannot connect to 127.0.0.1:${this.port}: ${err.message}`));
    });
    socket.on("close", () => {
      this.closed = true;
      this.closedBy ??= "adapter";
      this.notify();
    });
    socket.setNoDelay(true);
    let timer;
    const timeout = new Promise((_, reject) => {
      timer = setTimeout(() => reject(new StepFailure(`no connection to 127.0.0.1:${this.port} within ${timeoutMs} ms`)), timeoutMs);
    });
    try {
      await Promise.race([started, connectFailed, timeout]);
    } finally {
      clearTimeout(timer);
    }
    this.connected = true;
  }

  onMessage(msg) {
    if (msg.type === "event") {
      this.events.push({ msg, consumed: false });
      if (msg.event === "capabilities") Object.assign(this.capabilities, msg.body?.capabilities ?? {});
      if (msg.event === "output" && msg.body?.category !== "telemetry") this.outputs.push(msg.body);
      this.onEvent(msg);
    } else if (msg.type === "response") {
      this.responses.set(msg.request_seq, msg);
    } else if (msg.type === "request") {
      this.reverseRequests.push(msg);
      if (msg.command === "startDebugging") {
        // VS Code answers at once, then starts the new session (debugService.startDebugging)
        this.reply(msg, true);
        this.runner.openChild(this, msg.arguments ?? {}, "startDebugging");
      } else {
        // runInTerminal and anything else: DebugClient would drop it unanswered
        this.reply(msg, false, "reverse requests are not supported by this test client");
      }
    }
    this.notify();
  }

  onEvent(msg) {
    const body = msg.body ?? {};
    this.eventCounts[msg.event] = (this.eventCounts[msg.event] ?? 0) + 1;
    if (msg.event === "output" && body.category !== "telemetry") {
      const category = body.category ?? "console";
      this.output[category] = (this.output[category] ?? "") + (body.output ?? "");
    }
    if (msg.event === "breakpoint" && body.breakpoint?.id !== undefined) {
      const id = body.breakpoint.id;
      if (body.reason === "removed") delete this.breakpoints[id];
      else {
        // like VS Code, the event's breakpoint replaces the known one (we keep its file)
        const path = this.breakpoints[id]?.path;
        this.breakpoints[id] = { ...(path ? { path } : {}), ...normaliseBreakpoint(body.breakpoint), reason: body.reason };
      }
    }
    if (msg.event === "debugpyAttach" && this.runner.takesDebugpyAttach(this)) {
      // debugpy's announcement of a child to a client without startDebugging: the body is the
      // configuration (request: "attach" included)
      this.runner.openChild(this, { request: body.request ?? "attach", configuration: body }, "debugpyAttach");
    }
    if (msg.event === "terminated" && this.child && this.runner.scenario.childTerminated !== "keep") {
      // VS Code answers `terminated` with `disconnect` and closes (debugSession onDidTerminateDebugee)
      this.autoDisconnect();
    }
    this.runner.onEvent(this, msg);
  }

  reply(request, success, message) {
    const reply = { type: "response", seq: this.dc.sequence++, request_seq: request.seq, command: request.command, success };
    if (!success) reply.message = message;
    const json = JSON.stringify(reply);
    this.dc.outputStream.write(`Content-Length: ${Buffer.byteLength(json, "utf8")}\r\n\r\n${json}`, "utf8");
    this.runner.recordSent(this, reply);
  }

  async autoDisconnect() {
    if (this.disconnecting || this.closed) return;
    this.disconnecting = true;
    try {
      await this.call("disconnect", { restart: false }, this.timeoutMs);
    } catch (err) {
      log(`${this.title()}: disconnect after terminated: ${err.message}`);
    }
    this.close();
  }

  notify() {
    for (const check of [...this.waiters]) check();
    this.runner.notify();
  }

  // Resolve with the first non-undefined value of probe(), re-evaluated on every message.
  waitFor(probe, timeoutMs, what) {
    return pollUntil(this.waiters, probe, timeoutMs, () => {
      if (this.closed) return new StepFailure(`connection closed (by ${this.closedBy}) while waiting for ${what}`);
      return undefined;
    }, () => {
      const pending = this.events.filter((e) => !e.consumed).map((e) => e.msg.event);
      return new StepFailure(`no ${what} within ${timeoutMs} ms (unconsumed events: ${pending.join(", ") || "none"})`);
    });
  }

  // Send through DebugClient's own request method; returns the request's seq.
  send(command, args) {
    if (this.closed) throw new StepFailure(`cannot send ${command}: connection closed`);
    const dc = this.dc;
    const seq = dc.sequence; // doSend runs synchronously inside the Promise executor
    let sent;
    if (command === "threads") sent = dc.threadsRequest();
    else if (TYPED[command]) sent = dc[TYPED[command]](args);
    else sent = dc.customRequest(command, args);
    sent.catch(() => {}); // success:false is reported through the raw response instead
    return seq;
  }

  response(seq, command, timeoutMs) {
    return this.waitFor(() => this.responses.get(seq), timeoutMs, `response to '${command}' (seq ${seq})`);
  }

  // Resolve with the raw response, success or not.
  async call(command, args, timeoutMs) {
    return this.response(this.send(command, args), command, timeoutMs);
  }

  // First unconsumed event `name` with predicate(msg) true; consumed unless consume === false.
  takeEvent(name, predicate, consume = true) {
    const entry = this.events.find((e) => !e.consumed && e.msg.event === name && (!predicate || predicate(e.msg)));
    if (!entry) return undefined;
    if (consume) entry.consumed = true;
    return entry.msg;
  }

  waitEvent(name, timeoutMs, predicate, what, consume = true) {
    return this.waitFor(() => this.takeEvent(name, predicate, consume), timeoutMs, what ?? `'${name}' event`);
  }

  close(how = "end") {
    if (this.closed) return;
    this.closedBy = "client";
    const socket = this.dc._socket;
    if (socket) {
      if (how === "destroy") socket.destroy();
      else socket.end();
    }
  }

  waitClosed(timeoutMs) {
    return this.waitFor(() => (this.closed ? true : undefined), timeoutMs, "the connection to close").catch((err) => {
      if (this.closed) return true;
      throw err;
    });
  }

  summary() {
    const out = {
      index: this.index,
      kind: this.child ? "child" : "main",
      port: this.port,
      firstMessage: this.firstMessage,
      endMessage: this.runner.messageCount,
      messageCount: this.messageCount,
      closed: this.closed,
      closedBy: this.closedBy,
      reverseRequests: this.reverseRequests,
      capabilities: this.capabilities,
    };
    if (this.child) {
      Object.assign(out, {
        child: this.child.number,
        name: this.name,
        subProcessId: this.subProcessId,
        parent: this.child.parent.index,
        via: this.child.via,
        configuration: this.child.configuration,
        error: this.error,
        breakpoints: this.breakpoints,
        output: this.output,
        eventCounts: this.eventCounts,
      });
    }
    return out;
  }

  // ---- what steps use ---------------------------------------------------------------------------

  async request(command, args, step, { allowError = false } = {}) {
    const response = await this.call(command, args, step.timeoutMs ?? this.timeoutMs);
    if (!response.success && !(allowError || step.allowError)) {
      throw new StepFailure(`'${command}' failed: ${response.message ?? "(no message)"} ${describe(response.body ?? {})}`);
    }
    return response;
  }

  noteBreakpointAnswer(path, response) {
    for (const id of this.breakpointsByPath[path] ?? []) delete this.breakpoints[id];
    const list = (response.body?.breakpoints ?? []).map(normaliseBreakpoint);
    this.breakpointsByPath[path] = list.filter((b) => b.id !== null).map((b) => b.id);
    for (const b of list) if (b.id !== null) this.breakpoints[b.id] = { ...b, ...(path ? { path } : {}) };
    return list;
  }

  threadId(step) {
    const id = step.threadId ?? this.ctx.threadId;
    if (id === null || id === undefined) throw new StepFailure("no thread: nothing has stopped yet and no threadId given");
    return id;
  }

  frameId(step) {
    if (step.frameId !== undefined) return step.frameId;
    if (step.frame !== undefined) {
      const f = this.ctx.frames[step.frame];
      if (!f) throw new StepFailure(`no frame #${step.frame} in the last stack trace (${this.ctx.frames.length} frames)`);
      return f.id;
    }
    return this.ctx.frameId ?? undefined;
  }

  async scopesFor(frameId, step) {
    if (!this.ctx.scopes.has(frameId)) {
      const r = await this.request("scopes", { frameId }, step);
      this.ctx.scopes.set(frameId, r.body.scopes);
    }
    return this.ctx.scopes.get(frameId);
  }

  // variablesReference from step.variablesReference, or step.scope / step.path: [scope, name, ...]
  async containerRef(step) {
    if (step.variablesReference !== undefined) return step.variablesReference;
    const path = step.path ?? (step.scope !== undefined ? [step.scope] : null);
    if (!path || path.length === 0) throw new StepFailure("give variablesReference, scope or path");
    const frameId = this.frameId(step);
    if (frameId === undefined) throw new StepFailure("no frame: nothing has stopped yet and no frameId given");
    const scopes = await this.scopesFor(frameId, step);
    const scope = scopes.find((sc) => sc.name === path[0] || sc.presentationHint === path[0]);
    if (!scope) throw new StepFailure(`no scope '${path[0]}' in ${describe(scopes.map((sc) => sc.name))}`);
    let ref = scope.variablesReference;
    for (const name of path.slice(1)) {
      const r = await this.request("variables", { variablesReference: ref }, step);
      const v = r.body.variables.find((x) => x.name === name);
      if (!v) throw new StepFailure(`no variable '${name}' in ${describe(r.body.variables.map((x) => x.name))}`);
      if (!(v.variablesReference > 0)) throw new StepFailure(`variable '${name}' has no children`);
      ref = v.variablesReference;
    }
    return ref;
  }

  resetFocus() {
    this.ctx.frames = [];
    this.ctx.frameId = null;
    this.ctx.scopes = new Map();
  }

  async stackTrace(threadId, startFrame, levels, step) {
    const r = await this.request("stackTrace", { threadId, startFrame, levels }, step);
    return r;
  }

  // ---- handshake: VS Code's attach sequence (research/dap.md §2.4) ------------------------------
  // `base` gives initialize/attach/breakpoints/...; the step's own fields override it.
  async handshake(step, base = this.runner.scenario) {
    const spec = { ...base, ...step };
    const timeoutMs = step.timeoutMs ?? this.runner.scenario.handshakeTimeoutMs ?? this.timeoutMs;
    const t = { timeoutMs };
    const s = this;
    const out = {};
    s.initializeArgs = spec.initialize;
    const init = await this.request("initialize", spec.initialize, t);
    Object.assign(s.capabilities, init.body ?? {});
    out.capabilities = init.body ?? {};
    out.initialize = init;
    // VS Code sends attach as soon as initialize is answered and awaits it separately
    const attachSeq = s.send("attach", spec.attach);
    await s.waitFor(
      () => {
        const early = s.responses.get(attachSeq);
        if (early && !early.success) {
          throw new StepFailure(`attach failed: ${early.message ?? "(no message)"}`);
        }
        return s.takeEvent("initialized");
      },
      timeoutMs,
      "'initialized' event",
    );
    const files = spec.breakpoints ?? [];
    // debugService.sendAllBreakpoints: one setBreakpoints per file, then function, then exception
    // breakpoints, all in flight at once (Promise.all)
    const answers = await Promise.all([
      ...files.map((f) => this.request("setBreakpoints", breakpointArgs(f), t)),
      this.request("setFunctionBreakpoints", { breakpoints: spec.functionBreakpoints ?? [] }, t),
      this.request("setExceptionBreakpoints", {
        filters: spec.exceptionFilters ?? ["uncaught"],
        ...(spec.exceptionOptions ? { exceptionOptions: spec.exceptionOptions } : {}),
      }, t),
    ]);
    const perFile = answers.slice(0, files.length);
    const [fnBps, exBps] = answers.slice(files.length);
    out.setBreakpoints = files.map((f, i) => ({
      path: f.path,
      breakpoints: this.noteBreakpointAnswer(f.path, perFile[i]),
      raw: perFile[i],
    }));
    out.setFunctionBreakpoints = {
      breakpoints: (fnBps.body?.breakpoints ?? []).map(normaliseBreakpoint),
      raw: fnBps,
    };
    out.setExceptionBreakpoints = { raw: exBps };
    out.configurationDone = await this.request("configurationDone", undefined, t);
    const threads = await this.request("threads", undefined, t);
    out.threads = { threads: threads.body?.threads ?? [], raw: threads };
    const attach = await s.response(attachSeq, "attach", timeoutMs);
    if (!attach.success) throw new StepFailure(`attach failed: ${attach.message}`);
    out.attach = attach;
    out.capabilities = { ...s.capabilities };
    return out;
  }
}

// Resolve with the first non-undefined probe() (re-run whenever a waiter in `waiters` is called);
// reject with early() if it returns an error, or with late() after timeoutMs.
function pollUntil(waiters, probe, timeoutMs, early, late) {
  return new Promise((resolve, reject) => {
    let timer;
    const finish = (fn, value) => {
      clearTimeout(timer);
      waiters.delete(check);
      fn(value);
    };
    const check = () => {
      let value;
      try {
        value = probe();
      } catch (err) {
        finish(reject, err);
        return;
      }
      if (value !== undefined) {
        finish(resolve, value);
        return;
      }
      const failure = early();
      if (failure) finish(reject, failure);
    };
    timer = setTimeout(() => finish(reject, late()), timeoutMs);
    waiters.add(check);
    check();
  });
}

// ---------------------------------------------------------------------------------------------
// the runner: scenario state shared across sessions, and the step vocabulary

class Runner {
  constructor(scenario) {
    this.scenario = scenario;
    this.timeoutMs = scenario.timeoutMs ?? 30000;
    this.messageCount = 0;
    this.messageSessions = []; // the session index of every received message, in record order
    this.sessions = [];
    this.session = null; // the main session (the latest connect)
    this.children = []; // child sessions, in opening order
    this.waiters = new Set(); // runner-level waits (child sessions), re-run on every message
    this.labels = {};
    this.protocolErrors = [];
    this.eventCounts = {};
    this.output = {};
    // the main sessions' breakpoints: id -> latest normalised breakpoint (answers and events), and
    // path -> ids of the latest setBreakpoints answer
    this.mainBook = { breakpoints: {}, byPath: {} };
    // what VS Code's breakpoint model holds now: sent to every child session in its handshake
    this.model = {
      breakpoints: [...(scenario.breakpoints ?? [])],
      functionBreakpoints: scenario.functionBreakpoints ?? [],
      exceptionFilters: scenario.exceptionFilters ?? ["uncaught"],
      exceptionOptions: scenario.exceptionOptions,
    };
    this.stdinLines = [];
    this.stdinWaiters = new Set();
    this.stdinClosed = false;
    if (scenario.record) writeFileSync(scenario.record, "");
    if (scenario.transcript) writeFileSync(scenario.transcript, "");
  }

  recordReceived(session, msg) {
    this.messageCount += 1;
    session.messageCount += 1;
    this.messageSessions.push(session.index);
    if (this.scenario.record) appendFileSync(this.scenario.record, JSON.stringify(msg) + "\n");
    if (this.scenario.transcript) {
      appendFileSync(this.scenario.transcript, JSON.stringify({ session: session.index, dir: "adapter->client", t: now(), msg }) + "\n");
    }
  }

  recordSent(session, msg) {
    if (this.scenario.transcript) {
      appendFileSync(this.scenario.transcript, JSON.stringify({ session: session.index, dir: "client->adapter", t: now(), msg }) + "\n");
    }
  }

  // result.eventCounts / result.output: the main sessions' (each session has its own too)
  onEvent(session, msg) {
    if (session.child) return;
    this.eventCounts[msg.event] = (this.eventCounts[msg.event] ?? 0) + 1;
    const body = msg.body ?? {};
    if (msg.event === "output" && body.category !== "telemetry") {
      const category = body.category ?? "console";
      this.output[category] = (this.output[category] ?? "") + (body.output ?? "");
    }
  }

  notify() {
    for (const check of [...this.waiters]) check();
  }

  // a set_* step changed VS Code's breakpoint model (what later child sessions are sent)
  updateModel(kind, step) {
    const m = this.model;
    if (kind === "breakpoints") {
      const entry = { path: step.path, breakpoints: step.breakpoints ?? step.lines ?? [] };
      m.breakpoints = [...m.breakpoints.filter((f) => f.path !== step.path), entry];
    } else if (kind === "functionBreakpoints") {
      m.functionBreakpoints = step.breakpoints ?? [];
    } else {
      m.exceptionFilters = step.filters ?? [];
      m.exceptionOptions = step.exceptionOptions;
    }
  }

  get s() {
    if (!this.session) throw new StepFailure("not connected");
    return this.session;
  }

  // ---- child sessions ---------------------------------------------------------------------------

  // debugpyAttach events start a session when the scenario says so, or when the session's
  // initialize did not offer startDebugging (then debugpy announces children with the event)
  takesDebugpyAttach(session) {
    if (this.scenario.debugpyAttach !== undefined) return Boolean(this.scenario.debugpyAttach);
    return session.initializeArgs?.supportsStartDebuggingRequest !== true;
  }

  // What VS Code does for `startDebugging {request, configuration}`: a new session of the same
  // debug type, connected where the configuration says, through the whole attach handshake with
  // the same initialize arguments and the current breakpoints. Runs in the background.
  openChild(parent, args, via) {
    const configuration = args.configuration ?? {};
    const request = args.request ?? configuration.request ?? "attach";
    const port = configuration.connect?.port ?? configuration.port;
    const child = new Session(this, this.sessions.length, port, {
      number: this.children.length + 1,
      parent,
      via,
      request,
      configuration,
    });
    this.sessions.push(child);
    this.children.push(child);
    log(`${child.title()}: opening (${via} on session ${parent.index})`);
    const timeoutMs = this.scenario.handshakeTimeoutMs ?? this.timeoutMs;
    const host = configuration.connect?.host ?? configuration.host;
    const start = async () => {
      if (!Number.isInteger(port)) throw new StepFailure(`no connect.port in the configuration ${describe(configuration)}`);
      if (host !== undefined && !["127.0.0.1", "localhost"].includes(host)) {
        log(`${child.title()}: connecting to 127.0.0.1, not ${host} (DebugClient's port mode)`);
      }
      await child.connect(timeoutMs);
      // VS Code gives every session its own id (debugSession launchOrAttach)
      const attach = { ...configuration, request, __sessionId: randomUUID() };
      child.handshakeResult = await child.handshake({}, {
        ...this.model,
        initialize: parent.initializeArgs ?? this.scenario.initialize,
        attach,
      });
    };
    start()
      .catch((err) => {
        child.error = err instanceof StepFailure ? err.message : String(err?.stack ?? err);
        child.errorWhileClosed = child.closed;
        log(`${child.title()}: handshake failed: ${child.error}`);
      })
      .finally(() => {
        child.settled = true;
        this.notify();
      });
    this.notify();
    return child;
  }

  // the child a selector names: a wait_session label, a subProcessId (number or digits),
  // "child:N" (the Nth opened), or a regex on the configuration's name
  findChild(selector) {
    const label = typeof selector === "string" ? this.labels[selector] : undefined;
    if (label?.op === "wait_session") return this.children[label.child - 1];
    if (typeof selector === "number" || /^\d+$/.test(String(selector))) {
      return this.children.find((c) => c.subProcessId === Number(selector));
    }
    const nth = /^child:(\d+)$/.exec(String(selector));
    if (nth) return this.children[Number(nth[1]) - 1];
    const re = new RegExp(String(selector));
    return this.children.find((c) => typeof c.name === "string" && re.test(c.name));
  }

  waitFor(probe, timeoutMs, what) {
    // no child session comes after the main session ended (its `terminated`), once every child
    // announced before it has been opened
    const ended = () => {
      const main = this.session;
      const over = main && (main.closed || main.events.some((e) => e.msg.event === "terminated"));
      if (!over || !this.children.every((c) => c.settled)) return undefined;
      const opened = this.children.map((c) => c.title()).join("; ") || "none";
      return new StepFailure(`the main session ended without a ${what} (child sessions: ${opened})`);
    };
    return pollUntil(this.waiters, probe, timeoutMs, ended, () => {
      const opened = this.children.map((c) => c.title()).join("; ") || "none";
      return new StepFailure(`no ${what} within ${timeoutMs} ms (child sessions: ${opened})`);
    });
  }

  // The Session a step runs in: the main one, or (waiting for it to be opened) a child.
  async target(step) {
    const selector = step.session ?? "main";
    if (selector === "main") return this.s;
    const child = await this.waitFor(
      () => {
        const c = this.findChild(selector);
        return c?.settled ? c : undefined;
      },
      step.timeoutMs ?? this.timeoutMs,
      `child session ${describe(selector)}`,
    );
    if (child.error) throw new StepFailure(`${child.title()} could not be opened: ${child.error}`);
    return child;
  }

  // handshakes of child sessions that failed other than because their connection closed (a child
  // process that ended at once)
  childFailures() {
    return this.children.filter((c) => c.error && !c.errorWhileClosed).map((c) => `${c.title()}: ${c.error}`);
  }

  // stdin: `go <name>` releases a waiting mark
  startStdin() {
    const rl = createInterface({ input: process.stdin });
    rl.on("line", (line) => {
      this.stdinLines.push(line.trim());
      for (const w of [...this.stdinWaiters]) w();
    });
    rl.on("close", () => {
      this.stdinClosed = true;
      for (const w of [...this.stdinWaiters]) w();
    });
    this.stdinReader = rl;
  }

  waitStdin(name, timeoutMs) {
    return new Promise((resolve, reject) => {
      const timer = setTimeout(() => {
        this.stdinWaiters.delete(check);
        reject(new StepFailure(`mark '${name}' was not released ('go ${name}' on stdin) within ${timeoutMs} ms`));
      }, timeoutMs);
      const check = () => {
        const i = this.stdinLines.indexOf(`go ${name}`);
        if (i >= 0) {
          this.stdinLines.splice(i, 1);
        } else if (!this.stdinClosed) {
          return;
        }
        clearTimeout(timer);
        this.stdinWaiters.delete(check);
        if (i >= 0) resolve();
        else reject(new StepFailure(`stdin closed before mark '${name}' was released`));
      };
      this.stdinWaiters.add(check);
      check();
    });
  }
}

// ---- the step vocabulary -------------------------------------------------------------------------
// Runner-level ops get (runner, step); the others (session, step): the Session the step selects.
// $refs are resolved.

const controlOp = (command) => async (r, step) => {
  const args = { threadId: r.threadId(step) };
  if (step.granularity) args.granularity = step.granularity;
  if (step.singleThread !== undefined) args.singleThread = step.singleThread;
  if (step.targetId !== undefined) args.targetId = step.targetId;
  const resp = await r.request(command, args, step);
  if (command !== "pause") r.resetFocus();
  return { success: resp.success, body: resp.body ?? null, raw: resp };
};

const RUNNER_OPS = {
  async connect(r, step) {
    const session = new Session(r, r.sessions.length, step.port ?? r.scenario.port);
    r.sessions.push(session);
    r.session = session;
    await session.connect(step.timeoutMs ?? r.timeoutMs);
    return { session: session.index, port: session.port };
  },

  async reconnect(r, step) {
    // Against debugpy itself: after `close` (no disconnect) its adapter finalizes the old session
    // asynchronously; an attach within ~50 ms fails with "Server[pid=N] is already being
    // debugged.", and the adapter then stopped accepting connections (observed, 1.8.22). After a
    // `disconnect` step the response comes after finalization, so an immediate reconnect works.
    if (r.session && !r.session.closed) await OPS.close(r.session, { timeoutMs: step.timeoutMs });
    const connected = await RUNNER_OPS.connect(r, step);
    if (step.handshake === false) return connected;
    return { ...connected, ...(await r.s.handshake(step)) };
  },

  async mark(r, step) {
    process.stdout.write(`MARK ${step.name} ${JSON.stringify(step.data ?? null)}\n`);
    if (step.wait) await r.waitStdin(step.name, step.timeoutMs ?? r.timeoutMs);
    return { name: step.name };
  },

  async wait_session(r, step) {
    // the first child session no earlier wait_session took, matching the filters, once its
    // handshake ended
    const nameRe = step.name !== undefined ? new RegExp(step.name) : null;
    const fits = (c) =>
      !c.claimed &&
      (step.stopped !== true || c.events.some((e) => !e.consumed && e.msg.event === "stopped")) &&
      (step.subProcessId === undefined || c.subProcessId === step.subProcessId) &&
      (step.child === undefined || c.child.number === step.child) &&
      (nameRe === null || (typeof c.name === "string" && nameRe.test(c.name)));
    const what = `${step.stopped ? "stopped " : ""}child session${step.name !== undefined ? " named like " + describe(step.name) : ""}${step.subProcessId !== undefined ? " with subProcessId " + step.subProcessId : ""}`;
    const child = await r.waitFor(() => r.children.find((c) => c.settled && fits(c)), step.timeoutMs ?? r.timeoutMs, what);
    child.claimed = true;
    if (child.error) throw new StepFailure(`${child.title()} could not be opened: ${child.error}`);
    return {
      session: child.index,
      child: child.child.number,
      name: child.name,
      subProcessId: child.subProcessId,
      via: child.child.via,
      parent: child.child.parent.index,
      port: child.port,
      configuration: child.child.configuration,
      handshake: child.handshakeResult,
    };
  },
};

const OPS = {
  async handshake(r, step) {
    return await r.handshake(step);
  },

  async close(r, step) {
    const s = r.s;
    s.close(step.destroy ? "destroy" : "end");
    await s.waitClosed(step.timeoutMs ?? r.timeoutMs);
    return { session: s.index };
  },

  async request(r, step) {
    const resp = await r.request(step.command, step.arguments, step);
    return { success: resp.success, body: resp.body ?? null, message: resp.message ?? null, raw: resp };
  },

  async threads(r, step) {
    const resp = await r.request("threads", undefined, step);
    return { threads: resp.body?.threads ?? [], raw: resp };
  },

  async wait_stopped(r, step) {
    const s = r.s;
    const timeoutMs = step.timeoutMs ?? r.timeoutMs;
    const event = await s.waitEvent("stopped", timeoutMs, null, "'stopped' event");
    const body = event.body ?? {};
    const out = {
      reason: body.reason,
      threadId: body.threadId ?? null,
      description: body.description ?? null,
      text: body.text ?? null,
      allThreadsStopped: body.allThreadsStopped ?? null,
      hitBreakpointIds: body.hitBreakpointIds ?? [],
      raw: { event },
    };
    r.resetFocus();
    if (body.threadId !== undefined) r.ctx.threadId = body.threadId;
    if (step.inspect !== false) {
      // what VS Code does on 'stopped': threads, the top frame, then the rest (delayed loading)
      const threads = await r.request("threads", undefined, step);
      out.threads = threads.body?.threads ?? [];
      out.raw.threads = threads;
      const threadId = r.threadId(step);
      const [first, rest] = step.levels ?? [1, 19];
      const top = await r.stackTrace(threadId, 0, first, step);
      let frames = top.body.stackFrames;
      out.raw.stackTrace = [top];
      const total = top.body.totalFrames;
      if (rest > 0 && (total === undefined || total > frames.length) && frames.length === first) {
        const more = await r.stackTrace(threadId, first, rest, step);
        frames = frames.concat(more.body.stackFrames);
        out.raw.stackTrace.push(more);
      }
      out.frames = frames.map(normaliseFrame);
      out.totalFrames = total ?? null;
      r.ctx.frames = out.frames;
      r.ctx.frameId = out.frames[0]?.id ?? null;
      const f = out.frames[0] ?? {};
      out.function = f.name ?? null;
      out.line = f.line ?? null;
      out.path = f.path ?? null;
      if (body.reason === "exception" && step.exceptionInfo !== false) {
        const info = await r.request("exceptionInfo", { threadId }, step, { allowError: true });
        out.exception = exceptionSummary(info);
      }
    }
    const expected = {};
    for (const k of ["reason", "line", "function", "threadId", "description"]) if (step[k] !== undefined) expected[k] = step[k];
    if (step.path !== undefined) expected.path = { $path: step.path };
    const m = mismatch(out, expected);
    if (m !== null) throw new StepFailure(`stopped somewhere else: ${m} (stopped at ${out.function}:${out.line} ${out.path}, reason ${out.reason})`);
    return out;
  },

  async stack_trace(r, step) {
    const threadId = r.threadId(step);
    const resp = await r.stackTrace(threadId, step.startFrame ?? 0, step.levels ?? 20, step);
    const frames = (resp.body?.stackFrames ?? []).map(normaliseFrame);
    if ((step.startFrame ?? 0) === 0 && step.focus !== false) {
      r.ctx.frames = frames;
      r.ctx.frameId = frames[0]?.id ?? null;
    }
    return {
      frames,
      names: frames.map((f) => f.name),
      totalFrames: resp.body?.totalFrames ?? null,
      raw: resp,
    };
  },

  async scopes(r, step) {
    const frameId = r.frameId(step);
    if (frameId === undefined) throw new StepFailure("no frame: nothing has stopped yet and no frameId given");
    const resp = await r.request("scopes", { frameId }, step);
    r.ctx.scopes.set(frameId, resp.body.scopes);
    return {
      frameId,
      scopes: resp.body.scopes.map((sc) => ({
        name: sc.name,
        presentationHint: sc.presentationHint ?? null,
        variablesReference: sc.variablesReference,
        expensive: sc.expensive ?? false,
      })),
      names: resp.body.scopes.map((sc) => sc.name),
      raw: resp,
    };
  },

  async variables(r, step) {
    const ref = await r.containerRef(step);
    const args = { variablesReference: ref };
    for (const k of ["filter", "start", "count", "format"]) if (step[k] !== undefined) args[k] = step[k];
    const resp = await r.request("variables", args, step);
    const list = (resp.body?.variables ?? []).map((v) => ({
      name: v.name,
      value: v.value,
      type: v.type ?? null,
      evaluateName: v.evaluateName ?? null,
      variablesReference: v.variablesReference ?? 0,
      ...(v.indexedVariables !== undefined ? { indexedVariables: v.indexedVariables } : {}),
      ...(v.namedVariables !== undefined ? { namedVariables: v.namedVariables } : {}),
    }));
    return {
      variablesReference: ref,
      values: Object.fromEntries(list.map((v) => [v.name, v.value])),
      types: Object.fromEntries(list.map((v) => [v.name, v.type])),
      names: list.map((v) => v.name),
      list,
      raw: resp,
    };
  },

  async evaluate(r, step) {
    const args = { expression: step.expression, context: step.context ?? "repl" };
    const frameId = r.frameId(step);
    if (frameId !== undefined && step.noFrame !== true) args.frameId = frameId;
    if (step.format) args.format = step.format;
    const resp = await r.request("evaluate", args, step);
    const b = resp.body ?? {};
    return {
      success: resp.success,
      result: b.result ?? null,
      type: b.type ?? null,
      variablesReference: b.variablesReference ?? 0,
      message: resp.message ?? null,
      error: resp.success ? null : (b.error?.format ?? resp.message ?? null),
      raw: resp,
    };
  },

  async set_variable(r, step) {
    const ref = await r.containerRef(step);
    const args = { variablesReference: ref, name: step.name, value: step.value };
    if (step.format) args.format = step.format;
    const resp = await r.request("setVariable", args, step);
    const b = resp.body ?? {};
    return {
      success: resp.success,
      value: b.value ?? null,
      type: b.type ?? null,
      variablesReference: b.variablesReference ?? 0,
      message: resp.message ?? null,
      raw: resp,
    };
  },

  async exception_info(r, step) {
    const resp = await r.request("exceptionInfo", { threadId: r.threadId(step) }, step);
    return exceptionSummary(resp);
  },

  async set_breakpoints(r, step) {
    r.runner.updateModel("breakpoints", step);
    const resp = await r.request("setBreakpoints", breakpointArgs(step), step);
    return { path: step.path, breakpoints: r.noteBreakpointAnswer(step.path, resp), raw: resp };
  },

  async set_function_breakpoints(r, step) {
    r.runner.updateModel("functionBreakpoints", step);
    const resp = await r.request("setFunctionBreakpoints", { breakpoints: step.breakpoints ?? [] }, step);
    return { breakpoints: (resp.body?.breakpoints ?? []).map(normaliseBreakpoint), raw: resp };
  },

  async set_exception_breakpoints(r, step) {
    r.runner.updateModel("exceptionFilters", step);
    const args = { filters: step.filters ?? [] };
    if (step.exceptionOptions) args.exceptionOptions = step.exceptionOptions;
    if (step.filterOptions) args.filterOptions = step.filterOptions;
    const resp = await r.request("setExceptionBreakpoints", args, step);
    return { success: resp.success, raw: resp };
  },

  next: controlOp("next"),
  step_in: controlOp("stepIn"),
  step_out: controlOp("stepOut"),
  continue: controlOp("continue"),
  pause: async (r, step) => {
    if (step.threadId === undefined && r.ctx.threadId === null) {
      // VS Code pauses the focused thread; with none focused, the first one
      const threads = await r.request("threads", undefined, step);
      const first = threads.body?.threads?.[0];
      if (!first) throw new StepFailure("pause: the adapter reports no threads");
      r.ctx.threadId = first.id;
    }
    return controlOp("pause")(r, step);
  },

  async parallel(r, step) {
    // VS Code does not wait for one view before asking for the next: after a stop, the rest of the
    // stack, the variables view (scopes, then variables) and every watch `evaluate` are in flight
    // at once (research/latency-wan.md). Each branch runs its steps in order, in this step's
    // session; the branches run concurrently. Sub-steps share the session's focus.
    const runBranch = async (branch, b) => {
      const results = [];
      for (const [j, sub] of branch.entries()) {
        const started = now();
        const entry = { op: sub.op };
        try {
          Object.assign(entry, await OPS[sub.op](r, { timeoutMs: step.timeoutMs, ...sub }));
          if (sub.expect !== undefined) {
            const m = mismatch(entry, sub.expect);
            if (m !== null) throw new StepFailure(`expectation failed: ${m}`);
          }
        } catch (err) {
          const why = err instanceof StepFailure ? err.message : String(err?.stack ?? err);
          throw new StepFailure(`branch ${b} step ${j} (${sub.op}): ${why}`);
        }
        entry.ms = now() - started;
        results.push(entry);
      }
      return results;
    };
    return { branches: await Promise.all((step.branches ?? []).map(runBranch)) };
  },

  async wait_event(r, step) {
    const predicate = step.match ? (e) => mismatch(e.body ?? {}, step.match) === null : null;
    const event = await r.s.waitEvent(step.event, step.timeoutMs ?? r.timeoutMs, predicate,
      `'${step.event}' event${step.match ? " matching " + describe(step.match) : ""}`, step.consume !== false);
    return { event: event.event, body: event.body ?? null, raw: event };
  },

  async wait_output(r, step) {
    const s = r.s;
    const key = step.category ?? "*";
    const found = await s.waitFor(() => {
      const start = s.outputCursors[key] ?? 0;
      let text = "";
      for (let i = start; i < s.outputs.length; i++) {
        const o = s.outputs[i];
        if (step.category && (o.category ?? "console") !== step.category) continue;
        text += o.output ?? "";
        if (text.includes(step.contains)) return { text, end: i + 1 };
      }
      return undefined;
    }, step.timeoutMs ?? r.timeoutMs, `output containing ${describe(step.contains)}${step.category ? " in " + step.category : ""}`);
    s.outputCursors[key] = found.end;
    return { text: found.text };
  },

  async wait_breakpoint_event(r, step) {
    const want = {};
    for (const k of ["reason"]) if (step[k] !== undefined) want[k] = step[k];
    const bp = {};
    for (const k of ["id", "verified", "line"]) if (step[k] !== undefined) bp[k] = step[k];
    if (Object.keys(bp).length) want.breakpoint = bp;
    const event = await r.s.waitEvent("breakpoint", step.timeoutMs ?? r.timeoutMs,
      (e) => mismatch(e.body ?? {}, want) === null, `'breakpoint' event matching ${describe(want)}`);
    return { reason: event.body.reason, breakpoint: normaliseBreakpoint(event.body.breakpoint), raw: event };
  },

  async wait_breakpoints_verified(r, step) {
    // every breakpoint id from the latest setBreakpoints answers (or step.ids) becomes verified, in
    // its answer or through later 'breakpoint' events; the events are not consumed
    const ids = step.ids ?? Object.values(r.breakpointsByPath).flat();
    await r.s.waitFor(
      () => (ids.every((id) => r.breakpoints[id]?.verified) ? true : undefined),
      step.timeoutMs ?? r.timeoutMs,
      `breakpoints ${describe(ids.filter((id) => !r.breakpoints[id]?.verified))} to be verified`,
    );
    return { breakpoints: Object.fromEntries(ids.map((id) => [id, r.breakpoints[id]])) };
  },

  async wait_terminated(r, step) {
    const event = await r.s.waitEvent("terminated", step.timeoutMs ?? r.timeoutMs, null, "'terminated' event");
    const exited = r.s.events.find((e) => e.msg.event === "exited");
    return {
      restart: event.body?.restart ?? null,
      exitCode: exited ? exited.msg.body?.exitCode ?? null : null,
      raw: event,
    };
  },

  async disconnect(r, step) {
    const s = r.s;
    const args = { restart: step.restart ?? false };
    if (step.terminateDebuggee !== undefined) args.terminateDebuggee = step.terminateDebuggee;
    if (step.suspendDebuggee !== undefined) args.suspendDebuggee = step.suspendDebuggee;
    if (step.vscodeStrip) {
      // RawDebugSession.disconnect() drops flags the adapter did not advertise (spec spellings)
      if (!s.capabilities.supportTerminateDebuggee) delete args.terminateDebuggee;
      if (!s.capabilities.supportTerminateDebuggee || !s.capabilities.supportSuspendDebuggee) delete args.suspendDebuggee;
    }
    const resp = await r.request("disconnect", args, step);
    const terminatedBeforeResponse = s.events.some(
      (e) => e.msg.event === "terminated" && e.msg.seq < resp.seq,
    );
    // VS Code closes its end once disconnect is answered (rawDebugSession shutdown)
    if (step.close !== false) {
      s.close();
      await s.waitClosed(step.timeoutMs ?? r.timeoutMs);
    }
    return { success: resp.success, arguments: args, terminatedBeforeResponse, raw: resp };
  },
};

function exceptionSummary(resp) {
  const b = resp.body ?? {};
  return {
    success: resp.success,
    exceptionId: b.exceptionId ?? null,
    description: b.description ?? null,
    breakMode: b.breakMode ?? null,
    typeName: b.details?.typeName ?? null,
    message: b.details?.message ?? null,
    raw: resp,
  };
}

// ---------------------------------------------------------------------------------------------

function validate(scenario) {
  const problems = [];
  if (!Number.isInteger(scenario.port)) problems.push("port: an integer is required");
  if (scenario.host !== undefined && scenario.host !== "127.0.0.1") {
    problems.push("host: DebugClient's port mode always connects to 127.0.0.1");
  }
  if (scenario.handshake !== false) {
    if (!scenario.initialize) problems.push("initialize: the initialize arguments are required");
    if (!scenario.attach) problems.push("attach: the attach arguments are required");
  }
  (scenario.steps ?? []).forEach((step, i) => {
    if (!OPS[step.op] && !RUNNER_OPS[step.op]) problems.push(`steps[${i}]: unknown op ${describe(step.op)}`);
    if (step.session !== undefined && RUNNER_OPS[step.op]) {
      problems.push(`steps[${i}] (${step.op}): 'session' is for steps that run in a session`);
    }
    if (step.session !== undefined && !["string", "number"].includes(typeof step.session)) {
      problems.push(`steps[${i}] (${step.op}): 'session' is "main", a subProcessId, "child:N", a name regex or a wait_session label`);
    }
    if (step.op === "parallel") {
      const ok = Array.isArray(step.branches) && step.branches.every((b) => Array.isArray(b));
      if (!ok) problems.push(`steps[${i}] (parallel): 'branches' is a list of lists of steps`);
      else {
        step.branches.flat().forEach((sub, j) => {
          if (!OPS[sub?.op] || sub.op === "parallel") problems.push(`steps[${i}] (parallel) sub-step ${j}: ${describe(sub?.op)} is no session op (or is parallel)`);
          if (sub?.session !== undefined) problems.push(`steps[${i}] (parallel) sub-step ${j}: 'session' belongs on the parallel step`);
        });
      }
    }
    const need = {
      evaluate: ["expression"],
      set_variable: ["name", "value"],
      set_breakpoints: ["path"],
      wait_event: ["event"],
      wait_output: ["contains"],
      mark: ["name"],
      request: ["command"],
    }[step.op] ?? [];
    for (const k of need) if (step[k] === undefined) problems.push(`steps[${i}] (${step.op}): '${k}' is required`);
  });
  return problems;
}

async function main() {
  if (process.argv.length !== 3) {
    process.stderr.write("usage: node vscode_scenario.mjs scenario.json\n");
    return 2;
  }
  const scenario = JSON.parse(readFileSync(process.argv[2], "utf8"));
  const problems = validate(scenario);
  const result = { ok: false, error: null, failedStep: null, steps: [], labels: {} };
  if (problems.length) {
    result.error = "invalid scenario: " + problems.join("; ");
    return finish(scenario, result, 2);
  }
  const runner = new Runner(scenario);
  runner.startStdin();
  const steps = [
    { op: "connect", label: "connect" },
    ...(scenario.handshake === false ? [] : [{ op: "handshake", label: "handshake" }]),
    ...(scenario.steps ?? []),
  ];
  let status = 0;
  for (const [i, rawStep] of steps.entries()) {
    const index = i - (steps.length - (scenario.steps ?? []).length); // negative = implicit
    const started = now();
    const entry = { index, op: rawStep.op, ...(rawStep.label ? { label: rawStep.label } : {}) };
    try {
      const step = resolveRefs(rawStep, runner.labels);
      log(`step ${index} ${step.op}${step.label ? " [" + step.label + "]" : ""}`);
      if (RUNNER_OPS[step.op]) {
        Object.assign(entry, await RUNNER_OPS[step.op](runner, step));
      } else {
        const session = await runner.target(step);
        if (step.session !== undefined) entry.session = session.index;
        Object.assign(entry, await OPS[step.op](session, step));
      }
      if (step.expect !== undefined) {
        const m = mismatch(entry, step.expect);
        if (m !== null) throw new StepFailure(`expectation failed: ${m}`);
      }
    } catch (err) {
      entry.error = err instanceof StepFailure ? err.message : String(err?.stack ?? err);
      result.error = `step ${index} (${rawStep.op}${rawStep.label ? " " + rawStep.label : ""}): ${entry.error}`;
      result.failedStep = index;
      status = 1;
    }
    entry.ms = now() - started;
    result.steps.push(entry);
    if (rawStep.label) runner.labels[rawStep.label] = entry;
    if (status !== 0) break;
  }
  const failures = runner.childFailures();
  if (status === 0 && failures.length && runner.scenario.childErrors !== "ignore") {
    result.error = `child session handshake failed: ${failures.join("; ")}`;
    status = 1;
  }
  result.ok = status === 0;
  if (runner.labels.handshake) {
    result.capabilities = runner.labels.handshake.capabilities;
    result.handshake = runner.labels.handshake;
  }
  result.steps = result.steps.filter((e) => e.index >= 0);
  result.labels = runner.labels;
  result.breakpoints = runner.mainBook.breakpoints;
  result.output = runner.output;
  result.eventCounts = runner.eventCounts;
  result.sessions = runner.sessions.map((s) => s.summary());
  result.messageCount = runner.messageCount;
  result.messageSessions = runner.messageSessions;
  result.protocolErrors = runner.protocolErrors;
  result.durationMs = now();
  for (const s of runner.sessions) s.close("destroy");
  runner.stdinReader?.close();
  return finish(scenario, result, status);
}

function finish(scenario, result, status) {
  const line = JSON.stringify(result);
  if (scenario?.resultFile) writeFileSync(scenario.resultFile, line + "\n");
  return new Promise((resolve) => process.stdout.write(line + "\n", () => resolve(status)));
}

process.on("unhandledRejection", (err) => {
  log(`unhandled rejection: ${err?.stack ?? err}`);
});

main().then(
  (status) => process.exit(status),
  (err) => {
    log(`crashed: ${err?.stack ?? err}`);
    process.stdout.write(JSON.stringify({ ok: false, error: `runner crashed: ${err?.message ?? err}` }) + "\n", () => process.exit(2));
  },
);
