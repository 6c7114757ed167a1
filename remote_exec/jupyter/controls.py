"""Widget controls that act while the kernel is busy: a private socket per kernel.

A widget's buttons are comm messages, and comm messages travel on the kernel's shell channel:
they wait behind a running cell, so Kill on a foreground ``%%exec_remote`` cell did nothing until
the job had ended. The widgets' Python side runs on the blocking API's loop thread, which stays
free while a cell runs; so this module serves the same messages there, on a route that does not
pass the shell channel: one small aiohttp server per kernel on a Unix socket in a private
directory (``0700``) under Jupyter's runtime dir, which the Jupyter Server extension
:mod:`~remote_exec.jupyter.control_route` forwards the browser's ``POST`` to.

A request carries the kernel's random token (made here, never written to disk; it dies with the
kernel) and names a widget registered (weakly) under its model id; its JSON body is then handed to
the very handler the comm calls (``control``): one code path, no second implementation
of kill, stdin or fetch. Answers that carry data (Copy/Download) come back as kernel messages, as
before: those flow from the loop thread while a cell runs. The server starts with the first
widget, its socket file is removed at exit (and a killed kernel's, which had no exit, by the
next kernel that starts one: :func:`sweep_stale`); a widget's synced ``controls`` trait tells its front
end the socket's *name* (not a path), the token and the widget's key.
"""

from __future__ import annotations

import asyncio
import atexit
import contextlib
import hmac
import json
import os
import re
import secrets
import socket
import stat
import struct
import threading
import time
import weakref
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any, Protocol

from aiohttp import web

__all__ = [
    "socket_address",
    "MAX_BODY",
    "NAME_PATTERN",
    "SOCKET_DIR",
    "TOKEN_HEADER",
    "ack_control",
    "ControlServer",
    "Controllable",
    "control_dir",
    "enable_controls",
    "private_dir",
    "server_for",
    "sweep_stale",
]

SOCKET_DIR = "remote-exec-controls"
"""The private directory, under Jupyter's runtime dir, that holds every kernel's socket."""

NAME_PATTERN = re.compile(r"k-[0-9a-f]{32}\.sock")
"""A socket's name (``fullmatch``): no path characters, bounded length. The route checks it too."""

TOKEN_HEADER = "X-Remote-Exec-Token"
MAX_BODY = 64 * 1024
"""Bytes of one control request (a stdin line or a paste is the largest; the front end sends a
larger one by the comm)."""

_MAX_KEY = 64


class Controllable(Protocol):
    """A widget whose front-end messages the server can hand on."""

    def control(self, content: dict[str, Any]) -> None:
        """Handle ``content`` as the comm's handler does (called on the loop thread)."""


def control_dir() -> Path:
    """Where this host's kernels' sockets are: ``SOCKET_DIR-<host>`` under Jupyter's runtime dir
    (which a kernel inherits from the server that started it). One per host: a runtime dir in a
    home shared between machines (NFS) holds other hosts' sockets, which this host cannot reach
    and must not take for a dead kernel's (:func:`sweep_stale`)."""
    from jupyter_core.paths import jupyter_runtime_dir

    host = re.sub(r"[^A-Za-z0-9.-]", "_", socket.gethostname())[:64] or "host"
    return Path(jupyter_runtime_dir()) / f"{SOCKET_DIR}-{host}"


# sun_path holds 108 bytes with its NUL: a longer socket path cannot be bound or reached by name.
_SUN_PATH_MAX = 107


@contextlib.contextmanager
def socket_address(path: Path) -> Iterator[str]:
    """An address that binds or reaches the socket at ``path``: the path itself, or, when it is
    too long for ``sun_path`` (a runtime dir deep in a home or a test's temp dir), the same file
    through an fd of its directory (``/proc/self/fd/N/NAME``, Linux), open while the caller binds
    or connects.

    :raises OSError: the path is too long and there is no ``/proc`` to shorten it.
    """
    raw = os.fsencode(path)
    if len(raw) <= _SUN_PATH_MAX:
        yield os.fspath(path)
        return
    fd = os.open(path.parent, os.O_PATH | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC)
    try:
        short = f"/proc/self/fd/{fd}/{path.name}"
        if not os.path.isdir(f"/proc/self/fd/{fd}"):
            raise OSError(f"{path} is too long for a socket address and there is no /proc to shorten it")
        yield short
    finally:
        os.close(fd)


