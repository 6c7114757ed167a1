"""Dropping the head of a log file in place: one helper for the agent and the keeper.

A stream past its cap loses its oldest bytes by ``fallocate(PUNCH_HOLE | KEEP_SIZE)`` from offset
0 to a 4 KiB boundary: the blocks are freed, offsets do not move (a reader's cursor stays valid),
and where the data begins again is found with ``lseek(SEEK_DATA)``. The agent punches while it
runs (:mod:`.jobs.logfile`), the keeper while no agent does (:mod:`.keeper.caps`); both with these
constants and calls. Standard library only, like the keeper.
"""

from __future__ import annotations

import ctypes
import errno
import os

__all__ = ["BLOCK", "DEFAULT_CAP", "data_start", "punch_head"]

DEFAULT_CAP = 1 << 30
"""Bytes a stream keeps on disk unless its job or the agent's ``--disk-cap`` says otherwise."""
BLOCK = 4096
"""Punches end on a multiple of this: a partial block cannot be freed."""

_FALLOC_FL_KEEP_SIZE = 1
_FALLOC_FL_PUNCH_HOLE = 2
_libc = ctypes.CDLL(None, use_errno=True)
_libc.fallocate.argtypes = [ctypes.c_int, ctypes.c_int, ctypes.c_int64, ctypes.c_int64]


def punch_head(fd: int, new_base: int) -> int:
    """Free ``[0, new_base)`` of the open file ``fd`` (``new_base`` a multiple of :data:`BLOCK`).

    :returns: 0, or the errno of a file system that cannot punch (``EOPNOTSUPP``: some FUSE and
        network file systems), where the file then keeps growing.
    """
    if _libc.fallocate(fd, _FALLOC_FL_PUNCH_HOLE | _FALLOC_FL_KEEP_SIZE, 0, new_base) != 0:
        return ctypes.get_errno() or errno.EOPNOTSUPP
    return 0


def data_start(fd: int, size: int) -> int:
    """Where the data of the open file ``fd`` (``size`` bytes long) begins after punched holes:
    ``size`` when it is all hole, 0 when that cannot be told."""
    try:
        return os.lseek(fd, 0, os.SEEK_DATA)
    except OSError as exc:
        return size if exc.errno == errno.ENXIO else 0
