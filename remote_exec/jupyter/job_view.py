"""``JobView``: one job, live — state badge, elapsed time, exit code, stdout and stderr panes.

The view reads the handle it is given to its end (on the background loop), so give it a handle
nobody else iterates: ``JobView.attach(sb, job_id)`` makes a fresh one.

Its output bundle carries a record beside the widget (:mod:`~remote_exec.jupyter.record`):
shown with :meth:`JobView.show`, the view writes its newest record into a draft output beside it
every :data:`RECORD_PERIOD` seconds while the job runs, and into its own output at the job's end,
so a saved notebook tells how far the job got (the view itself is never re-rendered meanwhile).

Health: the view shows its sandbox's channel state (``link``: connected, reconnecting, lost,
gone; :class:`~remote_exec.client.link.Link`) beside the job's, and the front end says "no
output for N min" once a running job has been quiet for :attr:`JobView.quiet_after` seconds.
A lost agent does not end the view: it keeps asking from its cursors (``follow(ride_out=True)``)
and resumes when the agent answers again; a gone sandbox ends it as ``error``.

Usage: while at least one view is on screen in a visible tab (the front end says so with
``watch`` messages, renewed every few seconds), the job's CPU and memory are sampled every
:data:`SAMPLE_PERIOD` seconds into ``usage`` (the last :data:`USAGE_POINTS` points) for the
sparkline; nobody watching, nothing is sampled.
"""

from __future__ import annotations

import asyncio
import threading
import time
import weakref
from collections import deque
from collections.abc import Callable
from typing import Any, ClassVar

import traitlets

from ..blocking import BlockingExecRemoteProcess, Sandbox
from ..client.ends import end_words
from ..client.feed import JobFeed
from ..client.link import LinkStatus
from ..client.titles import first_meaningful_line, job_name, script_of
from ..client.types import ExecResult
from ..errors import JobNotFoundError, JobNotRunningError, RemoteExecError, SandboxClosedError
from ..protocol.names import check_job_id
from ._assets import css, esm
from .base import StreamWidget
from .display import widgets_enabled
from .follow import Outcome, loop_of
from .record import RECORD_LINE_CHARS, RECORD_LINES, JobRecord, RecordedDisplay
from .saving import RECORD_META
from .transcript import DEFAULT_TAIL_LINES

__all__ = ["QUIET_AFTER", "RECORD_PERIOD", "SAMPLE_PERIOD", "SHOWN", "USAGE_POINTS", "WATCH_TTL", "JobView"]

RECORD_PERIOD = 5.0
"""Seconds between rewrites of a running view's stored record (its draft, beside the view)."""

QUIET_AFTER = 60.0
"""Seconds without output after which a running job shows "no output for N min"."""

SAMPLE_PERIOD = 2.0
"""Seconds between CPU/memory samples while a view watches."""

USAGE_POINTS = 90
"""Samples kept for the sparkline (3 minutes at :data:`SAMPLE_PERIOD`)."""

WATCH_TTL = 15.0
"""Seconds a view's ``watch`` holds: a view that stops renewing it (closed tab) stops the sampling."""

_MAX_WATCHERS = 16  # views of one widget counted at once (a page shows a handful)

SHOWN: weakref.WeakValueDictionary[str, JobView] = weakref.WeakValueDictionary()
"""The view that last showed each job, by job id: what a reloaded page asks the kernel for
(:func:`~remote_exec.jupyter.attach.live_view`). Weak: a closed, forgotten view drops out."""


def _command_text(command: list[str] | str | None, fallback: str) -> str:
    if command is None:
        return fallback
    script = script_of(command)  # a cell body: show the script, not its wrapper
    return script if script is not None else " ".join(command)