def private_dir(path: Path) -> Path:
    """Make ``path`` (and its parents) if missing, and check it is a directory of ours with mode ``0700``.

    A directory of ours with group/other bits (an old umask) gets them removed.

    :raises PermissionError: it is a symlink, not a directory, or another user's.
    """
    path.parent.mkdir(parents=True, exist_ok=True, mode=0o700)
    with contextlib.suppress(FileExistsError):
        path.mkdir(mode=0o700)
    st = os.lstat(path)
    if not stat.S_ISDIR(st.st_mode) or st.st_uid != os.geteuid():
        raise PermissionError(f"{path} is not a directory of this user's: no busy-kernel controls")
    if stat.S_IMODE(st.st_mode) != 0o700:
        os.chmod(path, 0o700, follow_symlinks=False)
    return path


def _peer_uid(request: web.Request) -> int | None:
    sock = request.transport.get_extra_info("socket") if request.transport is not None else None
    if sock is None:
        return None
    creds = sock.getsockopt(socket.SOL_SOCKET, socket.SO_PEERCRED, struct.calcsize("3i"))
    return int(struct.unpack("3i", creds)[1])


class ControlServer:
    """One kernel's control socket (see the module doc); driven on the loop thread."""

    def __init__(self, directory: Path | None = None) -> None:
        self.name = f"k-{secrets.token_hex(16)}.sock"
        self.token = secrets.token_urlsafe(32)
        self._directory = directory
        self.path: Path | None = None
        self._widgets: weakref.WeakValueDictionary[str, Any] = weakref.WeakValueDictionary()
        self._runner: web.AppRunner | None = None
        self._started: asyncio.Task[None] | None = None

    def register(self, key: str, widget: Controllable) -> None:
        """Let requests naming ``key`` reach ``widget`` (for as long as it lives)."""
        self._widgets[key] = widget

    async def start(self) -> None:
        """Start serving (once; later calls wait for the first). Cancelled: the server may be up."""
        if self._started is None:
            self._started = asyncio.get_running_loop().create_task(self._start())
        await asyncio.shield(self._started)

    async def _start(self) -> None:
        sock = await asyncio.to_thread(self._bind)  # file-system calls: off the loop
        app = web.Application(client_max_size=MAX_BODY)
        app.router.add_post("/control", self._handle)
        self._runner = web.AppRunner(app, access_log=None, handle_signals=False)
        await self._runner.setup()
        await web.SockSite(self._runner, sock).start()

    def _bind(self) -> socket.socket:
        directory = private_dir(self._directory or control_dir())
        sweep_stale(directory)
        path = directory / self.name
        sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        try:
            with socket_address(path) as address:
                sock.bind(address)
            os.chmod(path, 0o600)
            sock.listen(64)
        except BaseException:
            sock.close()
            raise
        self.path = path
        atexit.register(_unlink, path)
        return sock

    async def close(self) -> None:
        """Stop serving and remove the socket file. Cancelled: the file may be left (the token dies
        with the process; a connection to it is refused)."""
        if self._runner is not None:
            await self._runner.cleanup()
        if self.path is not None:
            await asyncio.to_thread(_unlink, self.path)

    async def _handle(self, request: web.Request) -> web.Response:
        # Everything here may come from a hostile page through the route: checked again.
        if _peer_uid(request) != os.geteuid():
            return _answer(403, "not our user")
        token = request.headers.get(TOKEN_HEADER, "")
        if not hmac.compare_digest(token.encode(), self.token.encode()):
            return _answer(403, "bad token")
        try:
            content = json.loads(await request.read())
        except web.HTTPRequestEntityTooLarge:
            return _answer(413, "too large")
        except ValueError:
            return _answer(400, "not JSON")
        if not isinstance(content, dict):
            return _answer(400, "not an object")
        key, kind = content.pop("widget", None), content.get("type")
        if not isinstance(key, str) or len(key) > _MAX_KEY or not isinstance(kind, str):
            return _answer(400, "no widget or type")
        widget = self._widgets.get(key)
        if widget is None:
            return _answer(404, "no such widget")
        widget.control(content)
        return _answer(200, "ok")


