"""The fault suite's workload itself: a job's output is what :func:`expected` says, whatever way
its go line arrives. Run through bash directly (no agent): this is about the script, not the engine.
"""

from __future__ import annotations

import contextlib
import hashlib
import os
import select
import subprocess
import time

import anyio
import pytest

from .workload import PACE_EVERY, expected, go_line, job_command, tty

pytestmark = pytest.mark.anyio

TAG = "rxfault-test-"


async def test_go_line_cut_by_a_paced_read_timeout() -> None:
    """A paced ``read -t`` that times out after the first byte of the go line keeps that byte
    (bash assigns a timed-out read's partial input): the job must still print the whole go line.

    The fault suite once saw it as "got g" for "got go 180" (5 bytes short, sha wrong): the line
    landed whole just before a pause's deadline and the job was descheduled after reading its "g".
    Here the "g" comes alone, the rest only once that pause is over (its next line printed).
    """
    k = 0
    want = expected(TAG, k)
    line = go_line(k)
    out = b""
    with anyio.fail_after(20):
        async with await anyio.open_process(job_command(TAG, k), stderr=subprocess.DEVNULL) as proc:
            assert proc.stdin is not None and proc.stdout is not None
            await proc.stdin.send(line[:1])
            after_pause = f" line {PACE_EVERY} ".encode()  # printed once the first pause is over
            while after_pause not in out:
                out += await proc.stdout.receive()
            # The old script stopped pacing with go="g" and may have exited already.
            with contextlib.suppress(anyio.BrokenResourceError):
                await proc.stdin.send(line[1:])
                await proc.stdin.aclose()
            with contextlib.suppress(anyio.EndOfStream):
                while True:
                    out += await proc.stdout.receive()
            code = await proc.wait()
    assert out.endswith(b"got " + line), out[-60:]
    assert (len(out), code) == (want.stdout_len, want.exit_code)


def test_a_tty_job_gives_the_expected_terminal_stream() -> None:
    """A tty job's script, run in a real pseudo-terminal: its one stream (stdout and stderr in the
    order written, ``\\r\\n``, the go line not echoed) is what :func:`expected` says, and a
    ``kill -9`` job ends by SIGKILL."""
    for k in (3, 53):  # exit 3; killed by SIGKILL (53 % 9 == 8)
        assert tty(k)
        want = expected(TAG, k)
        master, slave = os.openpty()
        with subprocess.Popen(job_command(TAG, k), stdin=slave, stdout=slave, stderr=slave) as proc:
            os.close(slave)
            out = b""
            deadline = time.monotonic() + 30
            typed = False
            while True:
                ready, _, _ = select.select([master], [], [], max(0.0, deadline - time.monotonic()))
                assert ready, f"job {k}: no end by the deadline; got {out[-200:]!r}"
                try:
                    chunk = os.read(master, 65536)
                except OSError:  # EIO: every slave fd closed, all output read
                    break
                out += chunk
                if out and not typed:  # its first output: ``stty -echo`` is done (as the suite waits)
                    os.write(master, go_line(k) + b"\x04")
                    typed = True
            code = proc.wait(timeout=30)
        os.close(master)
        assert hashlib.sha256(out).hexdigest() == want.stdout_sha, out[-80:]
        assert (len(out), code, want.stderr_sha) == (want.stdout_len, want.exit_code, hashlib.sha256(b"").hexdigest())
