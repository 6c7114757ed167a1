"""What a :class:`~remote_exec.jupyter.dashboard.Dashboard` shows: whose jobs, which filters,
shell runs folded under their session, one page, and the rows that changed since the last send.

Pure functions over ``(sandbox index, JobInfo)`` pairs, so the widget stays a thin model and
the rules can be tested without an agent.
"""

from __future__ import annotations

import os
import re
import sys
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from ..client.ends import end_words, job_state
from ..client.titles import job_name, what_it_runs
from ..protocol import JobInfo

__all__ = [
    "KERNEL_TAG",
    "NOTEBOOK_TAG",
    "STATE_FILTERS",
    "Filters",
    "Identity",
    "Page",
    "diff_rows",
    "is_mine",
    "job_row",
    "session_row",
    "shell_session",
    "visible",
]

KERNEL_TAG = "kernel"
"""The job tag naming the kernel that started a job (set by jobs started from a notebook)."""
NOTEBOOK_TAG = "notebook"
"""The job tag naming the notebook (its path on the Jupyter server) that started a job."""

STATE_FILTERS = ("all", "running", "finished", "failed")
_SHELL_LABEL = re.compile(r"shell ([A-Za-z0-9_-]{1,64})")  # agent/shell/controller.py labels runs so

Item = tuple[int, JobInfo]  # (index of the dashboard's sandbox, job)


@dataclass(frozen=True)
class Identity:
    """Who "mine" is: this kernel (its id) and the notebook it serves (its path), when known."""

    kernel_id: str | None = None
    notebook: str | None = None

    @classmethod
    def current(cls) -> Identity:
        """This process's kernel id (from its connection file) and notebook path (``JPY_SESSION_NAME``,
        which jupyter-server sets for a notebook's kernel); ``None`` for what is not known."""
        kernel_id = None
        # Only look if a kernel runs here: importing ipykernel swaps the ``comm`` package's hooks.
        if "ipykernel.kernelapp" in sys.modules:
            try:
                from ipykernel.connect import get_connection_file

                name = Path(get_connection_file()).stem  # kernel-<id>.json
                kernel_id = name.removeprefix("kernel-") if name.startswith("kernel-") else None
            except Exception:  # no connection file: only handles tell what is mine
                kernel_id = None
        return cls(kernel_id=kernel_id, notebook=os.environ.get("JPY_SESSION_NAME") or None)


def is_mine(info: JobInfo, who: Identity, known: Iterable[str] = ()) -> bool:
    """True for a job this kernel or its notebook started: by its tags (a job started by an earlier
    kernel of the same notebook counts), else by the ids of the handles this kernel holds."""
    tags: Mapping[str, str] | None = getattr(info, "tags", None)  # optional in the job protocol
    if tags:
        if who.kernel_id and tags.get(KERNEL_TAG) == who.kernel_id:
            return True
        if who.notebook and tags.get(NOTEBOOK_TAG) == who.notebook:
            return True
    return info.job_id in known


def shell_session(info: JobInfo) -> str | None:
    """The shell session a job ran in (the agent labels each shell command ``shell <id>``)."""
    m = _SHELL_LABEL.fullmatch(info.label or "")
    return m.group(1) if m else None


def _failed(info: JobInfo) -> bool:
    return job_state(info.state, info.exit_code) in ("failed", "killed", "timed out", "lost")


@dataclass(frozen=True)
class Filters:
    """What the user asked to see.

    :ivar mine_only: only this kernel's/notebook's jobs (see :func:`is_mine`).
    :ivar state: one of :data:`STATE_FILTERS`.
    :ivar text: a case-insensitive substring of the label, the command or the job id.
    """

    mine_only: bool = True
    state: str = "all"
    text: str = ""

    def keep(self, info: JobInfo, mine: bool) -> bool:
        if self.mine_only and not mine:
            return False
        if self.state == "running" and info.state != "running":
            return False
        if self.state == "finished" and info.state == "running":
            return False
        if self.state == "failed" and not _failed(info):
            return False
        if self.text:
            needle = self.text.lower()
            hay = (info.label or "", _command(info), info.job_id, job_name(info.tags))
            return any(needle in h.lower() for h in hay)
        return True


def _command(info: JobInfo) -> str:
    return info.command if isinstance(info.command, str) else " ".join(info.command)


