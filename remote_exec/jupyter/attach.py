"""``%exec_remote_attach JOB|NAME``: a live view of a job from the agent's record.

After a kernel restart the handles are gone but the jobs are not: the agent keeps each one with
its command, start time, output and the tags the notebook gave it (``notebook``, ``kernel``,
``name``: the cell's ``--name``). A job is found by id, else by name, newest first, this
notebook's before others'.

:func:`attach_job` is the implementation, on arguments already parsed: the magic calls it, and
so does :func:`reconnect`, what a disconnected view's Reconnect (and a saved record's, in the
JupyterLab extension) runs in the kernel running now. Nothing here goes through IPython's
``{var}`` expansion, and the handle is bound only to a name the user gave (``--name``, or the
name they typed to find the job), never to a name the agent reports.
"""

from __future__ import annotations

import keyword
from typing import Any, cast

from IPython.core.error import UsageError

from ..blocking import Sandbox
from ..errors import JobNotFoundError, RemoteExecError, SandboxError
from ..protocol import JobInfo
from ..protocol.names import check_job_id, is_job_id, is_name
from .background import BackgroundJob
from .dashboard import Dashboard
from .display import RemoteCommandError, show, widgets_enabled
from .job_view import SHOWN, JobView
from .kernel_state import KernelState, notebook_tags
from .shell_view import ShellView
from .terminal_view import TerminalView
from .trust import attach_hint, jobs_hint, one_click, shell_hint

__all__ = [
    "MAX_DASHBOARD_SANDBOXES",
    "attach_job",
    "attach_view",
    "find_job",
    "live_view",
    "reconnect",
    "reconnect_dashboard",
    "reconnect_shell",
    "refusal",
    "show_again",
]

MAX_DASHBOARD_SANDBOXES = 64
"""Sandboxes a dashboard's Reconnect opens at most (the list comes from a notebook)."""


def find_job(sb: Sandbox, key: str, notebook: str | None) -> JobInfo:
    """The job ``key`` names in ``sb``: its id, else a ``--bg --name`` (the newest, this
    notebook's first), else its label.

    :raises JobNotFoundError: nothing matches.
    """
    jobs = sb.jobs()
    for info in jobs:
        if info.job_id == key:
            return info
    named = [j for j in jobs if (j.tags or {}).get("name") == key] or [j for j in jobs if j.label == key]
    mine = [j for j in named if notebook and (j.tags or {}).get("notebook") == notebook]
    found = sorted(mine or named, key=lambda j: j.started_at)
    if not found:
        raise JobNotFoundError(f"no job {key!r} in {sb.url} (by id, --name or label; %remote_jobs lists them)")
    return found[-1]


def attach_view(sb: Sandbox, info: JobInfo, *, show: bool, name: str | None = None) -> BackgroundJob:
    """A :class:`BackgroundJob` on ``info`` with a live view (replaying the output the agent kept),
    called ``name`` (the user's word; never the agent's tags).

    :raises JobNotFoundError: the job was released meanwhile.
    :raises ProtocolError: the job id is not of the safe form.
    """
    job_id = check_job_id(info.job_id)
    proc, watcher, control = (sb.attach(job_id) for _ in range(3))
    kind = TerminalView if info.tty else JobView  # a PTY job: the same screen, and a keyboard
    # %remote_shell's job shows as what was typed, not its login-shell wrapper
    command = info.label if info.label == "%remote_shell" else None
    view = kind(watcher, command=command, sandbox=sb.url, control=control) if show else None
    if view is not None:
        view.show()
    return BackgroundJob(proc, control, watcher, view, name)


def _variable(name: str | None) -> str | None:
    if name is not None and (not is_name(name) or keyword.iskeyword(name)):
        raise UsageError(f"--name needs a Python variable name, got {name!r}")
    return name


