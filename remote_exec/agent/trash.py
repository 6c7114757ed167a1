"""Directories deleted off the event loop.

Removing a finished job's dir unlinks its logs, and on ext4 the unlink of a big file frees its
extents inside the call: seconds for a few GB on a loaded disk. Done on the event loop, that
froze every poll and heartbeat of the agent (a client was told "the agent answered nothing for
6 s"). So :meth:`Trash.discard` only renames the dir into ``<state>/trash/`` (one metadata
operation on the same file system: the dir leaves ``jobs/`` at once, and nothing can name it
again) and one daemon thread deletes what is in the trash. A dir a dead agent left there is
deleted by the next agent's thread, which empties the trash when it starts.

The trash root is in the state dir, where a job (running as the agent's user) can replace it:
a symlink to an outside dir made the running agent move job dirs there and then empty it. So
the root is opened afresh for each rename and each sweep (``O_NOFOLLOW | O_DIRECTORY``, owned by
us), and the rename and the deletes resolve names against that fd: what a later swap puts at the
path redirects nothing. A root that is not a dir of ours is logged and replaced (unlinking a
symlink leaves its target alone).
"""

from __future__ import annotations

import contextlib
import itertools
import logging
import os
import shutil
import threading
from pathlib import Path

from .statefile import open_state_dir

__all__ = ["Trash"]

log = logging.getLogger("remote_exec.agent")


class Trash:
    """``root`` (made 0700 if missing) and the thread that empties it."""

    def __init__(self, root: Path) -> None:
        self.root = root
        self._names = itertools.count()
        self._wake = threading.Event()
        self._thread: threading.Thread | None = None

    def _open_root(self) -> int | None:
        """An fd of the trash dir itself (made if missing, replaced if a job put something else
        there); None if no dir of ours can be had."""
        try:
            try:
                fd = open_state_dir(self.root)
            except FileNotFoundError:
                os.mkdir(self.root, 0o700)
                fd = open_state_dir(self.root)
            except ValueError as exc:  # a symlink or a file: put there, not by us
                log.warning("skipped %s: %s; replaced by an empty dir", self.root, exc)
                os.unlink(self.root)
                os.mkdir(self.root, 0o700)
                fd = open_state_dir(self.root)
        except OSError as exc:
            log.warning("no trash in %s (%s): dirs are deleted in place", self.root, exc)
            return None
        if os.fstat(fd).st_uid != os.geteuid():
            os.close(fd)
            log.warning("skipped %s: not ours; dirs are deleted in place", self.root)
            return None
        return fd

    def discard(self, path: Path) -> None:
        """Move ``path`` (a dir, or a file) into the trash and wake the deleting thread; returns
        at once. Where the rename fails (no trash dir can be made: e.g. a full disk) the path is
        deleted here, as before, rather than left behind."""
        if not path.exists() and not path.is_symlink():
            return  # already gone
        root = self._open_root()
        try:
            if root is None:
                raise OSError("no trash")
            os.rename(path, f"{path.name}.{os.getpid()}.{next(self._names)}", dst_dir_fd=root)
        except FileNotFoundError:
            return  # gone meanwhile
        except OSError:
            if path.is_symlink():
                with contextlib.suppress(OSError):
                    os.unlink(path)
            else:
                shutil.rmtree(path, ignore_errors=True)
            return
        finally:
            if root is not None:
                os.close(root)
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
            root = self._open_root()
            if root is None:
                continue
            try:
                with contextlib.suppress(OSError), os.scandir(root) as entries:
                    for entry in list(entries):
                        if entry.is_dir(follow_symlinks=False):
                            shutil.rmtree(entry.name, ignore_errors=True, dir_fd=root)
                        else:
                            with contextlib.suppress(OSError):
                                os.unlink(entry.name, dir_fd=root)
            finally:
                os.close(root)
