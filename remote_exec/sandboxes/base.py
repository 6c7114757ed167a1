"""``ExecTransport``: the shared base of sandboxes reached by running a process in them.

Docker, Podman, Kubernetes, the bubblewrap jail and SSH all reduce to one primitive,
:meth:`ExecTransport.spawn`: run argv inside the sandbox with stdin/stdout pipes. On top of it
this class finds (or injects) the agent, starts it once, and opens ONE persistent
``remote-exec-agent stdio`` channel that every RPC is multiplexed over. Killing the host-side
process of that channel (``docker exec``, ``nsenter``, ``ssh``) leaves jobs running in the
sandbox; the channel is simply re-spawned and polls resume from their cursors.
"""

from __future__ import annotations

import asyncio
import json
from abc import abstractmethod
from collections.abc import Sequence
from typing import Literal

from ..client.callchannel import read_bounded
from ..client.channel import Channel, PipeProcess, StdioChannel
from ..client.transport import SandboxTransport
from ..errors import AgentUnavailableError, SandboxError
from ..protocol import PROTOCOL_VERSION
from .inject import inject_agent

__all__ = ["MAX_CAPTURE", "ExecTransport"]

MAX_CAPTURE = 256 * 1024 * 1024
"""The most a probe, an upload's check or a read-back may print (the agent bundle read back is
~14 MiB); more is a sandbox that prints forever."""


class ExecTransport(SandboxTransport):
    """A sandbox reached by spawning processes in it; subclasses implement :meth:`spawn`.

    :ivar agent_argv: how to run the agent CLI inside the sandbox, once known (found on the
        image, or injected by :meth:`locate_agent`).
    :ivar agent_state_dir: the agent's state directory inside the sandbox (None: its default).
    :ivar inject: when :meth:`locate_agent` injects the bundled agent (see
        :mod:`~remote_exec.sandboxes.inject`): ``auto`` when no agent is installed, ``always``
        without looking for one, ``never``.
    """

    agent_argv: list[str] | None = None
    agent_state_dir: str | None = None
    stdin_eof = True
    """Whether closing a spawned command's stdin is an EOF it reads (not over a v4 exec WebSocket)."""
    inject: Literal["auto", "always", "never"] = "auto"

    @abstractmethod
    async def spawn(self, argv: Sequence[str]) -> PipeProcess:
        """Run ``argv`` inside the sandbox with stdin and stdout pipes (stderr discarded)."""

    async def exec_capture(self, argv: Sequence[str], input: bytes = b"", timeout: float = 120.0) -> tuple[int, bytes]:
        """Run ``argv`` in the sandbox to completion; return (exit status, stdout).

        :raises SandboxError: it did not finish within ``timeout`` seconds.
        """
        proc = await self.spawn(argv)
        assert proc.stdin is not None and proc.stdout is not None
        try:
            async with asyncio.timeout(timeout):
                if input:
                    proc.stdin.write(input)
                    await proc.stdin.drain()
                proc.stdin.close()
                out = await read_bounded(proc.stdout, MAX_CAPTURE, f"{argv[0]} in {self.url}")
                return await proc.wait(), out
        except TimeoutError:
            raise SandboxError(f"{' '.join(argv)[:200]} did not finish within {timeout} s in {self.url}") from None
        finally:
            try:
                proc.kill()
            except ProcessLookupError:
                pass  # it ended by itself (and was waited for)
            else:
                await proc.wait()  # reaped here: what a bound or a timeout cut short is not left running

    def _agent_args(self, subcommand: str) -> list[str]:
        assert self.agent_argv is not None
        extra = ["--dir", self.agent_state_dir] if self.agent_state_dir else []
        return [*self.agent_argv, subcommand, *extra]

    async def locate_agent(self) -> list[str]:
        """Find an agent in the sandbox that speaks our protocol; return its argv.

        Tries ``remote-exec-agent`` on PATH, then ``python3 -m remote_exec.agent``, then (unless
        :attr:`inject` is ``never``) uploads the bundled agent, checksum-verified: see
        :func:`~remote_exec.sandboxes.inject.inject_agent`.

        :raises AgentUnavailableError: no usable agent.
        """
        if self.inject != "always":
            for argv in (["remote-exec-agent"], ["python3", "-m", "remote_exec.agent"]):
                if await self._agent_works(argv):
                    return argv
        if self.inject == "never":
            raise AgentUnavailableError(
                f"no remote_exec agent in {self.url}: pip install remote-exec-sandbox in the sandbox, "
                "or let the bundled agent be injected"
            )
        return await inject_agent(self)

    async def _agent_works(self, argv: list[str]) -> bool:
        self.agent_argv = argv
        try:
            code, out = await self.exec_capture(self._agent_args("ensure"))
        except (OSError, SandboxError):
            return False
        finally:
            self.agent_argv = None
        if code != 0:
            return False
        try:
            info = json.loads(out)["result"]
        except (ValueError, KeyError, TypeError):
            return False
        return isinstance(info, dict) and info.get("protocol_version") == PROTOCOL_VERSION

    async def open_channel(self) -> Channel:
        """Locate or inject the agent, start it, and return the persistent stdio channel."""
        if self.agent_argv is None:
            self.agent_argv = await self.locate_agent()
        return StdioChannel(self.spawn_agent)

    async def spawn_agent(self) -> PipeProcess:
        """The channel's process: the agent's ``stdio`` relay, spawned at each (re)connect."""
        return await self.spawn(self._agent_args("stdio"))
