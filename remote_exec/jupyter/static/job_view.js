// JobView: one job — state badge, command, elapsed, exit code, stdout/stderr panes, buttons.
// Traits: command, job_id, sandbox, state, exit_code, started_at, ended_at, stdout_chars,
// stderr_chars, error, stdin_open; health (health.js): link, link_reason, last_output_at, quiet_after,
// usage, hits. Sends {type: "hello" | "interrupt" | "kill" | "fetch" | "watch" | "stdin" | "close_stdin"}.

// a line typed into stdin is echoed in the stdout pane (job_view.py PANES); a merged view
// (job_view.py MERGED_PANES) shows every stream there, in the order the agent read them
const rxJobPaneOf = (model) => (stream) => (stream === "stdin" || model.get("merged") ? "stdout" : stream);
// The input line of a job whose stdin is open: Enter sends the line (with its newline), Ctrl+D
// or the button closes stdin (EOF). Shown only while the job runs with its stdin open.
function rxJobStdinLine(model) {
  const row = rxEl("div", "rx-job-stdin");
  row.setAttribute("data-lm-suppress-shortcuts", "true"); // Enter and Ctrl+D are the job's here
  const field = rxEl("input", "rx-mono rx-job-stdin-input");
  field.placeholder = "stdin: type a line, Enter sends it, Ctrl+D closes stdin";
  const close = rxButton("Close stdin", "Close the job's stdin (EOF, as Ctrl+D in a terminal)", () =>
    send({ type: "close_stdin" }),
  );
  const send = rxOrderedSender(model, close); // a busy kernel shows on the close button
  row.append(rxEl("span", "rx-muted", "stdin"), field, close);
  field.addEventListener("keydown", (ev) => {
    if (ev.key === "Enter") {
      send({ type: "stdin", data: `${field.value}\n` });
      field.value = "";
      ev.preventDefault();
    } else if (ev.key === "d" && ev.ctrlKey && !field.value) {
      send({ type: "close_stdin" });
      ev.preventDefault();
    }
  });
  const update = (disconnected) => {
    row.hidden = disconnected || !model.get("stdin_open") || model.get("state") !== "running";
  };
  return { el: row, update };
}

