// The debugger's responsiveness during an output flood, seen by VS Code's own client: Microsoft's
// DebugClient (@vscode/debugadapter-testsupport, the pinned copy in tests/e2e/node/node_modules).
//
//   node flood_probe.mjs cfg.json      -> one JSON result line on stdout
//
// cfg: {port, initialize, attach, intervalMs, pauseAfterOutputMs, windowMs, afterStopMs}
// VS Code's attach order (initialize, attach not awaited, `initialized`, setExceptionBreakpoints,
// configurationDone, threads, the attach response). Then a `threads` request every intervalMs (not
// waiting for the previous one; those sent between the first output and `stopped` are marked
// `during`) and one `pause`, pauseAfterOutputMs after the first of the
// program's stdout arrived; after `stopped`, `n` (the program's line counter) is evaluated in the
// stopped frame, and afterStopMs more of `threads`. The run ends at windowMs after
// configurationDone at the latest; then `disconnect` with terminateDebuggee.
// Times are milliseconds on one monotonic clock; a request still unanswered at the end has ms null.
import { readFileSync } from "node:fs";
import { createRequire } from "node:module";
import { performance } from "node:perf_hooks";

const require = createRequire(new URL("../tests/e2e/node/package.json", import.meta.url));
const { DebugClient } = require("@vscode/debugadapter-testsupport");
const cfg = JSON.parse(readFileSync(process.argv[2], "utf8"));
const now = () => performance.now();
const log = (...a) => process.stderr.write(`[flood_probe ${now().toFixed(0)}] ${a.join(" ")}\n`);

const dc = new DebugClient("unused", "unused", "debugpy");
const responses = new Map(); // request_seq -> {t, msg}
const waiters = new Set();
let outLines = 0;
let firstOutput = null;
let stopped = null;
let initialized = false;

const dispatch = dc.dispatch.bind(dc);
dc.dispatch = (body) => {
  const t = now();
  const msg = JSON.parse(body);
  if (msg.type === "event") {
    if (msg.event === "output" && msg.body?.category === "stdout") {
      const s = msg.body.output ?? "";
      for (let i = s.indexOf("\n"); i >= 0; i = s.indexOf("\n", i + 1)) outLines++;
      if (firstOutput === null) firstOutput = t;
    } else if (msg.event === "initialized") {
      initialized = true;
    } else if (msg.event === "stopped" && stopped === null) {
      stopped = { t, lines: outLines };
    }
  } else if (msg.type === "response") {
    responses.set(msg.request_seq, { t, msg });
  }
  for (const w of [...waiters]) w();
  dispatch(body);
};

function send(command, args) {
  const sent = { seq: dc.sequence, t: now(), command };
  dc.customRequest(command, args).catch(() => {});
  return sent;
}
function waitFor(probe, ms, what) {
  return new Promise((resolve, reject) => {
    const check = () => {
      const v = probe();
      if (v !== undefined) { clearTimeout(timer); waiters.delete(check); resolve(v); }
    };
    const timer = setTimeout(() => { waiters.delete(check); reject(new Error(`no ${what} within ${ms} ms`)); }, ms);
    waiters.add(check);
    check();
  });
}
const answer = (sent, ms, what) => waitFor(() => responses.get(sent.seq), ms, what);
const sleep = (ms) => new Promise((r) => setTimeout(r, ms));

async function main() {
  await dc.start(cfg.port);
  dc._socket.setNoDelay(true);
  await answer(send("initialize", cfg.initialize), 60000, "initialize response");
  const attach = send("attach", cfg.attach);
  await waitFor(() => (initialized ? true : undefined), 120000, "initialized");
  await answer(send("setExceptionBreakpoints", { filters: [] }), 60000, "setExceptionBreakpoints");
  await answer(send("configurationDone", {}), 120000, "configurationDone");
  const tCD = now();
  const first = await answer(send("threads"), 120000, "first threads");
  const threadId = first.msg.body?.threads?.[0]?.id ?? 1;
  await answer(attach, 120000, "attach response");
  log(`configured; thread ${threadId}`);
  const probes = [];
  let pause = null;
  let counter = null;
  let next = now();
  const end = tCD + cfg.windowMs;
  while (now() < end) {
    const t = now();
    if (stopped && t >= stopped.t + cfg.afterStopMs) break;
    if (!pause && firstOutput !== null && t >= firstOutput + cfg.pauseAfterOutputMs) {
      pause = send("pause", { threadId });
      log("pause sent");
    }
    if (stopped && counter === null) {
      counter = (async () => {
        const stack = await answer(send("stackTrace", { threadId, levels: 1 }), 20000, "stackTrace");
        const frameId = stack.msg.body?.stackFrames?.[0]?.id;
        const value = await answer(send("evaluate", { expression: "n", frameId, context: "watch" }), 20000, "evaluate");
        return value.msg.success ? Number(value.msg.body.result) : null;
      })().catch(() => null);
    }
    if (t >= next) {
      probes.push(send("threads"));
      next += cfg.intervalMs;
    }
    await sleep(10);
  }
  const tEnd = now();
  // a request sent after the program's output began and before `stopped`: during the flood
  const during = (s) => firstOutput !== null && s.t >= firstOutput && (stopped === null || s.t < stopped.t);
  const result = (s) => {
    const r = responses.get(s.seq);
    const answer = r ? { ms: r.t - s.t, success: r.msg.success } : { ms: null, waitedMs: tEnd - s.t };
    return { ...answer, during: during(s) };
  };
  const out = {
    probes: probes.map(result),
    pause: pause ? { ...result(pause), sentAfterOutputMs: pause.t - firstOutput } : null,
    pauseToStoppedMs: pause && stopped ? stopped.t - pause.t : null,
    linesBeforeStopped: stopped ? stopped.lines : null,
    printedAtStop: counter ? await counter : null,
    lines: outLines,
  };
  process.stdout.write(JSON.stringify(out) + "\n");
  try {
    await answer(send("disconnect", { terminateDebuggee: true }), 10000, "disconnect");
  } catch (e) {
    log(e.message);
  }
  dc._socket.destroy();
  process.exit(0);
}
main().catch((e) => {
  log("FAILED", e.stack);
  process.stdout.write(JSON.stringify({ error: String(e) }) + "\n");
  process.exit(1);
});
