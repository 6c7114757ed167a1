"""``widen_pipe``: the one helper every side (host sandboxes, native copy, agent relay) grows its pipes with."""

from __future__ import annotations

import fcntl
import os

from remote_exec.protocol.pipes import PIPE_SIZE, widen_pipe

F_GETPIPE_SZ = getattr(fcntl, "F_GETPIPE_SZ", 1032)


def test_widens_a_descriptor_and_a_file_object() -> None:
    r, w = os.pipe()
    with open(r, "rb") as reader, open(w, "wb") as writer:
        assert fcntl.fcntl(w, F_GETPIPE_SZ) < PIPE_SIZE
        widen_pipe(w)
        assert fcntl.fcntl(w, F_GETPIPE_SZ) == PIPE_SIZE
        widen_pipe(reader, 2 * PIPE_SIZE // 4)  # shrinking works as well: the size is what is asked
        assert fcntl.fcntl(writer.fileno(), F_GETPIPE_SZ) == PIPE_SIZE // 2


def test_failures_leave_the_pipe_as_it_was() -> None:
    r, w = os.pipe()
    os.close(r)
    widen_pipe(w, 1 << 40)  # over pipe-max-size: EINVAL/EPERM, suppressed
    assert fcntl.fcntl(w, F_GETPIPE_SZ) < PIPE_SIZE
    null = os.open(os.devnull, os.O_RDONLY)
    widen_pipe(null)  # not a pipe: EBADF, suppressed
    os.close(null)
    f = open(w, "wb")  # noqa: SIM115
    f.close()
    widen_pipe(f)  # closed: fileno() raises ValueError, suppressed
