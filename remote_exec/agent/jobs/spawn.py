"""Starting a job's process: fork+exec in a session of its own, and the error a failed start raises."""

from __future__ import annotations

import subprocess
from typing import Any

from ...errors import NoSpaceError, SpawnError

__all__ = ["popen_session", "spawn_error"]


def popen_session(
    argv: list[str], stdin: int, out: int, err: int, cwd: str | None, env: dict[str, str], **kwargs: Any
) -> subprocess.Popen[bytes]:
    """fork+exec in a session of its own (SIGINT and kills reach its group only), fds closed;
    synchronous like asyncio's own ``subprocess_exec`` (it waits for the exec). Jobs and shells."""
    return subprocess.Popen(
        argv,
        stdin=stdin,
        stdout=out,
        stderr=err,
        cwd=cwd,
        env=env,
        start_new_session=True,
        close_fds=True,
        **kwargs,
    )


def spawn_error(exc: OSError | ValueError, job_id: str, what: str) -> Exception:
    """The error for a start that failed with ``exc``: a full disk is :class:`NoSpaceError`."""
    import errno

    if isinstance(exc, OSError) and exc.errno in (errno.ENOSPC, errno.EDQUOT):
        name = errno.errorcode[exc.errno]
        return NoSpaceError(
            f"cannot start {what}: the sandbox's disk is full ({name})", data={"errno": name, "job_id": job_id}
        )
    return SpawnError(f"cannot start {what}: {exc}", job_id=job_id)
