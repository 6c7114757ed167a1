// JobView: one job — state badge, command, elapsed, exit code, stdout/stderr panes, buttons.
// Traits: command, job_id, sandbox, state, exit_code, started_at, ended_at, stdout_chars,
// stderr_chars, error, stdin_open; health (health.js): link, link_reason, last_output_at, quiet_after,
// usage, hits. Sends {type: "hello" | "interrupt" | "kill" | "fetch" | "watch" | "stdin" | "close_stdin"}.

const JOB_PANE_OF = (stream) => stream;
const JOB_WIDGET_MIME = "application/vnd.jupyter.widget-view+json";

// Reconnect: a view whose kernel went away asks the kernel running now for a live view of the
// same job (what %exec_remote_attach gives: the agent's whole kept output, true command and
// start) and shows it in its place. The code run names only the sandbox URL and job id, both
// passed as JSON string literals (valid Python literals).
function jobReconnect(model, root, button, onError) {
  const manager = model.widget_manager;
  const kernel = manager && manager.kernel;
  if (!kernel) return;
  // The JupyterLab extension (labextension/), when installed, runs it with the output routed into
  // this cell, replacing it: the new view's records then reach the notebook and its next save.
  const detail = { sandbox: model.get("sandbox"), job_id: model.get("job_id") };
  if (!root.dispatchEvent(new CustomEvent("remote-exec:reconnect", { bubbles: true, cancelable: true, detail }))) {
    return;
  }
  button.disabled = true;
  button.textContent = "Reconnecting…";
  const args = `${JSON.stringify(model.get("sandbox"))}, ${JSON.stringify(model.get("job_id"))}`;
  const code = `__import__("remote_exec.jupyter.attach", fromlist=["reconnect"]).reconnect(${args})`;
  const future = kernel.requestExecute({ code, silent: false, store_history: false, stop_on_error: false });
  const failed = (text) => {
    button.disabled = false;
    button.textContent = "Reconnect";
    onError(text);
  };
  future.onIOPub = (msg) => {
    const type = msg.header.msg_type;
    const ref = type === "display_data" && msg.content.data[JOB_WIDGET_MIME];
    if (ref) {
      manager
        .get_model(ref.model_id)
        .then((m) => manager.create_view(m))
        .then((view) => {
          root.replaceWith(view.el); // this view's timers stop with its cleanup; the live one takes over
          button.textContent = "Reconnected";
        }, (err) => failed(`Reconnect failed: ${err}`));
    } else if (type === "error") {
      failed(`Reconnect failed: ${msg.content.ename}: ${msg.content.evalue}`);
    }
  };
}

