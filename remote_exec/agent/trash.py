"""Directories deleted off the event loop.

Removing a finished job's dir unlinks its logs, and on ext4 the unlink of a big file frees its
extents inside the call: seconds for a few GB on a loaded disk. Done on the event loop, that
froze every poll and heartbeat of the agent (a client was told "the agent answered nothing for
6 s"). So :meth:`Trash.discard` only renames the dir into ``<state>/trash/`` (one metadata
operation on the same file system: the dir leaves ``jobs/`` at once, and nothing can name it
again) and one daemon thread deletes what is in the trash. A dir a dead agent left there is
deleted by the next agent's thread, which empties the trash when it starts.
"""

from __future__ import annotations

import contextlib
import itertools
import os
import shutil
import threading
from pathlib import Path

__all__ = ["Trash"]


class Trash:
    """``root`` (made 0700 if missing) and the thread that empties it."""

    def __init__(self, root: Path) -> None:
        self.root = root
        self._names = itertools.count()
        self._wake = threading.Event()
        self._thread: threading.Thread | None = None

    def discard(self, path: Path) -> None:
        """Move ``path`` (a dir, or a file) into the trash and wake the deleting thread; returns
        at once. Where the rename fails (no trash dir can be made: e.g. a full disk) the path is
        deleted here, as before, rather than left behind."""
        dest = self.root / f"{path.name}.{os.getpid()}.{next(self._names)}"
        try:
            try:
                os.rename(path, dest)
            except FileNotFoundError:
                if not path.exists() and not path.is_symlink():
                    return  # already gone
                os.mkdir(self.root, 0o700)  # the trash itself was missing
                os.rename(path, dest)
        except OSError:
            shutil.rmtree(path, ignore_errors=True)
            return
        self.empty()

    def empty(self) -> None:
        """Wake the thread (started on first use) that deletes everything in the trash."""
        if self._thread is None:
            self._thread = threading.Thread(target=self._run, name="trash", daemon=True)
            self._thread.start()
        self._wake.set()

    def _run(self) -> None:
        while True:
            self._wake.wait()
            self._wake.clear()
            with contextlib.suppress(OSError), os.scandir(self.root) as entries:
                for entry in list(entries):
                    if entry.is_dir(follow_symlinks=False):
                        shutil.rmtree(entry.path, ignore_errors=True)
                    else:
                        with contextlib.suppress(OSError):
                            os.unlink(entry.path)
