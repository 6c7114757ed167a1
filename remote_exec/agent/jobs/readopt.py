"""Finding a previous agent's jobs in the state dir, to re-adopt them.

Each job dir's ``job.json`` is read back and its job rebuilt as a :class:`DiskJob`: running
ones (same pid and start time) are watched again, those that ended meanwhile get the exit the
keeper recorded. A dir that cannot be read back is ended and removed. Every file there is the
job's to rewrite: ``job.json`` is read as hostile input (:mod:`..statefile`), and a job is
watched (and may be signalled) as running only if the keeper's ledger names the very process
its ``job.json`` does (:mod:`..keeper.auth`). What is skipped is logged with its path. A shell run's dir (see
``agent/shell/runlog.py``) is a finished job once it ended; one in progress is left to the
shell controller. Registering the jobs is the
:class:`~remote_exec.agent.jobs.controller.JobController`'s.
"""

from __future__ import annotations

import json
import logging
import os
from collections.abc import Callable
from pathlib import Path
from typing import Any

from ...protocol.names import is_job_id
from ..procfacts import proc_starttime
from ..statefile import open_state_dir, read_state_file
from .diskjob import DiskJob
from .hitrecord import load_hits
from .home import JobHome
from .job import Job
from .jobrecord import params_from_record, read_stdin_cursor, read_stdin_writers
from .proctable import scan
from .proctree import kill_tree
from .ptyjob import PtyJob

__all__ = ["readopt"]

log = logging.getLogger("remote_exec.agent")


async def readopt(home: JobHome, prefix: str, buffer_limit: int, on_done: Callable[[Job], None]) -> list[DiskJob]:
    """The jobs whose dirs are in ``home`` and whose ids start with ``prefix``, re-adopted (in
    no order); ``on_done`` is called when each ends. A job dir without a readable ``job.json``
    (the agent died while starting it) has its processes ended and is removed.

    Cancelling it stops part-way: the job dirs not reached yet are left as they were.
    """
    answer, _ = await home.keeper.request({"op": "exits"})
    exits = answer.get("exits") or {}
    leads = await _leaders(home)
    restored: list[DiskJob] = []
    for entry in os.scandir(home.root):
        if not entry.is_dir(follow_symlinks=False):
            continue
        try:
            meta = _load_meta(entry.path)
            if meta.get("job_id") != entry.name or not entry.name.startswith(prefix + "-"):
                raise ValueError("not a job of this state dir")
            if meta.get("shell") is not None and meta.get("end") is None:
                continue  # a shell run in progress: its session's re-adoption takes it up
            kind = PtyJob if meta.get("tty") else DiskJob
            restored.append(await restore_job(kind, meta, buffer_limit, on_done, home, exits, leads))
        except (OSError, ValueError, KeyError, TypeError) as exc:
            if entry.name.startswith(prefix + "-sh"):
                continue  # a shell run's, torn by a kill mid-write: its session's re-adoption rewrites it
            log.warning("skipped %s: %s; ending its processes and removing it", entry.path, exc)
            if entry.name.startswith(prefix + "-"):
                # An agent killed between the spawn and the job.json: the process runs (and the
                # keeper may hold its stdin) but nobody can name it. End it: the client's retry
                # of the start (same idempotency key) is told nothing of it and starts afresh.
                await scan(kill_tree, entry.name)
                await home.keeper.request({"op": "drop", "key": entry.name})
            home.discard(Path(entry.path))
    return restored


