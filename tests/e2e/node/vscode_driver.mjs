// Real VS Code (code-server) in a real headless Chromium (Debian's /usr/bin/chromium, or
// $CHROMIUM), driven by playwright-core (pinned in package.json; it never downloads a browser),
// one command at a time from the test:
//
//   node vscode_driver.mjs URL SHOTS_DIR
//
// It opens URL, then reads one JSON command per line on stdin and answers each with one JSON line
// on stdout, {"ok": true, "value"?} or {"ok": false, "error"} (then DIR/failure-N.png is saved).
// Every wait has a deadline (`timeout` ms, default 20000). VS Code's CSS class names change
// between versions: the commands lean on the keyboard, ARIA roles and labels, and the test
// asserts on the DAP traffic the extension logs, with screenshots for people.
//
//   press {keys}                  keyboard shortcut(s), e.g. "F5", "Control+P" (a list: in turn)
//   type {text}                   type into whatever has focus
//   command {title}               run a command from the palette (F1, its title, Enter)
//   open {file, line?}            open a workspace file (quick open), and go to a line
//   wait_text {text, selector?}   some element (under selector, default the workbench) shows text
//   click_text {text, selector?}  click the element showing text
//   click {selector}              click the (first) element matching selector
//   expand {title}                open the view titled `title` (its header), if it is collapsed
//   hover_click {row, label}      hover the tree row showing `row`, click its action `label`
//   menu_click {row, item, within?} right-click the tree row showing `row` (in the element
//                                 `within` selects), choose `item` from its context menu
//   wait_selector {selector}      an element matching selector is shown
//   text {selector}               the text of an element
//   screenshot {name}             DIR/name.png
//   close {}                      close the browser and exit

import { createInterface } from "node:readline";
import { join } from "node:path";
import { createRequire } from "node:module";

const require = createRequire(import.meta.url);
const { chromium } = require("playwright-core");

const [url, shots] = process.argv.slice(2);
const log = (...args) => process.stderr.write(`[vscode_driver] ${args.join(" ")}\n`);
const answer = (value) => process.stdout.write(`${JSON.stringify(value)}\n`);
const WORKBENCH = ".monaco-workbench";

const browser = await chromium.launch({
  executablePath: process.env.CHROMIUM || "/usr/bin/chromium",
  headless: true,
  args: [
    "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
    "--disable-background-networking", "--disable-component-update", "--disable-sync",
  ],
});
const context = await browser.newContext({ viewport: { width: 1400, height: 900 } });
const page = await context.newPage();
page.on("pageerror", (error) => log("page error:", error.message));

async function textShown(text, selector, timeout) {
  const where = page.locator(selector || WORKBENCH);
  await where.getByText(text, { exact: false }).first().waitFor({ state: "visible", timeout });
}

async function step(s) {
  const timeout = s.timeout ?? 20000;
  switch (s.do) {
    case "press":
      for (const keys of [].concat(s.keys)) await page.keyboard.press(keys);
      return undefined;
    case "type":
      return page.keyboard.type(s.text, { delay: 20 });
    case "command":
      await page.keyboard.press("F1");
      await page.locator(".quick-input-widget input").waitFor({ state: "visible", timeout });
      await page.keyboard.type(s.title, { delay: 10 });
      await page.locator(".quick-input-list .monaco-list-row").first().waitFor({ timeout });
      await page.keyboard.press("Enter");
      return undefined;
    case "open": {
      await page.keyboard.press("Control+P");
      const input = page.locator(".quick-input-widget input");
      await input.waitFor({ state: "visible", timeout });
      await page.keyboard.type(s.file, { delay: 10 });
      await page.locator(".quick-input-list .monaco-list-row").first().waitFor({ timeout });
      await page.keyboard.press("Enter");
      await page.locator(`.tab[aria-label^="${s.file.split("/").pop()}"]`).first().waitFor({ timeout });
      if (s.line) {
        await page.locator(".monaco-editor textarea").first().focus();
        await page.keyboard.press("Control+G");
        await input.waitFor({ state: "visible", timeout });
        await page.keyboard.type(String(s.line));
        await page.keyboard.press("Enter");
      }
      return undefined;
    }
    case "wait_text":
      await textShown(s.text, s.selector, timeout);
      return undefined;
    case "click_text":
      await page.locator(s.selector || WORKBENCH).getByText(s.text, { exact: false }).first().click({ timeout });
      return undefined;
    case "click":
      await page.locator(s.selector).first().click({ timeout });
      return undefined;
    case "expand": {
      const header = page.locator(".pane-header", { hasText: s.title }).first();
      await header.waitFor({ state: "visible", timeout });
      if ((await header.getAttribute("aria-expanded")) === "false") await header.click({ timeout });
      await page.locator(`.pane-header[aria-expanded="true"]`, { hasText: s.title }).first().waitFor({ timeout });
      return undefined;
    }
    case "hover_click": {
      const row = page.locator(`${s.within || ""} .monaco-list-row`, { hasText: s.row }).first();
      await row.hover({ timeout });
      await row.locator(`[aria-label="${s.label}"]`).first().click({ timeout });
      return undefined;
    }
    case "wait_selector":
      await page.locator(s.selector).first().waitFor({ state: "visible", timeout });
      return undefined;
    case "menu_click": {
      // the row itself, not another list's that names the run too (a debug session's, say)
      const row = page.locator(`${s.within || ""} .monaco-list-row`, { hasText: s.row }).first();
      await row.click({ button: "right", timeout });
      const item = page.locator(".context-view .action-label", { hasText: s.item }).first();
      await item.waitFor({ state: "visible", timeout });
      // VS Code's menu may take a click that comes right as it opened for the right-click's own
      // release and stay open: point at the item (its menu focuses it) and press Enter
      await item.hover({ timeout });
      await page.keyboard.press("Enter");
      await page.locator(".context-view .action-label").first().waitFor({ state: "hidden", timeout });
      return undefined;
    }
    case "text":
      return page.locator(s.selector).first().innerText({ timeout });
    case "screenshot":
      await page.screenshot({ path: join(shots, `${s.name}.png`) });
      return undefined;
    default:
      throw new Error(`unknown command ${JSON.stringify(s)}`);
  }
}

let failures = 0;
try {
  await page.goto(url, { timeout: 60000 });
  await page.locator(WORKBENCH).waitFor({ state: "visible", timeout: 60000 });
  answer({ ok: true, value: "ready" });
} catch (error) {
  answer({ ok: false, error: String(error.message || error).split("\n")[0] });
  await browser.close();
  process.exit(2);
}
for await (const line of createInterface({ input: process.stdin })) {
  if (!line.trim()) continue;
  const s = JSON.parse(line);
  if (s.do === "close") break;
  log(JSON.stringify(s));
  try {
    answer({ ok: true, value: await step(s) });
  } catch (error) {
    failures += 1;
    await page.screenshot({ path: join(shots, `failure-${failures}.png`) }).catch(() => {});
    answer({ ok: false, error: String(error.message || error).split("\n")[0] });
  }
}
await browser.close();
answer({ ok: true, value: "closed" });
