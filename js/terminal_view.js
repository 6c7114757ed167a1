// TerminalView: a PTY job (or an interactive shell) in xterm.js.
//
// Bundled with xterm.js by `make widgets` (js/build.mjs) into remote_exec/jupyter/static/; Python
// prepends common.js and connection.js to the bundle (rxEl, rxButton, rxDeliver, rxFormat*,
// rxOrderedSender, rxConnection), as for every widget.
//
// Traits: command, job_id, sandbox, state, exit_code, started_at, ended_at, stdout_chars, lines,
// error, rows, cols, stdin_open, convert_eol, tail_lines (the scrollback cap).
// From Python, {kind, seq, data}:
//   replay {panes: {main: {pieces: [[stream, text]...], hidden}}, now} -- reset the screen, write
//   delta  [[stream, text], ...]                                      -- new output only
//   full   {purpose, text}                                            -- Copy all / Download
// Sends {type: "hello" | "input" {data} | "resize" {cols, rows} | "interrupt" | "kill" | "fetch"}.

import { Terminal } from "@xterm/xterm";
import { FitAddon } from "@xterm/addon-fit";

const RX_TERM_THEME = {
  background: "#1e1e1e",
  foreground: "#d4d4d4",
  cursor: "#d4d4d4",
  selectionBackground: "#264f78",
};

// Output messages into one xterm: a replay resets it (unless it is another view's and this one
// is up to date: Python sent the new output as a delta first); deltas already in a replay are
// skipped. The reset goes through the write queue (RIS), after output written but not yet parsed.
function rxTermFeed(term, msg, seen, viewer) {
  if (!msg || typeof msg !== "object") return seen;
  if (msg.kind === "replay") {
    if (msg.data.for && msg.data.for !== viewer && seen > 0) return msg.seq;
    term.write("\x1bc");
    for (const { pieces } of Object.values(msg.data.panes)) for (const [, text] of pieces) term.write(text);
    return msg.seq;
  }
  if (msg.kind === "delta" && msg.seq > seen) {
    for (const [, text] of msg.data) term.write(text);
    return msg.seq;
  }
  return seen;
}

// The rows a finished job's output uses, if fewer than `most`: `ls` in a 24-row terminal left
// 21 empty rows under it. Counted over the whole buffer (scrollback too: a terminal made shorter
// before the last output came scrolled it), down to the cursor's row at least (xterm keeps the
// cursor in view). A full-screen program's screen, or more output than `most` rows: null.
function rxTermUsedRows(term, most) {
  const buf = term.buffer.active;
  if (buf.type === "alternate") return null;
  let last = buf.baseY + buf.cursorY;
  for (let y = last + 1; y < buf.length; y++) if (buf.getLine(y)?.translateToString(true)) last = y;
  return last + 1 <= most ? last + 1 : null;
}

// Fit the terminal's columns to its element's width (its rows are the model's), and tell Python
// when they changed: the job's PTY follows (SIGWINCH), so `stty size` and full-screen programs do.
// Once the job has ended, the terminal shrinks to the rows its screen uses (nothing to tell).
function rxTermFitter(model, term, fit) {
  let frame = 0;
  const apply = () => {
    frame = 0;
    const dims = fit.proposeDimensions();
    if (!dims || !Number.isFinite(dims.cols) || dims.cols < 2) return; // hidden: nothing to measure
    const cols = Math.min(dims.cols, 500);
    const ended = model.get("state") !== "running";
    const most = model.get("rows");
    const rows = ended ? (rxTermUsedRows(term, most) ?? most) : most;
    if (cols === term.cols && rows === term.rows) return;
    term.resize(cols, rows);
    if (!ended) model.send({ type: "resize", cols, rows });
  };
  return () => {
    if (!frame) frame = requestAnimationFrame(apply);
  };
}

