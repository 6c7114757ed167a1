"""A job's logs read at any offset, its tail, and forgetting ended jobs (``exec_remote_read``,
``exec_remote_forget``, ``exec_remote_prune``).

A job's streams are files in the sandbox (#14), addressed by the same byte cursors as polls:
these reads move no cursor and need no process handle, so a dashboard, ``remote-exec logs`` and
a notebook can all read one job's log at once. What an agent sends is checked against what was
asked (a hostile agent cannot hand back more bytes or another offset).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

from ..errors import ProtocolError
from ..protocol import DEFAULT_MAX_BYTES, JobState, Method, PruneParams, PruneResult, ReadParams, ReadResult
from .rpc import RpcClient

__all__ = ["OutputSlice", "Stream", "prune_jobs", "read_output"]

Stream = Literal["stdout", "stderr"]


@dataclass(frozen=True)
class OutputSlice:
    """Bytes of one stream of a job, read at an offset.

    :ivar data: the raw bytes (decode them as the job's encoding says).
    :ivar offset: where ``data`` starts in the stream.
    :ivar dropped: bytes before ``offset`` that were asked for but dropped by the disk cap.
    :ivar size: the stream's bytes written so far.
    :ivar state: the job's state at the read.
    :ivar exit_code: its exit code once it has ended.
    """

    data: bytes
    offset: int
    dropped: int
    size: int
    state: JobState
    exit_code: int | None

    @property
    def end(self) -> int:
        """The offset after ``data``: the next read's ``offset``."""
        return self.offset + len(self.data)

    @property
    def complete(self) -> bool:
        """The job has ended and nothing of the stream is left to read after this slice."""
        return self.state != "running" and self.end >= self.size


async def read_output(
    rpc: RpcClient,
    job_id: str,
    stream: Stream = "stdout",
    *,
    offset: int = 0,
    max_bytes: int = DEFAULT_MAX_BYTES,
    tail: int | None = None,
    since: float | None = None,
) -> OutputSlice:
    """Read ``stream`` of ``job_id`` from ``offset`` (at most ``max_bytes``), or its last ``tail``
    bytes, or from where the bytes written at or after wall time ``since`` begin (to the second:
    the agent looks at a running job's logs once a second, so up to a second's bytes more).

    Cancelling abandons the read; nothing on the agent changes.

    :raises JobNotFoundError: no such job (or it was forgotten).
    :raises InvalidParamsError: ``offset`` is past the end of the stream.
    :raises ProtocolError: the agent answered with bytes or an offset that were not asked for.
    """
    params = ReadParams(job_id=job_id, stream=stream, offset=offset, max_bytes=max_bytes, tail=tail, since=since)
    limit = max_bytes if tail is None else min(tail, max_bytes)
    r, payload = await rpc.call_with_payload(Method.EXEC_REMOTE_READ, params, ReadResult, max_payload=limit)
    data = b"" if payload is None else bytes(payload)
    end = r.offset + len(data)
    if tail is None and since is None and r.offset != offset + r.dropped:
        raise ProtocolError(f"job {job_id}: asked {stream} at {offset}, the agent answered at {r.offset}")
    if tail is not None and (r.dropped or end != r.size):
        raise ProtocolError(f"job {job_id}: the {stream} tail [{r.offset}, {end}) does not end the stream ({r.size})")
    if end > r.size:
        raise ProtocolError(f"job {job_id}: {stream} bytes up to {end} of a {r.size}-byte stream")
    return OutputSlice(data, r.offset, r.dropped, r.size, r.state, r.exit_code)


async def prune_jobs(rpc: RpcClient, older_than: float | None, keep: int | None) -> PruneResult:
    """Forget ended jobs older than ``older_than`` seconds or beyond the newest ``keep``."""
    return await rpc.call(Method.EXEC_REMOTE_PRUNE, PruneParams(older_than=older_than, keep=keep), PruneResult)
