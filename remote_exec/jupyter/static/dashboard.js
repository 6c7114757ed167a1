// Dashboard: the jobs of one sandbox or a fleet. Traits: rows, sandboxes, errors, interval,
// auto_refresh, now, message, opened (a JobView shown under the table).
// Sends {type: "hello" | "refresh" | "auto" | "close_view" | "kill" | "interrupt" | "open"}.

export default {
  render({ model, el, host }) {
    const root = rxEl("div", "rx-widget rx-dashboard");
    el.appendChild(root);
    const header = rxEl("div", "rx-header");
    const title = rxEl("strong", "", "Jobs");
    const status = rxEl("span", "rx-muted");
    const autoLabel = rxEl("label", "rx-muted rx-dash-auto");
    const auto = rxEl("input");
    auto.type = "checkbox";
    auto.addEventListener("change", () => model.send({ type: "auto", on: auto.checked }));
    autoLabel.append(auto, document.createTextNode(" auto-refresh"));
    const refresh = rxButton("Refresh", "Fetch the job list now", () => model.send({ type: "refresh" }));
    header.append(title, status, rxEl("span", "rx-spacer"), autoLabel, refresh);
    const errors = rxEl("div", "rx-error");
    const table = rxEl("table", "rx-dash-table");
    const body = rxEl("tbody");
    table.append(rxEl("thead"), body);
    const openedBox = rxEl("div", "rx-dash-opened");
    root.append(header, errors, table, openedBox);

    let offset = 0; // browser clock minus kernel clock
    const renderRows = () => {
      const rows = model.get("rows");
      const fleet = model.get("sandboxes").length > 1;
      const now = Date.now() / 1000 - offset;
      const head = ["", "command", "state", "elapsed", "output", "last line", ""];
      if (fleet) head.splice(1, 0, "sandbox");
      table.tHead.replaceChildren(rxEl("tr"));
      for (const h of head) table.tHead.rows[0].appendChild(rxEl("th", "", h));
      body.replaceChildren();
      for (const r of rows) {
        const tr = rxEl("tr", "rx-dash-row");
        tr.dataset.jobId = r.job_id;
        tr.dataset.state = r.state;
        const state = r.state === "timed_out" ? "timed out" : r.state === "completed" && r.exit_code ? "failed" : r.state;
        const badge = rxEl("span", `rx-badge rx-state-${state.replace(/ /g, "-")}`, state);
        const code = r.exit_code === null ? "" : ` (${r.exit_code})`;
        const cmd = rxEl("td", "rx-mono rx-dash-command", (r.label ? `[${r.label}] ` : "") + r.command.split("\n")[0]);
        cmd.title = `${r.job_id}\n${r.command}`;
        const cells = [
          rxEl("td", "rx-muted rx-mono", r.job_id.split("-").pop()),
          cmd,
          rxEl("td"),
          rxEl("td", "", rxFormatDuration((r.ended_at ?? now) - r.started_at)),
          rxEl("td", "", rxFormatBytes(r.bytes)),
          rxEl("td", "rx-mono rx-muted rx-dash-tail", r.tail),
          rxEl("td", "rx-dash-actions"),
        ];
        cells[2].append(badge, document.createTextNode(code));
        if (fleet) cells.splice(1, 0, rxEl("td", "rx-muted", model.get("sandboxes")[r.sandbox]));
        const running = r.state === "running";
        const act = (type) => () => model.send({ type, sandbox: r.sandbox, job_id: r.job_id });
        const actions = cells[cells.length - 1];
        const intr = rxButton("Interrupt", "Send SIGINT", act("interrupt"));
        const kill = rxButton("Kill", "Kill the job", act("kill"), "rx-danger");
        intr.disabled = kill.disabled = !running;
        actions.append(intr, kill, rxButton("Open", "Show this job's output live", act("open")));
        tr.append(...cells);
        body.appendChild(tr);
      }
      if (!rows.length) {
        const tr = rxEl("tr");
        const td = rxEl("td", "rx-muted", "no jobs");
        td.colSpan = head.length;
        tr.appendChild(td);
        body.appendChild(tr);
      }
      const running = rows.filter((r) => r.state === "running").length;
      status.textContent = `${rows.length} jobs, ${running} running`;
      auto.checked = model.get("auto_refresh");
      const errs = Object.entries(model.get("errors")).map(([u, m]) => `${u}: ${m}`);
      if (model.get("message")) errs.push(model.get("message"));
      errors.textContent = errs.join("\n");
    };
    const onNow = () => {
      offset = Date.now() / 1000 - model.get("now");
      renderRows();
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
    };

    const traits = "change:rows change:errors change:message change:auto_refresh change:sandboxes";
    model.on(traits, renderRows);
    model.on("change:now", onNow);
    model.on("change:opened", renderOpened);
    onNow();
    renderOpened();
    const timer = setInterval(renderElapsed, 1000);
    function renderElapsed() {
      if (model.get("rows").some((r) => r.state === "running")) renderRows();
    }
    model.send({ type: "hello" });
    return () => {
      clearInterval(timer);
      openedAbort?.abort();
      model.off(traits, renderRows);
      model.off("change:now", onNow);
      model.off("change:opened", renderOpened);
    };
  },
};
