"""``Dashboard``: every job of one sandbox, or of several (a fleet), refreshed live.

Rows come from ``jobs()``, so they include jobs started by other clients or a previous kernel.
Each row has Interrupt, Kill and Open (a :class:`~remote_exec.jupyter.job_view.JobView` of the
job, shown under the table).
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Sequence
from typing import Any

import anywidget
import traitlets

from ..blocking import BlockingExecRemoteProcess, Sandbox
from ..client.sandbox import AsyncSandbox
from ..errors import JobNotFoundError, JobNotRunningError, RemoteExecError
from ..protocol import JobInfo
from ._assets import css, esm
from .display import jobs_table, widgets_enabled
from .follow import loop_of
from .job_view import JobView
from .transcript import strip_ansi

__all__ = ["Dashboard"]

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
    """

    _esm = esm("dashboard")
    _css = css("dashboard")

    rows = traitlets.List(traitlets.Dict()).tag(sync=True)
    sandboxes = traitlets.List(traitlets.Unicode()).tag(sync=True)
    errors = traitlets.Dict().tag(sync=True)
    interval = traitlets.Float(2.0).tag(sync=True)
    auto_refresh = traitlets.Bool(True).tag(sync=True)
    now = traitlets.Float(0.0).tag(sync=True)
    message = traitlets.Unicode("").tag(sync=True)
    opened = anywidget.WidgetTrait().tag(sync=True)

    def __init__(self, sandboxes: Sandbox | Sequence[Sandbox], *, interval: float = 2.0) -> None:
        self._sbs = [sandboxes] if isinstance(sandboxes, Sandbox) else list(sandboxes)
        if not self._sbs:
            raise ValueError("a dashboard needs at least one sandbox")
        super().__init__(sandboxes=[sb.url for sb in self._sbs], interval=interval)
        self._loop = loop_of(self._sbs[0])
        self._jobs: list[tuple[int, JobInfo]] = []
        self._tails: dict[str, tuple[int, str]] = {}  # job id -> (bytes written, last line) when read
        self._refresher: asyncio.Task[None] | None = None
        self._closed = False
        self.on_msg(self._on_front_end_msg)
        if not widgets_enabled():
            self.refresh()  # plain text shows a snapshot

    # -- refreshing (loop thread) -----------------------------------------------------------------

    async def _refresh(self) -> None:
        jobs: list[tuple[int, JobInfo]] = []
        errors: dict[str, str] = {}
        for i, sb in enumerate(self._sbs):
            try:
                jobs += [(i, j) for j in await sb.async_sandbox.jobs()]
            except (RemoteExecError, RuntimeError) as exc:  # RuntimeError: that sandbox was closed
                errors[sb.url] = str(exc)
        rows = []
        for i, job in sorted(jobs, key=lambda x: -x[1].started_at):
            rows.append(await self._row(i, job))
        live = {job.job_id for _, job in jobs}
        self._tails = {k: v for k, v in self._tails.items() if k in live}
        self._jobs = jobs
        with self.hold_sync():
            self.rows, self.errors, self.now = rows, errors, time.time()

    async def _row(self, i: int, job: JobInfo) -> dict[str, Any]:
        written = job.stdout_bytes + job.stderr_bytes
        cached = self._tails.get(job.job_id)
        if cached is not None and cached[0] >= written:
            written, tail = cached
        else:
            try:
                tail, written = await tail_line(self._sbs[i].async_sandbox, job)
            except RemoteExecError:
                tail = ""  # released meanwhile: the next refresh drops the row
            self._tails[job.job_id] = (written, tail)
        command = job.command if isinstance(job.command, str) else " ".join(job.command)
        return {
            "sandbox": i,
            "job_id": job.job_id,
            "command": command,
            "label": job.label or "",
            "state": job.state,
            "exit_code": job.exit_code,
            "started_at": job.started_at,
            "ended_at": job.ended_at,
            "bytes": written,
            "tail": tail,
        }

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

    # -- from the front end (main thread) ---------------------------------------------------------

    def _on_front_end_msg(self, _widget: object, content: object, _buffers: object) -> None:
        if not isinstance(content, dict):
            return
        kind, job_id, sb = content.get("type"), content.get("job_id"), self._sandbox(content.get("sandbox"))
        if kind == "hello":
            self._loop.call_soon(self._start_auto)
        elif kind == "refresh":
            self._loop.spawn(self._guard, self._refresh)
        elif kind == "auto":
            self._loop.call_soon(self._set_auto, bool(content.get("on")))
        elif kind == "close_view":
            self._loop.call_soon(self._close_opened)
        elif kind in ("kill", "interrupt") and sb is not None and isinstance(job_id, str):
            self._loop.spawn(self._guard, self._signal, sb, job_id, kind)
        elif kind == "open" and sb is not None and isinstance(job_id, str):
            self._loop.spawn(self._guard, self._open, sb, job_id)

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
        if isinstance(self.opened, JobView):
            self.opened.close()
        super().close()

    def __repr__(self) -> str:
        jobs = [(self._sbs[i].url, j) for i, j in sorted(self._jobs, key=lambda x: -x[1].started_at)]
        return jobs_table(jobs)

    def _repr_mimebundle_(self, **kwargs: Any) -> Any:
        if not widgets_enabled():
            return {"text/plain": repr(self)}
        return super()._repr_mimebundle_(**kwargs)