def job_row(i: int, info: JobInfo, tail: str, written: int, depth: int = 0) -> dict[str, Any]:
    """One job's row as the front end draws it (``key`` identifies it across updates)."""
    return {
        "key": info.job_id,
        "kind": "job",
        "depth": depth,
        "sandbox": i,
        "job_id": info.job_id,
        "command": _command(info),
        "label": info.label or "",
        "name": job_name(info.tags),
        "title": what_it_runs(info.command, info.label if depth == 0 else None),  # (a session's run: its row says)
        "state": info.state,
        "shown": job_state(info.state, info.exit_code),  # the badge: the one vocabulary (ends.py)
        "exit_code": info.exit_code,
        "end": end_words(info.state, info.exit_code),
        "started_at": info.started_at,
        "ended_at": info.ended_at,
        "bytes": written,
        "tail": tail,
    }


def session_row(i: int, session: str, jobs: Sequence[JobInfo], expanded: bool) -> dict[str, Any]:
    """A folded shell session's row: its newest command, how many ran and how many still run."""
    newest = max(jobs, key=lambda j: j.started_at)
    running = sum(j.state == "running" for j in jobs)
    ends = [j.ended_at for j in jobs if j.ended_at is not None]
    return {
        "key": f"shell:{i}:{session}",
        "kind": "session",
        "depth": 0,
        "sandbox": i,
        "session": session,
        "expanded": expanded,
        "count": len(jobs),
        "running": running,
        "command": _command(newest),
        "label": newest.label or "",
        "name": "",
        "title": what_it_runs(newest.command),
        "state": "running" if running else newest.state,
        "shown": "running" if running else job_state(newest.state, newest.exit_code),
        "exit_code": None if running else newest.exit_code,
        "end": "" if running else end_words(newest.state, newest.exit_code),
        "started_at": min(j.started_at for j in jobs),
        "ended_at": None if running or not ends else max(ends),
        "bytes": sum(j.stdout_bytes + j.stderr_bytes for j in jobs),
        "tail": "",
    }


@dataclass
class Page:
    """One page of the folded, filtered list.

    :ivar entries: what to draw, in order: ``("job", i, info, depth)`` or ``("session", i, id, jobs)``.
    :ivar counts: ``total`` (every job listed), ``scope`` (after mine/all), ``matching`` (after the
        filters), ``cleared`` (finished jobs hidden by "clear finished"), ``running`` (of ``matching``),
        ``lines`` (top-level and unfolded lines), ``pages``, ``page`` (the one shown).
    """

    entries: list[tuple[Any, ...]] = field(default_factory=list)
    counts: dict[str, int] = field(default_factory=dict)


def visible(
    items: Sequence[Item],
    *,
    filters: Filters,
    who: Identity,
    known: Iterable[str],
    cleared: Iterable[str],
    expanded: Iterable[str],
    page: int,
    page_size: int,
) -> Page:
    """Filter ``items``, fold shell runs under their session (unfolded when its key is in
    ``expanded``), order newest first and cut page ``page`` (clamped to the last one)."""
    known_ids, cleared_ids, open_keys = set(known), set(cleared), set(expanded)
    scope = [(i, j) for i, j in items if not filters.mine_only or is_mine(j, who, known_ids)]
    shown = [(i, j) for i, j in scope if not (j.job_id in cleared_ids and j.state != "running")]
    matching = [(i, j) for i, j in shown if filters.keep(j, True)]
    sessions: dict[tuple[int, str], list[JobInfo]] = {}
    tops: list[tuple[float, tuple[Any, ...]]] = []
    for i, j in matching:
        sid = shell_session(j)
        if sid is None:
            tops.append((j.started_at, ("job", i, j, 0)))
        else:
            sessions.setdefault((i, sid), []).append(j)
    for (i, sid), jobs in sessions.items():
        tops.append((max(j.started_at for j in jobs), ("session", i, sid, jobs)))
    lines: list[tuple[Any, ...]] = []
    for _, entry in sorted(tops, key=lambda t: -t[0]):
        lines.append(entry)
        if entry[0] == "session" and f"shell:{entry[1]}:{entry[2]}" in open_keys:
            lines += [("job", entry[1], j, 1) for j in sorted(entry[3], key=lambda j: -j.started_at)]
    size = max(1, page_size)
    pages = max(1, -(-len(lines) // size))
    page = min(max(0, page), pages - 1)
    counts = {
        "total": len(items),
        "scope": len(scope),
        "matching": len(matching),
        "cleared": len(scope) - len(shown),
        "running": sum(j.state == "running" for _, j in matching),
        "lines": len(lines),
        "pages": pages,
        "page": page,
    }
    return Page(lines[page * size : (page + 1) * size], counts)


def diff_rows(
    sent: Mapping[str, dict[str, Any]], rows: Sequence[dict[str, Any]]
) -> tuple[list[str], list[dict[str, Any]]]:
    """The order of ``rows``' keys and the rows that differ from what was ``sent`` (new or changed)."""
    return [r["key"] for r in rows], [r for r in rows if sent.get(r["key"]) != r]
