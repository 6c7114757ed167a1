"""``docker://CONTAINER`` and ``podman://CONTAINER``: a running container, via ``docker exec -i``.

Every :meth:`ContainerTransport.spawn` is ``docker exec -i [--user U] CONTAINER argv...`` run
with the engine's own CLI, which honours ``DOCKER_HOST`` / ``CONTAINER_HOST``, contexts and
credentials. The agent is found in the container (``remote-exec-agent``, or ``python3 -m
remote_exec.agent``) or, failing that, the bundled agent is injected into ``/tmp``
(checksum-verified; see :mod:`~remote_exec.sandboxes.inject`), so any glibc-based image works,
with or without Python.

URL query options:

- ``user=NAME|UID[:GROUP]``: run the agent (and so every job) as this user.
- ``docker=/path`` (``podman=/path`` for podman): the CLI to use (default: found on PATH).
- ``host=URL``: the engine to talk to (``docker -H`` / ``podman --url``; default: the CLI's
  own choice, e.g. ``$DOCKER_HOST``).
- ``dir=/path``: the agent's state directory inside the container.
- ``inject=auto|always|never``: when to inject the bundled agent (default ``auto``: when the
  container has none).

Killing the host-side ``docker exec`` leaves the agent and its jobs running in the container;
the channel is re-spawned and output resumes from the cursors.
"""

from __future__ import annotations

from collections.abc import Sequence

from ..client.channel import Channel, PipeProcess
from ..errors import AgentUnresponsiveError, RemoteExecError, SandboxError, SandboxLostError
from .base import ExecTransport
from .hostcli import CliError, InjectMode, common_options, map_cli_errors, parse_query, run_cli
from .hostproc import spawn_host
from .native_copy import ArchiveCopy

__all__ = ["COMMON_OPTIONS", "ContainerTransport", "DockerTransport", "PodmanTransport"]

COMMON_OPTIONS = {"user", "host", "dir", "inject"}


class ContainerTransport(ExecTransport):
    """A running container of a Docker-compatible engine, reached with ``<cli> exec -i``.

    :param container: container name or id.
    :param cli: the engine's CLI (``docker``, ``podman``, or a path to one).
    :param host: the engine's address (``-H`` for docker, ``--url`` for podman); None: the CLI's default.
    :param user: user to exec as (``--user``); None: the container's default.
    """

    scheme = "docker"
    host_flag = "-H"

    def __init__(
        self,
        container: str,
        *,
        cli: str | None = None,
        host: str | None = None,
        user: str | None = None,
        state_dir: str | None = None,
        inject: InjectMode = "auto",
    ) -> None:
        if not container or container.startswith("-"):
            raise SandboxError(f"bad container name {container!r}")
        self.container = container
        self.cli = cli or self.scheme
        self.host = host
        self.user = user
        self.agent_state_dir = state_dir
        self.inject = inject
        self.url = f"{self.scheme}://{container}"

    @classmethod
    def from_url(cls, url: str) -> ContainerTransport:
        """Parse ``docker://CONTAINER?options`` (see the module docstring).

        :raises SandboxError: a malformed URL or an unknown option.
        """
        rest = url.partition("://")[2]
        container, _, query = rest.partition("?")
        if not container or "/" in container:
            raise SandboxError(f"{cls.scheme}:// needs a container name, {cls.scheme}://NAME?options: {url!r}")
        opts = parse_query(url, query, COMMON_OPTIONS | {cls.scheme})
        user, host, state_dir, inject = common_options(url, opts)
        cli = opts.get(cls.scheme, [None])[-1]
        transport = cls(container, cli=cli, host=host, user=user, state_dir=state_dir, inject=inject)
        transport.url = url
        return transport

    def cli_argv(self, *args: str) -> list[str]:
        """``[cli, (-H host), *args]``: a command line for this engine."""
        return [self.cli, *((self.host_flag, self.host) if self.host else ()), *args]

    def exec_argv(self, argv: Sequence[str]) -> list[str]:
        """The host command line that runs ``argv`` in the container."""
        user = ["--user", self.user] if self.user else []
        return self.cli_argv("exec", "-i", *user, self.container, *argv)

    async def spawn(self, argv: Sequence[str]) -> PipeProcess:
        """``docker exec -i CONTAINER argv...`` with stdin/stdout pipes (stderr discarded).

        :raises SandboxError: the CLI is not installed.
        """
        with map_cli_errors(self.cli):
            return await spawn_host(self.exec_argv(argv))

    def native_copy(self) -> ArchiveCopy:
        """Big files go in and out with ``<cli> cp`` (the engine's archive API), not ``exec`` pipes."""
        return ArchiveCopy(
            lambda where: self.cli_argv("cp", "-", f"{self.container}:{where}"),
            lambda path: self.cli_argv("cp", f"{self.container}:{path}", "-"),
        )

    async def check_running(self) -> None:
        """Fail early, with the engine's own words, unless the container is running.

        :raises SandboxError: no such container, it is stopped, or the engine is unreachable.
        """
        try:
            state = await run_cli(
                self.cli_argv("inspect", "--type", "container", "-f", "{{.State.Running}}", self.container)
            )
        except CliError as exc:
            raise SandboxError(f"{self.url}: {exc.stderr or exc}") from exc
        if state != "true":
            raise SandboxError(f"{self.url}: container {self.container} is not running")

    async def diagnose(self) -> RemoteExecError | None:
        """The container's state: paused (unresponsive, ``unpause`` resumes it), gone or
        stopped (lost), running (nothing to add); the engine unreachable says nothing."""
        try:
            state = await run_cli(
                self.cli_argv("inspect", "--type", "container", "-f", "{{.State.Status}}", self.container)
            )
        except CliError as exc:
            if "no such" in (exc.stderr or str(exc)).lower():
                return SandboxLostError(f"{self.url}: container {self.container} no longer exists")
            return None
        if state == "paused":
            return AgentUnresponsiveError(
                f"{self.url}: container {self.container} is paused ({self.scheme} unpause resumes it)"
            )
        if state != "running":
            return SandboxLostError(f"{self.url}: container {self.container} is {state[:40]}, not running")
        return None

    async def open_channel(self) -> Channel:
        """Check the container runs, locate or inject the agent, open the persistent channel.

        :raises SandboxError: the container is not there or not running.
        :raises AgentUnavailableError: no agent could be found, injected or started.
        """
        if self.agent_argv is None:
            await self.check_running()
        return await super().open_channel()


class DockerTransport(ContainerTransport):
    """``docker://CONTAINER``: a running Docker container."""

    scheme = "docker"
    host_flag = "-H"


class PodmanTransport(ContainerTransport):
    """``podman://CONTAINER``: a running Podman container (same CLI verbs as docker)."""

    scheme = "podman"
    host_flag = "--url"
