// remote_exec's JupyterLab extension: a record saved in a notebook gets its way back to a live view.
//
// The server's pre-save hook (remote_exec/jupyter/saving.py) stores each view as its record
// (text/plain, text/html) plus RECORD_MIME: its kind and what its Reconnect needs (a job's id,
// sandbox URL, label and state; a shell's session id; a dashboard's sandboxes) and the record's
// HTML. This one plugin renders RECORD_MIME: the record (sanitized: a notebook file is not to be
// trusted) and, while the notebook has a kernel, one button -- Reconnect (a running job, an open
// shell), Open live view (a job that ended), Open live dashboard -- that runs the matching call
// of remote_exec.jupyter.attach in that kernel with the output routed into this same cell (as a
// cell's own run is), so the live view takes the record's place and its records (in a draft
// beside it) follow into that output: the next save stores a fresh one. When the kernel up already shows a view of the job (the
// page was reloaded), the view comes back by itself: a silent user_expressions query asks, which
// imports nothing into a kernel that never used remote_exec and starts nothing. A live view's own
// Reconnect (after a kernel restart) is routed the same way when this extension is there.
//
// A notebook is a stranger's document: an untrusted one gets the button only for a sandbox URL
// one click may open (ONE_CLICK below), otherwise the exact magic to type, quoted. The kernel's
// reconnect() checks again (remote_exec/jupyter/trust.py): the authority is there.
import { IRenderMimeRegistry, renderHTML } from "@jupyterlab/rendermime";
import { Widget } from "@lumino/widgets";

const RECORD_MIME = "application/vnd.remote-exec.record+json";
// A live view's draft record (remote_exec/jupyter/record.py): rewritten beside the view so the view
// itself is never re-rendered; the saver moves its record into the view's output. Shown as nothing.
const DRAFT_MIME = "application/vnd.remote-exec.draft+json";

class DraftRenderer extends Widget {
  constructor() {
    super();
    this.addClass("rx-record-draft");
  }

  renderModel() {
    return Promise.resolve();
  }

  // style/index.css hides the output's row with :has(); a browser without it (Firefox < 121)
  // would show an empty row per draft, so the row is hidden here too.
  onAfterAttach() {
    const row = this.node.closest(".jp-OutputArea-child");
    if (row) row.style.display = "none";
  }
}
const UP = new Set(["idle", "busy"]);

// A JSON string is a valid Python str literal: the only way a value from the file reaches code.
// Every non-ASCII character is escaped too: IPython splits a cell's lines on U+2028, U+2029 and
// U+0085 (str.splitlines) before Python sees the literal.
const py = (value) =>
  JSON.stringify(String(value)).replace(/[^\x00-\x7e]/gu, (c) => {
    const cp = c.codePointAt(0);
    return cp > 0xffff ? `\\U${cp.toString(16).padStart(8, "0")}` : `\\u${cp.toString(16).padStart(4, "0")}`;
  });

// A notebook file is not to be trusted (it need not have passed our saver): a record is acted on
// only with a job id of the safe form (remote_exec/protocol/names.py) and a sandbox URL of a sane
// length, as the saver writes.
const JOB_ID = /^[A-Za-z0-9][A-Za-z0-9._-]{0,127}$/;
const MAX_URL = 2048;
const MAX_SANDBOXES = 64; // saving.py's MAX_SANDBOXES
const saneUrl = (url) => typeof url === "string" && url.length > 0 && url.length <= MAX_URL;
const ENDED = new Set(["completed", "failed", "killed", "timed out", "error"]);

// What a record's button runs, by kind: [the call of remote_exec.jupyter.attach, its arguments,
// the sandbox URLs it opens], or null when there is nothing to reconnect to (a malformed record,
// a closed shell).
function request(rec) {
  if (rec.kind === "dashboard") {
    const urls = Array.isArray(rec.sandboxes) ? rec.sandboxes.map(String) : [];
    return urls.length && urls.length <= MAX_SANDBOXES && urls.every(saneUrl) ? ["reconnect_dashboard", urls, urls] : null;
  }
  if (!saneUrl(rec.sandbox)) return null;
  if (rec.kind === "shell") {
    const id = rec.session_id; // "new" and "last" are words, not sessions (attach.py refuses them too)
    return JOB_ID.test(id) && id !== "new" && id !== "last" && rec.state === "open"
      ? ["reconnect_shell", [rec.sandbox, id], [rec.sandbox]]
      : null;
  }
  return rec.kind === "job" && JOB_ID.test(rec.job_id) ? ["reconnect", [rec.sandbox, rec.job_id], [rec.sandbox]] : null;
}

