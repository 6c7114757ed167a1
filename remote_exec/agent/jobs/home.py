"""What every disk job of one agent shares: where job dirs live, the inotify fd, the keeper."""

from __future__ import annotations

import shutil
from dataclasses import dataclass
from pathlib import Path

from ..keeperlink import KeeperLink
from ..trash import Trash
from .cgroup import CgroupHome
from .logbudget import LogBudget
from .logfile import Inotify

__all__ = ["JobHome"]


@dataclass
class JobHome:
    """What every disk job of one agent shares: where job dirs live, the inotify fd, the keeper.

    :ivar cap: the default disk cap per stream (a start may set its own).
    :ivar logs: the agent-wide budget of all streams' bytes on disk (see :mod:`.logbudget`).
    :ivar trash: deletes released job dirs off the event loop (none: deleted in place).
    :ivar cgroups: where each job gets a cgroup of its own (none: attribution alone; see
        :mod:`.proctree`).
    """

    root: Path
    keeper: KeeperLink
    inotify: Inotify | None
    cap: int
    logs: LogBudget | None = None
    trash: Trash | None = None
    cgroups: CgroupHome | None = None

    def discard(self, path: Path) -> None:
        """Remove a job's dir without blocking the event loop on the unlink of its logs."""
        if self.trash is not None:
            self.trash.discard(path)
        else:
            shutil.rmtree(path, ignore_errors=True)
