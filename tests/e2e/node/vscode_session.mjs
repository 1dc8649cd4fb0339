// A VS Code-shaped debug session against a DAP server on 127.0.0.1, driven by Microsoft's
// DebugClient (@vscode/debugadapter-testsupport). Usage: node vscode_session.mjs scenario.json
//
// scenario: {port, initialize, attach, breakpoints: [{path, lines}], expression, record}
// Prints "CONFIGURED <json>" once configurationDone is answered (the test then starts a worker),
// and "RESULT <json>" at the end. Every message received is appended to scenario.record (JSONL).
// DebugClient's own traps (shared/research/dap.md §8) are avoided: events are buffered from the
// first byte (waitForEvent loses earlier ones), every wait has a watchdog, configurationDone is
// sent explicitly, and reverse requests are not offered (supportsStartDebuggingRequest: false).

import { readFileSync, appendFileSync, writeFileSync } from "node:fs";
import { createRequire } from "node:module";

const require = createRequire(import.meta.url);
const { DebugClient } = require("@vscode/debugadapter-testsupport");

const scenario = JSON.parse(readFileSync(process.argv[2], "utf8"));
const WAIT_MS = scenario.waitMs ?? 60000;
writeFileSync(scenario.record, "");

const dc = new DebugClient("unused", "unused", "debugpy");
const events = [];
const waiters = [];
const originalDispatch = dc.dispatch.bind(dc);
dc.dispatch = (body) => {
  const msg = JSON.parse(body);
  appendFileSync(scenario.record, JSON.stringify(msg) + "\n");
  if (msg.type === "event") {
    events.push(msg);
    for (const w of [...waiters]) w();
  }
  originalDispatch(body);
};

function waitEvent(name, predicate = () => true) {
  return new Promise((resolve, reject) => {
    const timer = setTimeout(() => {
      reject(new Error(`no '${name}' event within ${WAIT_MS} ms; unconsumed: ${events.map((e) => e.event)}`));
    }, WAIT_MS);
    const check = () => {
      const i = events.findIndex((e) => e.event === name && predicate(e));
      if (i < 0) return false;
      const [found] = events.splice(i, 1);
      clearTimeout(timer);
      waiters.splice(waiters.indexOf(check), 1);
      resolve(found);
      return true;
    };
    waiters.push(check);
    check();
  });
}

function withTimeout(promise, what) {
  return Promise.race([
    promise,
    new Promise((_, reject) => setTimeout(() => reject(new Error(`${what}: no response within ${WAIT_MS} ms`)), WAIT_MS)),
  ]);
}

async function stoppedAt() {
  const stopped = await waitEvent("stopped");
  const threadId = stopped.body.threadId;
  // VS Code: threads, then the top frame, then the rest (supportsDelayedStackTraceLoading)
  await dc.threadsRequest();
  const top = await dc.stackTraceRequest({ threadId, startFrame: 0, levels: 1 });
  const rest = await dc.stackTraceRequest({ threadId, startFrame: 1, levels: 19 });
  const frame = top.body.stackFrames[0];
  return {
    reason: stopped.body.reason,
    hitBreakpointIds: stopped.body.hitBreakpointIds ?? [],
    threadId,
    frame: { id: frame.id, name: frame.name, line: frame.line, path: frame.source?.path },
    totalFrames: top.body.totalFrames,
    callers: rest.body.stackFrames.map((f) => f.name),
  };
}

async function locals(frameId) {
  const scopes = await dc.scopesRequest({ frameId });
  const vars = await dc.variablesRequest({ variablesReference: scopes.body.scopes[0].variablesReference });
  return {
    scopes: scopes.body.scopes.map((s) => s.name),
    values: Object.fromEntries(vars.body.variables.map((v) => [v.name, v.value])),
  };
}

async function main() {
  const result = { steps: [] };
  await dc.start(scenario.port);
  const init = await withTimeout(dc.initializeRequest(scenario.initialize), "initialize");
  result.capabilities = init.body;
  const attached = withTimeout(dc.attachRequest(scenario.attach), "attach"); // not awaited: VS Code's order
  await waitEvent("initialized");
  const configuration = await Promise.all([
    ...scenario.breakpoints.map((b) =>
      dc.setBreakpointsRequest({
        source: { name: b.path.split("/").pop(), path: b.path },
        lines: b.lines,
        breakpoints: b.lines.map((line) => ({ line })),
        sourceModified: false,
      }),
    ),
    dc.setFunctionBreakpointsRequest({ breakpoints: [] }),
    dc.setExceptionBreakpointsRequest({ filters: ["uncaught"] }),
  ]);
  await withTimeout(dc.configurationDoneRequest(), "configurationDone");
  await attached;
  const threads = await dc.threadsRequest();
  result.queued = {
    breakpoints: configuration.slice(0, scenario.breakpoints.length).map((r) => r.body.breakpoints),
    threads: threads.body.threads,
  };
  console.log("CONFIGURED " + JSON.stringify(result.queued));

  // the worker starts now: verification arrives as breakpoint events under the ids we hold
  const ids = result.queued.breakpoints.flat().map((b) => b.id);
  result.verified = {};
  for (const id of scenario.direct ? [] : ids) {
    const ev = await waitEvent("breakpoint", (e) => e.body.breakpoint.id === id && e.body.breakpoint.verified);
    result.verified[id] = { reason: ev.body.reason, line: ev.body.breakpoint.line };
  }

  const first = await stoppedAt();
  result.stopped = first;
  result.locals = await locals(first.frame.id);
  result.evaluate = {};
  for (const context of ["repl", "hover", "watch"]) {
    const r = await dc.evaluateRequest({ expression: scenario.expression, frameId: first.frame.id, context });
    result.evaluate[context] = r.body.result;
  }
  await dc.nextRequest({ threadId: first.threadId });
  result.steps.push(await stoppedAt());
  await dc.stepInRequest({ threadId: first.threadId });
  result.steps.push(await stoppedAt());
  await dc.stepOutRequest({ threadId: first.threadId });
  result.steps.push(await stoppedAt());

  for (const b of scenario.breakpoints) {
    await dc.setBreakpointsRequest({ source: { path: b.path }, lines: [], breakpoints: [] });
  }
  const cont = await dc.continueRequest({ threadId: first.threadId });
  result.continued = cont.body;
  // debugpy sends no "exited" in attach mode; tether adds it with the run's exit code
  const exited = scenario.direct ? null : await waitEvent("exited");
  await waitEvent("terminated");
  result.exitCode = exited ? exited.body.exitCode : null;
  await dc.disconnectRequest({});
  console.log("RESULT " + JSON.stringify(result));
}

main()
  .then(() => process.exit(0))
  .catch((err) => {
    console.log("ERROR " + (err && err.stack ? err.stack : String(err)));
    process.exit(1);
  });
