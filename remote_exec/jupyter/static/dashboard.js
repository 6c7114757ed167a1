// Dashboard: the jobs of one sandbox or a fleet. State (traits): sandboxes, errors, interval,
// auto_refresh, message, opened (a JobView shown under the table), mine_only, state_filter,
// text_filter, page, page_size, expanded, counts, links (health). Rows arrive as {type: "rows", order, rows, now}
// messages carrying only the rows that changed: each row's <tr> is kept and updated in place, so
// a selection, focus or a press on a button survives a refresh.
// Sends {type: "hello" | "refresh" | "auto" | "clear_finished" | "show_cleared" | "close_view" |
// "kill" | "interrupt" | "open"}.

const STATES = [["all", "all states"], ["running", "running"], ["finished", "finished"], ["failed", "failed"]];

export default {
  render({ model, el, host }) {
    const root = rxEl("div", "rx-widget rx-dashboard");
    el.appendChild(root);
    const save = (name, value) => {
      model.set(name, value);
      model.save_changes();
    };

    // header: title and counts, then the controls (they wrap on a narrow notebook)
    const header = rxEl("div", "rx-header rx-dash-header");
    const status = rxEl("span", "rx-muted rx-dash-status");
    const mineLabel = rxEl("label", "rx-muted rx-dash-check");
    const mine = rxEl("input");
    mine.type = "checkbox";
    mine.title = "Only the jobs this kernel or notebook started; untick to see every client's";
    mine.addEventListener("change", () => save("mine_only", mine.checked));
    mineLabel.append(mine, document.createTextNode(" only mine"));
    const stateSel = rxEl("select", "rx-dash-state");
    stateSel.title = "Show jobs in this state";
    for (const [value, text] of STATES) {
      const o = rxEl("option", "", text);
      o.value = value;
      stateSel.appendChild(o);
    }
    stateSel.addEventListener("change", () => save("state_filter", stateSel.value));
    const text = rxEl("input", "rx-dash-filter");
    text.type = "search";
    text.placeholder = "filter label / command";
    let textTimer = null;
    text.addEventListener("input", () => {
      clearTimeout(textTimer);
      textTimer = setTimeout(() => save("text_filter", text.value), 250);
    });
    const clear = rxButton("Clear finished", "Hide finished jobs (their records stay in the agent)", () =>
      model.send({ type: "clear_finished" }));
    const autoLabel = rxEl("label", "rx-muted rx-dash-check");
    const auto = rxEl("input");
    auto.type = "checkbox";
    auto.addEventListener("change", () => model.send({ type: "auto", on: auto.checked }));
    autoLabel.append(auto, document.createTextNode(" auto-refresh"));
    const refresh = rxButton("Refresh", "Fetch the job list now", () => model.send({ type: "refresh" }));
    const controls = rxEl("span", "rx-dash-controls");
    // one disconnected state and one Reconnect for every widget (connection.js): the jobs go on,
    // this table stops (its clocks too) and Reconnect gives a live dashboard of the same sandboxes
    const gone = rxEl("span", "rx-badge rx-state-disconnected", "disconnected");
    gone.hidden = true;
    const connection = rxConnection(model, root, {
      onReplaced: () => cleanup(), // defined below: this render's cleanup
      call: () => ({ fn: "reconnect_dashboard", args: model.get("sandboxes") }),
      label: () => "Reconnect",
      onChange: () => renderAll(),
      onError: (text) => setText(errors, text),
    });
    controls.append(mineLabel, stateSel, text, clear, autoLabel, refresh, connection.button);
    header.append(rxEl("strong", "", "Jobs"), gone, status, rxEl("span", "rx-spacer"), controls);

    const linksBox = rxEl("div", "rx-dash-links"); // health: each sandbox's channel
    const notice = rxEl("div", "rx-muted rx-dash-notice");
    const errors = rxEl("div", "rx-error");
    const table = rxEl("table", "rx-dash-table");
    const thead = rxEl("thead");
    const body = rxEl("tbody");
    table.append(thead, body);
    const empty = rxEl("div", "rx-muted rx-dash-empty");
    const pager = rxEl("div", "rx-dash-pager");
    const prev = rxButton("‹ Newer", "Previous page", () => save("page", Math.max(0, model.get("counts").page - 1)));
    const next = rxButton("Older ›", "Next page", () => save("page", model.get("counts").page + 1));
    const pageText = rxEl("span", "rx-muted");
    pager.append(prev, pageText, next);
    const openedBox = rxEl("div", "rx-dash-opened");
    // The job view opened under the table reconnects in place: its event stops here, short of
    // the JupyterLab extension, which would replace the whole cell's output (this dashboard).
    openedBox.addEventListener("remote-exec:reconnect", (event) => event.stopPropagation());
    root.append(header, linksBox, notice, errors, table, empty, pager, openedBox);

    const fleet = () => model.get("sandboxes").length > 1;
    const renderHead = () => {
      const head = [["", "id"], ["command", "command"], ["state", "state"], ["elapsed", "elapsed"],
        ["output", "bytes"], ["cpu · mem", "usage"], ["last line", "tail"], ["", "actions"]];
      if (fleet()) head.splice(1, 0, ["sandbox", "sandbox"]);
      const tr = rxEl("tr");
      for (const [h, cls] of head) tr.appendChild(rxEl("th", `rx-dash-col-${cls}`, h));
      thead.replaceChildren(tr);
    };

    // -- rows, keyed and kept ------------------------------------------------------------------
    const rows = new Map(); // key -> {tr, cells, data}
    let offset = 0; // browser clock minus kernel clock
    let lostAt = null; // when the kernel went away (browser clock)
    const setText = (node, value) => {
      if (node.textContent !== value) node.textContent = value;
    };
    const act = (entry, type) => (ev) => {
      const r = entry.data;
      rxControl(model, { type, sandbox: r.sandbox, job_id: r.job_id }, ev && ev.currentTarget);
    };
    const makeRow = (key) => {
      const tr = rxEl("tr", "rx-dash-row");
      tr.dataset.key = key;
      const c = {
        id: rxEl("td", "rx-muted rx-mono rx-dash-col-id"),
        sandbox: rxEl("td", "rx-muted rx-dash-col-sandbox"),
        command: rxEl("td", "rx-mono rx-dash-command rx-dash-col-command"),
        state: rxEl("td", "rx-dash-col-state"),
        elapsed: rxEl("td", "rx-dash-col-elapsed"),
        bytes: rxEl("td", "rx-dash-col-bytes"),
        usage: rxEl("td", "rx-dash-col-usage"),
        tail: rxEl("td", "rx-mono rx-muted rx-dash-tail rx-dash-col-tail"),
        actions: rxEl("td", "rx-dash-actions rx-dash-col-actions"),
      };
      const entry = { tr, c, data: null, kind: null };
      c.badge = rxEl("span", "rx-badge");
      c.code = document.createTextNode("");
      c.quiet = rxEl("span", "rx-quiet");
      c.state.append(c.badge, c.code, c.quiet);
      c.fold = rxEl("button", "rx-dash-fold");
      c.fold.type = "button";
      c.fold.addEventListener("click", () => {
        const k = entry.data.key;
        const open = new Set(model.get("expanded"));
        if (open.has(k)) open.delete(k);
        else open.add(k);
        save("expanded", [...open]);
      });
      c.name = rxEl("strong", "rx-dash-name");
      c.text = rxEl("span");
      c.command.append(c.fold, c.name, c.text);
      c.intr = rxButton("Interrupt", "Send SIGINT", act(entry, "interrupt"));
      c.kill = rxButton("Kill", "Kill the job", act(entry, "kill"), "rx-danger");
      c.open = rxButton("Open", "Show this job's output live, under the table", act(entry, "open"));
      c.actions.append(c.intr, c.kill, c.open);
      tr.append(c.id, ...(fleet() ? [c.sandbox] : []), c.command, c.state, c.elapsed, c.bytes, c.usage, c.tail, c.actions);
      return entry;
    };
    const update = (entry, r) => {
      const { tr, c } = entry;
      entry.data = r;
      tr.dataset.state = r.state;
      tr.dataset.kind = r.kind;
      tr.dataset.jobId = r.job_id ?? "";
      tr.classList.toggle("rx-dash-child", r.depth > 0);
      const session = r.kind === "session";
      setText(c.id, session ? "shell" : r.job_id.split("-").pop());
      setText(c.sandbox, model.get("sandboxes")[r.sandbox] ?? "");
      c.fold.hidden = !session;
      setText(c.fold, session ? (r.expanded ? "▾" : "▸") : "");
      c.fold.title = session ? (r.expanded ? "Fold this session's commands" : "Show this session's commands") : "";
      // The name leads; then the script's first meaningful line (dashboard_view.py's "title").
      setText(c.name, r.name ?? "");  // (its " ·" is drawn by the CSS)
      c.name.hidden = !r.name;
      setText(c.text, session
        ? `shell ${r.session}: ${r.count} command${r.count === 1 ? "" : "s"}${r.running ? `, ${r.running} running` : ""} · last: ${r.title}`
        : r.title);
      c.command.title = session ? `shell session ${r.session}` : `${r.job_id}\n${r.command}`;
      const state = r.shown;  // dashboard_view.py says it, in the words every view uses
      setText(c.badge, state);
      c.badge.className = `rx-badge rx-state-${state.replace(/ /g, "-")}`;
      // how it ended, in words (dashboard_view.py's "end": "interrupted (SIGINT)"), not a bare code
      c.code.textContent = r.end ? ` · ${r.end}` : r.exit_code === null ? "" : ` (${r.exit_code})`;
      setText(c.bytes, rxFormatBytes(r.bytes));
      setText(c.usage, r.cpu === null || r.cpu === undefined ? "" : `${r.cpu.toFixed(0)}% · ${rxFormatBytes(r.rss)}`);
      setText(c.tail, r.tail);
      c.tail.title = r.tail;
      const running = r.state === "running" && !connection.lost();
      c.intr.hidden = c.kill.hidden = c.open.hidden = session;
      if (c.intr.disabled === running) c.intr.disabled = c.kill.disabled = !running;
      c.open.disabled = connection.lost();
      elapsed(entry);
    };
    const elapsed = (entry) => {
      const r = entry.data;
      const now = (lostAt ?? Date.now() / 1000) - offset; // a lost kernel's table stops its clocks
      setText(entry.c.elapsed, rxFormatDuration(Math.max(0, (r.ended_at ?? now) - r.started_at)));
      // health: a running job quiet for a minute says so ("≥": it was quiet before we looked)
      const q = r.state === "running" && r.last_output_at != null ? rxQuietText(r.last_output_at, r.started_at, offset, 60) : "";
      setText(entry.c.quiet, q && !r.quiet_exact ? q.replace("for ", "for ≥ ") : q);
      entry.c.quiet.title = entry.c.quiet.textContent;
      entry.tr.dataset.quiet = q ? "yes" : "no";
    };
    const renderLinks = () => {
      const links = model.get("links") || {};
      linksBox.replaceChildren();
      for (const url of model.get("sandboxes")) {
        const l = links[url];
        if (!l) continue;
        const item = rxEl("span", "rx-dash-link");
        const badge = rxEl("span");
        rxRenderLink(badge, l.state, l.reason);
        item.dataset.sandbox = url;
        item.append(rxEl("span", "rx-muted", `${url} `), badge);
        linksBox.append(item);
      }
    };
    const onRows = (msg) => {
      offset = Date.now() / 1000 - msg.now;
      for (const r of msg.rows) {
        let entry = rows.get(r.key);
        if (!entry) rows.set(r.key, (entry = makeRow(r.key)));
        update(entry, r);
      }
      const keep = new Set(msg.order);
      for (const [key, entry] of rows) {
        if (!keep.has(key)) {
          entry.tr.remove();
          rows.delete(key);
        }
      }
      // Put rows in order, moving only those out of place (a moved node loses focus and a press).
      let at = body.firstChild;
      for (const key of msg.order) {
        const tr = rows.get(key).tr;
        if (tr === at) at = at.nextSibling;
        else body.insertBefore(tr, at);
      }
      renderStatus();
    };

    const renderStatus = () => {
      const c = model.get("counts");
      if (c.total === undefined) return;
      setText(status, `${c.matching} jobs, ${c.running} running`);
      const notes = [];
      if (model.get("mine_only") && c.total > c.scope) {
        notes.push(`${c.total - c.scope} jobs of other clients hidden (untick "only mine")`);
      }
      if (c.cleared) notes.push(`${c.cleared} finished jobs cleared`);
      notice.replaceChildren(notes.join(" · "));
      if (c.cleared) {
        const show = rxButton("Show cleared", "Show the finished jobs cleared from the table", () =>
          model.send({ type: "show_cleared" }));
        notice.append(" ", show);
      }
      setText(empty, rows.size ? "" : (c.scope ? "no jobs match the filters" : "no jobs"));
      pager.hidden = c.pages <= 1;
      setText(pageText, ` page ${c.page + 1} of ${c.pages} `);
      prev.disabled = c.page <= 0;
      next.disabled = c.page >= c.pages - 1;
    };
    const renderState = () => {
      const disconnected = connection.lost();
      if (disconnected && lostAt === null) lostAt = Date.now() / 1000;
      gone.hidden = !disconnected;
      linksBox.hidden = disconnected; // the gone kernel's links to the sandboxes: no longer known
      root.dataset.state = disconnected ? "disconnected" : "connected";
      for (const input of [mine, stateSel, text, clear, auto, refresh]) input.disabled = disconnected;
      connection.update();
      mine.checked = model.get("mine_only");
      auto.checked = model.get("auto_refresh");
      if (stateSel.value !== model.get("state_filter")) stateSel.value = model.get("state_filter");
      if (document.activeElement !== text) text.value = model.get("text_filter");
      const errs = Object.entries(model.get("errors")).map(([u, m]) => `${u}: ${m}`);
      if (model.get("message")) errs.push(model.get("message"));
      if (disconnected) errs.splice(0, errs.length, rxGoneText("the jobs go on in their sandboxes, this table no longer follows them", ""));
      if (!connection.busy()) setText(errors, errs.join("\n"));
      renderStatus();
    };
    const renderAll = () => {
      renderState();
      for (const entry of rows.values()) update(entry, entry.data);
    };
    const onSandboxes = () => {
      renderHead();
      for (const entry of rows.values()) entry.tr.remove();
      rows.clear();
      model.send({ type: "hello" }); // the columns changed: have every row sent again
    };

    let openedAbort = null;
    const renderOpened = async () => {
      openedAbort?.abort();
      openedBox.replaceChildren();
      const ref = model.get("opened");
      if (!ref || !host) return;
      const controller = new AbortController();
      openedAbort = controller;
      const bar = rxEl("div", "rx-header");
      bar.append(rxEl("span", "rx-muted", "opened job"), rxEl("span", "rx-spacer"),
        rxButton("Close", "Hide this job view", () => model.send({ type: "close_view" })));
      const slot = rxEl("div");
      openedBox.append(bar, slot);
      try {
        const child = await host.getWidget(ref);
        if (!controller.signal.aborted) await child.render({ el: slot, signal: controller.signal });
      } catch (e) {
        slot.textContent = `cannot show the job view: ${e}`;
      }
      // Opened from a row far up a long output: bring the view on screen.
      if (!controller.signal.aborted) openedBox.scrollIntoView({ block: "nearest", behavior: "auto" });
    };

    const onMsg = (msg) => {
      if (msg?.type === "rows") onRows(msg);
    };
    const traits = "change:errors change:message change:auto_refresh change:mine_only change:state_filter " +
      "change:text_filter change:counts";
    model.on(traits, renderState);
    model.on("change:sandboxes", onSandboxes);
    model.on("change:opened", renderOpened);
    model.on("change:links", renderLinks);
    model.on("msg:custom", onMsg);
    renderLinks();
    renderHead();
    renderState();
    renderOpened();
    // Elapsed times of running jobs tick here; only their text changes.
    const timer = setInterval(() => {
      if (connection.lost()) return;
      for (const entry of rows.values()) if (entry.data.state === "running") elapsed(entry);
    }, 1000);
    const unmark = rxMarkControls(model, root);
    const unhold = rxHoldRecord(model, root);
    model.send({ type: "hello" });
    const cleanup = rxOnce(() => {
      unmark();
      unhold();
      clearInterval(timer);
      clearTimeout(textTimer);
      openedAbort?.abort();
      model.off(traits, renderState);
      model.off("change:sandboxes", onSandboxes);
      model.off("change:opened", renderOpened);
      model.off("change:links", renderLinks);
      model.off("msg:custom", onMsg);
      connection.stop();
    });
    return cleanup;
  },
};
