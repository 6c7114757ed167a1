"""``local://``: the agent as a detached process on this machine (no isolation at all).

The agent keeps running when the host process ends, so a job survives a kernel restart and can
be re-attached; it exits by itself after ``idle_timeout`` seconds with no jobs and no requests.

Which agent: by default the one of this project (the git work tree holding the working
directory, or the directory itself), so that one notebook's jobs are not every tool's; ``scope=user``
shares the per-user agent on purpose, ``dir`` names a state directory (see
:mod:`remote_exec.sandboxes.localscope`). The agent starts with a small allowlist of the starting
client's environment, never all of it (:mod:`remote_exec.sandboxes.localenv`).

URL query options: ``dir`` (state directory), ``scope`` (``project``, the default, or ``user``),
``channel`` (``socket``, the default, talks to the agent's socket directly; ``stdio`` and ``call``
go through the agent CLI as remote sandboxes do), ``idle_timeout`` (seconds, 0 = never),
``buffer_limit`` (bytes a job's stdin queue holds; output goes to disk), ``memory_budget`` (bytes
the agent holds in all;
default from the cgroup limit), ``disk_cap`` (bytes of each job output stream kept on disk, default
1 GiB), ``log_budget`` (bytes of all jobs' logs on disk; default a quarter of the state dir's file
system). The last five apply when this call starts the agent.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import sys
from pathlib import Path
from typing import Literal
from urllib.parse import quote, urlsplit

from ..client.callchannel import CallChannel
from ..client.channel import Channel, PipeProcess, StdioChannel
from ..client.socketchannel import SocketChannel
from ..client.transport import SandboxTransport
from ..errors import AgentUnavailableError, SandboxError, error_from_wire
from ..protocol import STREAM_SOCKET
from ..protocol.ownership import check_peer, check_socket, check_state_dir
from .hostcli import parse_query
from .hostproc import spawn_host
from .localenv import agent_environment
from .localscope import Scope, scope_dir, secure_parent

__all__ = ["LocalTransport"]

ChannelKind = Literal["socket", "stdio", "call"]
_OPTIONS = {"dir", "scope", "channel", "idle_timeout", "buffer_limit", "memory_budget", "disk_cap", "log_budget"}


class LocalTransport(SandboxTransport):
    """Runs the agent with this interpreter, as ``python -m remote_exec.agent``."""

    def __init__(
        self,
        state_dir: Path | None = None,
        channel: ChannelKind = "socket",
        idle_timeout: float = 900.0,
        buffer_limit: int = 8 * 1024 * 1024,
        memory_budget: int | None = None,
        disk_cap: int | None = None,
        log_budget: int | None = None,
        scope: Scope = "project",
    ) -> None:
        # A project's state dir sits in a "-projects" dir we make and check ourselves.
        self.state_dir, self._scoped = (state_dir, False) if state_dir else scope_dir(scope)
        self.channel_kind = channel
        self.idle_timeout = idle_timeout
        self.buffer_limit = buffer_limit
        self.memory_budget = memory_budget
        self.disk_cap = disk_cap
        self.log_budget = log_budget
        # Quoted, so that a dir holding "&" or "#" gives a URL that opens this same dir again.
        self.url = f"local://?dir={quote(os.fspath(self.state_dir), safe='/')}" if state_dir else "local://"
        if state_dir is None and scope == "user":
            self.url = "local://?scope=user"

    @classmethod
    def from_url(cls, url: str) -> LocalTransport:
        parts = urlsplit(url)
        if parts.netloc or parts.path not in ("", "/"):
            raise SandboxError(f"local:// takes no host or path, only ?dir=...: {url!r}")
        query = {k: v[-1] for k, v in parse_query(url, parts.query, _OPTIONS).items()}
        if query.get("dir") == "":
            raise SandboxError(f"option dir= is empty in {url!r}")
        scope = query.get("scope", "project")
        if scope not in ("project", "user"):
            raise SandboxError(f"scope must be project or user, not {scope!r}")
        if "dir" in query and "scope" in query:
            raise SandboxError(f"give dir= or scope=, not both: {url!r}")
        channel = query.get("channel", "socket")
        if channel not in ("socket", "stdio", "call"):
            raise SandboxError(f"channel must be socket, stdio or call, not {channel!r}")
        try:
            idle = float(query.get("idle_timeout", 900.0))
            buffer_limit = int(query.get("buffer_limit", 8 * 1024 * 1024))
            memory_budget = int(query["memory_budget"]) if "memory_budget" in query else None
            disk_cap = int(query["disk_cap"]) if "disk_cap" in query else None
            log_budget = int(query["log_budget"]) if "log_budget" in query else None
        except ValueError:
            raise SandboxError(
                f"idle_timeout, buffer_limit, memory_budget, disk_cap and log_budget must be numbers: {url!r}"
            ) from None
        state_dir = Path(query["dir"]) if "dir" in query else None
        transport = cls(state_dir, channel, idle, buffer_limit, memory_budget, disk_cap, log_budget, scope)  # type: ignore[arg-type]
        transport.url = url
        return transport

    def agent_argv(self, subcommand: str) -> list[str]:
        return [
            sys.executable,
            "-m",
            "remote_exec.agent",
            subcommand,
            "--dir",
            os.fspath(self.state_dir),
            "--idle-timeout",
            str(self.idle_timeout),
            "--buffer-limit",
            str(self.buffer_limit),
            *(["--memory-budget", str(self.memory_budget)] if self.memory_budget is not None else []),
            *(["--disk-cap", str(self.disk_cap)] if self.disk_cap is not None else []),
            *(["--log-budget", str(self.log_budget)] if self.log_budget is not None else []),
        ]

    def default_cwd(self) -> str | None:
        """The client's working directory now (a notebook kernel's: the notebook's folder, where
        ``%%bash`` runs too): the agent is shared by every client of the project, and its own
        working directory is that of whichever client started it. ``None`` (the agent's) when
        the client's has been removed."""
        try:
            return os.getcwd()  # the kernel's cached dentry path: no I/O (listed in loopguard.py)
        except OSError:
            return None

    @property
    def socket_path(self) -> Path:
        return self.state_dir / "agent.sock"

    async def _socket_accepts(self) -> bool:
        """True if our own agent accepts on the socket; False if there is none (start one).

        :raises UntrustedAgentError: the state dir, the socket or its listener is another
            user's (checked before connecting, and the peer's uid once connected).
        """

        def owned_socket() -> bool:  # (lstats: in a thread, not on the loop)
            check_state_dir(self.state_dir)
            return check_socket(self.socket_path)

        try:
            if not await asyncio.to_thread(owned_socket):
                return False
            _, writer = await asyncio.open_unix_connection(os.fspath(self.socket_path))
        except OSError:
            return False
        try:
            check_peer(writer.get_extra_info("socket"), self.socket_path)
        finally:
            writer.close()
            await writer.wait_closed()
        return True

    async def ensure_agent(self) -> None:
        """Start the agent unless its socket accepts connections already.

        :raises UntrustedAgentError: the state dir or the agent in it is another user's.
        :raises AgentUnavailableError: the agent could not be started.
        """
        if self._scoped:
            await asyncio.to_thread(secure_parent, self.state_dir)  # (a mkdir and lstats: not on the loop)
        if await self._socket_accepts():
            return
        proc = await asyncio.create_subprocess_exec(
            *self.agent_argv("ensure"),
            stdout=asyncio.subprocess.PIPE,
            stderr=asyncio.subprocess.PIPE,
            env=agent_environment(os.environ),
        )
        out, err = await proc.communicate()
        if proc.returncode != 0:
            with contextlib.suppress(ValueError, TypeError, KeyError):  # the agent's own reason, as its class
                error = json.loads(out)["error"]
                raise error_from_wire(int(error["code"]), str(error["message"]), error.get("data"))
            raise AgentUnavailableError(
                f"cannot start the local agent: {(err or out).decode(errors='replace').strip()}"
            )

    async def _spawn(self, subcommand: str) -> PipeProcess:
        return await spawn_host(self.agent_argv(subcommand), env=agent_environment(os.environ))

    async def open_channel(self) -> Channel:
        await self.ensure_agent()
        if self.channel_kind == "stdio":
            return StdioChannel(lambda: self._spawn("stdio"))
        if self.channel_kind == "call":
            return CallChannel(lambda: self._spawn("call"))
        return SocketChannel(self.state_dir / STREAM_SOCKET, self.ensure_agent)