// The button's words, by kind and state.
function buttonText(rec) {
  if (rec.kind === "dashboard") return "Open live dashboard";
  return rec.kind === "job" && ENDED.has(rec.state) ? "Open live view" : "Reconnect";
}

// The sandbox URLs one click may open (remote_exec/jupyter/trust.py's ONE_CLICK_URLS, which the
// kernel checks again): forms that can run no host program, mount or choose no host path and
// create no sandbox. Any other URL in an untrusted notebook gets no button: the magic to type.
const ONE_CLICK = [/^local:\/\/(?:\?scope=(?:project|user))?$/, /^(?:docker|podman):\/\/[A-Za-z0-9][A-Za-z0-9_.-]{0,127}$/];
const oneClick = (url) => ONE_CLICK.some((re) => re.test(url));

// shlex.quote's rule: a word of safe characters as is, anything else in single quotes.
const shellQuote = (s) => (/^[A-Za-z0-9_@%+=:,./-]+$/.test(s) ? s : `'${s.replace(/'/g, `'"'"'`)}'`);
// attach_hint, shell_hint and jobs_hint (trust.py): the magic, quoted; none for a URL that is not
// one plain printable line (quoting keeps a value in one word, not in one line: pasted, the rest
// would be Python).
const showable = (url) => /^[\x21-\x7e]{1,2048}$/.test(url);
function hintOf(rec) {
  if (rec.kind === "dashboard") {
    const urls = rec.sandboxes.map(String);
    // %remote_jobs expands {expr} and $var (trust.py's jobs_hint): no hint names such a URL
    const plain = (u) => showable(u) && !/[{}$]/.test(u);
    return urls.every(plain) ? `%remote_jobs ${urls.map((u) => `--sandbox ${shellQuote(u)}`).join(" ")}` : null;
  }
  if (!showable(rec.sandbox)) return null;
  if (rec.kind === "shell") return `%remote_shell --shell ${shellQuote(rec.session_id)} --sandbox ${shellQuote(rec.sandbox)}`;
  return `%exec_remote_attach ${shellQuote(rec.job_id)} --sandbox ${shellQuote(rec.sandbox)}`;
}

// The --name a cell's own %%exec_remote line gives (passed to Reconnect for a trusted cell only:
// an untrusted one is a stranger's text, which must not choose a kernel variable).
function cellName(cell) {
  const first = String(cell.model.sharedModel.getSource()).split("\n", 1)[0];
  const found = /^%%exec_remote\s.*--name[ =]([A-Za-z_][A-Za-z0-9_]{0,63})(?:\s|$)/.exec(first);
  return found && cell.model.trusted ? [found[1]] : [];
}

// What the probe asks: True only when remote_exec is loaded and holds an open view of the job.
const probe = (jobId) =>
  `__import__("sys").modules.get("remote_exec.jupyter.job_view") is not None and ` +
  `__import__("remote_exec.jupyter.attach", fromlist=["live_view"]).live_view(${py(jobId)})`;

const CALLS = new Set(["reconnect", "reconnect_shell", "reconnect_dashboard", "show_again"]);
// How many arguments a widget's Reconnect may pass to each call (a third to `reconnect` would
// name a kernel variable: only the extension adds it, for a trusted cell's own --name).
const WIDGET_ARGS = { reconnect: [2, 2], reconnect_shell: [2, 2], reconnect_dashboard: [1, MAX_SANDBOXES] };
const call = (name, ...args) => {
  if (!CALLS.has(name)) throw new Error(`remote-exec: no such call ${name}`);
  return `__import__("remote_exec.jupyter.attach", fromlist=[${py(name)}]).${name}(${args.map(py).join(", ")})`;
};

class RecordRenderer extends Widget {
  constructor(options, app) {
    super();
    this.addClass("rx-record");
    this._options = options;
    this._app = app;
    this._record = null;
    this._panel = null; // the notebook panel and cell showing this record, found once attached
    this._cell = null;
    this._probed = false;
    this._bar = document.createElement("div");
    this._bar.className = "rx-record-bar";
    this._button = document.createElement("button");
    this._button.className = "rx-record-reconnect jp-mod-styled jp-mod-accept";
    this._button.textContent = "Reconnect";
    this._button.hidden = true;
    this._button.addEventListener("click", () => {
      const [fn, args] = this._request;
      const name = fn === "reconnect" && this._cell ? cellName(this._cell) : [];
      this._run(fn, ...args, ...name);
    });
    // In place of the button, for a URL one click may not open: the exact magic, for the user to
    // read and run (or not).
    this._hint = document.createElement("div");
    this._hint.className = "rx-record-hint";
    this._hint.hidden = true;
    this._bar.append(this._button, this._hint);
    this._html = document.createElement("div");
    this.node.append(this._bar, this._html);
  }

  async renderModel(model) {
    const raw = model.data[RECORD_MIME];
    const rec = raw && typeof raw === "object" ? raw : {};
    const kind = rec.kind === "shell" || rec.kind === "dashboard" ? rec.kind : "job"; // no kind: a job's
    this._record = {
      kind,
      job_id: String(rec.job_id ?? ""),
      session_id: String(rec.session_id ?? ""),
      sandboxes: Array.isArray(rec.sandboxes) ? rec.sandboxes.slice(0, MAX_SANDBOXES + 1) : [],
      sandbox: String(rec.sandbox ?? ""),
      label: String(rec.label ?? ""),
      state: String(rec.state ?? ""),
    };
    this._request = request(this._record); // null: shown, never acted on
    const urls = this._request ? this._request[2] : [];
    // An untrusted notebook (not signed by this user's server: e.g. downloaded) names on the
    // button itself the sandbox a click connects the kernel to, and is not asked about on render.
    this._trusted = Boolean(model.trusted);
    this._oneClick = this._trusted || urls.every(oneClick);
    if (this._request && !this._oneClick) {
      const hint = hintOf(this._record);
      this._hint.textContent =
        "This notebook is not trusted, and its record names a sandbox that Reconnect does not open" +
        (hint ? ". If you trust it, run: " : ` (its URL cannot be shown on one line): ${JSON.stringify(urls.join(" "))}`);
      if (hint) {
        const code = document.createElement("code");
        code.textContent = hint;
        this._hint.append(code);
      }
    }
    const what = kind === "dashboard" ? `the jobs of ${urls.join(", ")}` : kind === "shell"
      ? `shell ${this._record.session_id} in ${this._record.sandbox}`
      : `job ${this._record.job_id} (${this._record.label}) from ${this._record.sandbox}`;
    this._button.textContent = this._trusted ? buttonText(this._record) : `${buttonText(this._record)} to ${urls.join(", ")}`;
    this._button.title = `A live view of ${what}, in this notebook's kernel`;
    const o = this._options;
    await renderHTML({
      host: this._html,
      source: String(rec.html ?? ""),
      trusted: false, // sanitized whatever the notebook's trust: no script, no event handler
      sanitizer: o.sanitizer,
      resolver: o.resolver,
      linkHandler: o.linkHandler,
      shouldTypeset: false,
      latexTypesetter: null,
      translator: o.translator,
    });
    this._update();
  }

  onAfterAttach(msg) {
    super.onAfterAttach(msg);
    const found = !this._panel && cellOf(this._app, this.node); // none in a cloned output view
    if (found) {
      this._panel = found.panel;
      this._cell = found.cell;
      this._panel.sessionContext.statusChanged.connect(this._update, this);
      this._panel.sessionContext.kernelChanged.connect(this._update, this);
    }
    this._update();
  }

  dispose() {
    if (this._panel && !this._panel.isDisposed) {
      this._panel.sessionContext.statusChanged.disconnect(this._update, this);
      this._panel.sessionContext.kernelChanged.disconnect(this._update, this);
    }
    super.dispose();
  }

  _kernel() {
    return kernelOf(this._panel);
  }

  _update() {
    if (this.isDisposed || !this._record) return;
    const kernel = this._kernel();
    this._button.hidden = !kernel || !this._request || !this._oneClick;
    this._hint.hidden = !this._request || this._oneClick;
    if (kernel && this._request && this._record.kind === "job" && this._trusted && !this._probed) {
      this._probed = true; // once per rendering: a kernel that holds no view now will not later
      this._probe(kernel);
    }
  }

  async _probe(kernel) {
    try {
      const future = kernel.requestExecute({
        code: "",
        silent: true,
        store_history: false,
        user_expressions: { rx: probe(this._record.job_id) },
      });
      const reply = await future.done;
      const answer = reply.content.user_expressions && reply.content.user_expressions.rx;
      if (answer && answer.status === "ok" && answer.data["text/plain"] === "True") {
        this._run("show_again", this._record.job_id);
      }
    } catch (err) {
      console.warn("remote-exec: could not ask the kernel for a live view", err);
    }
  }

  _run(name, ...args) {
    const kernel = this._kernel();
    if (!kernel || !this._cell || this._cell.isDisposed) return;
    this._button.disabled = true;
    this._button.textContent = "Reconnecting…";
    runInCell(kernel, this._cell.outputArea, call(name, ...args));
  }
}

// Run ``code`` in the kernel with its output routed into ``area``, as the cell's own run is (so
// display updates, a view's rewritten records, land there too, and the next save stores them).
// The area is cleared for it; if the code fails, what it showed comes back above the error.
function runInCell(kernel, area, code) {
  const before = area.model.toJSON();
  const content = { code, silent: false, store_history: false, stop_on_error: false };
  const future = kernel.requestExecute(content, false); // kept open: the view's records come later
  area.future = future;
  future.done.then(
    (reply) => {
      if (reply.content.status !== "ok" && area.future === future && !area.isDisposed) {
        const after = area.model.toJSON();
        area.model.clear();
        area.model.fromJSON([...before, ...after]);
      }
    },
    () => {},
  );
}

// The notebook panel and code cell whose DOM holds ``node``, or null.
function cellOf(app, node) {
  for (const w of app.shell.widgets("main")) {
    if (!w.sessionContext || !w.content || !w.content.widgets || !w.node.contains(node)) continue;
    const cell = w.content.widgets.find((c) => c.outputArea && c.node.contains(node));
    return cell ? { panel: w, cell } : null;
  }
  return null;
}

function kernelOf(panel) {
  const kernel = panel && panel.sessionContext.session && panel.sessionContext.session.kernel;
  return kernel && UP.has(kernel.status) ? kernel : null;
}

// A disconnected widget's own Reconnect (remote_exec/jupyter/static/connection.js) asks here
// first: handled, the live view replaces that cell's output, so its records reach the notebook
// (otherwise the saved record would stay the one from before the restart).
function onWidgetReconnect(app, event) {
  const found = cellOf(app, event.target);
  const kernel = found && kernelOf(found.panel);
  const detail = event.detail || {};
  const args = Array.isArray(detail.args) ? detail.args : null;
  const count = Object.hasOwn(WIDGET_ARGS, detail.fn) ? WIDGET_ARGS[detail.fn] : null;
  if (!kernel || !count || !args || args.length < count[0] || args.length > count[1] || !args.every((a) => typeof a === "string")) {
    return;
  }
  event.preventDefault();
  // The kernel refuses an unsafe id and opens only a one-click URL or one it already opened.
  const name = detail.fn === "reconnect" ? cellName(found.cell) : [];
  runInCell(kernel, found.cell.outputArea, call(detail.fn, ...args, ...name));
}

const plugin = {
  id: "remote-exec:record",
  description: "Saved remote_exec job records: Reconnect, and the live view back after a page reload.",
  autoStart: true,
  requires: [IRenderMimeRegistry],
  activate: (app, rendermime) => {
    document.addEventListener("remote-exec:reconnect", (event) => onWidgetReconnect(app, event));
    rendermime.addFactory(
      {
        safe: true, // sanitized HTML; in the kernel only the probe (a trusted notebook's) and a click run
        mimeTypes: [RECORD_MIME],
        createRenderer: (options) => new RecordRenderer(options, app),
      },
      0, // ahead of text/html, which the same output carries for every other reader
    );
    rendermime.addFactory({ safe: true, mimeTypes: [DRAFT_MIME], createRenderer: () => new DraftRenderer() }, 0);
  },
};

export default plugin;
