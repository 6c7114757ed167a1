// One story for "the kernel is gone", shared by every widget (JobView, TerminalView, ShellView,
// Dashboard): a widget whose kernel went away (restart, shutdown, another kernel) can no longer
// reach its job, shell or sandbox. It goes to one disconnected state -- the grey "disconnected"
// badge, its inputs and buttons disabled, its clocks stopped -- and offers one Reconnect, enabled
// once a kernel is up again, which asks that kernel for a live widget of the same thing and shows
// it in this one's place.
//
// Reconnect runs one call of remote_exec.jupyter.attach (RX_RECONNECT_CALLS) whose arguments are
// the widget's sandbox URL and ids, passed as JSON string literals (valid Python literals): the
// kernel validates them again (a notebook may be a stranger's) and opens only a one-click URL or a
// sandbox it already opened. With the JupyterLab extension (labextension/) the call's output is
// routed into the widget's own cell, so the new widget's records reach the notebook's next save.

const RX_KERNEL_LOST = new Set(["restarting", "autorestarting", "dead"]);
const RX_KERNEL_UP = new Set(["idle", "busy"]);
const RX_WIDGET_MIME = "application/vnd.jupyter.widget-view+json";
const RX_RECONNECT_CALLS = new Set(["reconnect", "reconnect_shell", "reconnect_dashboard"]);

// `value` as a Python str literal: JSON's escapes (a valid Python literal for ASCII) and every
// other character as \u/\U (IPython splits a cell's lines on U+2028, U+2029 and U+0085).
function rxPyString(value) {
  return JSON.stringify(String(value)).replace(/[^\x00-\x7e]/gu, (c) => {
    const cp = c.codePointAt(0);
    return cp > 0xffff ? `\\U${cp.toString(16).padStart(8, "0")}` : `\\u${cp.toString(16).padStart(4, "0")}`;
  });
}

// Follow `model`'s kernel. `call()` gives the reconnect call, {fn, args} (args: strings), or null
// when there is nothing to reconnect to; `label()` the button's text ("Reconnect", or "Open live
// view" for a job that has ended); `onChange()` re-renders the widget; `onError(text)` shows why a
// Reconnect failed. Returns {lost(), button, update(), stop()}.
function rxConnection(model, root, { call, label = () => "Reconnect", onChange, onError, onReplaced = () => {} }) {
  const manager = model.widget_manager;
  const kernel = manager && manager.kernel; // the kernel that made this widget
  const current = () => (manager && manager.kernel) || kernel; // the one up now (another after "Change kernel")
  let lost = false;
  let busy = false; // a Reconnect under way: its own text stands
  const button = rxButton("Reconnect", "A live view of this from the kernel running now", () => reconnect());
  button.classList.add("rx-reconnect");
  button.hidden = true;

  const isLost = () => {
    if (!lost && manager && kernel && manager.kernel !== kernel) lost = true;
    return lost;
  };
  const update = () => {
    const gone = isLost();
    root.dataset.connection = gone ? "disconnected" : "connected";
    button.hidden = !gone || !call();
    if (busy) return;
    button.textContent = label();
    const now = current();
    button.disabled = !(now && RX_KERNEL_UP.has(now.status));
    button.title = button.disabled ? "Waiting for a kernel to be up" : "A live view of this from the kernel running now";
  };
  const onLost = () => {
    if (lost) return;
    lost = true;
    onChange();
  };
  const onStatus = (_k, status) => {
    if (RX_KERNEL_LOST.has(status)) onLost();
    else if (lost) update(); // a kernel is up again: Reconnect is offered
  };
  if (kernel && kernel.statusChanged) kernel.statusChanged.connect(onStatus);
  if (kernel && kernel.disposed) kernel.disposed.connect(onLost);
  model.on("comm:close", onLost);

  const reconnect = () => {
    const request = call();
    const target = current();
    if (busy || !request || !RX_RECONNECT_CALLS.has(request.fn) || !target) return;
    const args = request.args.map((a) => String(a));
    busy = true; // one request per click: a second click waits for this one
    button.disabled = true;
    button.textContent = "Reconnecting…";
    // The JupyterLab extension, when installed, runs it with the output routed into this cell
    // (the cell's output is replaced, this view with it; if the call fails, the output comes
    // back with the error, this view rendered anew).
    const detail = { fn: request.fn, args };
    if (!root.dispatchEvent(new CustomEvent("remote-exec:reconnect", { bubbles: true, cancelable: true, detail }))) {
      return;
    }
    const code = `__import__("remote_exec.jupyter.attach", fromlist=[${rxPyString(request.fn)}]).${request.fn}(${args.map(rxPyString).join(", ")})`;
    const future = target.requestExecute({ code, silent: false, store_history: false, stop_on_error: false });
    let shown = false;
    const failed = (text) => {
      busy = false;
      update();
      onError(text);
    };
    // The request ended with no widget to show (widgets off in that kernel, the kernel died):
    // say so rather than "Reconnecting…" for ever.
    future.done.then(
      () => !shown && busy && failed("Reconnect gave no live view (does this kernel show widgets?)"),
      (err) => !shown && busy && failed(`Reconnect failed: ${err}`),
    );
    future.onIOPub = (msg) => {
      const type = msg.header.msg_type;
      const ref = type === "display_data" && msg.content.data[RX_WIDGET_MIME];
      if (ref && !shown) {
        shown = true;
        manager
          .get_model(ref.model_id)
          .then((m) => manager.create_view(m))
          .then((view) => {
            root.replaceWith(view.el); // the live one takes over
            button.textContent = "Reconnected";
            busy = false;
            onReplaced(); // replaceWith runs no cleanup: this view stops its own timers and listeners
          }, (err) => failed(`Reconnect failed: ${err}`));
      } else if (type === "error") {
        failed(`Reconnect failed: ${msg.content.ename}: ${msg.content.evalue}`);
      }
    };
  };

  return {
    lost: isLost,
    button,
    update,
    busy: () => busy,
    stop: () => {
      model.off("comm:close", onLost);
      if (kernel && kernel.statusChanged) kernel.statusChanged.disconnect(onStatus);
      if (kernel && kernel.disposed) kernel.disposed.disconnect(onLost);
    },
  };
}

// `fn` run at most once (a view's cleanup: by its Reconnect, then again by anywidget).
function rxOnce(fn) {
  let done = false;
  return () => {
    if (done) return;
    done = true;
    fn();
  };
}

// What a disconnected widget says, the same words everywhere: what goes on without the kernel,
// and how to get a live view back (the magic, when there is one to paste).
function rxGoneText(what, hint) {
  return `The kernel that showed this view is gone; ${what}. Reconnect` + (hint ? `, or in a running kernel: ${hint}` : "");
}
