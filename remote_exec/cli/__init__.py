"""The command line: ``remote-exec`` (:mod:`~remote_exec.cli.app`, with ``cp`` in
:mod:`~remote_exec.cli.cp` and ``shell`` in :mod:`~remote_exec.cli.shell`) and the demo
(:mod:`~remote_exec.cli.demo`). ``python -m remote_exec.cli`` is ``remote-exec``.
"""

from .app import main as main

__all__ = ["main"]