export default {
  initialize({ model }) {
    return rxInitialize(model, rxJobPaneOf(model));
  },

  render({ model, el }) {
    const store = rxStore(model, rxJobPaneOf(model));
    const merged = model.get("merged"); // fixed for the view's life (set when it was made)
    const root = rxEl("div", "rx-widget rx-job");
    el.appendChild(root);

    const header = rxEl("div", "rx-header");
    const badge = rxEl("span", "rx-badge");
    const cmd = rxEl("span", "rx-mono rx-job-command");
    const meta = rxEl("span", "rx-muted rx-job-meta");
    const interrupt = rxButton("Interrupt", "Send SIGINT (Ctrl-C) to the job", () => rxControl(model, { type: "interrupt" }, interrupt));
    const kill = rxButton("Kill", "Kill the job (SIGTERM, then SIGKILL)", () => rxControl(model, { type: "kill" }, kill), "rx-danger");
    // -- health: the link, "no output for N min", the usage sparklines, the bell ---------------
    const link = rxEl("span", "rx-link");
    const quiet = rxEl("span", "rx-quiet");
    const usage = rxEl("span", "rx-usage");
    const cpuSpark = rxSparkline("rx-spark-cpu", "CPU % of the job's processes (sampled while this view is on screen)", "cpu");
    const memSpark = rxSparkline("rx-spark-mem", "resident memory of the job's processes", "mem");
    const usageText = rxEl("span", "rx-muted rx-usage-text");
    usage.append(cpuSpark, memSpark, usageText);
    usage.hidden = true;
    const bell = rxNotifyButton();
    const error = rxEl("div", "rx-error rx-job-error");
    // one disconnected state and one Reconnect for every widget (connection.js); a job that has
    // ended offers its live view (the agent's whole kept output) instead
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
    actions.append(bell, interrupt, kill, connection.button);
    header.append(badge, link, cmd, actions);
    // What changes while the job runs (elapsed, "no output for…", the sparklines) has a row of its
    // own: nothing appearing there moves the buttons under the pointer.
    const facts = rxEl("div", "rx-job-facts");
    facts.append(meta, quiet, usage);
    const stdin = rxJobStdinLine(model);
    root.append(header, facts, error, stdin.el);

    const views = {};
    const copies = {};
    const boxes = {};
    for (const stream of ["stdout", "stderr"]) {
      const box = rxEl("div", `rx-pane rx-pane-${stream}`);
      const title = rxEl("div", "rx-pane-title");
      const hidden = rxEl("span", "rx-muted rx-hidden");
      const what = merged ? null : stream; // merged: the whole output, interleaved
      const label = merged ? "output" : stream;
      const copy = rxButton("Copy", `Copy the whole ${label}`, () => rxControl(model, { type: "fetch", stream: what, purpose: "copy" }, copy));
      const save = rxButton("Download", `Download the whole ${label}`, () =>
        rxControl(model, { type: "fetch", stream: what, purpose: "download" }, save),
      );
      // Lines above the held ones come from the kernel's transcript, a press at a time.
      const earlier = rxButton("Earlier", `Show up to 2,000 earlier ${stream} lines above these`, () =>
        rxControl(model, { type: "earlier", pane: stream, before: store.pane(stream).hidden }, earlier),
      );
      earlier.classList.add("rx-earlier");
      earlier.hidden = true;
      const find = rxFindBox(stream, () => views[stream]);
      copies[stream] = copy;
      boxes[stream] = box;
      title.append(rxEl("strong", "", label), hidden, earlier, rxEl("span", "rx-spacer"), find.el, copy, save);
      box.appendChild(title);
      root.appendChild(box);
      views[stream] = new RxPaneView(box, store.pane(stream), (n) => {
        hidden.textContent = n ? `${n.toLocaleString()} lines hidden` : "";
        earlier.hidden = !n;
      });
      title.insertBefore(rxFirstErrorButton(views[stream]), copy); // health: jump to first error
    }
    const since = rxSinceMarker(views, model.model_id); // health: "new since you last looked"
    // An empty stderr pane takes no room: it shows once the job wrote to stderr (its text may
    // come in a delta before the trait that counts it).
    const showPanes = () => {
      const pane = store.pane("stderr");
      boxes.stderr.hidden = merged || !(model.get("stderr_chars") || pane.version || pane.hidden);
    };

    const elapsed = () => {
      const end = model.get("ended_at") ?? Date.now() / 1000 - store.offset;
      return rxFormatDuration(end - model.get("started_at"));
    };
    const renderState = () => {
      const disconnected = connection.lost();
      const state = disconnected && model.get("state") === "running" ? "disconnected" : model.get("state");
      badge.textContent = state;
      badge.className = `rx-badge rx-state-${state.replace(/ /g, "-")}`;
      root.dataset.state = state;
      showPanes();
      const command = model.get("command");
      const script = command.trim(); // a cell body ends with a newline: one line is still one line
      // The name leads, then the first meaningful line (job_view.py's "title"), "…" if there is more.
      const name = model.get("name");
      const title = model.get("title") || script.split("\n")[0];
      cmd.textContent = (name ? `${name} · ` : "") + title + (script.includes("\n") ? " …" : "");
      cmd.title = command;
      const code = model.get("exit_code");
      const bytes = model.get("stdout_chars") + model.get("stderr_chars");
      meta.textContent = [
        `job ${model.get("job_id")}`,
        elapsed(),
        model.get("ended_as") || (code === null ? null : `exit ${code}`),
        bytes ? rxFormatBytes(bytes) : null,
      ]
        .filter(Boolean)
        .join(" · ");
      const running = state === "running";
      interrupt.disabled = kill.disabled = !running;
      connection.update();
      stdin.update(disconnected);
      renderHealth(running);
      if (connection.busy()) return; // its own message stands
      const what = model.get("state") === "running" ? "the job goes on in the sandbox" : "the job had ended";
      error.textContent = disconnected ? rxGoneText(what, rxAttachHint(model)) : model.get("error");
    };
    // -- health -----------------------------------------------------------------------------
    const renderHealth = (running) => {
      rxRenderLink(link, model.get("link"), model.get("link_reason"));
      link.hidden = connection.lost(); // the gone kernel's link to the sandbox: no longer known
      root.dataset.link = model.get("link");
      const q = running && model.get("link") === "connected"
        ? rxQuietText(model.get("last_output_at"), model.get("started_at"), store.offset, model.get("quiet_after"))
        : "";
      if (quiet.textContent !== q) quiet.textContent = q;
      root.dataset.quiet = q ? "yes" : "no";
    };
    const renderUsage = () => {
      const points = model.get("usage");
      usage.hidden = !points.length;
      if (!points.length) return;
      const span = points[points.length - 1][0] - points[0][0];
      rxDrawSparkline(cpuSpark, points.map((p) => p[1]), 100, (v) => `${v.toFixed(0)}%`, span);
      rxDrawSparkline(memSpark, points.map((p) => p[2]), 0, rxFormatBytes, span);
      const [, cpu, rss] = points[points.length - 1];
      usageText.textContent = `${cpu.toFixed(0)}% · ${rxFormatBytes(rss)}`;
    };
    let lastState = model.get("state");
    let lastHits = model.get("hits");
    const notifyChanges = () => {
      const state = model.get("state");
      const hits = model.get("hits");
      const what = `job ${model.get("job_id")}: ${cmd.textContent}`;
      if (lastState === "running" && state !== "running") {
        const code = model.get("exit_code");
        const how = model.get("ended_as") || (code === null ? "" : `exit ${code}`);
        rxNotify(`remote_exec: ${state}${how ? ` (${how})` : ""}`, what, `rx-${model.get("job_id")}`);
      }
      if (hits > lastHits) {
        rxNotify(`remote_exec: a watch rule fired (${hits})`, what, `rx-${model.get("job_id")}-hits`);
      }
      lastState = state;
      lastHits = Math.max(lastHits, hits); // a count that goes back (a replayed update) is no new hit
    };
    const onMsg = (msg) => {
      if (msg.kind === "full") {
        const key = msg.data.stream ?? "stdout"; // (merged: the whole output, asked by the one pane)
        rxDeliver(msg.data, `${model.get("job_id")}-${msg.data.stream ?? "output"}.txt`, copies[key]);
      }
      else {
        for (const v of Object.values(views)) v.update();
        since.update();
        showPanes();
      }
    };
    store.listeners.add(onMsg);
    const traits = "change:state change:exit_code change:ended_at change:stdout_chars change:stderr_chars change:error change:command change:name change:title change:ended_as " +
      "change:link change:link_reason change:last_output_at change:stdin_open";
    model.on(traits, renderState);
    model.on("change:usage", renderUsage);
    model.on("change:state change:hits", notifyChanges);
    const unwatch = rxWatch(model, root);
    renderState();
    renderUsage();
    const timer = setInterval(() => model.get("state") === "running" && !connection.lost() && renderState(), 500);
    const unmark = rxMarkControls(model, root);
    const unhold = rxHoldRecord(model, root);
    model.send({ type: "hello" });
    const cleanup = rxOnce(() => {
      unmark();
      unhold();
      clearInterval(timer);
      unwatch();
      since.cleanup();
      model.off("change:usage", renderUsage);
      model.off("change:state change:hits", notifyChanges);
      store.listeners.delete(onMsg);
      model.off(traits, renderState);
      connection.stop();
    });
    return cleanup;
  },
};
