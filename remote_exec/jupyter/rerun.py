"""What a re-run cell finds still running from its earlier runs: a ``--bg --name`` job, a
``%remote_shell`` terminal.

A kernel forgets its handles when it restarts (Restart & Run All); the agent does not. Each
cell's job carries the notebook's path and the kernel's id in its tags
(:func:`~remote_exec.jupyter.kernel_state.notebook_tags`), so a cell asks the agent's job
listing which of *this notebook's* (or kernel's) jobs run, as the dashboard's "only mine" does
(:func:`~remote_exec.jupyter.dashboard_view.is_mine`), and re-attaches instead of starting a
duplicate. The listing is the sandbox's, so it is hostile input: bounded and validated as it is
parsed (:meth:`~remote_exec.AsyncSandbox.jobs`, the ``Tags`` model), and each id is checked
again here before any use (:func:`~remote_exec.protocol.names.check_job_id`).
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterable

from ..blocking import Sandbox
from ..errors import JobNotFoundError, JobNotRunningError
from ..protocol import JobInfo
from ..protocol.names import NAME_TAG, check_job_id
from .attach import attach_view
from .background import BackgroundJob
from .dashboard_view import Identity, is_mine
from .kernel_state import KernelState

__all__ = ["SHELL_LABEL", "attached_line", "rerun_named", "running_named", "running_terminals"]

SHELL_LABEL = "%remote_shell"
"""The label of ``%remote_shell``'s terminal job (what it shows instead of its login-shell wrapper)."""


def _running_mine(sb: Sandbox, known: Iterable[str], keep: Callable[[JobInfo], bool]) -> list[JobInfo]:
    """This notebook's (or kernel's, or ``known``) running jobs in ``sb`` that ``keep``, oldest first.

    :raises ProtocolError: the agent's listing or one of its ids is not of the safe form.
    """
    who, ids = Identity.current(), set(known)
    found = [j for j in sb.jobs() if j.state == "running" and keep(j) and is_mine(j, who, ids)]
    for info in found:
        check_job_id(info.job_id)
    return sorted(found, key=lambda j: j.started_at)


def running_named(sb: Sandbox, name: str, known: Iterable[str] = ()) -> list[JobInfo]:
    """The running jobs of this notebook tagged ``name`` (a ``--bg --name``), oldest first;
    ``known``: ids of this kernel's own handles (what counts where the kernel has no tags to give)."""
    return _running_mine(sb, known, lambda j: (j.tags or {}).get(NAME_TAG) == name)


def running_terminals(sb: Sandbox, known: Iterable[str] = ()) -> list[JobInfo]:
    """The running ``%remote_shell`` terminals of this notebook, oldest first."""
    return _running_mine(sb, known, lambda j: j.tty and j.label == SHELL_LABEL)


def attached_line(name: str, job_id: str) -> str:
    """What a re-run ``--bg --name`` cell says when it attached instead of starting its job."""
    return f"{name} is still running (job {job_id}): attached; --replace restarts it"


def rerun_named(state: KernelState, sb: Sandbox, name: str, *, replace: bool, show: bool) -> BackgroundJob | None:
    """What a ``--bg --name`` cell run in ``sb`` finds of its ``name``: a handle on the running
    job it attaches to (printing :func:`attached_line`; with ``show``, its live view is the cell's
    output: the kernel's own view shown again, else a new one replaying the kept output), or
    ``None`` when the cell starts its job: no job of that name of this notebook runs (one that
    ended does not count), or ``replace`` killed every one (each gone when this returns).

    :raises RemoteExecError: the agent failed (``ProtocolError``: an unsafe listing).
    """
    old = state.named.get(name)
    known = [p.job_id or "" for p in state.background] + [j.job_id for j in state.named.values()]
    running = running_named(sb, name, known)
    if replace:
        for info in running:  # an earlier kernel's too, and any duplicate one left
            if old is not None and info.job_id == old.job_id:
                old.kill()
                old.wait()  # its handle and view see the kill before the new job starts
            else:
                with contextlib.suppress(JobNotFoundError, JobNotRunningError):
                    sb.attach(info.job_id).kill()
        return None
    if not running:
        return None
    newest = running[-1]
    print(attached_line(name, newest.job_id))
    if old is not None and old.job_id == newest.job_id:
        if old.view is not None and show:
            old.view.show()  # the same widget again: the re-run cell's output is its live view
        return old
    try:
        bg = attach_view(sb, newest, show=show, name=name)
    except JobNotFoundError:
        return None  # it ended and was forgotten since the listing: the name is free
    state.named[name] = bg
    return bg
