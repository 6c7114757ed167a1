"""Which job a word on the command line names: its id, its ``--name`` (``tags["name"]``, as the
notebook's ``--bg --name`` sets it) or its label, as ``docker`` takes an id or a name.

A name or label that several jobs share names the one of them still running, if exactly one
is; otherwise it is ambiguous and the error lists the candidates (so a script never acts on a
job it did not mean).
"""

from __future__ import annotations

from ..client import titles
from ..client.sandbox import AsyncSandbox
from ..errors import JobNotFoundError
from ..protocol import JobInfo
from ..termsafe import terminal_safe

__all__ = ["job_name", "resolve_job"]


def job_name(job: JobInfo) -> str:
    """The job's ``--name`` tag, or ``""`` (:func:`remote_exec.client.titles.job_name`)."""
    return titles.job_name(job.tags)


async def resolve_job(sb: AsyncSandbox, ref: str) -> JobInfo:
    """The job ``ref`` names in ``sb``: an id first, then a name, then a label.

    Cancelling it changes nothing (it only reads the job list).

    :raises JobNotFoundError: nothing matches, or several jobs do and not exactly one of them
        runs (the message lists them).
    """
    jobs = await sb.jobs()
    for job in jobs:
        if job.job_id == ref:
            return job
    found = [j for j in jobs if job_name(j) == ref] or [j for j in jobs if j.label == ref]
    running = [j for j in found if j.state == "running"]
    if len(found) == 1 or len(running) == 1:
        return (running or found)[0]
    if not found:
        raise JobNotFoundError(f"no job {ref!r} in {sb.url} (by id, name or label; `remote-exec ps -a` lists them)")
    listed = ", ".join(f"{terminal_safe(j.job_id)} ({terminal_safe(j.state)})" for j in found[-10:])
    more = f" and {len(found) - 10} more" if len(found) > 10 else ""
    raise JobNotFoundError(f"{ref!r} names {len(found)} jobs: {listed}{more}; give a job id")
