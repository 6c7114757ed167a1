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
from .fileops import Write
from .paths import resolve

__all__ = ["WriteJournal"]

log = logging.getLogger("remote_exec.agent")
_O_PATH = getattr(os, "O_PATH", os.O_RDONLY)
_SUFFIXES = (".rxtmp", ".rxstage")


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
        name (that agent is gone: this runs before the server accepts). Returns how many."""
        if self.directory is None:
            return 0
        try:
            os.makedirs(self.directory, mode=0o700, exist_ok=True)
            entries = os.listdir(self.directory)
        except OSError as exc:
            log.warning("no write journal in %s (%s): writes go on without one", self.directory, exc)
            self.directory = None
            return 0
        removed = 0
        for entry in entries:
            removed += self._remove_leftover(entry)
            self.remove(entry)
        if removed:
            log.info("removed %d temporary file(s) left by writes of an agent that was killed", removed)
        return removed

    def _remove_leftover(self, entry: str) -> int:
        assert self.directory is not None
        try:
            record = json.loads((self.directory / entry).read_bytes())
            name, where, staged = str(record["name"]), str(record["dir"]), bool(record["staged"])
        except (OSError, ValueError, KeyError, TypeError):
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