def attach_job(state: KernelState, shell: Any, key: str, url: str | None, name: str | None) -> BackgroundJob:
    """``%exec_remote_attach``'s work: find ``key`` in ``url`` (default: the kernel's sandbox),
    show a live view where widgets render, and store the handle in ``shell.user_ns[name]``.

    With no ``name``, the handle is stored under ``key`` only when ``key`` is the job's
    ``--name`` (the user typed it, to find that job); the agent's tags never choose a variable.

    :raises UsageError: a bad URL or ``name``.
    :raises RemoteCommandError: no such job, or the agent failed or lied.
    """
    name = _variable(name)
    try:
        sb = state.sandbox(url or state.defaults.sandbox)
    except SandboxError as exc:
        raise UsageError(str(exc)) from None
    try:
        info = find_job(sb, key, notebook_tags().get("notebook"))
        check_job_id(info.job_id)
        if name is None and (info.tags or {}).get("name") == key and is_name(key) and not keyword.iskeyword(key):
            name = key
        bg = attach_view(sb, info, show=widgets_enabled(), name=name)
    except RemoteExecError as exc:
        raise RemoteCommandError(f"{type(exc).__name__}: {exc}") from exc
    if not widgets_enabled():
        print(f"attached to job {info.job_id} ({info.state})")
    if name is not None:
        shell.user_ns[name] = bg
        if (info.tags or {}).get("name") == name:  # the running --bg job of that name (--replace)
            state.named[name] = bg
    return bg


def _kernel_state(shell: Any) -> KernelState:
    cast(Any, shell).extension_manager.load_extension("remote_exec")  # after a restart nothing is loaded
    # by name: magics.py imports this module
    state = getattr(shell.magics_manager.registry.get("RemoteExecMagics"), "state", None)
    if not isinstance(state, KernelState):
        raise RuntimeError("remote_exec's magics are not loaded in this kernel")
    return state


def _reconnecting_kernel() -> tuple[Any, KernelState]:
    from IPython.core.getipython import get_ipython

    shell = get_ipython()
    if shell is None:
        raise RuntimeError("Reconnect runs in an IPython kernel")
    return shell, _kernel_state(shell)


def _may_open(state: KernelState, url: object, what: str, hint: str | None) -> str:
    """``url``, checked for a Reconnect: only a one-click URL or one this kernel opened.

    :raises UsageError: not a string, or a URL a Reconnect does not open (the message names the
        magic that would, ``hint``).
    """
    if not isinstance(url, str) or not url:
        raise UsageError(f"Reconnect refused: the notebook names no sandbox URL for {what}")
    if not (one_click(url) or state.is_open(url)):
        raise UsageError(_not_opened(url, hint, "Type the magic with --sandbox URL yourself."))
    return url


def _open(state: KernelState, url: str) -> Sandbox:
    try:
        return state.sandbox(url)
    except SandboxError as exc:
        raise UsageError(str(exc)) from None


def reconnect(url: str, job_id: str, name: str | None = None) -> None:
    """What a Reconnect button runs in the kernel running now: a live view of ``job_id`` in
    ``url`` (the display this request gets back), the handle stored in ``name`` if given (the
    cell's own ``--name``, which the front end passes for a trusted notebook only).

    ``url`` and ``job_id`` come from a notebook, which may be a stranger's: a job id not of the
    safe form is refused; a URL not on :data:`~remote_exec.jupyter.trust.ONE_CLICK_URLS` and not
    already opened in this kernel is not opened: the error names the exact magic to run.

    :raises RuntimeError: not in IPython.
    :raises UsageError: an unsafe job id or ``name``, or a URL it does not open (see above).
    :raises RemoteCommandError: no such job, or the agent failed.
    """
    shell, state = _reconnecting_kernel()
    if not is_job_id(job_id):
        raise UsageError(f"Reconnect refused: the notebook names a job id of an unsafe form: {job_id[:80]!r}")
    if not (one_click(url) or state.is_open(url)):
        # an error, not output: the front end keeps the record it showed, this message below it
        raise UsageError(refusal(url, job_id))
    attach_job(state, shell, job_id, url, _variable(name))  # no value: the request would print it


