// JobView: one job — state badge, command, elapsed, exit code, stdout/stderr panes, buttons.
// Traits: command, job_id, sandbox, state, exit_code, started_at, ended_at, stdout_chars,
// stderr_chars, error, stdin_open. Sends {type: "hello" | "interrupt" | "kill" | "fetch" | "stdin" | "close_stdin"}.

const JOB_PANE_OF = (stream) => stream;

// The input line of a job whose stdin is open: Enter sends the line (with its newline), Ctrl+D
// or the button closes stdin (EOF). Shown only while the job runs with its stdin open.
function rxJobStdinLine(model) {
  const send = rxOrderedSender(model);
  const row = rxEl("div", "rx-job-stdin");
  row.setAttribute("data-lm-suppress-shortcuts", "true"); // Enter and Ctrl+D are the job's here
  const field = rxEl("input", "rx-mono rx-job-stdin-input");
  field.placeholder = "stdin: type a line, Enter sends it, Ctrl+D closes stdin";
  const close = rxButton("Close stdin", "Close the job's stdin (EOF, as Ctrl+D in a terminal)", () =>
    send({ type: "close_stdin" }),
  );
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
    const interrupt = rxButton("Interrupt", "Send SIGINT (Ctrl-C) to the job", () => model.send({ type: "interrupt" }));
    const kill = rxButton("Kill", "Kill the job (SIGTERM, then SIGKILL)", () => model.send({ type: "kill" }), "rx-danger");
    header.append(badge, cmd, meta, interrupt, kill);
    const error = rxEl("div", "rx-error rx-job-error");
    const stdin = rxJobStdinLine(model);
    root.append(header, error, stdin.el);

    const views = {};
    const copies = {};
    for (const stream of ["stdout", "stderr"]) {
      const box = rxEl("div", `rx-pane rx-pane-${stream}`);
      const title = rxEl("div", "rx-pane-title");
      const hidden = rxEl("span", "rx-muted rx-hidden");
      const copy = rxButton("Copy", `Copy the whole ${stream}`, () => model.send({ type: "fetch", stream, purpose: "copy" }));
      const save = rxButton("Download", `Download the whole ${stream}`, () =>
        model.send({ type: "fetch", stream, purpose: "download" }),
      );
      copies[stream] = copy;
      title.append(rxEl("strong", "", stream), hidden, rxEl("span", "rx-spacer"), copy, save);
      box.appendChild(title);
      root.appendChild(box);
      views[stream] = new RxPaneView(box, store.pane(stream), (n) => {
        hidden.textContent = n ? `${n.toLocaleString()} lines hidden` : "";
      });
    }

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
      const command = model.get("command");
      const script = command.trim(); // a cell body ends with a newline: one line is still one line
      cmd.textContent = script.split("\n")[0] + (script.includes("\n") ? " …" : "");
      cmd.title = command;
      const code = model.get("exit_code");
      const bytes = model.get("stdout_chars") + model.get("stderr_chars");
      meta.textContent = [
        `job ${model.get("job_id")}`,
        elapsed(),
        code === null ? null : `exit ${code}`,
        bytes ? rxFormatBytes(bytes) : null,
      ]
        .filter(Boolean)
        .join(" · ");
      const running = state === "running";
      interrupt.disabled = kill.disabled = !running;
      stdin.update(disconnected);
      error.textContent = disconnected
        ? `The kernel that showed this view is gone; the job goes on in the sandbox. In a running kernel: %exec_remote_attach ${model.get("job_id")}`
        : model.get("error");
    };
    const onMsg = (msg) => {
      if (msg.kind === "full") rxDeliver(msg.data, `${model.get("job_id")}-${msg.data.stream}.txt`, copies[msg.data.stream]);
      else for (const v of Object.values(views)) v.update();
    };
    store.listeners.add(onMsg);
    const traits =
      "change:state change:exit_code change:ended_at change:stdout_chars change:stderr_chars change:error change:command change:stdin_open";
    model.on(traits, renderState);
    renderState();
    const timer = setInterval(() => model.get("state") === "running" && !disconnected && renderState(), 500);
    model.send({ type: "hello" });
    return () => {
      clearInterval(timer);
      store.listeners.delete(onMsg);
      model.off(traits, renderState);
      model.off("comm:close", lost);
      if (kernel && kernel.statusChanged) kernel.statusChanged.disconnect(onStatus);
      if (kernel && kernel.disposed) kernel.disposed.disconnect(lost);
    };
  },
};
