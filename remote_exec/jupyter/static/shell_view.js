// ShellView: a shell session — one output pane (command / stdout / stderr / info told apart),
// a prompt showing the cwd, an input line with history (↑/↓), Interrupt, reattach by id.
// Traits: session_id, sandbox, cwd, state, busy, history, error.
// Sends {type: "hello" | "run" | "stdin" | "close_stdin" | "interrupt" | "reattach" | "fetch"}:
// while a command runs, a line typed is its stdin and Ctrl+D closes it.

const SHELL_PANE_OF = () => "main";

// The magic that shows this shell again from a running kernel, by attach_hint's rules (common.js).
function rxShellHint(model) {
  const id = model.get("session_id");
  const url = model.get("sandbox");
  if (typeof id !== "string" || !RX_JOB_ID.test(id) || typeof url !== "string" || !/^[\x21-\x7e]{1,2048}$/.test(url)) {
    return "";
  }
  return `%remote_shell --shell ${rxShellQuote(id)} --sandbox ${rxShellQuote(url)}`;
}

export default {
  initialize({ model }) {
    return rxInitialize(model, SHELL_PANE_OF);
  },

  render({ model, el }) {
    const store = rxStore(model, SHELL_PANE_OF);
    const root = rxEl("div", "rx-widget rx-shell");
    el.appendChild(root);

    const header = rxEl("div", "rx-header");
    const badge = rxEl("span", "rx-badge");
    const title = rxEl("span", "rx-mono rx-shell-title");
    const reattachId = rxEl("input", "rx-shell-reattach rx-mono");
    reattachId.placeholder = "session id";
    const reattach = rxButton("Reattach", "Switch this view to another session", () => {
      if (reattachId.value.trim()) model.send({ type: "reattach", session_id: reattachId.value.trim() });
    });
    const interrupt = rxButton("Interrupt", "Ctrl-C: SIGINT to the running command", () => rxControl(model, { type: "interrupt" }, interrupt));
    const copy = rxButton("Copy", "Copy the whole transcript", () => rxControl(model, { type: "fetch", purpose: "copy" }, copy));
    const error = rxEl("div", "rx-error rx-shell-error");
    // one disconnected state and one Reconnect for every widget (connection.js): the shell goes on
    // in the sandbox, and Reconnect shows it again (its transcript from the session's record)
    const connection = rxConnection(model, root, {
      onReplaced: () => cleanup(), // defined below: this render's cleanup
      call: () =>
        model.get("state") === "open" ? { fn: "reconnect_shell", args: [model.get("sandbox"), model.get("session_id")] } : null,
      onChange: () => renderState(),
      onError: (text) => {
        error.textContent = text;
      },
    });
    const actions = rxEl("span", "rx-actions");
    actions.append(reattachId, reattach, interrupt, copy, connection.button);
    header.append(badge, title, actions);

    const box = rxEl("div", "rx-pane");
    const hiddenNote = rxEl("div", "rx-muted rx-hidden rx-shell-hidden");
    box.appendChild(hiddenNote);
    const view = new RxPaneView(box, store.pane("main"), (n) => {
      hiddenNote.textContent = n ? `${n.toLocaleString()} lines hidden` : "";
    });

    const inputRow = rxEl("div", "rx-shell-input-row rx-mono");
    const prompt = rxEl("span", "rx-shell-prompt");
    const input = rxEl("input", "rx-shell-input rx-mono");
    input.spellcheck = false;
    input.autocomplete = "off";
    inputRow.append(prompt, input);
    root.append(header, error, box, inputRow);

    let pos = -1; // -1: editing a new line; else an index into history
    let draft = "";
    const sendOrdered = rxOrderedSender(model);
    input.addEventListener("keydown", (e) => {
      const history = model.get("history");
      if (e.key === "Enter" && !e.shiftKey && model.get("busy")) {
        e.preventDefault();
        sendOrdered({ type: "stdin", data: `${input.value}\n` });
        input.value = "";
      } else if (e.key === "d" && e.ctrlKey && model.get("busy") && !input.value) {
        e.preventDefault();
        sendOrdered({ type: "close_stdin" });
      } else if (e.key === "Enter" && !e.shiftKey) {
        e.preventDefault();
        const command = input.value;
        if (!command.trim()) return;
        rxControl(model, { type: "run", command });
        input.value = "";
        pos = -1;
      } else if (e.key === "ArrowUp" && history.length) {
        e.preventDefault();
        if (pos === -1) {
          draft = input.value;
          pos = history.length - 1;
        } else pos = Math.max(0, pos - 1);
        input.value = history[pos];
      } else if (e.key === "ArrowDown" && pos !== -1) {
        e.preventDefault();
        pos += 1;
        if (pos >= history.length) {
          pos = -1;
          input.value = draft;
        } else input.value = history[pos];
      } else if (e.key === "c" && e.ctrlKey && !input.selectionStart && !input.selectionEnd && model.get("busy")) {
        rxControl(model, { type: "interrupt" }, interrupt);
      }
    });

    const renderState = () => {
      const disconnected = connection.lost();
      const open = model.get("state") === "open";
      const busy = model.get("busy") && !disconnected;
      const state = !open ? "closed" : disconnected ? "disconnected" : busy ? "running" : "idle";
      badge.textContent = state;
      badge.className = `rx-badge rx-state-${disconnected ? "disconnected" : busy ? "running" : open ? "completed" : "killed"}`;
      root.dataset.state = state;
      title.textContent = `shell ${model.get("session_id")} · ${model.get("sandbox")}`;
      prompt.textContent = `${model.get("cwd")}$ `;
      input.disabled = !open || disconnected;
      input.placeholder = disconnected
        ? "the kernel is gone: Reconnect to type here"
        : busy
          ? "running… a line typed here is its input (Ctrl+D ends it; Interrupt stops it)"
          : open
            ? "type a command, Enter to run"
            : "shell closed";
      interrupt.disabled = !busy;
      reattach.disabled = reattachId.disabled = disconnected;
      connection.update();
      if (connection.busy()) return; // its own message stands
      error.textContent = disconnected && open
        ? rxGoneText("the shell goes on in the sandbox", rxShellHint(model))
        : model.get("error");
    };
    const onMsg = (msg) => {
      if (msg.kind === "full") rxDeliver(msg.data, `shell-${model.get("session_id")}.txt`, copy);
      else view.update();
    };
    store.listeners.add(onMsg);
    const traits = "change:state change:busy change:cwd change:session_id change:error change:sandbox";
    model.on(traits, renderState);
    renderState();
    const unmark = rxMarkControls(model, root);
    const unhold = rxHoldRecord(model, root);
    model.send({ type: "hello" });
    const cleanup = rxOnce(() => {
      unmark();
      unhold();
      store.listeners.delete(onMsg);
      model.off(traits, renderState);
      connection.stop();
    });
    return cleanup;
  },
};
