"""The ``port_*`` JSON-RPC methods: names bound to :class:`PortController` operations."""

from __future__ import annotations

from ...protocol import Method
from ..rpc import Handler
from .controller import PortController

__all__ = ["port_methods"]


def port_methods(ctl: PortController) -> dict[str, Handler]:
    """The port methods served by ``ctl``; params arrive validated by the dispatcher."""
    return {
        Method.PORT_CONNECT: ctl.connect,
        Method.PORT_SEND: ctl.send,
        Method.PORT_RECV: ctl.recv,
        Method.PORT_CLOSE: ctl.close,
        Method.PORT_LIST: ctl.list,
    }
