// A scripted browser session against tether's web view, in a real headless Chromium (Debian's
// /usr/bin/chromium, or $CHROMIUM), driven by playwright-core 1.65.1 (pinned in package.json; it
// never downloads a browser).
//
//   node web_scenario.mjs scenario.json
//
// scenario.json: {"base": "http://127.0.0.1:PORT", "shots": "DIR", "steps": [...]}. Each step is an
// object with `do` and its arguments; every wait has a deadline (`timeout` ms, default 20000):
//
//   goto {path, status?}            navigate; with `status`, the answer must have it
//   fill {selector, value}          type into an input
//   click {selector, dialog?}       click (dialog: "accept" answers a confirm() yes)
//   wait_url {path}                 the page's path becomes `path` (a regexp when it starts with ^)
//   wait_text {selector, text}      the element's text contains `text`
//   wait_visible {selector}         the element is visible
//   wait_gone {selector}            no element matches
//   text {selector, as}             store the element's text under `as`
//   touch {file}                    create a file (a program under test waits for it)
//   screenshot {name, full?}        save DIR/name.png
//   timing {as}                     store the last navigation's duration (ms, start to load)
//
// The result is the LAST line of stdout (JSON): {"ok", "values", "failed"?: {"step", "error"}};
// a failed step also saves DIR/failure.png. Exit status: 0 passed, 1 a step failed, 2 no run.

import { existsSync, readFileSync, writeFileSync } from "node:fs";
import { join } from "node:path";
import { createRequire } from "node:module";

const require = createRequire(import.meta.url);
const { chromium } = require("playwright-core");

const scenario = JSON.parse(readFileSync(process.argv[2], "utf8"));
const executablePath = process.env.CHROMIUM || "/usr/bin/chromium";
const values = {};
const log = (...args) => process.stderr.write(`[web_scenario] ${args.join(" ")}\n`);

function pathMatches(url, want) {
  const path = new URL(url).pathname;
  return want.startsWith("^") ? new RegExp(want).test(path) : path === want;
}

async function step(page, s) {
  const timeout = s.timeout ?? 20000;
  switch (s.do) {
    case "goto": {
      const response = await page.goto(scenario.base + s.path, { timeout });
      if (s.status !== undefined && response.status() !== s.status) {
        throw new Error(`${s.path} answered ${response.status()}, not ${s.status}`);
      }
      return;
    }
    case "fill":
      return page.fill(s.selector, s.value, { timeout });
    case "click":
      if (s.dialog) page.once("dialog", (dialog) => dialog.accept());
      return page.click(s.selector, { timeout });
    case "wait_url":
      return page.waitForURL((url) => pathMatches(url.href, s.path), { timeout });
    case "wait_text":
      return page.waitForFunction(
        ([selector, text]) => document.querySelector(selector)?.textContent.includes(text),
        [s.selector, s.text],
        { timeout },
      );
    case "wait_visible":
      return page.waitForSelector(s.selector, { state: "visible", timeout });
    case "wait_gone":
      return page.waitForSelector(s.selector, { state: "detached", timeout });
    case "text":
      values[s.as] = await page.textContent(s.selector, { timeout });
      return;
    case "touch":
      writeFileSync(s.file, "go\n");
      return;
    case "timing":
      values[s.as] = await page.evaluate(
        () => performance.getEntriesByType("navigation")[0]?.duration ?? null,
      );
      return;
    case "screenshot":
      return page.screenshot({ path: join(scenario.shots, `${s.name}.png`), fullPage: !!s.full });
    default:
      throw new Error(`unknown step ${JSON.stringify(s)}`);
  }
}

let browser;
try {
  if (!existsSync(executablePath)) throw new Error(`no Chromium at ${executablePath}`);
  browser = await chromium.launch({
    executablePath,
    headless: true,
    args: [
      "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
      "--disable-background-networking", "--disable-component-update", "--disable-sync",
    ],
  });
} catch (error) {
  console.log(JSON.stringify({ ok: false, values, failed: { step: -1, error: String(error) } }));
  process.exit(2);
}
const context = await browser.newContext({ viewport: { width: 1280, height: 800 } });
const page = await context.newPage();
page.on("console", (message) => log("console:", message.type(), message.text()));
page.on("pageerror", (error) => log("page error:", error.message));
let failed;
for (const [i, s] of scenario.steps.entries()) {
  log(`step ${i}: ${JSON.stringify(s)}`);
  try {
    await step(page, s);
  } catch (error) {
    failed = { step: i, do: s.do, error: String(error.message || error).split("\n")[0] };
    await page.screenshot({ path: join(scenario.shots, "failure.png") }).catch(() => {});
    values.failure_url = page.url();
    values.failure_html = (await page.content().catch(() => "")).slice(0, 4000);
    break;
  }
}
await browser.close();
console.log(JSON.stringify({ ok: !failed, values, ...(failed ? { failed } : {}) }));
process.exit(failed ? 1 : 0);