SWEEP_MAX = 256
"""Socket files one start looks at (the directory is ours, but a bound keeps a start quick)."""

SWEEP_MIN_AGE = 60.0
"""Seconds a socket file must have existed before a sweep may take it for a dead kernel's: a
kernel starting now has bound its socket and not yet called ``listen``, and a connect to it is
refused meanwhile."""

_PROBE_TIMEOUT = 0.5  # a listener with a full queue is busy, not dead: a timeout counts as alive


def sweep_stale(directory: Path) -> list[str]:
    """Remove the sockets in ``directory`` that no process listens on any more: those of kernels
    that were killed (SIGKILL, a crash, the machine's OOM killer) and so never ran their exit
    handler. A socket older than :data:`SWEEP_MIN_AGE` whose connect is refused is dead (a live
    kernel's accepts, or times out when busy); anything else -- not ours by name, not a socket,
    young, a connect that fails otherwise, a file another kernel removed meanwhile -- is left.
    Blocking (file system and connects, each bounded): call it off the event loop. Returns the
    names removed."""
    removed = []
    now = time.time()
    for entry in sorted(directory.iterdir())[:SWEEP_MAX]:
        try:
            st = os.lstat(entry)
        except OSError:
            continue  # gone meanwhile (another kernel's sweep, or its exit)
        if not NAME_PATTERN.fullmatch(entry.name) or not stat.S_ISSOCK(st.st_mode):
            continue
        if now - st.st_mtime < SWEEP_MIN_AGE:
            continue
        probe = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        probe.settimeout(_PROBE_TIMEOUT)
        try:
            with socket_address(entry) as address:
                probe.connect(address)
        except ConnectionRefusedError:
            _unlink(entry)
            removed.append(entry.name)
        except OSError:
            pass  # a timeout (busy), or anything else: not known dead
        finally:
            probe.close()
    return removed


def _answer(status: int, reason: str) -> web.Response:
    return web.json_response({"ok": status == 200, "reason": reason}, status=status)


def _unlink(path: Path) -> None:
    with contextlib.suppress(OSError):
        path.unlink()


def ack_control(
    call_soon: Callable[..., None], send: Callable[[dict[str, Any]], None], content: dict[str, Any]
) -> None:
    """Acknowledge a control that came by the comm (its ``ack`` id): the front end flags a control
    not acknowledged soon as waiting for a busy kernel. Sent from the loop thread, as all else."""
    ack = content.pop("ack", None)
    if isinstance(ack, str) and 0 < len(ack) <= 32:
        call_soon(send, {"kind": "ack", "id": ack})


_servers: dict[int, ControlServer] = {}
_servers_lock = threading.Lock()


def server_for(loop: asyncio.AbstractEventLoop) -> ControlServer:
    """The control server of this process's widgets on ``loop`` (made, not started, on first use)."""
    with _servers_lock:
        server = _servers.get(id(loop))
        if server is None:
            server = _servers[id(loop)] = ControlServer()
        return server


async def enable_controls(widget: Controllable, key: str) -> dict[str, str] | None:
    """Start the process's control server if needed and register ``widget`` under ``key``; the
    value for its ``controls`` trait, or ``None`` when no socket could be made (the comm remains).

    Runs on the widgets' loop. Cancelled: the widget is not registered.
    """
    server = server_for(asyncio.get_running_loop())
    try:
        await server.start()
    except OSError:
        return None
    server.register(key, widget)
    return {"socket": server.name, "token": server.token, "widget": key}
