// Health, usage and attention, shared by JobView and Dashboard (prepended after common.js):
// the channel's link badge, "no output for N min", the CPU/memory sparkline and the watching
// that drives its sampling, browser notifications, the "new since you last looked" marker and
// "jump to first error". Each widget calls these from its own section marked "health".

const RX_LINK_TEXT = {
  connecting: "connecting",
  connected: "connected",
  reconnecting: "reconnecting…",
  lost: "agent not answering",
  gone: "sandbox gone",
  closed: "closed",
};

// The sandbox channel's state (traits `link`, `link_reason`) on a badge; the reason on hover.
function rxRenderLink(el, state, reason) {
  const text = RX_LINK_TEXT[state] ?? state;
  if (el.textContent !== text) el.textContent = text;
  el.className = `rx-link rx-link-${state}`;
  el.dataset.link = state;
  el.title = reason || `the channel to the sandbox: ${text}`;
}

// "no output for 3 min 05 s" once a running job was quiet `after` seconds (kernel clock times).
function rxQuietText(lastOutputAt, startedAt, offset, after) {
  const quiet = Date.now() / 1000 - offset - (lastOutputAt ?? startedAt);
  return quiet >= after ? `no output for ${rxFormatDuration(quiet)}` : "";
}

// A sparkline: one SVG polyline per series, each scaled to its own maximum.
const RX_SVG = "http://www.w3.org/2000/svg";

// A labelled sparkline: a short word before the line ("cpu", "mem"); the line's tooltip says
// what it plots and, once drawn, its newest value, its peak and the time it spans.
function rxSparkline(cls, title, word) {
  const svg = document.createElementNS(RX_SVG, "svg");
  svg.setAttribute("class", `rx-spark ${cls}`);
  svg.setAttribute("viewBox", "0 0 100 20");
  svg.setAttribute("preserveAspectRatio", "none");
  svg.setAttribute("role", "img");
  const line = document.createElementNS(RX_SVG, "polyline");
  svg.appendChild(line);
  const tip = document.createElementNS(RX_SVG, "title");
  tip.textContent = title;
  svg.appendChild(tip);
  svg.rxTitle = title;
  const box = rxEl("span", "rx-spark-box");
  box.append(rxEl("span", "rx-spark-label", word), svg);
  box.title = title;
  box.rxSvg = svg;
  return box;
}

// Draw `values` (oldest first; `floor`: the least top of the scale, e.g. 100 for a percentage)
// into a sparkline from rxSparkline; `format` turns a value into text for the tooltip, `span`
// is the seconds the values cover.
function rxDrawSparkline(box, values, floor = 0, format = String, span = 0) {
  const svg = box.rxSvg || box;
  const line = svg.firstChild;
  const max = Math.max(floor, ...values);
  const n = values.length;
  const pts = values.map((v, i) => `${n > 1 ? ((i / (n - 1)) * 100).toFixed(1) : 100},${(19 - (max ? v / max : 0) * 18).toFixed(1)}`);
  line.setAttribute("points", pts.join(" "));
  svg.dataset.points = String(n);
  if (n) {
    const peak = Math.max(...values);
    const over = span > 0 ? ` over the last ${rxFormatDuration(span)}` : "";
    const text = `${svg.rxTitle}: ${format(values[n - 1])} now, peak ${format(peak)}${over}`;
    svg.lastChild.textContent = text;
    if (box !== svg) box.title = text;
  }
}

// Tell Python ({type: "watch", view, on}) while `el` is on screen in a visible tab, renewed every
// `renew` ms (Python forgets a view that stops renewing); returns the cleanup.
function rxWatch(model, el, renew = 5000) {
  const view = Math.random().toString(36).slice(2, 12);
  let onScreen = false;
  let sent = false;
  const check = () => {
    const on = onScreen && !document.hidden;
    if (on !== sent) model.send({ type: "watch", view, on });
    sent = on;
  };
  const observer = typeof IntersectionObserver === "undefined"
    ? null
    : new IntersectionObserver((entries) => {
      onScreen = entries.some((e) => e.isIntersecting);
      check();
    });
  if (observer) observer.observe(el);
  else onScreen = true;
  check();
  document.addEventListener("visibilitychange", check);
  const timer = setInterval(() => sent && model.send({ type: "watch", view, on: true }), renew);
  return () => {
    clearInterval(timer);
    observer?.disconnect();
    document.removeEventListener("visibilitychange", check);
    if (sent) model.send({ type: "watch", view, on: false });
  };
}

