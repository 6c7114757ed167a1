// Shared by the remote_exec widgets; Python prepends it to each widget's module (anywidget
// loads a module from its text, so it cannot import a sibling file).
//
// Messages from Python are {kind, seq, data}:
//   replay  {panes: {name: {pieces: [[stream, text]...], hidden: n}}, now}  -- resets the panes
//   delta   [[stream, text], ...]                                            -- new text only
//   full    {stream, purpose, text, dropped}                                 -- for Copy/Download
// A per-model Store (made in initialize, so nothing sent before a view exists is lost) holds
// the tail of every pane; views render from it and re-render only the lines that changed.

const RX_STORES = new Map(); // model _uid -> Store

const RX_SGR = /\x1b\[([0-9;]*)m/g;
const RX_OTHER_ESCAPES = /\x1b\[[0-9;?]*[@-ln-~]|\x1b\][^\x07\x1b]*(?:\x07|\x1b\\)|\x1b[@-Z\\-_]/g;

function rxSgrApply(state, params) {
  const s = { ...state };
  const codes = params === "" ? [0] : params.split(";").map((x) => parseInt(x || "0", 10));
  for (let i = 0; i < codes.length; i++) {
    const c = codes[i];
    if (c === 0) Object.assign(s, { fg: null, bg: null, bold: false, dim: false, italic: false, underline: false, inverse: false });
    else if (c === 1) s.bold = true;
    else if (c === 2) s.dim = true;
    else if (c === 3) s.italic = true;
    else if (c === 4) s.underline = true;
    else if (c === 7) s.inverse = true;
    else if (c === 22) s.bold = s.dim = false;
    else if (c === 23) s.italic = false;
    else if (c === 24) s.underline = false;
    else if (c === 27) s.inverse = false;
    else if (c >= 30 && c <= 37) s.fg = c - 30;
    else if (c >= 90 && c <= 97) s.fg = c - 90 + 8;
    else if (c === 39) s.fg = null;
    else if (c >= 40 && c <= 47) s.bg = c - 40;
    else if (c >= 100 && c <= 107) s.bg = c - 100 + 8;
    else if (c === 49) s.bg = null;
    else if ((c === 38 || c === 48) && codes[i + 1] === 5) {
      s[c === 38 ? "fg" : "bg"] = codes[i + 2];
      i += 2;
    } else if ((c === 38 || c === 48) && codes[i + 1] === 2) {
      s[c === 38 ? "fg" : "bg"] = `rgb(${codes[i + 2] | 0},${codes[i + 3] | 0},${codes[i + 4] | 0})`;
      i += 4;
    }
  }
  return s;
}

const RX_PLAIN = Object.freeze({ fg: null, bg: null, bold: false, dim: false, italic: false, underline: false, inverse: false });

function rxColour(v) {
  if (typeof v === "string") return v;
  if (v < 16) return null; // a class
  if (v < 232) {
    const n = v - 16, k = [0, 95, 135, 175, 215, 255];
    return `rgb(${k[Math.floor(n / 36)]},${k[Math.floor(n / 6) % 6]},${k[n % 6]})`;
  }
  const g = 8 + (v - 232) * 10;
  return `rgb(${g},${g},${g})`;
}

function rxSpan(text, s) {
  if (s === RX_PLAIN || (!s.fg && s.fg !== 0 && !s.bg && s.bg !== 0 && !s.bold && !s.dim && !s.italic && !s.underline && !s.inverse)) {
    return document.createTextNode(text);
  }
  const span = document.createElement("span");
  span.textContent = text;
  let [fg, bg] = s.inverse ? [s.bg, s.fg] : [s.fg, s.bg];
  if (s.inverse && fg === null) span.classList.add("rx-inverse");
  for (const [v, kind] of [[fg, "fg"], [bg, "bg"]]) {
    if (v === null || v === undefined) continue;
    const css = rxColour(v);
    if (css) span.style[kind === "fg" ? "color" : "backgroundColor"] = css;
    else span.classList.add(`rx-${kind}-${v}`);
  }
  if (s.bold) span.classList.add("rx-bold");
  if (s.dim) span.classList.add("rx-dim");
  if (s.italic) span.classList.add("rx-italic");
  if (s.underline) span.classList.add("rx-underline");
  return span;
}

// Render text holding ANSI escapes, starting in SGR state `state`, into `parent`.
function rxRenderAnsi(parent, text, state) {
  let s = state;
  let last = 0;
  RX_SGR.lastIndex = 0;
  for (let m; (m = RX_SGR.exec(text)); ) {
    if (m.index > last) parent.appendChild(rxSpan(text.slice(last, m.index).replace(RX_OTHER_ESCAPES, ""), s));
    s = rxSgrApply(s, m[1]);
    last = RX_SGR.lastIndex;
  }
  if (last < text.length) parent.appendChild(rxSpan(text.slice(last).replace(RX_OTHER_ESCAPES, ""), s));
  return s;
}

function rxSgrAfter(state, text) {
  let s = state;
  RX_SGR.lastIndex = 0;
  for (let m; (m = RX_SGR.exec(text)); ) s = rxSgrApply(s, m[1]);
  return s;
}

// One pane's tail: lines of parts {kind, text, sgr}; the last line is the unfinished one.
// Each line also carries `t`, when its first text arrived in this browser (ms since the epoch;
// unknown for replayed text): one number per kept line, so capped with the lines themselves.
// Each line array carries `v`, the version that last changed it, so every view of the pane
// (a widget can be shown twice) re-renders just what changed since it last looked.
class RxPane {
  constructor(maxLines) {
    this.maxLines = maxLines;
    this.epoch = 0;
    this.reset(0);
  }
  reset(hidden) {
    this.epoch += 1; // views render from scratch
    this.version = 0;
    this.base = 0; // lines dropped at the top since the reset (absolute index of lines[0])
    this.lines = [this.line()];
    this.hidden = hidden;
    this.sgr = {}; // kind -> SGR state at the end of what was fed
  }
  line() {
    const l = [];
    l.v = this.version;
    return l;
  }
  feed(kind, text, at) {
    if (!text) return;
    this.version += 1;
    this.lines[this.lines.length - 1].v = this.version;
    for (const bit of text.split(/(\r\n|\n|\r)/)) {
      if (bit === "\n" || bit === "\r\n") {
        this.lines.push(this.line());
      } else if (bit === "\r") {
        this.lines[this.lines.length - 1] = this.line(); // a progress bar redraws its line
      } else if (bit) {
        const line = this.lines[this.lines.length - 1];
        line.t ??= at ?? null;
        const st = this.sgr[kind] || RX_PLAIN;
        const prev = line[line.length - 1];
        if (prev && prev.kind === kind) prev.text += bit;
        else line.push({ kind, text: bit, sgr: st });
        this.sgr[kind] = bit.includes("\x1b") ? rxSgrAfter(st, bit) : st;
      }
    }
    const excess = this.lines.length - this.maxLines;
    if (excess > 0) {
      this.lines.splice(0, excess);
      this.hidden += excess;
      this.base += excess;
    }
  }
  text() {
    return this.lines.map((l) => l.map((p) => p.text).join("")).join("\n");
  }
  // Earlier lines put above the held ones (base.py's "earlier" answer: lines first..before-1,
  // each with its end); an answer for another top line (more output trimmed it meanwhile) is
  // dropped. The pane then holds them too, until as many new lines push them out again.
  prepend({ before, first, pieces }) {
    if (before !== this.hidden || !Array.isArray(pieces) || !pieces.length || !(first < before)) return false;
    const scratch = new RxPane(Infinity);
    for (const [stream, text] of pieces) scratch.feed(String(stream), String(text));
    const lines = scratch.lines;
    if (!lines[lines.length - 1].length) lines.pop(); // after the last line end: nothing
    this.version += 1;
    for (const l of lines) l.v = this.version;
    this.lines = lines.concat(this.lines);
    this.maxLines += lines.length;
    this.hidden = first;
    this.base -= lines.length;
    this.epoch += 1; // views render from scratch
    return true;
  }
}

class RxStore {
  constructor(paneOf, maxLines) {
    this.paneOf = paneOf;
    this.maxLines = maxLines;
    this.panes = {};
    this.seq = 0;
    this.offset = 0; // browser clock minus kernel clock, in seconds
    this.listeners = new Set();
  }
  pane(name) {
    return (this.panes[name] ??= new RxPane(this.maxLines));
  }
  handle(msg) {
    if (!msg || typeof msg !== "object") return;
    if (msg.kind === "replay") {
      this.seq = msg.seq;
      this.offset = Date.now() / 1000 - msg.data.now;
      for (const [name, pane] of Object.entries(this.panes)) if (!(name in msg.data.panes)) pane.reset(0);
      for (const [name, { pieces, hidden }] of Object.entries(msg.data.panes)) {
        const pane = this.pane(name);
        // A replay (each view's hello: a view is drawn anew whenever its output's record is
        // rewritten) keeps the arrival times this page saw, by absolute line number.
        const seen = new Map(pane.lines.map((l, i) => [pane.hidden + i, l.t]));
        pane.reset(hidden);
        for (const [stream, text] of pieces) pane.feed(stream, text);
        pane.lines.forEach((l, i) => {
          l.t ??= seen.get(pane.hidden + i) ?? null;
        });
      }
    } else if (msg.kind === "earlier") {
      const pane = this.panes[msg.data?.pane];
      if (pane) pane.prepend(msg.data);
    } else if (msg.kind === "delta") {
      if (msg.seq <= this.seq) return; // already in a replay
      this.seq = msg.seq;
      const at = Date.now();
      for (const [stream, text] of msg.data) this.pane(this.paneOf(stream)).feed(stream, text, at);
    }
    for (const fn of this.listeners) fn(msg);
  }
}

function rxStore(model, paneOf) {
  const uid = model.get("_uid");
  let store = RX_STORES.get(uid);
  if (!store) {
    store = new RxStore(paneOf, model.get("tail_lines") || 5000);
    RX_STORES.set(uid, store);
  }
  return store;
}

// The model-level half of a streaming widget: collect messages from the model's creation on.
function rxInitialize(model, paneOf) {
  const store = rxStore(model, paneOf);
  const onMsg = (msg) => store.handle(msg);
  model.on("msg:custom", onMsg);
  return () => {
    model.off("msg:custom", onMsg);
    RX_STORES.delete(model.get("_uid"));
  };
}

// Keeps a pane's DOM in step with its RxPane, re-rendering only the lines that changed.
class RxPaneView {
  constructor(parent, pane, onHidden) {
    this.el = document.createElement("div");
    this.el.className = "rx-pane-body";
    parent.appendChild(this.el);
    this.pane = pane;
    this.onHidden = onHidden;
    this.epoch = -1; // the pane's epoch this DOM shows
    this.stick = true; // follow the end until the user scrolls up
    this.el.addEventListener("scroll", () => {
      this.stick = this.el.scrollTop + this.el.clientHeight >= this.el.scrollHeight - 8;
    });
    this.update();
  }
  update() {
    const pane = this.pane;
    if (this.epoch !== pane.epoch) {
      this.el.textContent = "";
      Object.assign(this, { epoch: pane.epoch, base: pane.base, count: 0, seen: -1 });
    }
    // lines that fell off the top
    const dropped = Math.min(pane.base - this.base, this.count);
    for (let i = 0; i < dropped; i++) this.el.removeChild(this.el.firstChild);
    this.count -= dropped;
    this.base = pane.base;
    // lines changed since the last look: only ever at the end
    let from = Math.min(this.count, pane.lines.length);
    while (from > 0 && pane.lines[from - 1].v > this.seen) from--;
    while (this.count > from) {
      this.el.removeChild(this.el.lastChild);
      this.count--;
    }
    const frag = document.createDocumentFragment();
    for (let i = from; i < pane.lines.length; i++) {
      const div = document.createElement("div");
      div.className = "rx-line";
      for (const part of pane.lines[i]) {
        const holder = document.createElement("span");
        holder.className = `rx-kind-${part.kind}`;
        rxRenderAnsi(holder, part.text, part.sgr);
        div.appendChild(holder);
      }
      if (!pane.lines[i].length) div.classList.add("rx-empty");
      if (pane.lines[i].t) div.title = `arrived ${rxClock(pane.lines[i].t)}`;
      frag.appendChild(div);
      this.count++;
    }
    this.el.appendChild(frag);
    this.seen = pane.version;
    if (this.stick) this.el.scrollTop = this.el.scrollHeight;
    this.onHidden?.(pane.hidden);
  }
}

// The magic a disconnected view tells the user to paste, made here from its job id and sandbox
// URL by trust.py's attach_hint rules (a safe-form id; a URL of one plain printable line; both
// quoted as shlex.quote does). Never text taken from the model: a stranger's notebook can save
// any widget state, and a saved ready-made hint would be shown as ours, verbatim.
const RX_JOB_ID = /^[A-Za-z0-9][A-Za-z0-9._-]{0,127}$/;
const rxShellQuote = (s) => (/^[A-Za-z0-9_@%+=:,./-]+$/.test(s) ? s : `'${s.replace(/'/g, `'"'"'`)}'`);
function rxAttachHint(model) {
  const id = model.get("job_id");
  const url = model.get("sandbox");
  if (typeof id !== "string" || !RX_JOB_ID.test(id) || typeof url !== "string" || !/^[\x21-\x7e]{1,2048}$/.test(url)) {
    return "";
  }
  return `%exec_remote_attach ${rxShellQuote(id)} --sandbox ${rxShellQuote(url)}`;
}

// One element with an optional class and text (every view builds its DOM with it).
function rxEl(tag, cls, text) {
  const e = document.createElement(tag);
  if (cls) e.className = cls;
  if (text !== undefined) e.textContent = text;
  return e;
}

function rxButton(label, title, onClick, cls = "") {
  const b = document.createElement("button");
  b.className = `rx-button ${cls}`;
  b.textContent = label;
  b.title = title;
  b.addEventListener("click", onClick);
  return b;
}

function rxFormatDuration(s) {
  if (s < 10) return `${Math.max(s, 0).toFixed(1)} s`;
  if (s < 60) return `${Math.round(s)} s`;
  if (s < 3600) return `${Math.floor(s / 60)} min ${String(Math.floor(s % 60)).padStart(2, "0")} s`;
  return `${Math.floor(s / 3600)} h ${String(Math.floor((s % 3600) / 60)).padStart(2, "0")} min`;
}

// A wall-clock time with milliseconds, "14:03:07.412" (for arrival times).
function rxClock(ms) {
  const d = new Date(ms);
  return `${d.toLocaleTimeString([], { hour12: false })}.${String(d.getMilliseconds()).padStart(3, "0")}`;
}

function rxFormatBytes(n) {
  if (n < 1024) return `${n} B`;
  if (n < 1024 * 1024) return `${(n / 1024).toFixed(1)} KiB`;
  return `${(n / 1024 / 1024).toFixed(1)} MiB`;
}

// Say on a button what its press did ("Copied ✓"), then show its label again.
function rxFlash(button, text, ms = 1500) {
  if (!button) return;
  const label = button.dataset.label ?? button.textContent;
  button.dataset.label = label;
  button.textContent = text;
  clearTimeout(button.rxFlashTimer);
  button.rxFlashTimer = setTimeout(() => {
    button.textContent = label;
  }, ms);
}

// Copy or download the text Python sent back for a "fetch"; a copy is confirmed on `button`.
function rxDeliver({ purpose, text, stream }, filename, button) {
  if (purpose === "download") {
    const a = document.createElement("a");
    a.href = URL.createObjectURL(new Blob([text], { type: "text/plain" }));
    a.download = filename || `${stream || "output"}.txt`;
    document.body.appendChild(a);
    a.click();
    setTimeout(() => {
      URL.revokeObjectURL(a.href);
      a.remove();
    }, 1000);
    return;
  }
  const lines = text ? text.split("\n").length - (text.endsWith("\n") ? 1 : 0) : 0;
  const done = () => {
    rxFlash(button, `Copied ✓ (${lines.toLocaleString()} lines)`);
    // What the last copy delivered, kept after the 1.5 s flash (a loaded page or a glance away
    // can miss the flash; a browser test waits on this, not on the flash).
    if (button) button.dataset.copied = String(lines);
  };
  const fallback = () => {
    const ta = document.createElement("textarea");
    ta.value = text;
    document.body.appendChild(ta);
    ta.select();
    try {
      if (document.execCommand("copy")) done();
      else rxFlash(button, "Copy failed");
    } finally {
      ta.remove();
    }
  };
  if (navigator.clipboard?.writeText) navigator.clipboard.writeText(text).then(done, fallback);
  else fallback();
}

// A view's sender for messages whose order matters (keystrokes, stdin lines): each is numbered
// within the view, and Python hands them on in that order (the kernel may swap two comm messages,
// and two requests of the control route may overtake each other). They go as controls.
function rxOrderedSender(model, button) {
  const view = Math.random().toString(36).slice(2) + Date.now().toString(36);
  let n = 0;
  return (content) => rxControl(model, { ...content, view, n: n++ }, button);
}

// -- controls that act while the kernel is busy -------------------------------------------------
// Comm messages wait behind a running cell. A widget whose kernel serves a control socket has a
// `controls` trait ({socket, token, widget}); its controls are then POSTed to the Jupyter Server
// route remote-exec/controls/<socket> (remote_exec/jupyter/control_route.py), which hands them to
// the kernel's loop thread at once. Without it (no trait, no page config, the route refused) the
// comm carries them; one it has not acknowledged within RX_BUSY_MS is flagged on its button.

const RX_BUSY_MS = 1500;
const RX_BUSY_TEXT = "kernel busy: use ■";

function rxPageConfig() {
  if (rxPageConfig.cached !== undefined) return rxPageConfig.cached;
  const el = document.getElementById("jupyter-config-data");
  let config = null;
  try {
    config = el ? JSON.parse(el.textContent) : null;
  } catch {
    config = null;
  }
  rxPageConfig.cached = config;
  return config;
}

function rxCookie(name) {
  const m = document.cookie.match(new RegExp(`(?:^|;\\s*)${name}=([^;]*)`));
  return m ? decodeURIComponent(m[1]) : "";
}

// The request that sends `content` by the control route, or null when there is none.
function rxControlRequest(model, content) {
  const controls = model.get("controls");
  const config = rxPageConfig();
  if (!controls || !controls.socket || !controls.token || !config || typeof config.baseUrl !== "string") return null;
  const base = config.baseUrl.endsWith("/") ? config.baseUrl : `${config.baseUrl}/`;
  const headers = { "Content-Type": "application/json", "X-Remote-Exec-Token": controls.token };
  if (config.token) headers.Authorization = `token ${config.token}`;
  const xsrf = rxCookie("_xsrf");
  if (xsrf) headers["X-XSRFToken"] = xsrf;
  return {
    url: `${base}remote-exec/controls/${encodeURIComponent(controls.socket)}`,
    init: { method: "POST", credentials: "same-origin", headers, body: JSON.stringify({ ...content, widget: controls.widget }) },
  };
}

// Mark `root` with the route its controls take now (data-controls: "socket" or "comm"); returns
// the function that stops following the trait.
function rxMarkControls(model, root) {
  const mark = () => {
    root.dataset.controls = rxControlRequest(model, {}) ? "socket" : "comm";
  };
  mark();
  model.on("change:controls", mark);
  return () => model.off("change:controls", mark);
}

// While a person presses a button or types in this view, the kernel holds back the one rewrite
// of the view's output (its final record, at the job's end; records before it go into a draft
// beside the view): JupyterLab's widget renderer re-creates the whole view for a rewritten
// output, and a press that spans it never clicks (Chromium drops a click whose mousedown node
// left the page), a field loses its focus. Sent by the control route when there is one (it
// acts while the kernel runs a cell). Returns the function that stops (and releases).
function rxHoldRecord(model, root) {
  let pressing = false;
  let typing = false;
  let held = false;
  const sync = () => {
    const now = pressing || typing;
    if (now !== held) {
      held = now;
      rxControl(model, { type: "hold", on: now });
    }
  };
  const down = () => { pressing = true; sync(); };
  const up = () => { if (pressing) { pressing = false; sync(); } };
  const focusIn = (e) => { typing = e.target instanceof HTMLInputElement || e.target instanceof HTMLTextAreaElement; sync(); };
  const focusOut = () => { typing = false; sync(); };
  root.addEventListener("pointerdown", down, true);
  window.addEventListener("pointerup", up, true);
  window.addEventListener("pointercancel", up, true);
  root.addEventListener("focusin", focusIn);
  root.addEventListener("focusout", focusOut);
  return () => {
    root.removeEventListener("pointerdown", down, true);
    window.removeEventListener("pointerup", up, true);
    window.removeEventListener("pointercancel", up, true);
    root.removeEventListener("focusin", focusIn);
    root.removeEventListener("focusout", focusOut);
    pressing = typing = false;
    sync();
  };
}

// Acknowledgements of comm-sent controls, per model: id -> callback.
const RX_ACKS = new WeakMap();

function rxAcks(model) {
  let acks = RX_ACKS.get(model);
  if (!acks) {
    acks = new Map();
    RX_ACKS.set(model, acks);
    model.on("msg:custom", (msg) => {
      if (msg && msg.kind === "ack" && acks.has(msg.id)) {
        acks.get(msg.id)();
        acks.delete(msg.id);
      }
    });
  }
  return acks;
}

// The comm route: the kernel acknowledges what it handled; no acknowledgement within RX_BUSY_MS
// means the kernel is busy, and `button` says so until the acknowledgement comes.
function rxControlByComm(model, content, button) {
  const id = Math.random().toString(36).slice(2);
  const acks = rxAcks(model);
  let flagged = null;
  const timer = setTimeout(() => {
    if (!button || !acks.has(id)) return;
    flagged = { text: button.textContent, title: button.title };
    button.textContent = RX_BUSY_TEXT;
    button.title = "The kernel runs a cell: this waits for it to end. Interrupt the kernel (■) to stop a foreground job now.";
    button.classList.add("rx-busy");
  }, RX_BUSY_MS);
  acks.set(id, () => {
    clearTimeout(timer);
    if (flagged && button.textContent === RX_BUSY_TEXT) {
      button.textContent = flagged.text;
      button.title = flagged.title;
      button.classList.remove("rx-busy");
    }
  });
  model.send({ ...content, ack: id });
}

// Send a control (kill, interrupt, stdin, fetch, input...): by the route if the kernel serves one,
// else (or if the route failed) by the comm. `button`, if given, shows a busy kernel.
function rxControl(model, content, button) {
  const request = rxControlRequest(model, content);
  if (!request) {
    rxControlByComm(model, content, button);
    return;
  }
  // Only the kernel's own answer counts: a server without the route may answer with a redirect
  // or a page (status 200), and the control would be lost.
  fetch(request.url, { ...request.init, redirect: "error" })
    .then((r) => (r.ok ? r.json() : null))
    .then(
      (answer) => {
        if (!answer || answer.ok !== true) rxControlByComm(model, content, button);
      },
      () => rxControlByComm(model, content, button),
    );
}

// A pane's find box: the lines the pane holds that contain the text (any case) are marked,
// Enter scrolls to the next one (Shift+Enter: the previous) and "3/12" says where. Earlier
// lines are searched once they are shown ("Earlier"); Copy and Download have the whole text.
function rxFindBox(stream, viewOf) {
  const el = rxEl("span", "rx-find");
  el.setAttribute("data-lm-suppress-shortcuts", "true"); // typed letters are the search's, not the notebook's
  const input = rxEl("input", "rx-find-input");
  input.type = "search";
  input.placeholder = "find";
  input.title = `Find in the ${stream} lines shown (Enter: next, Shift+Enter: previous)`;
  const count = rxEl("span", "rx-muted rx-find-count");
  el.append(input, count);
  let at = -1;
  const mark = () => {
    const q = input.value.toLowerCase();
    const lines = [...viewOf().el.children];
    for (const l of lines) l.classList.remove("rx-match", "rx-match-current");
    const found = q ? lines.filter((l) => l.textContent.toLowerCase().includes(q)) : [];
    for (const l of found) l.classList.add("rx-match");
    return found;
  };
  input.addEventListener("input", () => {
    at = -1;
    const found = mark();
    count.textContent = input.value ? `${found.length}` : "";
  });
  input.addEventListener("keydown", (e) => {
    if (e.key !== "Enter") return;
    e.preventDefault();
    const found = mark();
    if (!found.length) {
      count.textContent = input.value ? "0" : "";
      return;
    }
    const from = at < 0 ? (e.shiftKey ? 0 : -1) : Math.min(at, found.length - 1);
    at = (from + (e.shiftKey ? -1 : 1) + found.length) % found.length;
    found[at].classList.add("rx-match-current");
    viewOf().stick = false; // stay at the match while output goes on
    found[at].scrollIntoView({ block: "nearest" });
    count.textContent = `${at + 1}/${found.length}`;
  });
  return { el };
}
