"""A job home in a temporary dir: controllers under test run the production path (logs on disk).

No keeper serves it (jobs do not outlive the test's event loop) and no log budget caps it; the
inotify instance is real, so waiting readers are woken as the agent's are.
"""

from __future__ import annotations

import secrets
from pathlib import Path

from remote_exec.agent.jobs.controller import JobController
from remote_exec.agent.jobs.home import JobHome
from remote_exec.agent.jobs.logfile import Inotify
from remote_exec.agent.keeperlink import KeeperLink
from remote_exec.agent.statedir import secure_dir

__all__ = ["job_home", "jobs_in"]


def job_home(state: Path) -> JobHome:
    """A home for jobs under ``state`` (made 0700 if missing)."""
    root = secure_dir(secure_dir(state) / "jobs")
    inotify = Inotify()
    return JobHome(root, KeeperLink(state), inotify if inotify.available else None, 1 << 30)


def jobs_in(state: Path) -> JobController:
    """A job controller whose jobs live under ``state``, with an instance id of its own: its
    jobs' processes carry it as their marker, and a controller's shutdown kills every process
    whose marker starts with it, so a shared id would kill another test's jobs (on another
    xdist worker, too)."""
    return JobController(secrets.token_hex(4), home=job_home(state))