// Browser notifications: the permission is asked once, from a press on the bell (a user
// gesture, as browsers require); once answered the bell hides. Notes go out only while the tab
// is hidden: a person looking at the page needs none.
function rxNotifyButton() {
  const b = rxButton("", "Notify me (browser notification) when this job ends or a watch rule fires while the tab is hidden", () => {
    if (typeof Notification !== "undefined") Notification.requestPermission().then(show, show);
  }, "rx-notify");
  // An SVG bell in the text colour: the 🔔 emoji was a tofu box where no colour-emoji font is.
  b.innerHTML =
    '<svg viewBox="0 0 16 16" width="12" height="12" aria-hidden="true" fill="currentColor">' +
    '<path d="M8 16a2 2 0 0 0 2-2H6a2 2 0 0 0 2 2zm5-5V7a5 5 0 0 0-4-4.9V1a1 1 0 1 0-2 0v1.1A5 5 0 0 0 3 7v4l-2 2v1h14v-1z"/></svg>';
  b.setAttribute("aria-label", "Notify me");
  const show = () => {
    b.hidden = typeof Notification === "undefined" || Notification.permission !== "default";
  };
  show();
  return b;
}

// What this page already told (tag + title): several views of one job (a re-rendered output,
// Open in the dashboard) each see the same change, and the person is told once.
const RX_NOTIFIED = new Set();

function rxNotify(title, body, tag) {
  if (typeof Notification === "undefined" || Notification.permission !== "granted" || !document.hidden) return null;
  const key = `${tag}|${title}`;
  if (RX_NOTIFIED.has(key)) return null;
  if (RX_NOTIFIED.size > 1000) RX_NOTIFIED.clear(); // bounded: a page open for days
  RX_NOTIFIED.add(key);
  try {
    return new Notification(title, { body, tag });
  } catch (e) {
    return null; // some browsers allow notifications only from a service worker
  }
}

// "New since you last looked": when the tab is hidden, note each pane's end; when it is shown
// again, mark the first line that came meanwhile (the mark stays until the tab is hidden again).
// Marks live in the page, not in the view: a view is drawn anew when its output is rewritten
// (update_display: once, at its job's end) or shown again, and the mark must outlive that.
// Keyed by model and pane.
const RX_SINCE = new Map(); // `${model id}:${pane}` -> {at (absolute line index of the last line seen), shown}

function rxSinceMarker(views, id) {
  const key = (name) => `${id}:${name}`;
  const place = (name, view) => {
    view.el.querySelector(".rx-new-since")?.classList.remove("rx-new-since");
    const m = RX_SINCE.get(key(name));
    // By absolute line number (lines hidden before the pane's first, plus its index): a replay
    // resets the pane's versions and base.
    if (!m || !m.shown || view.pane.hidden + view.pane.lines.length - 1 <= m.at) return;
    view.el.children[m.at - view.pane.hidden]?.classList.add("rx-new-since");
  };
  const note = (name, view) => {
    const pane = view.pane;
    if (RX_SINCE.size > 1000) RX_SINCE.clear(); // bounded: a page open for days
    RX_SINCE.set(key(name), { at: pane.hidden + pane.lines.length - 1, shown: false });
  };
  const onVisibility = () => {
    for (const [name, view] of Object.entries(views)) {
      if (document.hidden) note(name, view);
      else if (RX_SINCE.has(key(name))) {
        RX_SINCE.get(key(name)).shown = true;
        place(name, view);
      }
    }
  };
  // Drawn while hidden with no mark yet (the first view, hidden at once): mark from here.
  if (document.hidden) for (const [name, view] of Object.entries(views)) if (!RX_SINCE.has(key(name))) note(name, view);
  document.addEventListener("visibilitychange", onVisibility);
  return {
    update: () => Object.entries(views).forEach(([name, view]) => place(name, view)),
    cleanup: () => document.removeEventListener("visibilitychange", onVisibility),
  };
}

// "First error": scroll a pane to its first kept line holding a Traceback or "error:".
const RX_ERROR_LINE = /Traceback \(most recent call last\)|\berror:/i;

function rxFirstErrorButton(view) {
  const b = rxButton("First error", "Jump to the first Traceback or “error:” line kept in this pane", () => {
    const line = [...view.el.children].find((div) => RX_ERROR_LINE.test(div.textContent));
    view.el.querySelector(".rx-error-line")?.classList.remove("rx-error-line");
    if (!line) {
      rxFlash(b, "No error shown");
      return;
    }
    view.stick = false; // stay there: new output must not scroll it away
    line.classList.add("rx-error-line");
    view.el.scrollTop = line.offsetTop - view.el.offsetTop - 4;
  });
  return b;
}
