"""The ``stdio`` relay's way down into a pipe (:func:`remote_exec.agent.relay._relay_down`):
every byte arrives, in order, and a small frame after a big run arrives without waiting for
more. A blocking ``splice`` held the pipe's lock while it waited for the socket, and the frame
sat behind it until more bytes came (why the first splicing relay stalled). Where splice is
refused (seccomp, gVisor), the relay copies. A real socket pair and a real pipe: the relay runs
in a process of its own, its stdout the pipe this test reads."""

from __future__ import annotations

import os
import select
import socket
import subprocess
import sys
import threading
import time

import pytest

RELAY = """
import errno, os, socket, sys
from remote_exec.agent import relay
conn = socket.socket(fileno=int(sys.argv[1]))
if sys.argv[2] == "refused":
    def refused(*args, **kwargs):
        raise OSError(errno.EINVAL, "splice refused here")
    os.splice = refused
conn.settimeout(relay._FOREVER)
relay._relay_down(conn, True)
"""


def _read_exactly(fd: int, n: int, bound: float) -> bytes:
    got = bytearray()
    deadline = time.monotonic() + bound
    while len(got) < n:
        left = deadline - time.monotonic()
        assert left > 0 and select.select([fd], [], [], left)[0], f"{len(got)} of {n} bytes arrived"
        chunk = os.read(fd, n - len(got))
        assert chunk, f"EOF after {len(got)} of {n} bytes"
        got += chunk
    return bytes(got)


@pytest.mark.parametrize("mode", ["splice", "refused"])
def test_a_small_frame_after_a_big_run_arrives_whole_without_more_bytes(mode: str) -> None:
    ours, theirs = socket.socketpair()
    proc = subprocess.Popen(
        [sys.executable, "-c", RELAY, str(theirs.fileno()), mode], stdout=subprocess.PIPE, pass_fds=[theirs.fileno()]
    )
    theirs.close()
    try:
        assert proc.stdout is not None
        out = proc.stdout.fileno()
        for round_ in range(3):
            big = os.urandom(300_000 + round_)  # fills the relay's buffer: the splice path
            frame = big + b'{"push":%d}\n' % round_  # and then nothing more
            # Sent by a thread: the pipe holds less than a frame until this test reads it.
            sender = threading.Thread(target=ours.sendall, args=(frame,))
            sender.start()
            # (Before: the last line stayed behind a blocking splice until more bytes came.)
            assert _read_exactly(out, len(frame), 30.0) == frame
            sender.join(30)
        for i in range(50):  # small frames alone: each crosses by itself (spliced, or copied)
            small = b'{"n":%d}\n' % i
            ours.sendall(small)
            assert _read_exactly(out, len(small), 30.0) == small
        ours.sendall(b"the end\n")
        assert _read_exactly(out, 8, 30.0) == b"the end\n"
        ours.close()
        assert proc.wait(30) == 0
        assert os.read(out, 1) == b""  # EOF once the server side closed: nothing more, nothing twice
    finally:
        ours.close()
        if proc.poll() is None:
            proc.kill()
            proc.wait()
        if proc.stdout is not None:
            proc.stdout.close()
