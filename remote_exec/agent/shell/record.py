"""What a shell session leaves for the next agent: its dir, its record, and the key of its secrets.

A durable session lives in ``<state dir>/shells/<session id>/`` (0700): the shell's ``out`` and
``err`` (its fds 1 and 2, opened ``O_APPEND``: the shell writes there itself, with or without an
agent) and ``session.json`` (0600), rewritten whole (write + rename) before each run's line is
sent. The record holds the shell's pid and start time, its argv, and the current (or last) run:
its job id, command, public id, and the offsets in ``out``/``err`` its output starts at. It holds
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

__all__ = ["KEY_SIZE", "derive_nonce", "key_memfd", "read_key", "read_record", "session_dir", "write_record"]

KEY_SIZE = 32
RECORD = "session.json"
MAX_RECORD = 1 << 20  # a command line is bounded by the request size; more is not ours


def session_dir(root: Path, session_id: str) -> Path:
    """``root/session_id``, made 0700 (``root`` too)."""
    root.mkdir(mode=0o700, exist_ok=True)
    path = root / session_id
    path.mkdir(mode=0o700, exist_ok=True)
    return path


def write_record(path: Path, record: dict[str, Any]) -> None:
    """Replace ``path/session.json`` whole (0600): a reader sees the old record or the new one.

    :raises OSError: the disk is full (the caller refuses the run: no record, no survival).
    """
    tmp = path / (RECORD + ".new")
    with contextlib.suppress(FileNotFoundError):
        tmp.unlink()
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC, 0o600)
    with os.fdopen(fd, "wb") as f:
        f.write(json.dumps(record).encode())
    os.replace(tmp, path / RECORD)


def read_record(path: Path) -> dict[str, Any]:
    """The record in ``path``.

    :raises OSError: there is none.
    :raises ValueError: it is not a record (too long, not JSON, not an object).
    """
    fd = os.open(path / RECORD, os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC)
    with os.fdopen(fd, "rb") as f:
        data = f.read(MAX_RECORD + 1)
    if len(data) > MAX_RECORD:
        raise ValueError("the session record is too long")
    record = json.loads(data)
    if not isinstance(record, dict):
        raise ValueError("the session record is not an object")
    return record


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