async def restore_job(
    kind: type[DiskJob],
    meta: dict[str, Any],
    buffer_limit: int,
    on_done: Callable[[Job], None],
    home: JobHome,
    exits: dict[str, Any],
    leads: dict[str, Any] | None = None,
) -> DiskJob:
    """The job ``meta`` (its ``job.json``) describes, as this agent finds it now.

    Alive (same pid *and* start time): running again, its stdin re-opened from the keeper's
    copy. Gone: ended, with the exit status the keeper recorded (``exit_code`` None if
    nobody could reap it, e.g. the agent reaped it and died before writing it down).
    ``leads`` is the keeper's ledger (None: an old keeper keeps none): a process it does not
    name for this job is not the job's, whatever ``meta`` says (the job can rewrite it), so
    it is never watched or signalled; the job counts as ended.
    """
    params = params_from_record(meta)
    mark, client_id = meta["job_id"], meta.get("client_id")
    # A job can rewrite its job.json: an id of another form would reach every client's listing.
    if not is_job_id(mark) or (client_id is not None and not is_job_id(client_id)):
        raise ValueError(f"job.json names an id of an unsafe form ({mark!r}, {client_id!r})")
    if client_id is not None:
        params = params.model_copy(update={"job_id": client_id})
    job = kind(client_id or mark, params, buffer_limit, on_done, home, mark)
    job.reason = meta.get("reason") if isinstance(meta.get("reason"), str) else None
    job.pid, job.starttime, job.started_at = int(meta.get("pid") or 0), meta.get("starttime"), meta["started_at"]
    job.take_record(meta)
    load_hits(job, meta)
    cursor = read_stdin_cursor(job.dir)
    if cursor is not None:
        job.stdin.written = cursor
    job.stdin.writers = read_stdin_writers(job.dir)
    job.tree_ended = bool(meta.get("tree_ended"))
    job.cgroup = home.cgroups.find(job.mark) if home.cgroups is not None else None
    # Only the keeper's ledger makes the record's leader the job's: a job can rewrite its
    # job.json to name any process (and, by its pid and start time, that process's session).
    leader_ours = leads is None or leads.get(job.mark) == [job.pid, job.starttime]
    end = meta.get("end")
    if end is not None:
        job.finish(end["state"], end.get("exit_code"), end.get("ended_at"), save=False)
    elif job.pid and job.starttime is not None and proc_starttime(job.pid) == job.starttime:
        if leader_ours:
            await job.reattach()
        else:
            log.warning(
                "skipped %s: pid %s is not a process the keeper started for this job; not signalled",
                job.dir / "job.json",
                job.pid,
            )
            job.finish("completed", None, None)
    else:
        how = exits.get(f"{job.pid}:{job.starttime}")
        if how is None and home.keeper.present and job.pid:
            # ``exits`` was read before the dirs were: a job that ended since is gone from
            # the process table only once the keeper reaped it, and it records the exit in
            # the same step, so it has it now (else a job ending mid-scan was "lost").
            answer, _ = await home.keeper.request({"op": "exit", "pid": job.pid, "start": job.starttime})
            how = answer.get("exit") if isinstance(answer.get("exit"), dict) else None
        job.finish("completed", None if how is None else how["code"], None if how is None else how["at"])
    if not leader_ours:
        # Its leftovers are found by its marker and cgroup only, never by the session a
        # record names (a forged one named an outside session leader, which the leftovers'
        # end at the job's timeout then killed).
        job.starttime = None
    return job


MAX_RECORD = 4 << 20  # a job.json is a few kB; one this big was not written by an agent


async def _leaders(home: JobHome) -> dict[str, Any] | None:
    """The keeper's ledger of job leaders (job id -> [pid, start time]); None from a keeper too
    old to keep one (then job.json's pid and start time are all there is, as before)."""
    if not home.keeper.present:
        return {}  # no keeper: nothing outlived an agent as its job
    answer, _ = await home.keeper.request({"op": "leads"})
    leads = answer.get("leads")
    if isinstance(leads, dict):
        return leads
    if answer:
        log.warning("the keeper keeps no ledger of job leaders (an older keeper): job.json's pids are trusted")
        return None
    return {}


def _load_meta(job_dir: str) -> dict[str, object]:
    """A job dir's ``job.json`` (small; read once per job when an agent starts).

    :raises ValueError: it is not a regular file (a FIFO blocked the agent for good), larger
        than :data:`MAX_RECORD`, or not a JSON object (its text says which).
    """
    dir_fd = open_state_dir(job_dir)
    try:
        try:
            raw = read_state_file("job.json", MAX_RECORD, dir_fd=dir_fd)
        except ValueError as exc:
            raise ValueError(f"{os.path.join(job_dir, 'job.json')}: {exc}") from None
    finally:
        os.close(dir_fd)
    meta = json.loads(raw)
    if not isinstance(meta, dict):
        raise ValueError("job.json is not an object")
    return meta