class JobView(StreamWidget):
    """A live view of one job, with Interrupt (SIGINT) and Kill buttons and Copy/Download.

    :param proc: the job's handle; the view reads it to its end.
    :param command: what to show as the command line (default: the agent's record of an
        attached handle, else the job id).
    :param sandbox: the sandbox URL, shown next to the job id.
    :param started_at: when the job started (seconds since the epoch; default: the agent's
        record of an attached handle, else now).
    :param control: the handle Kill and Interrupt act through (default: ``proc``). A separate
        one leaves ``proc`` reading the job to its true end: the view then shows the killed
        job's exit code and last output.
    :param live: send output before any view said hello (a cell that blocks cannot answer one).
    :param tail_lines: lines per pane the browser keeps; older ones show as "N lines hidden".
    :param merged: one pane for stdout and stderr, in the order read (``--merged``).
    """

    # a line typed into the view's stdin shows in the stdout pane, as a terminal echoes it
    PANES = {"stdout": "stdout", "stderr": "stderr", "stdin": "stdout"}  # noqa: RUF012 - a ClassVar of the base
    MERGED_PANES: ClassVar[dict[str, str]] = {"stdout": "stdout", "stderr": "stdout", "stdin": "stdout"}
    """``merged``: one pane, stdout and stderr in the order the agent read them (stderr in its
    colour). Two streams are two files in the sandbox: what one read brings shows stdout first."""
    _esm = esm("job_view", "health")
    _css = css("job_view", "health")

    command = traitlets.Unicode("").tag(sync=True)
    name = traitlets.Unicode("").tag(sync=True)
    """The job's ``--name``: it leads the header."""
    title = traitlets.Unicode("").tag(sync=True)
    """The command's first meaningful line (:mod:`remote_exec.client.titles`), after the name."""
    job_id = traitlets.Unicode("").tag(sync=True)
    sandbox = traitlets.Unicode("").tag(sync=True)
    state = traitlets.Unicode("running").tag(sync=True)
    exit_code = traitlets.Int(None, allow_none=True).tag(sync=True)
    ended_as = traitlets.Unicode("").tag(sync=True)
    """How it ended, in words (:func:`~remote_exec.client.ends.end_words`): "interrupted (SIGINT)"."""
    started_at = traitlets.Float(0.0).tag(sync=True)
    ended_at = traitlets.Float(None, allow_none=True).tag(sync=True)
    stdout_chars = traitlets.Int(0).tag(sync=True)
    stderr_chars = traitlets.Int(0).tag(sync=True)
    error = traitlets.Unicode("").tag(sync=True)
    link = traitlets.Unicode("connecting").tag(sync=True)
    link_reason = traitlets.Unicode("").tag(sync=True)
    last_output_at = traitlets.Float(None, allow_none=True).tag(sync=True)
    quiet_after = traitlets.Float(QUIET_AFTER).tag(sync=True)
    usage: traitlets.List[list[float]] = traitlets.List().tag(sync=True)  # [[time, cpu %, rss], ...]
    hits = traitlets.Int(0).tag(sync=True)  # watch-rule matches seen so far
    merged = traitlets.Bool(False).tag(sync=True)
    """One pane for both streams, in the order read (``merged=True``; see :attr:`MERGED_PANES`)."""
    stdin_open = traitlets.Bool(False).tag(sync=True)
    """The job's stdin takes input: the view shows an input line (Enter sends, Ctrl+D closes)."""

    def __init__(
        self,
        proc: BlockingExecRemoteProcess,
        *,
        command: list[str] | str | None = None,
        sandbox: str = "",
        started_at: float | None = None,
        live: bool = False,
        tail_lines: int = DEFAULT_TAIL_LINES,
        control: BlockingExecRemoteProcess | None = None,
        merged: bool = False,
        **traits: Any,
    ) -> None:
        # the id ends up in the view, its record, its hint and its Reconnect: the safe form only
        job_id = check_job_id(proc.job_id, source="the job's handle") if proc.job_id else ""
        info = proc.async_process.info  # an attached handle knows the job's true command and start
        if command is None and info is not None:
            command = info.command
        if started_at is None:
            started_at = info.started_at if info is not None else time.time()
        text = _command_text(command, f"job {job_id}")
        tags = info.tags if info is not None else proc.async_process.options.tags
        super().__init__(
            loop_of(proc),
            live=live,
            tail_lines=tail_lines,
            command=text,
            name=job_name(tags),
            title=first_meaningful_line(text),
            job_id=job_id,
            sandbox=sandbox,
            started_at=started_at,
            merged=merged,
            panes=self.MERGED_PANES if merged else None,
            **{"stdin_open": info.stdin_open if info is not None else proc.async_process.options.stdin_open, **traits},
        )
        self.process = proc
        """The handle the view follows."""
        self._control_proc = control or proc
        self._recorded = RecordedDisplay(self._repr_mimebundle_)  # the output that shows it, its record rewritten
        self.outcome: Outcome | None = None
        """How the job ended, once it has."""
        self._done = threading.Event()
        self._last_output: float | None = None
        self._watchers: dict[str, float] = {}  # view id -> when it last said it watches
        self._usage: deque[tuple[float, float, int]] = deque(maxlen=USAGE_POINTS)
        self._sampler: asyncio.Task[None] | None = None
        self._stdin_lock = asyncio.Lock()  # a handle's stdin cursor takes one write at a time
        self._serve_controls()
        self._loop.spawn(self._run)

    @classmethod
    def attach(cls, sandbox: Sandbox, job_id: str, **kwargs: Any) -> JobView:
        """A view of a job started elsewhere (a previous kernel, another client).

        :raises JobNotFoundError: no such job.
        :raises ProtocolError: ``job_id`` is not of the safe form (``protocol/names.py``).
        """
        # the agent's record: the view shows its command and start
        proc = sandbox.attach(check_job_id(job_id, source="JobView.attach"))
        kwargs.setdefault("sandbox", sandbox.url)
        kwargs.setdefault("control", sandbox.attach(job_id))
        return cls(proc, **kwargs)

    # -- the job (loop thread) -------------------------------------------------------------------

    async def _run(self) -> None:
        recorder = asyncio.get_running_loop().create_task(self._record_while_running())
        # The job's one feed on this connection: every view of it shares the reading (a view
        # made later gets what the feed kept, then the rest).
        self.feed = JobFeed.of(self.process.async_process)
        link = self.feed.source.link
        self._on_link(link.status)
        unsubscribe = link.subscribe(self._on_link)
        stop_hits = self.feed.source.on_hit(lambda _: self._kick())  # the counter goes out
        try:
            outcome = await self.feed.follow(self._emit)
        finally:
            recorder.cancel()
            unsubscribe()
            stop_hits()
            if self._sampler is not None:
                self._sampler.cancel()
        if isinstance(outcome.error, SandboxClosedError):
            # Its sandbox was closed under it (the kernel shutting down does that, leaving --bg
            # jobs running): the job did not end. The record says what was true last, "running
            # as of" now, never "error".
            self.outcome = outcome
            self._update_record()
            self._done.set()
            return
        code = outcome.exit_code
        error = "" if outcome.state != "error" else str(outcome.error)
        info = self.process.async_process.info  # attached after its end: the agent knows when
        ended = info.ended_at if info is not None and info.ended_at is not None else time.time()
        timeout = self.process.async_process.options.timeout
        self._set(
            state=outcome.state,
            exit_code=code,
            ended_at=ended,
            error=error,
            ended_as=end_words(outcome.state, code, timeout),
        )
        self.outcome = outcome
        await self._drain()
        self._recorded.update(final=True)  # the final record: what a saved notebook shows from now on
        self._done.set()

    def _on_link(self, status: LinkStatus) -> None:
        self._set(link=status.state, link_reason=status.reason)

    def _emit(self, stream: str, text: str) -> None:
        self._last_output = time.time()
        super()._emit(stream, text)

    # -- usage, sampled while watched (loop thread) ------------------------------------------------

    def _watch(self, view: str, on: bool) -> None:
        if on and (view in self._watchers or len(self._watchers) < _MAX_WATCHERS):
            self._watchers[view] = time.monotonic()
        elif not on:
            self._watchers.pop(view, None)
        if self._watchers and self._sampler is None and not self._done.is_set():
            self._sampler = asyncio.get_running_loop().create_task(self._sample())

    async def _sample(self) -> None:
        """Sample the job's tree while a view watches; cancelled when the job ends."""
        proc = self.process.async_process
        try:
            while True:
                now = time.monotonic()
                self._watchers = {v: t for v, t in self._watchers.items() if now - t < WATCH_TTL}
                if not self._watchers:
                    return
                try:
                    st = await proc.stats()
                except JobNotFoundError:
                    return  # released: nothing more to sample
                except RemoteExecError:
                    st = None  # a lost link: a gap in the line, the link badge says why
                if st is not None and st.running:
                    self._usage.append((round(time.time(), 1), round(st.cpu_percent, 1), st.rss))
                    self._set(usage=[list(p) for p in self._usage])
                await asyncio.sleep(SAMPLE_PERIOD)  # the sampling period: a timer, not synchronisation
        finally:
            self._sampler = None

    async def _record_while_running(self) -> None:
        # Cancelled when the job ends (the final record is written after).
        while True:
            await asyncio.sleep(RECORD_PERIOD)
            self._update_record()

    # -- the stored record ---------------------------------------------------------------------

    def record(self) -> JobRecord:
        """The job as this view knows it now (what its stored fallback shows)."""
        end = self.ended_at if self.ended_at is not None else time.time()
        due = self._due  # a state change not yet sent to the front end is already true
        state = due.get("state", self.state)
        return JobRecord(
            job_id=self.job_id,
            command=self.command,
            sandbox=self.sandbox,
            state=state,
            exit_code=due.get("exit_code", self.exit_code),
            duration=max(0.0, end - self.started_at),
            stdout=self._tail("stdout"),
            stderr=self._tail("stderr"),
            as_of=time.time() if state == "running" else None,
        )

    def _tail(self, stream: str) -> tuple[str, int]:
        if stream not in self.panes.values():  # merged: stderr is in the one pane
            return "", 0
        pieces, hidden = self._transcript.tail(stream, RECORD_LINES, RECORD_LINES * RECORD_LINE_CHARS)
        return "".join(text for _, text in pieces), hidden

    def show(self) -> None:
        """Display the view in the cell's output, its record kept up to date (see the module doc)."""
        SHOWN[self.job_id] = self
        # raw: display(self) would come back here through _ipython_display_; shown again (a
        # reloaded page), its records go to the new output
        self._recorded.show(self._uid)

    @property
    def _ipython_display_(self) -> Callable[[], None] | None:
        """IPython's hook for a cell's value or ``display()``: with widgets, :meth:`show` (a record
        that follows the job); else none, so the text stays the cell's value (what nbval compares)."""
        return self.show if widgets_enabled() else None

    def _update_record(self) -> None:
        self._recorded.update()

    def _hold_record(self, on: bool) -> None:
        self._recorded.hold(on)

    def _repr_mimebundle_(self, **kwargs: Any) -> Any:
        if not widgets_enabled():
            return super()._repr_mimebundle_(**kwargs)  # plain text only: what nbval compares
        record = self.record()
        bundle = super()._repr_mimebundle_(**kwargs)
        data, meta = bundle if isinstance(bundle, tuple) else (bundle, {})
        # Beside the widget: what GitHub, nbviewer, nbconvert and a reopened notebook show.
        data = {**data, "text/plain": record.plain(), "text/html": record.html()}
        # The mark that lets the server save the record in place of the widget (saving.py).
        # The sandbox and label let a saved record offer Reconnect (the JupyterLab extension).
        label = self.command.strip().split("\n", 1)[0][:200]
        meta = {
            **meta,
            RECORD_META: {"job_id": self.job_id, "state": record.state, "sandbox": self.sandbox, "label": label},
        }
        return data, meta

    def _counters(self) -> dict[str, Any]:
        chars = self._transcript.chars
        return {
            "stdout_chars": chars["stdout"],
            "stderr_chars": chars["stderr"],
            "last_output_at": self._last_output,
            "hits": self.process.async_process.hits,
        }

    async def _control(self, what: str) -> None:
        proc = self._control_proc.async_process
        try:
            if what == "kill":
                await proc.kill()
            else:
                await proc.signal("SIGINT")
        except JobNotRunningError:
            pass  # it ended meanwhile: nothing to stop
        except RemoteExecError as exc:
            self._set(error=f"{what} failed: {exc}")

    async def _stdin(self, data: str | None) -> None:
        """Write ``data`` to the job's stdin, or close it (``None``); in the order they came."""
        proc = self._control_proc.async_process
        async with self._stdin_lock:
            try:
                if data is None:
                    await proc.close_stdin()
                    self._set(stdin_open=False)
                else:
                    if "stdin" in self.panes:  # echoed where the answer will come (a PTY echoes itself)
                        self._emit("stdin", data)
                    await proc.write_stdin(data)
            except JobNotRunningError:
                self._set(stdin_open=False)  # it ended, or its stdin was closed elsewhere
            except (RemoteExecError, ValueError) as exc:  # ValueError: not UTF-8 for a text job
                self._set(error=f"stdin: {exc}")

    def _action(self, kind: str, content: dict[str, Any]) -> None:
        if kind in ("kill", "interrupt") and not self._done.is_set():
            self._loop.spawn(self._control, kind)
        elif kind == "watch" and isinstance(view := content.get("view"), str) and len(view) <= 64:
            self._loop.call_soon(self._watch, view, bool(content.get("on")))
        elif kind == "stdin" and isinstance(content.get("data"), str) and self.stdin_open:
            self._loop.spawn(self._stdin, content["data"])
        elif kind == "close_stdin" and self.stdin_open:
            self._loop.spawn(self._stdin, None)

    # -- Python side -----------------------------------------------------------------------------

    def kill(self) -> None:
        """Kill the job (SIGTERM to its group, SIGKILL after its grace); returns once it is gone."""
        self._loop.call(self._control, "kill")

    def interrupt(self) -> None:
        """Send SIGINT to the job's process group (Ctrl-C)."""
        self._loop.call(self._control, "interrupt")

    @property
    def sampling(self) -> bool:
        """True while CPU/memory are being sampled (a view watches and the job runs)."""
        return self._sampler is not None

    @property
    def done(self) -> bool:
        """True once the job ended and the view sent its last update."""
        return self._done.is_set()

    def wait(self, timeout: float | None = None) -> Outcome | None:
        """Block until the job ends (or ``timeout`` passes: then ``None``)."""
        return self.outcome if self._done.wait(timeout) else None

    @property
    def result(self) -> ExecResult | None:
        """The job's result once it ended (``None`` if it was killed through this view)."""
        return self.outcome.result if self.outcome is not None else None

    def _plain_text(self) -> str:
        return self.record().plain()
