"""``Dashboard``: the jobs of one sandbox, or of several (a fleet), refreshed live.

Rows come from ``jobs()``; by default only this kernel's/notebook's are shown (a toggle shows
every client's). Shell commands fold under their session; filters, "clear finished" and pages
keep thousands of jobs usable. Each job row has Interrupt, Kill and Open (a
:class:`~remote_exec.jupyter.job_view.JobView` of the job, shown under the table).

What persists (filters, page, folds) is widget state; rows travel as ``{type: "rows"}``
messages carrying only the rows that changed since the last one, so the front end updates its
table in place (a selection, focus or a press on a button survives a refresh).

Displayed, its output carries a record (the page's rows), kept fresh in a draft beside it every
``RECORD_PERIOD`` s at most as it refreshes (the view is never re-rendered for it): a saved
notebook shows the jobs as they last were (:mod:`~remote_exec.jupyter.saving`).

Health: ``links`` holds each sandbox's channel state (:class:`~remote_exec.client.link.Link`),
shown above the table; each running job's row carries its CPU and memory (one batched
``job_stats_many`` per sandbox and refresh, for the running jobs of the page shown, so only
while a view refreshes) and when its output last grew (``quiet_since``; ``quiet_exact`` false
when the job was already quiet when the dashboard first saw it: then it is "at least").
"""

from __future__ import annotations

import asyncio
import contextlib
import time
import uuid
from collections.abc import Callable, Iterable, Sequence
from typing import Any

import anywidget
import traitlets

from ..blocking import BlockingExecRemoteProcess, Sandbox
from ..client.activity import OutputActivity
from ..client.link import LinkStatus
from ..client.sandbox import AsyncSandbox
from ..errors import JobNotFoundError, JobNotRunningError, RemoteExecError, SandboxClosedError
from ..protocol import JobInfo, JobStats
from ._assets import css, esm
from .controls import ack_control, enable_controls
from .dashboard_view import STATE_FILTERS, Filters, Identity, Page, is_mine, job_row, session_row, visible
from .display import jobs_table, widgets_enabled
from .follow import loop_of
from .job_view import RECORD_PERIOD, JobView
from .record import RecordedDisplay, jobs_html
from .saving import RECORD_META
from .transcript import strip_ansi

__all__ = ["Dashboard"]


def _link(status: LinkStatus) -> dict[str, Any]:
    return {"state": status.state, "reason": status.reason, "since": status.since}


TAIL_BYTES = 1024  # the end of each stream read for a row's "last line"


def _last_line(text: str) -> str:
    for line in reversed(strip_ansi(text).replace("\r", "\n").splitlines()):
        if line.strip():
            return line.strip()[:200]
    return ""


async def tail_line(sandbox: AsyncSandbox, job: JobInfo) -> tuple[str, int]:
    """The last non-empty line of the job's stdout (else stderr), read from the end only, and
    the bytes written by then (the line may be newer than ``job``'s counts)."""
    out = await sandbox.tail_output(job.job_id, TAIL_BYTES, "stdout")
    err = await sandbox.tail_output(job.job_id, TAIL_BYTES, "stderr")
    texts = [x.data.decode("utf-8", "replace") for x in (out, err)]
    return _last_line(texts[0]) or _last_line(texts[1]), out.size + err.size


