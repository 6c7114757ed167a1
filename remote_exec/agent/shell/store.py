"""Where a shell session lives outside the agent's memory: its temporary dir, its session dir
with the output files and the record, and (with a keeper) its stdin end and run key.

See :mod:`.record` for what the record holds and why no secret is in it. Without a keeper
(an agent run by hand, or the controller alone in tests) the output files live in the
temporary dir and nothing is recorded: the session then dies with its agent.
"""

from __future__ import annotations

import contextlib
import errno
import os
import shutil
import socket
import stat
import tempfile
from pathlib import Path
from typing import Any

from ...errors import NoSpaceError, SpawnError
from ..statefile import open_own_file
from .process import ShellHome
from .record import RecordFile, derive_nonce, key_memfd, session_dir

__all__ = ["SessionStore", "no_space", "write_private"]

OUTPUT_FLAGS = os.O_WRONLY | os.O_CREAT | os.O_APPEND | os.O_NOFOLLOW | os.O_CLOEXEC


class SessionStore:
    """One session's dirs and keeper holdings.

    :ivar tmpdir: the private temporary dir (run input files and FIFOs).
    :ivar dir: ``out``, ``err`` and, when durable, the record.
    :ivar key: the key of the run secrets (:func:`.record.derive_nonce`).
    """

    def __init__(self, home: ShellHome, session_id: str) -> None:
        self.home = home
        self.session_id = session_id
        self.tmpdir: str | None = None
        self.dir: Path | None = None
        self.key = b""
        self._records: RecordFile | None = None

    async def create(self, ours: socket.socket) -> tuple[int, int]:
        """Make the dirs and the output files and give the keeper ``ours`` (our end of the
        shell's stdin) and a new key; return the files' fds (the caller closes them).

        :raises NoSpaceError: the disk is full (nothing is left behind).
        :raises SpawnError: they cannot be made for another reason.
        """
        try:
            self.tmpdir = tempfile.mkdtemp(prefix=f"rx-{self.session_id}-")
        except OSError as exc:
            raise no_space(exc, f"the temporary directory of shell {self.session_id}") from None
        out = err = -1
        try:
            if self.home.durable:
                assert self.home.root is not None
                self.dir = session_dir(self.home.root, self.session_id)
                self._records = RecordFile(self.dir)
                self._records.open()
            else:
                self.dir = Path(self.tmpdir)  # not durable: the files go with the temporary dir
            out = open_own_file(self.dir / "out", OUTPUT_FLAGS)
            err = open_own_file(self.dir / "err", OUTPUT_FLAGS)
            await self._hold(ours)
        except (OSError, ValueError) as exc:  # (ValueError: another user's file in the way)
            for fd in (out, err):
                if fd >= 0:
                    os.close(fd)
            self.discard()
            raise no_space(exc, f"the files of shell {self.session_id}") from None
        return out, err

    async def _hold(self, ours: socket.socket) -> None:
        keeper = self.home.keeper
        if not self.home.durable or keeper is None:
            self.key = os.urandom(32)
            return
        fd, self.key = key_memfd()
        try:
            await keeper.request({"op": "hold", "key": f"{self.session_id}.key"}, fd)
        finally:
            os.close(fd)
        await keeper.request({"op": "hold", "key": self.session_id}, ours.fileno())

    def adopt(self, record: dict[str, Any], path: Path, key: bytes) -> None:
        """Take over the dirs an earlier agent recorded (``path``: the session dir).

        :raises ValueError: the recorded temporary dir is not one this session made (the record
            is a file the shell's user may write: it must not make us delete another dir).
        :raises OSError, KeyError: it is missing.
        """
        tmpdir = str(record["tmpdir"])
        name = os.path.basename(tmpdir)
        if os.path.dirname(tmpdir) != tempfile.gettempdir() or not name.startswith(f"rx-{self.session_id}-"):
            raise ValueError(f"{tmpdir!r} is not the session's temporary dir")
        st = os.lstat(tmpdir)
        if not stat.S_ISDIR(st.st_mode) or st.st_uid != os.geteuid():
            raise ValueError(f"{tmpdir!r} is not the session's temporary dir")
        self.tmpdir, self.dir, self.key = tmpdir, path, key
        self._records = RecordFile(path, int(record["seq"]))
        self._records.open()

    def nonce(self, public: str) -> str:
        """The secret of the frame named ``public``."""
        return derive_nonce(self.key, public)

    def save(self, record: dict[str, Any]) -> None:
        """Replace the record (durable sessions only).

        :raises OSError: the disk is full.
        """
        if self._records is not None:
            self._records.write(record)

    def input_path(self, job_id: str) -> str:
        assert self.tmpdir is not None
        return os.path.join(self.tmpdir, f"{job_id}.in")

    def remove_input(self, job_id: str) -> None:
        if self.tmpdir is not None:
            with contextlib.suppress(OSError):
                os.unlink(self.input_path(job_id))

    async def release(self) -> None:
        """The session ended: the keeper lets go of its stdin end and key."""
        keeper = self.home.keeper
        if self.home.durable and keeper is not None:
            await keeper.request({"op": "drop", "key": self.session_id})
            await keeper.request({"op": "drop", "key": f"{self.session_id}.key"})

    def discard(self) -> None:
        """Delete the dirs (the session ended)."""
        if self._records is not None:
            self._records.close()
        if self.tmpdir is not None:
            shutil.rmtree(self.tmpdir, ignore_errors=True)  # small: input files and FIFOs
        if self.dir is not None and str(self.dir) != self.tmpdir:
            self.home.discard(Path(self.dir))  # its output files may be large: unlinked off the loop


def no_space(exc: OSError | ValueError, what: str) -> Exception:
    if isinstance(exc, OSError) and exc.errno in (errno.ENOSPC, errno.EDQUOT):
        name = errno.errorcode[exc.errno or 0]
        return NoSpaceError(f"cannot write {what}: the sandbox's disk is full ({name})", data={"errno": name})
    return SpawnError(f"cannot write {what}: {exc}")


def write_private(path: str, data: bytes) -> None:
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    with os.fdopen(fd, "wb") as f:
        f.write(data)
