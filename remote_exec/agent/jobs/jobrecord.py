"""A disk job's durable record: ``job.json`` and ``stdin_bytes`` in its job dir, written so that
a crash leaves something a later agent can read back (or knows to discard), and read back.

What goes into ``job.json`` is the job's to say (:meth:`DiskJob._meta`); this module writes it
and turns it back into the job's start parameters.
"""

from __future__ import annotations

import contextlib
import json
import logging
import os
from pathlib import Path
from typing import Any

from ...protocol import JobPolicy, StartParams
from ..statefile import open_own_file, planted, read_state_file
from .stdin import MAX_WRITERS, WRITER_FORM

__all__ = [
    "params_from_record",
    "read_stdin_cursor",
    "read_stdin_writers",
    "write_first_record",
    "write_record",
    "write_stdin_cursor",
    "write_stdin_writers",
]


log = logging.getLogger("remote_exec.agent")
CURSOR_SIZE = 64  # "%20d\n" is 21 bytes


def start_record(p: StartParams) -> dict[str, Any]:
    """What ``job.json`` keeps of a start (read back by :func:`params_from_record`): never the
    environment's values, which may be secrets, only its names."""
    return {
        "command": p.command,
        "label": p.label,
        "cwd": p.cwd,
        "user": p.user,
        "env_names": sorted(p.env or {}),
        "encoding": p.encoding,
        "timeout": p.timeout,
        "kill_grace": p.kill_grace,
        "stdin_open": p.stdin_open,
        "output_cap": p.output_cap,
        "idempotency_key": p.idempotency_key,
        "tags": p.tags,  # the starter's notes (notebook, kernel, name): what finds it after a restart
        "policy": None if p.policy is None else p.policy.model_dump(mode="json"),
    }


def write_record(job_dir: Path, meta: dict[str, Any]) -> None:
    """Write ``job.json`` atomically (a crash leaves the old or the new one, never half)."""
    tmp = job_dir / "job.json.tmp"
    with contextlib.suppress(OSError, ValueError):  # a full disk: the job runs on, its record is older
        fd = open_own_file(tmp, os.O_WRONLY | os.O_TRUNC)  # (what the job planted there is replaced)
        with os.fdopen(fd, "w") as f:
            json.dump(meta, f)
        os.replace(tmp, job_dir / "job.json")


def write_first_record(fd: int, meta: dict[str, Any]) -> None:
    """The first record, written into the spare's empty ``job.json`` (no file to create, no
    rename); closes ``fd``. A crash mid-write leaves a torn record, which the next agent treats
    as none, as it treats a crash before the record: the start never answered, so it ends the
    job's processes and removes the dir."""
    try:
        view = memoryview(json.dumps(meta).encode())
        while view:
            view = view[os.write(fd, view) :]
    except OSError:
        pass  # a full disk: as in write_record(), the job runs on
    finally:
        os.close(fd)


def write_stdin_cursor(job_dir: Path, written: int) -> None:
    """Record how many stdin bytes the job took, so writers resume exactly after a restart."""
    with contextlib.suppress(OSError, ValueError):
        fd = open_own_file(job_dir / "stdin_bytes", os.O_WRONLY)  # a FIFO there blocked the agent
        try:
            os.pwrite(fd, b"%20d\n" % written, 0)
        finally:
            os.close(fd)


def read_stdin_cursor(job_dir: Path) -> int | None:
    """The stdin cursor :func:`write_stdin_cursor` left, None if there is none to be read (one
    the job replaced, e.g. by a symlink to ``/dev/zero``, is logged and skipped)."""
    path = job_dir / "stdin_bytes"
    try:
        return max(0, int(read_state_file(path, CURSOR_SIZE)))
    except FileNotFoundError:
        return None
    except (OSError, ValueError) as exc:
        log.warning("skipped %s: %s%s", path, exc, "; removed" if planted(exc) else "")
        if planted(exc):
            with contextlib.suppress(OSError):
                os.unlink(path)  # a symlink or FIFO itself: the next cursor is written afresh
        return None


WRITERS_SIZE = 16 * 1024  # MAX_WRITERS entries of at most ~90 bytes each


def write_stdin_writers(job_dir: Path, writers: dict[str, int]) -> None:
    """Record each terminal typist's cursor (see :class:`.stdin.StdinQueue`), atomically."""
    tmp = job_dir / "stdin_writers.tmp"
    with contextlib.suppress(OSError, ValueError):
        fd = open_own_file(tmp, os.O_WRONLY | os.O_TRUNC)
        with os.fdopen(fd, "w") as f:
            json.dump(writers, f)
        os.replace(tmp, job_dir / "stdin_writers")


def read_stdin_writers(job_dir: Path) -> dict[str, int]:
    """The typists' cursors :func:`write_stdin_writers` left; what is not of their form (the job
    can write there) is skipped and logged: those writers start again from 0."""
    path = job_dir / "stdin_writers"
    try:
        got = json.loads(read_state_file(path, WRITERS_SIZE))
        if not isinstance(got, dict) or len(got) > MAX_WRITERS:
            raise ValueError(f"not a map of at most {MAX_WRITERS} writers")
        return {
            k: v
            for k, v in got.items()
            if isinstance(k, str) and WRITER_FORM.fullmatch(k) and type(v) is int and 0 <= v < 2**63
        }
    except FileNotFoundError:
        return {}
    except (OSError, ValueError) as exc:
        log.warning("skipped %s: %s", path, exc)
        return {}


def params_from_record(meta: dict[str, Any]) -> StartParams:
    """The start parameters a ``job.json`` recorded (env values and input never are).

    :raises KeyError: no command. :raises ValueError: a field out of its range.
    """
    return StartParams(
        command=meta["command"],
        cwd=meta.get("cwd"),
        user=meta.get("user"),
        stdin_open=bool(meta.get("stdin_open")),
        timeout=meta.get("timeout"),
        kill_grace=meta.get("kill_grace", 5.0),
        encoding=meta.get("encoding", "utf-8"),
        label=meta.get("label"),
        idempotency_key=meta.get("idempotency_key"),
        output_cap=meta.get("output_cap"),
        tags=meta.get("tags"),
        tty=bool(meta.get("tty", False)),
        tty_size=meta.get("tty_size"),
        policy=_policy(meta.get("policy")),
    )


def _policy(raw: object) -> JobPolicy | None:
    """The policy a job.json recorded (``None`` if absent, or not one this agent reads)."""
    try:
        return None if raw is None else JobPolicy.model_validate(raw)
    except ValueError:
        return None
