"""The ``shell_*`` JSON-RPC methods: names bound to :class:`ShellController` operations."""

from __future__ import annotations

from ...protocol import Method
from ..rpc import Handler
from .controller import ShellController

__all__ = ["shell_methods"]


def shell_methods(ctl: ShellController) -> dict[str, Handler]:
    """The shell methods served by ``ctl``; params arrive validated by the dispatcher."""
    return {
        Method.SHELL_OPEN: ctl.open,
        Method.SHELL_RUN: ctl.run,
        Method.SHELL_LIST: ctl.list,
        Method.SHELL_CLOSE: ctl.close,
        Method.SHELL_INTERRUPT: ctl.interrupt,
    }
