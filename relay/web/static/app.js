// tether's web view: the little the pages need a script for. Served from the relay itself; the
// Content-Security-Policy allows no other script. Everything shown comes rendered (and escaped)
// by the relay; log text is only ever set as text.
"use strict";

const csrf = () => document.querySelector('meta[name="tether-csrf"]')?.content || "";

async function post(url, headers = {}) {
  const response = await fetch(url, {
    method: "POST",
    credentials: "same-origin",
    headers: { "X-Tether-CSRF": csrf(), ...headers },
  });
  let body = {};
  try { body = await response.json(); } catch (_) { /* an empty answer */ }
  return { ok: response.ok, status: response.status, body };
}

function say(text) {
  const flash = document.getElementById("login-error") || document.createElement("p");
  flash.className = "flash";
  flash.setAttribute("role", "alert");
  flash.textContent = text;
  flash.hidden = false;
  if (!flash.isConnected) document.querySelector("main").prepend(flash);
}

// --- logging in ----------------------------------------------------------------------------------

const NEXT = /^\/ui(\/runs\/[A-Za-z0-9_-]{1,64})?$/;

async function logIn(headers, next = "/ui") {
  const got = await post("/ui/login", headers);
  if (got.ok) { location.replace(NEXT.test(next) ? next : "/ui"); return; }
  say(got.body.error || `login refused (${got.status})`);
}

const loginForm = document.getElementById("login");
if (loginForm) {
  loginForm.addEventListener("submit", (event) => {
    event.preventDefault();
    const token = document.getElementById("token").value.trim();
    if (token) logIn({ Authorization: `Bearer ${token}` });
  });
  // a `tether ui` link: used on a click only (a link someone else made logs you in as them)
  const link = new URLSearchParams(location.hash.slice(1));
  if (link.get("code")) {
    history.replaceState(null, "", location.pathname);  // the code is good once: drop it
    document.getElementById("with-link").hidden = false;
    document.getElementById("use-link").addEventListener("click", () => {
      logIn({ "X-Tether-Login-Code": link.get("code") }, link.get("next") || "/ui");
    });
  }
}

// --- actions (cancel, rerun, log out) and copy buttons --------------------------------------------

document.addEventListener("click", async (event) => {
  const button = event.target.closest("button[data-post]");
  if (button) {
    if (button.dataset.confirm && !confirm(button.dataset.confirm)) return;
    button.disabled = true;
    const got = await post(button.dataset.post);
    button.disabled = false;
    if (!got.ok) { say(got.body.error || `refused (${got.status})`); return; }
    if (button.dataset.then) location.assign(button.dataset.then);
    else if (button.dataset.follow && got.body.url) location.assign(got.body.url);
    return;
  }
  const stacks = event.target.closest("button[data-stacks]");
  if (stacks) { readStacks(stacks); return; }
  const copy = event.target.closest("button[data-copy]");
  if (copy) {
    const text = document.getElementById(copy.dataset.copy)?.textContent || "";
    navigator.clipboard?.writeText(text).then(() => { copy.textContent = "Copied"; });
  }
});

// --- the run's processes' stacks, merged (the Ranks section): set as text, never as HTML ------------

async function readStacks(button) {
  const shown = document.getElementById("ranks");
  button.disabled = true;
  shown.setAttribute("aria-busy", "true");
  const got = await post(button.dataset.stacks);
  button.disabled = false;
  shown.removeAttribute("aria-busy");
  shown.hidden = false;
  shown.textContent = got.ok
    ? [got.body.header, ...got.body.lines].join("\n")
    : `tether: ${got.body.error || `refused (${got.status})`}`;
  shown.classList.toggle("failed", !got.ok);
  button.textContent = "Refresh";
}

// --- the log: search and follow -------------------------------------------------------------------

const logView = document.getElementById("log");
let logText = logView ? logView.textContent : "";
const search = document.getElementById("log-search");
const follow = document.getElementById("log-follow");

function showLog() {
  const needle = search?.value || "";
  logView.textContent = needle
    ? logText.split("\n").filter((line) => line.includes(needle)).join("\n")
    : logText;
  if (follow?.checked) logView.scrollTop = logView.scrollHeight;
}
if (logView) {
  search?.addEventListener("input", showLog);
  showLog();
}

// --- live updates ---------------------------------------------------------------------------------

const live = document.body.dataset.live;
const dot = document.querySelector(".live-dot");
const PAGE = 50;

function onMessage(message) {
  if (message.t === "log" && logView) {
    logText += message.text;
    showLog();
  } else if (message.t === "summary" || message.t === "debug") {
    document.getElementById(message.t)?.replaceWith(fragment(message.html));
  } else if (message.t === "row") {
    const rows = document.getElementById("runs");
    if (!rows) return;
    const old = document.getElementById(`run-${message.id}`);
    if (old && !message.match) old.remove();
    else if (old) old.replaceWith(fragment(message.html, "tbody"));
    else if (message.match && rows.dataset.first === "1") {
      rows.querySelector("tr.empty")?.remove();
      rows.prepend(fragment(message.html, "tbody"));
      while (rows.rows.length > PAGE) rows.lastElementChild.remove();
    }
  }
}

function fragment(html, parent = "div") {
  const holder = document.createElement(parent === "tbody" ? "tbody" : "div");
  holder.innerHTML = html;  // rendered and escaped by the relay
  return holder.firstElementChild;
}

// A closed live socket reloads the page (what was missed is on it then, and a lost session shows
// as the login page), soon if the socket had worked, later and later if it never opened (a relay
// refusing it, or gone): 2, 4, 8... s, at most 5 minutes, counted across reloads.
const FAILS = "tether-live-fails";

function connect() {
  const scheme = location.protocol === "https:" ? "wss:" : "ws:";
  const socket = new WebSocket(`${scheme}//${location.host}${live}`);
  let opened = false;
  socket.onopen = () => {
    opened = true;
    sessionStorage.removeItem(FAILS);
    if (dot) dot.hidden = false;
  };
  socket.onmessage = (event) => onMessage(JSON.parse(event.data));
  socket.onclose = () => {
    if (dot) dot.hidden = true;
    const fails = opened ? 0 : Number(sessionStorage.getItem(FAILS) || 0) + 1;
    sessionStorage.setItem(FAILS, String(fails));
    setTimeout(() => location.reload(), Math.min(1000 * 2 ** fails, 300000));
  };
}
if (live) connect();