class Dashboard(anywidget.AnyWidget):
    """Jobs of one sandbox or a fleet of them, with per-row Kill / Interrupt / Open.

    :param sandboxes: one blocking sandbox (``rx.connect(url)``) or several.
    :param interval: seconds between refreshes while a view is shown (and ``auto_refresh``).
    :param mine_only: show only this kernel's/notebook's jobs (the toggle "only mine" changes it).
    :param known: handles (or job ids) of jobs this kernel started, counted as its own.
    :param page_size: lines per page.
    :param state: show only jobs in this state: ``all``, ``running``, ``finished`` or ``failed``.
    :param text: show only jobs whose label, command or id contains this (case-insensitive).
    :raises SandboxClosedError: a sandbox is closed already.
    """

    _esm = esm("dashboard", "health")
    _css = css("dashboard", "health")

    sandboxes = traitlets.List(traitlets.Unicode()).tag(sync=True)
    errors = traitlets.Dict().tag(sync=True)
    interval = traitlets.Float(2.0).tag(sync=True)
    auto_refresh = traitlets.Bool(True).tag(sync=True)
    message = traitlets.Unicode("").tag(sync=True)
    opened = anywidget.WidgetTrait().tag(sync=True)
    mine_only = traitlets.Bool(True).tag(sync=True)
    state_filter = traitlets.Unicode("all").tag(sync=True)
    text_filter = traitlets.Unicode("").tag(sync=True)
    page = traitlets.Int(0).tag(sync=True)
    page_size = traitlets.Int(50).tag(sync=True)
    expanded = traitlets.List(traitlets.Unicode()).tag(sync=True)
    counts = traitlets.Dict().tag(sync=True)
    links = traitlets.Dict().tag(sync=True)  # url -> {state, reason, since}: each channel's Link
    controls = traitlets.Dict().tag(sync=True)  # {socket, token, widget}: controls past a busy kernel

    def __init__(
        self,
        sandboxes: Sandbox | Sequence[Sandbox],
        *,
        interval: float = 2.0,
        mine_only: bool = True,
        known: Iterable[BlockingExecRemoteProcess | str] = (),
        page_size: int = 50,
        state: str = "all",
        text: str = "",
    ) -> None:
        self._unsubscribe: list[Callable[[], None]] = []  # close() may run with __init__ failed
        self._sbs = [sandboxes] if isinstance(sandboxes, Sandbox) else list(sandboxes)
        if not self._sbs:
            raise ValueError("a dashboard needs at least one sandbox")
        for sb in self._sbs:
            if sb.closed:
                raise SandboxClosedError(f"{sb.url}: this sandbox is closed; open a new one with rx.connect()")
        super().__init__(
            sandboxes=[sb.url for sb in self._sbs],
            interval=interval,
            mine_only=mine_only,
            page_size=page_size,
            state_filter=state if state in STATE_FILTERS else "all",
            text_filter=text,
        )
        self._loop = loop_of(self._sbs[0])
        self._who = Identity.current()
        self._known = list(known)
        self._jobs: list[tuple[int, JobInfo]] = []
        self._tails: dict[str, tuple[int, str]] = {}  # job id -> (bytes written, last line) when read
        self._cleared: set[str] = set()  # finished jobs hidden by "clear finished"
        self._sent: dict[str, dict[str, Any]] = {}  # key -> row as the front end last got it
        self._order: list[str] = []
        self.rows: list[dict[str, Any]] = []
        """The rows of the page shown (what the front end draws)."""
        self._refresher: asyncio.Task[None] | None = None
        self._closed = False
        self._display = RecordedDisplay(self._repr_mimebundle_)  # the output that shows it, its record rewritten
        self._recorded = float("-inf")
        self._recorded_text = ""  # the record last written (rewritten only when it changes)
        self._usage: dict[str, JobStats] = {}  # running job id -> its last reading
        self._activity = OutputActivity()  # when each job's output last grew
        self._unsubscribe = [sb.link.subscribe(self._on_link) for sb in self._sbs]
        self.links = {sb.url: _link(sb.link.status) for sb in self._sbs}
        self.on_msg(self._on_front_end_msg)
        self.observe(self._on_view_change, ["mine_only", "state_filter", "text_filter", "page", "expanded"])
        if not widgets_enabled():
            self.refresh()  # plain text shows a snapshot
        else:  # last: its trait is set on the loop thread, which then owns the widget
            self._loop.spawn(self._enable_controls)

    # -- refreshing (loop thread) -----------------------------------------------------------------

    async def _refresh(self) -> None:
        jobs: list[tuple[int, JobInfo]] = []
        errors: dict[str, str] = {}
        for i, sb in enumerate(self._sbs):
            if sb.closed:  # the blocking face's words, not the async core's
                errors[sb.url] = "this sandbox is closed; open a new one with rx.connect()"
                continue
            try:
                jobs += [(i, j) for j in await sb.async_sandbox.jobs()]
            except (RemoteExecError, RuntimeError) as exc:  # RuntimeError: closed meanwhile
                errors[sb.url] = str(exc)
        live = {job.job_id for _, job in jobs}
        self._tails = {k: v for k, v in self._tails.items() if k in live}
        self._cleared &= live
        self._jobs = jobs
        self._activity.note(job for _, job in jobs)
        if errors != self.errors:
            self.errors = errors
        await self._sample_usage()
        await self._publish()

    async def _sample_usage(self) -> None:
        """CPU and memory of the running jobs on the page shown: one batched call per sandbox."""
        wanted: dict[int, list[str]] = {}
        for entry in self._page().entries:
            if entry[0] == "job" and entry[2].state == "running":
                wanted.setdefault(entry[1], []).append(entry[2].job_id)
        usage: dict[str, JobStats] = {}
        for i, ids in wanted.items():
            # An error (or a lost link) shows above the table; the rows then carry no numbers.
            with contextlib.suppress(RemoteExecError, RuntimeError):
                usage |= await self._sbs[i].async_sandbox.job_stats_many(ids)
        self._usage = usage

    def _on_link(self, _status: LinkStatus) -> None:
        # On the loop thread (where the channel reports); one dict for all the sandboxes.
        self.links = {sb.url: _link(sb.link.status) for sb in self._sbs}

    def _known_ids(self) -> set[str]:
        return {k if isinstance(k, str) else (k.job_id or "") for k in self._known}

    def _page(self) -> Page:
        filters = Filters(self.mine_only, self.state_filter, self.text_filter)
        return visible(
            self._jobs,
            filters=filters,
            who=self._who,
            known=self._known_ids(),
            cleared=self._cleared,
            expanded=self.expanded,
            page=self.page,
            page_size=self.page_size,
        )

    async def _publish(self) -> None:
        """Recompute the page shown and send the rows that changed (nothing if none did)."""
        view = self._page()
        rows = []
        for entry in view.entries:
            if entry[0] == "session":
                _, i, sid, jobs = entry
                rows.append(session_row(i, sid, jobs, f"shell:{i}:{sid}" in self.expanded))
            else:
                _, i, job, depth = entry
                rows.append(self._health(job, job_row(i, job, *await self._tail(i, job), depth=depth)))
        self.rows = rows
        if view.counts != self.counts:
            self.counts = view.counts
        order = [r["key"] for r in rows]
        changed = [r for r in rows if self._sent.get(r["key"]) != r]
        if changed or order != self._order:
            self._sent = {r["key"]: r for r in rows}
            self._order = order
            self.send({"type": "rows", "order": order, "rows": changed, "now": time.time()})
        if self._display.shown and time.monotonic() - self._recorded >= RECORD_PERIOD:
            self._update_record()

    def _health(self, job: JobInfo, row: dict[str, Any]) -> dict[str, Any]:
        st = self._usage.get(job.job_id) if job.state == "running" else None
        quiet = self._activity.get(job.job_id)
        return {
            **row,
            "cpu": round(st.cpu_percent, 1) if st else None,
            "rss": st.rss if st else None,
            "last_output_at": quiet.since if quiet else None,
            "quiet_exact": quiet.exact if quiet else False,
        }

    async def _tail(self, i: int, job: JobInfo) -> tuple[str, int]:
        written = job.stdout_bytes + job.stderr_bytes
        cached = self._tails.get(job.job_id)
        if cached is not None and cached[0] >= written:
            return cached[1], cached[0]
        try:
            tail, written = await tail_line(self._sbs[i].async_sandbox, job)
        except (RemoteExecError, RuntimeError):
            tail = ""  # released (or the sandbox closed) meanwhile: the next refresh drops the row
        self._tails[job.job_id] = (written, tail)
        return tail, written

    async def _auto(self) -> None:
        while not self._closed and self.auto_refresh:
            await self._guard(self._refresh)
            await asyncio.sleep(max(self.interval, 0.2))
        self._refresher = None

    def _start_auto(self) -> None:
        if self._refresher is None and not self._closed and self.auto_refresh:
            self._refresher = asyncio.get_running_loop().create_task(self._auto())

    async def _guard(self, fn: Any, *args: Any) -> None:
        try:
            await fn(*args)
        except JobNotRunningError:
            pass
        except RemoteExecError as exc:
            self.message = str(exc)

    # -- row actions (loop thread) ----------------------------------------------------------------

    def _sandbox(self, index: object) -> Sandbox | None:
        return self._sbs[index] if isinstance(index, int) and 0 <= index < len(self._sbs) else None

    async def _signal(self, sb: Sandbox, job_id: str, what: str) -> None:
        proc = await sb.async_sandbox.attach(job_id)
        if what == "kill":
            await proc.kill()
        else:
            await proc.signal("SIGINT")
        await self._refresh()

    async def _open(self, sb: Sandbox, job_id: str) -> None:
        info = next((j for _, j in self._jobs if j.job_id == job_id), None)
        proc = BlockingExecRemoteProcess(self._loop.portal, await sb.async_sandbox.attach(job_id))
        view = JobView(
            proc,
            command=info.command if info else None,
            started_at=info.started_at if info else None,
            sandbox=sb.url,
        )
        old, self.opened = self.opened, view
        if isinstance(old, JobView):
            old.close()

    async def _clear_finished(self) -> None:
        known = self._known_ids()
        self._cleared |= {
            j.job_id
            for _, j in self._jobs
            if j.state != "running" and (not self.mine_only or is_mine(j, self._who, known))
        }
        await self._publish()

    async def _enable_controls(self) -> None:
        # Row Kill/Interrupt by the kernel's control socket, which a running cell does not hold up.
        value = await enable_controls(self, self.model_id)
        if value is not None:
            self.controls = value

    def control(self, content: dict[str, Any]) -> None:
        """A message that came by the control socket (loop thread): handled as the comm's."""
        self._on_front_end_msg(self, content, None)

    # -- from the front end (main thread) ---------------------------------------------------------

    def _on_front_end_msg(self, _widget: object, content: object, _buffers: object) -> None:
        if not isinstance(content, dict):
            return
        ack_control(self._loop.call_soon, self.send, content)
        kind, job_id, sb = content.get("type"), content.get("job_id"), self._sandbox(content.get("sandbox"))
        if kind == "hello":  # a view rendered: it has no rows yet, send them all
            self._loop.call_soon(self._hello)
        elif kind == "refresh":
            self._loop.spawn(self._guard, self._refresh)
        elif kind == "auto":
            self._loop.call_soon(self._set_auto, bool(content.get("on")))
        elif kind == "clear_finished":
            self._loop.spawn(self._guard, self._clear_finished)
        elif kind == "show_cleared":
            self._loop.spawn(self._guard, self._show_cleared)
        elif kind == "hold":  # a press or typing in a view: a final rewrite of its output waits
            self._display.hold(content.get("on") is True)
        elif kind == "close_view":
            self._loop.call_soon(self._close_opened)
        elif kind in ("kill", "interrupt") and sb is not None and isinstance(job_id, str):
            self._loop.spawn(self._guard, self._signal, sb, job_id, kind)
        elif kind == "open" and sb is not None and isinstance(job_id, str):
            self._loop.spawn(self._guard, self._open, sb, job_id)

    def _on_view_change(self, change: Any) -> None:
        if change["name"] == "state_filter" and change["new"] not in STATE_FILTERS:
            self.state_filter = "all"  # a value no control offers: from a stale or foreign front end
            return
        if change["name"] in ("mine_only", "state_filter", "text_filter") and self.page:
            self.page = 0  # a new filter starts at its first page (this change publishes)
            return
        self._loop.spawn(self._guard, self._publish)

    def _hello(self) -> None:
        self._sent, self._order = {}, []
        self._loop.spawn(self._guard, self._publish)
        self._start_auto()

    async def _show_cleared(self) -> None:
        self._cleared.clear()
        await self._publish()

    def _set_auto(self, on: bool) -> None:
        self.auto_refresh = on
        if on:
            self._start_auto()

    def _close_opened(self) -> None:
        old, self.opened = self.opened, None
        if isinstance(old, JobView):
            old.close()

    # -- Python side -------------------------------------------------------------------------------

    def refresh(self) -> None:
        """Fetch the job lists now (blocking)."""
        self._loop.call(self._refresh)

    def clear_finished(self) -> None:
        """Hide the finished jobs shown now (their records stay in the agent; see :meth:`show_cleared`)."""
        self._loop.call(self._clear_finished)

    def show_cleared(self) -> None:
        """Show the jobs :meth:`clear_finished` hid again."""
        self._loop.call(self._show_cleared)

    def open_job(self, job_id: str) -> JobView:
        """Show a live view of ``job_id`` under the table, and return it.

        :raises JobNotFoundError: no sandbox of the dashboard has that job.
        """
        for sb in self._sbs:
            if any(j.job_id == job_id for j in sb.jobs()):
                self._loop.call(self._open, sb, job_id)
                assert isinstance(self.opened, JobView)
                return self.opened
        raise JobNotFoundError(f"no job {job_id} in {', '.join(self.sandboxes)}", job_id=job_id)

    def close(self) -> None:
        """Stop refreshing and close the widget (and the job view it shows)."""
        self._closed = True
        for unsubscribe in self._unsubscribe:
            unsubscribe()
        if isinstance(self.opened, JobView):
            self.opened.close()
        super().close()

    def __repr__(self) -> str:
        view = self._page()
        shown = [(self._sbs[e[1]].url, e[2]) for e in view.entries if e[0] == "job"]
        for e in view.entries:
            if e[0] == "session":  # folded: its newest command stands for the session
                shown.append((self._sbs[e[1]].url, max(e[3], key=lambda j: j.started_at)))
        shown.sort(key=lambda x: -x[1].started_at)
        text = jobs_table(shown)
        c = view.counts
        notes = []
        if c["pages"] > 1:
            notes.append(f"page {c['page'] + 1} of {c['pages']}")
        if self.mine_only and c["total"] > c["scope"]:
            notes.append(f"{c['total'] - c['scope']} jobs of other clients hidden (mine_only=False shows them)")
        return text + "".join(f"\n({n})" for n in notes)

    def _repr_mimebundle_(self, **kwargs: Any) -> Any:
        if not widgets_enabled():
            return {"text/plain": repr(self)}
        bundle: Any = super()._repr_mimebundle_(**kwargs)
        data, meta = bundle if isinstance(bundle, tuple) else (bundle, None)
        c = self.counts
        pages = f", page {c.get('page', 0) + 1} of {c['pages']}" if c.get("pages", 1) > 1 else ""
        note = f"as of {time.strftime('%Y-%m-%d %H:%M:%S')}, {c.get('matching', len(self.rows))} listed{pages}"
        data = {**data, "text/plain": repr(self), "text/html": jobs_html(self.rows, self.sandboxes, note)}
        # saved in place of the widget (saving.py), with what a Reconnect opens
        mark = {"kind": "dashboard", "sandboxes": list(self.sandboxes)}
        return data, {**(meta or {}), RECORD_META: mark}

    @property
    def _ipython_display_(self) -> Callable[[], None] | None:
        """IPython's hook for a cell's value or ``display()``: with widgets, :meth:`show` (a record
        that follows); else none, so the plain table stays the cell's value (what nbval compares)."""
        return self.show if widgets_enabled() else None

    def show(self) -> None:
        """Display the dashboard, its stored record kept up to date (see the module doc)."""
        if widgets_enabled() and not self._jobs:
            self.refresh()  # the record shows the jobs from the start, not "no jobs"
        self._recorded = time.monotonic()
        self._recorded_text = repr((self.rows, self.counts, self.errors))  # what this first record shows
        self._display.show(uuid.uuid4().hex)

    def _update_record(self) -> None:
        self._recorded = time.monotonic()
        # Only when the table would read differently (its "as of" time aside): each rewrite sends
        # the whole record, ~10 kB for a page of 50 rows, to every front end.
        text = repr((self.rows, self.counts, self.errors))
        if text == self._recorded_text:
            return
        self._recorded_text = text
        self._display.update()