// Copy and paste in a terminal where Ctrl+C is the job's interrupt: Ctrl+Shift+C copies the
// selection, Ctrl+Shift+V pastes (through the browser's paste event, which xterm turns into
// bracketed paste when the program asked for it). Other keys go to the job.
function rxTermClipboardKeys(term) {
  term.attachCustomKeyEventHandler((ev) => {
    if (ev.type !== "keydown" || !ev.ctrlKey || !ev.shiftKey) return true;
    const key = ev.key.toLowerCase();
    if (key === "c" && term.hasSelection()) {
      navigator.clipboard?.writeText(term.getSelection());
      ev.preventDefault();
      return false;
    }
    return key !== "v"; // let the browser's paste reach xterm's textarea
  });
}

export default {
  render({ model, el }) {
    const root = rxEl("div", "rx-widget rx-term");
    // JupyterLab's shortcuts (Escape, Shift+Enter, arrows...) must not swallow the job's keys.
    root.setAttribute("data-lm-suppress-shortcuts", "true");
    el.appendChild(root);

    const header = rxEl("div", "rx-header");
    const badge = rxEl("span", "rx-badge");
    const cmd = rxEl("span", "rx-mono rx-term-command");
    const meta = rxEl("span", "rx-muted rx-term-meta");
    const hidden = rxEl("span", "rx-muted rx-hidden");
    const interrupt = rxButton("Ctrl-C", "Send SIGINT to the job", () => rxControl(model, { type: "interrupt" }, interrupt));
    const kill = rxButton("Kill", "Kill the job (SIGTERM, then SIGKILL)", () => rxControl(model, { type: "kill" }, kill), "rx-danger");
    const copy = rxButton("Copy", "Copy the selection (or the screen); Ctrl+Shift+C in the terminal", () => {
      const text = term.hasSelection() ? term.getSelection() : rxTermScreenText(term);
      rxDeliver({ purpose: "copy", text }, "", copy);
    });
    const save = rxButton("Download", "Download the whole output (control sequences removed)", () =>
      rxControl(model, { type: "fetch", stream: null, purpose: "download" }, save),
    );
    const error = rxEl("div", "rx-error rx-term-error");
    // one disconnected state and one Reconnect for every widget (connection.js): Reconnect gives
    // a live terminal of the same job (the agent keeps its whole output)
    const connection = rxConnection(model, root, {
      onReplaced: () => cleanup(), // defined below: this render's cleanup
      call: () => ({ fn: "reconnect", args: [model.get("sandbox"), model.get("job_id")] }),
      label: () => (model.get("state") === "running" ? "Reconnect" : "Open live view"),
      onChange: () => renderState(),
      onError: (text) => {
        error.textContent = text;
      },
    });
    const actions = rxEl("span", "rx-actions"); // the buttons wrap together, never one by one
    actions.append(interrupt, kill, copy, save, connection.button);
    header.append(badge, cmd, meta, hidden, actions);
    const screen = rxEl("div", "rx-term-screen");
    root.append(header, error, screen);

    const term = new Terminal({
      cols: model.get("cols") || 80,
      rows: model.get("rows") || 24,
      scrollback: model.get("tail_lines") || 5000, // the cap; Download has the rest
      // xterm measures its font itself: a CSS variable means nothing there, its value does
      fontFamily: getComputedStyle(document.body).getPropertyValue("--jp-code-font-family").trim() || "monospace",
      fontSize: 13,
      cursorBlink: true,
      theme: RX_TERM_THEME,
      convertEol: model.get("convert_eol"), // a job without a PTY: no staircase of bare "\n"
    });
    const fit = new FitAddon();
    term.loadAddon(fit);
    term.open(screen);
    screen.rxTerminal = term; // for tests and the bench: read the buffer, not pixels
    rxTermClipboardKeys(term);

    const renderState = () => {
      const disconnected = connection.lost();
      const state = disconnected && model.get("state") === "running" ? "disconnected" : model.get("state");
      badge.textContent = state;
      badge.className = `rx-badge rx-state-${state.replace(/ /g, "-")}`;
      root.dataset.state = state;
      const command = model.get("command").trim();
      // the name leads, then the first meaningful line (job_view.py's "title"), as in a JobView
      const name = model.get("name");
      const title = model.get("title") || command.split("\n")[0];
      cmd.textContent = (name ? `${name} · ` : "") + title + (command.includes("\n") ? " …" : "");
      cmd.title = command;
      const code = model.get("exit_code");
      const end = model.get("ended_at") ?? Date.now() / 1000 - offset;
      const bytes = model.get("stdout_chars");
      meta.textContent = [
        `job ${model.get("job_id")}`,
        `${term.cols}×${term.rows}`,
        rxFormatDuration(end - model.get("started_at")),
        model.get("ended_as") || (code === null ? null : `exit ${code}`),
        bytes ? rxFormatBytes(bytes) : null,
      ]
        .filter(Boolean)
        .join(" · ");
      // Lines beyond the scrollback cap: gone from the view, kept for Download.
      const over = model.get("lines") - term.rows - (model.get("tail_lines") || 5000);
      hidden.textContent = over > 0 ? `${over.toLocaleString()} lines hidden` : "";
      const running = state === "running";
      interrupt.disabled = kill.disabled = !running;
      term.options.disableStdin = !running || !model.get("stdin_open");
      connection.update();
      if (connection.busy()) return; // its own message stands
      const what = model.get("state") === "running" ? "the job goes on in the sandbox" : "the job had ended";
      error.textContent = disconnected ? rxGoneText(what, rxAttachHint(model)) : model.get("error");
    };

    let seen = 0;
    const viewer = Math.random().toString(36).slice(2); // this view, in its hello
    let offset = 0; // browser clock minus kernel clock
    const onMsg = (msg) => {
      if (msg && msg.kind === "replay") offset = Date.now() / 1000 - msg.data.now;
      if (msg && msg.kind === "full") rxDeliver(msg.data, `${model.get("job_id")}-terminal.txt`, save);
      else seen = rxTermFeed(term, msg, seen, viewer);
    };
    model.on("msg:custom", onMsg);
    const send = rxOrderedSender(model); // keys in the order typed, whatever the kernel does
    // xterm answers a program's queries (`vim` asks for the cursor position, the colours...)
    // through onData too: only the view being typed in may answer, or with two views of one
    // terminal the program reads the second answer as keystrokes.
    const typing = () => term.textarea !== undefined && document.activeElement === term.textarea;
    const onInput = (data) => {
      if (!connection.lost() && model.get("state") === "running" && typing()) send({ type: "input", data });
    };
    const input = term.onData(onInput);
    const binary = term.onBinary(onInput);
    const refit = rxTermFitter(model, term, fit);
    const observer = new ResizeObserver(refit);
    observer.observe(screen);
    const resized = term.onResize(renderState);
    const parsed = term.onWriteParsed(() => model.get("state") !== "running" && refit()); // (a replay's screen)
    const traits =
      "change:state change:exit_code change:ended_at change:ended_as change:stdout_chars change:lines change:error change:command change:name change:title change:stdin_open";
    model.on(traits, renderState);
    model.on("change:rows change:state", refit);
    renderState();
    const timer = setInterval(() => model.get("state") === "running" && !connection.lost() && renderState(), 500);
    model.send({ type: "hello", viewer });
    refit();
    const cleanup = rxOnce(() => {
      clearInterval(timer);
      observer.disconnect();
      input.dispose();
      binary.dispose();
      resized.dispose();
      parsed.dispose();
      model.off("msg:custom", onMsg);
      model.off(traits, renderState);
      model.off("change:rows change:state", refit);
      connection.stop();
      term.dispose();
    });
    return cleanup;
  },
};

// The visible screen as text (what Copy takes when nothing is selected).
function rxTermScreenText(term) {
  const buf = term.buffer.active;
  const lines = [];
  for (let y = 0; y < term.rows; y++) lines.push(buf.getLine(buf.viewportY + y)?.translateToString(true) ?? "");
  while (lines.length && !lines[lines.length - 1]) lines.pop();
  return lines.join("\n") + "\n";
}
