"""What a shell session leaves for the next agent: its dir, its record, and the key of its secrets.

A durable session lives in ``<state dir>/shells/<session id>/`` (0700): the shell's ``out`` and
``err`` (its fds 1 and 2, opened ``O_APPEND``: the shell writes there itself, with or without an
agent) and the record (0600, :class:`RecordFile`), rewritten before each run's line is sent. The
record holds the shell's pid and start time, its argv, and the current (or last) run: its job
id, start params, public id, and the offsets in ``out``/``err`` its output starts at. It holds
**no secret**: the run-end sentinels' secrets are ``HMAC(key, public id)``, and the 32-byte key
is in a sealed memfd that the agent makes and the keeper holds (``hold`` under
``<session id>.key``); the next agent takes it back with ``fd``. So a command that can read the
record (it runs as the agent's uid) learns nothing it can forge an end with; reading the key
takes reading another process's descriptors (``/proc/<keeper>/fd``), which is the same
same-uid-ptrace residual as reading the shell's memory (see docs/security.md).
"""

from __future__ import annotations

import contextlib
import fcntl
import hashlib
import hmac
import json
import os
import secrets
from pathlib import Path
from typing import Any

from ..statefile import open_own_file, read_state_file

__all__ = ["KEY_SIZE", "SLOTS", "RecordFile", "derive_nonce", "key_memfd", "read_key", "read_record", "session_dir"]

KEY_SIZE = 32
SLOTS = ("session.0.json", "session.1.json")
MAX_RECORD = 1 << 20  # a command line is bounded by the request size; more is not ours


def session_dir(root: Path, session_id: str) -> Path:
    """``root/session_id``, made 0700 (``root`` too)."""
    root.mkdir(mode=0o700, exist_ok=True)
    path = root / session_id
    path.mkdir(mode=0o700, exist_ok=True)
    return path


def read_record(path: Path) -> dict[str, Any]:
    """The newest record in ``path`` (its ``seq`` tells :class:`RecordFile` where to go on).

    :raises OSError: there is none.
    :raises ValueError: no slot holds a record (too long, not JSON, not an object).
    """
    found: list[dict[str, Any]] = []
    errors: list[OSError] = []
    for name in SLOTS:
        try:
            data = read_state_file(path / name, MAX_RECORD)  # a FIFO, a symlink: not a record
        except ValueError as exc:
            errors.append(OSError(f"{path / name}: {exc}"))
            continue
        except OSError as exc:
            errors.append(exc)
            continue
        with contextlib.suppress(ValueError):  # torn, or not ours: the other slot may hold one
            record = json.loads(data)
            if isinstance(record, dict) and isinstance(record.get("seq"), int):
                found.append(record)
    if not found:
        if len(errors) == len(SLOTS):
            raise errors[0]
        raise ValueError("no slot holds a session record")
    return max(found, key=lambda r: int(r["seq"]))


class RecordFile:
    """The record, in two slots (``session.0.json``, ``session.1.json``) written in turn, each in
    place through a held fd: a ``pwrite`` and an ``ftruncate`` per run, no create or rename (those
    cost half a millisecond a run). Each carries a sequence number; the reader takes the newest
    slot that parses. A write torn by a kill leaves the other slot, one record older: the state
    before the run being recorded, whose line was not sent yet, so it is the truth.
    """

    def __init__(self, path: Path, seq: int = 0) -> None:
        self.path = path
        self._seq = seq
        self._fds: list[int] = []

    def open(self) -> None:
        """Open (create) both slots, 0600.

        :raises OSError: they cannot be made.
        """
        flags = os.O_RDWR | os.O_CREAT | os.O_NOFOLLOW | os.O_CLOEXEC
        for name in SLOTS:
            self._fds.append(open_own_file(self.path / name, flags))

    def write(self, record: dict[str, Any]) -> None:
        """Record ``record`` (the older slot is overwritten).

        :raises OSError: the disk is full.
        """
        self._seq += 1
        data = memoryview(json.dumps({**record, "seq": self._seq}).encode())
        fd = self._fds[self._seq % 2]
        at = 0
        while at < len(data):
            at += os.pwrite(fd, data[at:], at)
        os.ftruncate(fd, len(data))

    def close(self) -> None:
        for fd in self._fds:
            with contextlib.suppress(OSError):
                os.close(fd)
        self._fds.clear()


def key_memfd() -> tuple[int, bytes]:
    """A new random key in a sealed memfd (no file anywhere); return (fd, key)."""
    key = secrets.token_bytes(KEY_SIZE)
    fd = os.memfd_create("rx-shell-key", os.MFD_CLOEXEC | os.MFD_ALLOW_SEALING)
    try:
        os.write(fd, key)
        fcntl.fcntl(fd, fcntl.F_ADD_SEALS, fcntl.F_SEAL_WRITE | fcntl.F_SEAL_GROW | fcntl.F_SEAL_SHRINK)
    except OSError:
        os.close(fd)
        raise
    return fd, key


def read_key(fd: int) -> bytes:
    """The key in a memfd from :func:`key_memfd` (taken back from the keeper).

    :raises ValueError: it holds no key of the right size.
    """
    key = os.pread(fd, KEY_SIZE + 1, 0)
    if len(key) != KEY_SIZE:
        raise ValueError("the session key is not a key")
    return key


def derive_nonce(key: bytes, public: str) -> str:
    """The secret of the frame named ``public``: 32 hex digits no one without ``key`` can make."""
    return hmac.new(key, public.encode(), hashlib.sha256).hexdigest()[:32]
