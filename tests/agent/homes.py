"""A job home in a temporary dir: controllers under test run the production path (logs on disk).

No keeper serves it (jobs do not outlive the test's event loop) and no log budget caps it; the
inotify instance is real, so waiting readers are woken as the agent's are.
"""

from __future__ import annotations

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


def jobs_in(state: Path, instance_id: str = "t") -> JobController:
    """A job controller whose jobs live under ``state``."""
    return JobController(instance_id, home=job_home(state))