def reconnect_shell(url: str, session_id: str) -> None:
    """What a disconnected ShellView's Reconnect runs: the shell session ``session_id`` of ``url``
    shown again (what ``%remote_shell --shell ID --sandbox URL`` shows), in the output of the
    request running now. Both come from a notebook: checked as :func:`reconnect` checks.

    :raises UsageError: an unsafe session id, or a URL it does not open.
    :raises RemoteCommandError: no such session (or it has ended), or the agent failed.
    """
    _, state = _reconnecting_kernel()
    # "new" and "last" are ids of the safe form, and words to KernelState.shell: a record would
    # open a shell (or show the user's own newest one) where Reconnect only ever shows one that is
    if not is_job_id(session_id) or session_id in ("new", "last"):
        raise UsageError(f"Reconnect refused: the notebook names an unsafe shell id: {str(session_id)[:80]!r}")
    hint = shell_hint(session_id, url) if isinstance(url, str) else None
    sb = _open(state, _may_open(state, url, f"shell {session_id}", hint))
    try:
        _, session = state.shell(session_id, sb.url)
        session.refresh()  # commands run since the view went away moved its cwd
        view = ShellView(session)
    except RemoteExecError as exc:
        raise RemoteCommandError(f"{type(exc).__name__}: {exc}") from exc
    show(view)


def reconnect_dashboard(*urls: str) -> None:
    """What a disconnected Dashboard's Reconnect runs: a live dashboard of the same sandboxes
    (each opened only if :func:`reconnect` would open it), in the output of the request running now.

    :raises UsageError: no URL, too many, or one it does not open.
    :raises RemoteCommandError: the agent failed.
    """
    _, state = _reconnecting_kernel()
    if not urls or len(urls) > MAX_DASHBOARD_SANDBOXES:
        raise UsageError(f"Reconnect refused: a dashboard of 1 to {MAX_DASHBOARD_SANDBOXES} sandboxes, got {len(urls)}")
    unique = list(dict.fromkeys(urls))
    hint = jobs_hint(unique) if all(isinstance(u, str) for u in unique) else None
    checked = [_may_open(state, u, "the dashboard", hint) for u in unique]  # all, before opening one
    sandboxes = [_open(state, u) for u in checked]
    try:
        dash = Dashboard(sandboxes, known=state.background)
    except RemoteExecError as exc:
        raise RemoteCommandError(f"{type(exc).__name__}: {exc}") from exc
    show(dash)


def refusal(url: str, job_id: str) -> str:
    """What a Reconnect that did not open ``url`` says: why, and the magic that would."""
    return _not_opened(url, attach_hint(job_id, url), "Type %exec_remote_attach JOB --sandbox URL yourself.")


def _not_opened(url: str, hint: str | None, otherwise: str) -> str:
    how = f"If you trust it, run:\n    {hint}" if hint else f"Its URL cannot be shown on one line: {otherwise}"
    return (
        "Not opened: a notebook's Reconnect opens only local://, or docker:// or podman:// NAME, with no "
        f"options, or a sandbox this kernel already opened; this record names {url[:200]!r}.\n{how}"
    )


def live_view(job_id: str) -> bool:
    """Whether this kernel holds an open view of ``job_id``: what the JupyterLab extension asks
    (as a silent ``user_expressions`` query, cheap, starting nothing) when a page shows the job's
    saved record while the kernel still runs, e.g. after a reload."""
    view = SHOWN.get(job_id) if is_job_id(job_id) else None
    return view is not None and view.comm is not None


def show_again(job_id: str) -> None:
    """Show this kernel's open view of ``job_id`` again, in the output of the request running now
    (the extension routes it into the record's cell): the same widget, its records from now on
    going into that output's draft, which the next save stores.

    :raises JobNotFoundError: no open view of that job here (closed meanwhile).
    """
    if not live_view(job_id):
        raise JobNotFoundError(
            f"this kernel shows no view of job {job_id[:80]!r} (%exec_remote_attach gives a new one)"
        )
    SHOWN[job_id].show()
