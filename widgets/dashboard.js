// Dashboard: the jobs of one sandbox or a fleet. Traits: rows, sandboxes, errors, interval,
// auto_refresh, now, message, opened (a JobView shown under the table).
// Sends {type: "hello" | "refresh" | "auto" | "close_view" | "kill" | "interrupt" | "open"}.

function dashEl(tag, cls, text) {
  const e = document.createElement(tag);
  if (cls) e.className = cls;
  if (text !== undefined) e.textContent = text;
  return e;
}

export default {
  render({ model, el, host }) {
    const root = dashEl("div", "rx-widget rx-dashboard");
    el.appendChild(root);
    const header = dashEl("div", "rx-header");
    const title = dashEl("strong", "", "Jobs");
    const status = dashEl("span", "rx-muted");
    const autoLabel = dashEl("label", "rx-muted rx-dash-auto");
    const auto = dashEl("input");
    auto.type = "checkbox";
    auto.addEventListener("change", () => model.send({ type: "auto", on: auto.checked }));
    autoLabel.append(auto, document.createTextNode(" auto-refresh"));
    const refresh = rxButton("Refresh", "Fetch the job list now", () => model.send({ type: "refresh" }));
    header.append(title, status, dashEl("span", "rx-spacer"), autoLabel, refresh);
    const errors = dashEl("div", "rx-error");
    const table = dashEl("table", "rx-dash-table");
    const body = dashEl("tbody");
    table.append(dashEl("thead"), body);
    const openedBox = dashEl("div", "rx-dash-opened");
    root.append(header, errors, table, openedBox);

    let offset = 0; // browser clock minus kernel clock
    const renderRows = () => {
      const rows = model.get("rows");
      const fleet = model.get("sandboxes").length > 1;
      const now = Date.now() / 1000 - offset;
      const head = ["", "command", "state", "elapsed", "output", "last line", ""];
      if (fleet) head.splice(1, 0, "sandbox");
      table.tHead.replaceChildren(dashEl("tr"));
      for (const h of head) table.tHead.rows[0].appendChild(dashEl("th", "", h));
      body.replaceChildren();
      for (const r of rows) {
        const tr = dashEl("tr", "rx-dash-row");
        tr.dataset.jobId = r.job_id;
        tr.dataset.state = r.state;
        const state = r.state === "timed_out" ? "timed out" : r.state === "completed" && r.exit_code ? "failed" : r.state;
        const badge = dashEl("span", `rx-badge rx-state-${state.replace(/ /g, "-")}`, state);
        const code = r.exit_code === null ? "" : ` (${r.exit_code})`;
        const cmd = dashEl("td", "rx-mono rx-dash-command", (r.label ? `[${r.label}] ` : "") + r.command.split("\n")[0]);
        cmd.title = `${r.job_id}\n${r.command}`;
        const cells = [
          dashEl("td", "rx-muted rx-mono", r.job_id.split("-").pop()),
          cmd,
          dashEl("td"),
          dashEl("td", "", rxFormatDuration((r.ended_at ?? now) - r.started_at)),
          dashEl("td", "", rxFormatBytes(r.bytes)),
          dashEl("td", "rx-mono rx-muted rx-dash-tail", r.tail),
          dashEl("td", "rx-dash-actions"),
        ];
        cells[2].append(badge, document.createTextNode(code));
        if (fleet) cells.splice(1, 0, dashEl("td", "rx-muted", model.get("sandboxes")[r.sandbox]));
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
        const tr = dashEl("tr");
        const td = dashEl("td", "rx-muted", "no jobs");
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
      const bar = dashEl("div", "rx-header");
      bar.append(dashEl("span", "rx-muted", "opened job"), dashEl("span", "rx-spacer"),
        rxButton("Close", "Hide this job view", () => model.send({ type: "close_view" })));
      const slot = dashEl("div");
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
