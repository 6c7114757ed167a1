"""A Jupyter Server extension: a widget's controls reach its kernel while the kernel is busy.

``POST {base_url}remote-exec/controls/<socket name>`` forwards the JSON body and the kernel's
token (header ``X-Remote-Exec-Token``) to that kernel's control socket
(:mod:`~remote_exec.jupyter.controls`) and answers with its status. The request is authenticated
and XSRF-checked like any Jupyter API call (``APIHandler``, ``@authenticated``); the name must be
a socket name of the kernel's form (no ``/``, no ``..``, bounded length), is only looked up in the
private directory under Jupyter's runtime dir, and must be a socket of this user's; the body is
bounded. The kernel checks the token, the widget and the message again: what a page sends is
hostile until proven otherwise.

Enabled by ``etc/jupyter/jupyter_server_config.d/remote_exec_controls.json``, which the wheel
installs into the environment's prefix; without it the widgets fall back to comm messages (which
wait while the kernel is busy, and the buttons say so).
"""

from __future__ import annotations

import os
import stat
from typing import Any

import aiohttp
import tornado.web
from jupyter_server.base.handlers import APIHandler
from jupyter_server.utils import url_path_join

from .controls import MAX_BODY, NAME_PATTERN, TOKEN_HEADER, control_dir, socket_address

__all__ = ["ControlHandler", "load_jupyter_server_extension"]

_TIMEOUT = aiohttp.ClientTimeout(total=10)


class ControlHandler(APIHandler):
    """Forward one control to a kernel's socket (see the module doc)."""

    @tornado.web.authenticated
    async def post(self, name: str) -> None:
        if not NAME_PATTERN.fullmatch(name):
            raise tornado.web.HTTPError(400, "not a control socket name")
        body = self.request.body
        if len(body) > MAX_BODY:
            raise tornado.web.HTTPError(413, "control request too large")
        token = self.request.headers.get(TOKEN_HEADER, "")
        if not token or len(token) > 256:
            raise tornado.web.HTTPError(403, "no token")
        path = control_dir() / name
        try:
            st = os.lstat(path)
        except OSError:
            raise tornado.web.HTTPError(404, "no such kernel socket") from None
        if not stat.S_ISSOCK(st.st_mode) or st.st_uid != os.geteuid():
            raise tornado.web.HTTPError(404, "no such kernel socket")
        try:
            with socket_address(path) as address:  # a long runtime dir: reached through its fd
                answer, status = await _forward(address, body, token)
        except (aiohttp.ClientError, TimeoutError, OSError) as exc:
            raise tornado.web.HTTPError(502, f"the kernel's control socket did not answer: {exc}") from None
        self.set_status(status)
        self.set_header("Content-Type", "application/json")
        self.finish(answer[:4096])


async def _forward(address: str, body: bytes, token: str) -> tuple[bytes, int]:
    """POST ``body`` to the kernel's socket at ``address``; its answer and status."""
    connector = aiohttp.UnixConnector(path=address)
    async with (
        aiohttp.ClientSession(connector=connector, timeout=_TIMEOUT) as http,
        http.post(
            "http://kernel/control", data=body, headers={TOKEN_HEADER: token, "Content-Type": "application/json"}
        ) as resp,
    ):
        return await resp.read(), resp.status


def _jupyter_server_extension_points() -> list[dict[str, str]]:
    return [{"module": "remote_exec.jupyter.control_route"}]


def load_jupyter_server_extension(serverapp: Any) -> None:
    """Add the route under the server's base URL."""
    web_app = serverapp.web_app
    route = url_path_join(web_app.settings["base_url"], r"remote-exec/controls/([^/]{1,100})")
    web_app.add_handlers(".*$", [(route, ControlHandler)])


_load_jupyter_server_extension = load_jupyter_server_extension
