"""``%exec_remote_attach JOB|NAME``: a live view of a job from the agent's record.

After a kernel restart the handles are gone but the jobs are not: the agent keeps each one with
its command, start time, output and the tags the notebook gave it (``notebook``, ``kernel``,
``name``: the cell's ``--name``). A job is found by id, else by name, newest first, this
notebook's before others'.

A view whose kernel went away offers Reconnect once a kernel runs again: the button runs
:func:`reconnect` in that kernel, which is ``%exec_remote_attach`` on the view's sandbox and job.
"""

from __future__ import annotations

import shlex
from typing import Any, cast

from ..blocking import Sandbox
from ..errors import JobNotFoundError
from ..protocol import JobInfo
from .background import BackgroundJob
from .job_view import SHOWN, JobView
from .terminal_view import TerminalView

__all__ = ["attach_view", "find_job", "live_view", "reconnect", "show_again"]


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


def attach_view(sb: Sandbox, info: JobInfo, *, show: bool) -> BackgroundJob:
    """A :class:`BackgroundJob` on ``info`` with a live view (replaying the output the agent kept).

    :raises JobNotFoundError: the job was released meanwhile.
    """
    proc, watcher, control = (sb.attach(info.job_id) for _ in range(3))
    kind = TerminalView if info.tty else JobView  # a PTY job: the same screen, and a keyboard
    # %remote_shell's job shows as what was typed, not its login-shell wrapper
    command = info.label if info.label == "%remote_shell" else None
    view = kind(watcher, command=command, sandbox=sb.url, control=control) if show else None
    if view is not None:
        view.show()
    return BackgroundJob(proc, control, watcher, view, (info.tags or {}).get("name"))


def reconnect(url: str, job_id: str) -> None:
    """What a disconnected view's Reconnect button runs in the kernel running now: load the
    extension if needed, then ``%exec_remote_attach --sandbox URL JOB`` (the live view is the
    display this request gets back; the handle goes to the cell's ``--name`` as the magic does).

    :raises RuntimeError: not in IPython.
    """
    from IPython.core.getipython import get_ipython

    shell = get_ipython()
    if shell is None:
        raise RuntimeError("Reconnect runs in an IPython kernel")
    cast(Any, shell).extension_manager.load_extension("remote_exec")  # after a restart nothing is loaded
    shell.run_line_magic("exec_remote_attach", f"--sandbox {shlex.quote(url)} {shlex.quote(job_id)}")


def live_view(job_id: str) -> bool:
    """Whether this kernel holds an open view of ``job_id``: what the JupyterLab extension asks
    (as a silent ``user_expressions`` query, cheap, starting nothing) when a page shows the job's
    saved record while the kernel still runs, e.g. after a reload."""
    view = SHOWN.get(job_id)
    return view is not None and view.comm is not None


def show_again(job_id: str) -> None:
    """Show this kernel's open view of ``job_id`` again, in the output of the request running now
    (the extension routes it into the record's cell): the same widget, its records from now on
    rewriting that output, which the next save stores.

    :raises JobNotFoundError: no open view of that job here (closed meanwhile).
    """
    if not live_view(job_id):
        raise JobNotFoundError(f"this kernel shows no view of job {job_id!r} (%exec_remote_attach gives a new one)")
    SHOWN[job_id].show()
