"""``OutputActivity``: when each job's output last grew, as seen across listings.

The agent's job list says how many bytes each job wrote and when it last wrote
(``JobInfo.last_output_at``, on the sandbox's clock); a view that lists jobs (the Dashboard,
``remote-exec top`` and ``ps``) takes that time to say "no output for N min" of a running job.
Where a listing has no such time, it notes when each count last changed: a job first seen with
no output at all has been quiet since its start (exact); one first seen with output has been
quiet at least since that first look (not exact: shown as "≥" or ">").
"""

from __future__ import annotations

import time
from collections.abc import Iterable
from dataclasses import dataclass

from ..protocol import JobInfo

__all__ = ["OutputActivity", "Quiet"]


@dataclass(frozen=True)
class Quiet:
    """A job's silence as far as it is known.

    :ivar written: bytes of output (stdout and stderr) at the last change.
    :ivar since: when the count last changed (seconds since the epoch), or the first look.
    :ivar exact: ``since`` is the true last change (else the silence is at least this long).
    """

    written: int
    since: float
    exact: bool

    def seconds(self, now: float | None = None) -> float:
        return max(0.0, (time.time() if now is None else now) - self.since)


class OutputActivity:
    """The :class:`Quiet` of each job of the latest listing (older jobs are forgotten, so it is
    bounded by the listing)."""

    def __init__(self) -> None:
        self.jobs: dict[str, Quiet] = {}

    def note(self, jobs: Iterable[JobInfo], now: float | None = None) -> None:
        """Take a new listing into account."""
        now = time.time() if now is None else now
        seen = {}
        for job in jobs:
            written = job.stdout_bytes + job.stderr_bytes
            old = self.jobs.get(job.job_id)
            if job.last_output_at is not None:
                seen[job.job_id] = Quiet(written, job.last_output_at, True)
            elif old is None:
                seen[job.job_id] = Quiet(written, job.started_at, True) if not written else Quiet(written, now, False)
            else:
                seen[job.job_id] = old if written == old.written else Quiet(written, now, True)
        self.jobs = seen

    def get(self, job_id: str) -> Quiet | None:
        return self.jobs.get(job_id)