// The Reconnect button: offered once this view's kernel is gone and a kernel is up again.
function jobReconnectButton(model, root, onError) {
  const button = rxButton("Reconnect", "A live view of this job from the kernel running now", () =>
    jobReconnect(model, root, button, onError),
  );
  button.classList.add("rx-job-reconnect");
  const kernel = model.widget_manager && model.widget_manager.kernel;
  const update = (disconnected) => {
    const up = kernel && (kernel.status === "idle" || kernel.status === "busy");
    button.hidden = !disconnected;
    if (button.textContent === "Reconnect") button.disabled = !up;
  };
  return { button, update };
}

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
    return rxInitialize(model, JOB_PANE_OF);
  },

  render({ model, el }) {
    const store = rxStore(model, JOB_PANE_OF);
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
    const cpuSpark = rxSparkline("rx-spark-cpu", "CPU % of the job's processes (sampled while this view is on screen)");
    const memSpark = rxSparkline("rx-spark-mem", "resident memory of the job's processes");
    const usageText = rxEl("span", "rx-muted rx-usage-text");
    usage.append(cpuSpark, memSpark, usageText);
    usage.hidden = true;
    const bell = rxNotifyButton();
    const error = rxEl("div", "rx-error rx-job-error");
    const reconnect = jobReconnectButton(model, root, (text) => {
      error.textContent = text;
    });
    const actions = rxEl("span", "rx-actions"); // the buttons wrap together, never one by one
    actions.append(bell, interrupt, kill, reconnect.button);
    header.append(badge, link, cmd, meta, quiet, usage, actions);
    const stdin = rxJobStdinLine(model);
    root.append(header, error, stdin.el);

    const views = {};
    const copies = {};
    const boxes = {};
    for (const stream of ["stdout", "stderr"]) {
      const box = rxEl("div", `rx-pane rx-pane-${stream}`);
      const title = rxEl("div", "rx-pane-title");
      const hidden = rxEl("span", "rx-muted rx-hidden");
      const copy = rxButton("Copy", `Copy the whole ${stream}`, () => rxControl(model, { type: "fetch", stream, purpose: "copy" }, copy));
      const save = rxButton("Download", `Download the whole ${stream}`, () =>
        rxControl(model, { type: "fetch", stream, purpose: "download" }, save),
      );
      copies[stream] = copy;
      boxes[stream] = box;
      title.append(rxEl("strong", "", stream), hidden, rxEl("span", "rx-spacer"), copy, save);
      box.appendChild(title);
      root.appendChild(box);
      views[stream] = new RxPaneView(box, store.pane(stream), (n) => {
        hidden.textContent = n ? `${n.toLocaleString()} lines hidden` : "";
      });
      title.insertBefore(rxFirstErrorButton(views[stream]), copy); // health: jump to first error
    }
    const since = rxSinceMarker(views, model.model_id); // health: "new since you last looked"
    // An empty stderr pane takes no room: it shows once the job wrote to stderr (its text may
    // come in a delta before the trait that counts it).
    const showPanes = () => {
      const pane = store.pane("stderr");
      boxes.stderr.hidden = !(model.get("stderr_chars") || pane.version || pane.hidden);
    };

    const elapsed = () => {
      const end = model.get("ended_at") ?? Date.now() / 1000 - store.offset;
      return rxFormatDuration(end - model.get("started_at"));
    };
    // A view whose kernel went away (restart, shutdown, another kernel) can no longer reach its
    // job: it says so and disables its buttons. The kernel connection the widget manager holds
    // reports restarts and deaths; a comm the kernel closes fires comm:close on the model.
    let disconnected = false;
    const manager = model.widget_manager;
    const kernel = manager && manager.kernel;
    const lost = () => {
      if (disconnected) return;
      disconnected = true;
      renderState();
    };
    const onStatus = (_k, status) => {
      if (status === "restarting" || status === "autorestarting" || status === "dead") lost();
      else if (disconnected) reconnect.update(true); // a kernel is up again: Reconnect is offered
    };
    if (kernel && kernel.statusChanged) kernel.statusChanged.connect(onStatus);
    if (kernel && kernel.disposed) kernel.disposed.connect(lost);
    model.on("comm:close", lost);
    const renderState = () => {
      if (!disconnected && manager && kernel && manager.kernel !== kernel) disconnected = true;
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
      reconnect.update(disconnected);
      stdin.update(disconnected);
      renderHealth(running);
      if (reconnect.button.textContent !== "Reconnect") return; // its own message stands
      error.textContent = disconnected
        ? "The kernel that showed this view is gone; the job goes on in the sandbox. Reconnect" +
          (rxAttachHint(model) ? `, or in a running kernel: ${rxAttachHint(model)}` : "")
        : model.get("error");
    };
    // -- health -----------------------------------------------------------------------------
    const renderHealth = (running) => {
      rxRenderLink(link, model.get("link"), model.get("link_reason"));
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
      rxDrawSparkline(cpuSpark, points.map((p) => p[1]), 100);
      rxDrawSparkline(memSpark, points.map((p) => p[2]));
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
      if (msg.kind === "full") rxDeliver(msg.data, `${model.get("job_id")}-${msg.data.stream}.txt`, copies[msg.data.stream]);
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
    const timer = setInterval(() => model.get("state") === "running" && !disconnected && renderState(), 500);
    const unmark = rxMarkControls(model, root);
    model.send({ type: "hello" });
    return () => {
      unmark();
      clearInterval(timer);
      unwatch();
      since.cleanup();
      model.off("change:usage", renderUsage);
      model.off("change:state change:hits", notifyChanges);
      store.listeners.delete(onMsg);
      model.off(traits, renderState);
      model.off("comm:close", lost);
      if (kernel && kernel.statusChanged) kernel.statusChanged.disconnect(onStatus);
      if (kernel && kernel.disposed) kernel.disposed.disconnect(lost);
    };
  },
};
