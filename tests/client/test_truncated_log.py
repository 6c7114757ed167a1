"""A job that truncates its own stdout (issue #21 point 9): the stream goes on, with a notice of
exactly what the truncation took, instead of aborting with "offset past the end"."""

from __future__ import annotations

import os
from pathlib import Path

import anyio
import pytest

import remote_exec as rx
from remote_exec.client.types import ExecRemoteEvent

pytestmark = pytest.mark.anyio

# The job talks to the test through FIFOs: each open blocks until the other side opens, so each
# step below waits for the job's own event, never for time.
SCRIPT = """
printf 'first\\n'
read _ < go1
printf 'second-part\\n'
echo > written
read _ < go2
: > /dev/stdout
printf 'B\\n'
echo > done
exit 3
"""


def _fifos(where: Path) -> None:
    for name in ("go1", "written", "go2", "done"):
        os.mkfifo(where / name)


async def _tell(fifo: Path) -> None:
    await anyio.to_thread.run_sync(fifo.write_bytes, b"\n")


async def _hear(fifo: Path) -> None:
    await anyio.to_thread.run_sync(fifo.read_bytes)


@pytest.mark.parametrize(
    "reader",
    ["polls-first", "nothing-read", "pushes-all"],
)
async def test_a_job_truncating_its_stdout_goes_on_with_a_notice(
    url: str, agent_dir: Path, tmp_path: Path, reader: str
) -> None:
    """``polls-first``: a handle that polls (the stateless channel) has read the first line
    when the job truncates: the notice counts the second line. ``nothing-read``: a handle
    that read nothing: both lines. ``pushes-all``: a handle the agent pushes to has both lines
    before the truncation: nothing was lost to it, so no notice."""
    _fifos(tmp_path)
    if reader == "polls-first":
        url = f"local://?dir={agent_dir}&channel=call"
    async with rx.open_sandbox(url) as sb:
        proc = sb.exec_remote(["sh", "-c", SCRIPT], cwd=str(tmp_path))
        events = proc.__aiter__()
        seen: list[ExecRemoteEvent] = []
        with anyio.fail_after(60):
            if reader != "nothing-read":
                seen.append(await events.__anext__())
                assert seen == [rx.StdoutChunk("first\n")]
            await _tell(tmp_path / "go1")
            await _hear(tmp_path / "written")  # 18 bytes written in all ...
            assert proc.job_id is not None
            assert (await sb.tail_output(proc.job_id, 1)).size == 18  # ... and seen by the agent
            if reader == "pushes-all":
                seen.append(await events.__anext__())  # pushed as it was written
            await _tell(tmp_path / "go2")
            await _hear(tmp_path / "done")  # truncated, then "B\n" written: the job exits now
            seen += [ev async for ev in events]
    if reader == "pushes-all":
        both = [rx.StdoutChunk("first\n"), rx.StdoutChunk("second-part\n")]
        assert seen == [*both, rx.StdoutChunk("B\n"), rx.Completed(3, "first\nsecond-part\nB\n", "")]
        assert (await proc.wait()).stdout_truncated == 0
        return
    lost = 12 if reader == "polls-first" else 18  # "second-part\n" never read, or both lines
    head = [rx.StdoutChunk("first\n")] if reader == "polls-first" else []
    tail = "first\nB\n" if reader == "polls-first" else "B\n"
    assert seen == [*head, rx.StreamTruncated("stdout", lost), rx.StdoutChunk("B\n"), rx.Completed(3, tail, "")]
    result = await proc.wait()
    assert (result.returncode, result.stdout, result.stdout_truncated) == (3, tail, lost)
