"""The notebook face: magics and live widgets (needs the ``jupyter`` extra).

``%load_ext remote_exec`` registers the magics::

    %%exec_remote --timeout 600
    pytest -x tests/

``JobView(proc)``, ``Dashboard(sb)`` (or ``Dashboard([sb1, sb2])`` for a fleet), ``ShellView(sb)``
and ``TerminalView(proc)`` (a ``tty=True`` job) work in any cell, on the blocking API's objects
(``rx.connect(url)``).
Nothing below this package imports it; the agent never does.
"""

from __future__ import annotations

import atexit
from typing import Any

from .dashboard import Dashboard as Dashboard
from .display import JobInterrupted as JobInterrupted
from .display import RemoteCommandError as RemoteCommandError
from .file_magics import RemoteFileMagics as RemoteFileMagics
from .job_view import JobView as JobView
from .magics import RemoteExecMagics as RemoteExecMagics
from .shell_view import ShellView as ShellView
from .terminal_view import TerminalView as TerminalView

__all__ = [
    "Dashboard",
    "JobInterrupted",
    "JobView",
    "RemoteCommandError",
    "RemoteExecMagics",
    "RemoteFileMagics",
    "ShellView",
    "TerminalView",
    "load_ipython_extension",
    "unload_ipython_extension",
]


def load_ipython_extension(ipython: Any) -> None:
    """Register the magics with ``ipython`` (what ``%load_ext remote_exec`` calls).

    When the kernel exits its sandbox connections are closed; ``--bg`` jobs keep running.
    """
    magics = RemoteExecMagics(ipython)
    ipython.register_magics(magics)
    ipython.register_magics(RemoteFileMagics(ipython, magics.state))  # the copies, on the same state
    atexit.register(magics.state.close, keep_background=True)


def unload_ipython_extension(ipython: Any) -> None:
    """``%unload_ext remote_exec``: close the kernel's sandboxes (killing the jobs still running)."""
    magics = ipython.magics_manager.registry.get(RemoteExecMagics.__name__)
    if isinstance(magics, RemoteExecMagics):
        atexit.unregister(magics.state.close)
        magics.state.close()
