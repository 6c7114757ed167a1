"""The write journal: which temporary files the agent's open writes own, kept in its state dir.

An agent killed mid-write (``kill -9``, the OOM killer, a power cut) cannot remove the
temporary file (``.<name>.<id>.rxtmp``) or staging directory (``.rxstage``) beside the target,
and nobody else knows it is garbage: a 172 MiB upload stays as a hidden 172 MiB file. So each
write records its temporary's location in ``<state dir>/writes/<entry>`` while it is open, and
forgets it once the temporary is renamed or removed; the next agent to start in that state dir
removes whatever the entries left name (:meth:`WriteJournal.recover`) before it serves.

The journal is best-effort: when the state dir cannot take an entry (full, read-only) the write
goes on and a warning is logged; only a crash during that write would then leave its file.
"""

from __future__ import annotations

import contextlib
import json
import logging
import os
import secrets
import shutil
from pathlib import Path

from ...errors import FileError
from ..statefile import claim_state_dir, read_state_file
from .fileops import Write
from .paths import resolve

__all__ = ["WriteJournal"]

log = logging.getLogger("remote_exec.agent")
_O_PATH = getattr(os, "O_PATH", os.O_RDONLY)
_SUFFIXES = (".rxtmp", ".rxstage")
MAX_ENTRY = 16 * 1024  # an entry is a path (at most 4 KiB) and a name, as JSON


class WriteJournal:
    """Entries in ``directory`` (``None``: journal nothing), one per open write. Blocking calls."""

    def __init__(self, directory: Path | None) -> None:
        self.directory = directory

    def add(self, w: Write) -> str | None:
        """Record ``w``'s temporary; return the entry's name for :meth:`remove` (``None``: none)."""
        if self.directory is None:
            return None
        entry = secrets.token_hex(8)
        record = {"dir": os.path.dirname(w.target.path) or "/", "name": w.temp, "staged": w.staged}
        path = self.directory / entry
        try:
            fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC, 0o600)
            try:
                os.write(fd, json.dumps(record).encode())
            finally:
                os.close(fd)
        except OSError as exc:
            with contextlib.suppress(OSError):
                os.unlink(path)
            log.warning("cannot journal the write of %s (%s): a crash now would leave %s", w.target.path, exc, w.temp)
            return None
        return entry

    def remove(self, entry: str | None) -> None:
        """Forget an entry (its temporary was renamed over the target or removed)."""
        if self.directory is not None and entry is not None:
            with contextlib.suppress(OSError):
                os.unlink(self.directory / entry)

    def recover(self) -> int:
        """Make the journal's directory, and remove every temporary an earlier agent's entries
        name (that agent is gone: this runs before the server accepts). Returns how many.

        The directory and its entries are a job's to replace (jobs run as the agent's user):
        the directory is used through an fd of itself (a symlink there is replaced by an empty
        dir, never followed), and an entry is read only if it is a small regular file (a FIFO
        blocked this read for good, a symlink to ``/dev/zero`` filled the agent's memory).
        What is skipped is logged with its path and why."""
        if self.directory is None:
            return 0
        try:
            dfd = claim_state_dir(self.directory)
            try:
                entries = os.listdir(dfd)
                removed = sum(self._recover_entry(dfd, entry) for entry in entries)
            finally:
                os.close(dfd)
        except OSError as exc:
            log.warning("no write journal in %s (%s): writes go on without one", self.directory, exc)
            self.directory = None
            return 0
        if removed:
            log.info("removed %d temporary file(s) left by writes of an agent that was killed", removed)
        return removed

    def _recover_entry(self, dfd: int, entry: str) -> int:
        assert self.directory is not None
        try:
            data = read_state_file(entry, MAX_ENTRY, dir_fd=dfd)
        except (OSError, ValueError) as exc:
            log.warning("skipped %s: %s; removed", self.directory / entry, exc)
            data = None
        removed = self._remove_leftover(data) if data is not None else 0
        with contextlib.suppress(OSError):
            os.unlink(entry, dir_fd=dfd)
        return removed

    @staticmethod
    def _remove_leftover(data: bytes) -> int:
        try:
            record = json.loads(data)
            name, where, staged = str(record["name"]), str(record["dir"]), bool(record["staged"])
        except (ValueError, KeyError, TypeError):
            return 0  # not an entry of ours (or cut short by the crash): nothing to remove
        # Only a name of the form begin_write makes, in the recorded directory: an entry can never
        # make us remove anything else.
        if "/" in name or not name.startswith(".") or not name.endswith(_SUFFIXES):
            return 0
        try:
            with resolve(where, None) as r:
                dfd = os.open(r.name, _O_PATH | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC, dir_fd=r.dir_fd)
            try:
                if staged:
                    shutil.rmtree(name, dir_fd=dfd)
                else:
                    os.unlink(name, dir_fd=dfd)
            finally:
                os.close(dfd)
        except (OSError, FileError):
            return 0  # gone already (or its directory is)
        return 1
