"""``docker+image://IMAGE``: a hardened throwaway container started from IMAGE, removed on close.

The container is locked down by default, and the agent needs none of what is taken away:

- read-only root filesystem (``--read-only``), with a private tmpfs on ``/tmp`` that allows
  exec (the injected agent runs from there; jobs get scratch space there);
- no capabilities (``--cap-drop ALL``) and ``--security-opt no-new-privileges``;
- ``--pids-limit`` (default 512) against fork bombs;
- no network (``--network none``: only ``lo``) unless asked for;
- ``--init``, so orphaned processes are reaped.

The image's entrypoint is replaced by ``sleep infinity`` (the image needs ``sleep``; busybox
or coreutils); jobs run through ``docker exec``. The agent is injected unless the image has it.

URL query options (besides those of ``docker://``: ``user``, ``docker``, ``host``, ``dir``,
``inject``):

- ``network=NAME``: ``bridge``, ``host``, a network's name... (default ``none``).
- ``volume=SRC:DST[:ro]``: a bind mount or named volume (repeatable).
- ``name=NAME``: name the container; an existing container of that name made by remote_exec
  is reused (so two handles, or a restarted kernel, see the same jobs).
- ``keep=1``: leave the container running on close (default: the handle that created it
  removes it on close; a handle that reused it never does).
- ``pids_limit=N``, ``memory=SIZE`` (e.g. ``2g``), ``tmp_size=SIZE`` (of ``/tmp``, default ``1g``).
- ``pull=missing|never|always``: when to pull IMAGE (default ``missing``, docker's own).

A container whose host process died without closing is left running; find such leftovers with
``docker ps --filter label=remote-exec.managed=1``.
"""

from __future__ import annotations

import secrets

import anyio

from ..client.channel import Channel
from ..errors import SandboxError
from .docker import COMMON_OPTIONS, DockerTransport
from .hostcli import CliError, InjectMode, common_options, parse_query, run_cli

__all__ = ["DockerImageTransport"]

_OPTIONS = COMMON_OPTIONS | {"docker", "network", "volume", "name", "keep", "pids_limit", "memory", "tmp_size", "pull"}
_LABEL = "remote-exec.managed"


class DockerImageTransport(DockerTransport):
    """Starts a hardened container from an image on open; removes it on close (unless kept).

    :param image: the image reference (``python:3.12-slim``, ``registry/x/y@sha256:...``).
    :param name: the container's name; None: a fresh random one.
    :param keep: leave the container running when closed.
    :param network: ``--network`` (``none`` by default).
    :param volumes: ``-v`` arguments.

    The other parameters are those of :class:`~remote_exec.sandboxes.docker.ContainerTransport`
    and the URL options of the same names.
    """

    def __init__(
        self,
        image: str,
        *,
        name: str | None = None,
        keep: bool = False,
        network: str = "none",
        volumes: tuple[str, ...] = (),
        pids_limit: int = 512,
        memory: str | None = None,
        tmp_size: str = "1g",
        pull: str = "missing",
        cli: str | None = None,
        host: str | None = None,
        user: str | None = None,
        state_dir: str | None = None,
        inject: InjectMode = "auto",
    ) -> None:
        if not image or image.startswith("-"):
            raise SandboxError(f"bad image reference {image!r}")
        container = name or f"remote-exec-{secrets.token_hex(6)}"
        super().__init__(container, cli=cli, host=host, user=user, state_dir=state_dir, inject=inject)
        self.image = image
        self.keep = keep
        self.network = network
        self.volumes = volumes
        self.pids_limit = pids_limit
        self.memory = memory
        self.tmp_size = tmp_size
        self.pull = pull
        self.url = f"docker+image://{image}"
        self._named = name is not None
        self._created = False
        self._started = False

    @classmethod
    def from_url(cls, url: str) -> DockerImageTransport:
        """Parse ``docker+image://IMAGE?options`` (see the module docstring).

        :raises SandboxError: a malformed URL or a bad option.
        """
        image, _, query = url.partition("://")[2].partition("?")
        opts = parse_query(url, query, _OPTIONS, multi=frozenset({"volume"}))
        user, host, state_dir, inject = common_options(url, opts)
        one = {k: v[-1] for k, v in opts.items()}
        if one.get("pull", "missing") not in ("missing", "never", "always"):
            raise SandboxError(f"pull must be missing, never or always: {url!r}")
        if one.get("keep", "0") not in ("0", "1", "true", "false"):
            raise SandboxError(f"keep must be 0 or 1: {url!r}")
        try:
            pids_limit = int(one.get("pids_limit", "512"))
        except ValueError:
            raise SandboxError(f"pids_limit must be an integer: {url!r}") from None
        transport = cls(
            image,
            name=one.get("name") or None,
            keep=one.get("keep", "0") in ("1", "true"),
            network=one.get("network") or "none",
            volumes=tuple(opts.get("volume", [])),
            pids_limit=pids_limit,
            memory=one.get("memory") or None,
            tmp_size=one.get("tmp_size") or "1g",
            pull=one.get("pull", "missing"),
            cli=one.get("docker"),
            host=host,
            user=user,
            state_dir=state_dir,
            inject=inject,
        )
        transport.url = url
        return transport

    def run_argv(self) -> list[str]:
        """The ``docker run`` command line that starts the container."""
        argv = ["run", "-d", "--name", self.container, "--label", f"{_LABEL}=1"]
        argv += ["--label", f"remote-exec.image={self.image}"]
        argv += ["--init", "--read-only", "--cap-drop", "ALL", "--security-opt", "no-new-privileges"]
        argv += ["--pids-limit", str(self.pids_limit), "--network", self.network, "--pull", self.pull]
        argv += ["--tmpfs", f"/tmp:rw,exec,nosuid,nodev,size={self.tmp_size},mode=1777"]
        argv += ["--memory", self.memory] if self.memory else []
        argv += ["--user", self.user] if self.user else []
        for volume in self.volumes:
            argv += ["-v", volume]
        return self.cli_argv(*argv, "--entrypoint", "sleep", self.image, "infinity")

    async def _existing(self) -> tuple[bool, bool] | None:
        """(running, made by remote_exec) of the named container, or None if there is none."""
        fmt = '{{.State.Running}} {{index .Config.Labels "' + _LABEL + '"}}'
        try:
            out = await run_cli(self.cli_argv("inspect", "--type", "container", "-f", fmt, self.container))
        except CliError as exc:
            if "no such" in exc.stderr.lower():
                return None
            raise
        running, _, label = out.partition(" ")
        return running == "true", label == "1"

    async def start_container(self) -> None:
        """Create the container (or, when named, reuse one remote_exec made).

        Cancelling may leave a container behind (``docker ps --filter label=remote-exec.managed=1``).

        :raises SandboxError: the image cannot be found or run, or the name belongs to a
            container remote_exec did not make.
        """
        for _ in range(3):
            found = await self._existing() if self._named else None
            if found is not None:
                running, ours = found
                if not ours:
                    raise SandboxError(
                        f"container {self.container} exists and was not made by remote_exec: "
                        f"use docker://{self.container} to use it as it is"
                    )
                if not running:
                    await run_cli(self.cli_argv("start", self.container))
                self._started = True
                return
            try:
                await run_cli(self.run_argv(), timeout=600.0)
            except CliError as exc:
                if self._named and "conflict" in exc.stderr.lower():
                    continue  # created by a concurrent handle just now: reuse it
                raise SandboxError(f"cannot start a container from {self.image}: {exc.stderr or exc}") from exc
            self._created = self._started = True
            return
        raise SandboxError(f"container {self.container} keeps appearing and vanishing")

    async def open_channel(self) -> Channel:
        """Start the container if not yet done, then inject/locate the agent and open the channel.

        A failure or cancellation after the container was created removes it again (unless
        ``keep``), shielded from cancellation.

        :raises SandboxError: the container cannot be started.
        :raises AgentUnavailableError: the agent cannot be injected or started in it.
        """
        if not self._started:
            await self.start_container()
        try:
            return await super().open_channel()
        except BaseException:
            with anyio.CancelScope(shield=True):
                await self.aclose()
            raise

    async def aclose(self) -> None:
        """Remove the container if this handle created it (and ``keep`` is off). Idempotent."""
        if self._created and not self.keep:
            self._created = False
            try:
                await run_cli(self.cli_argv("rm", "-f", "-v", self.container), timeout=60.0)
            except CliError as exc:
                if "no such" not in exc.stderr.lower():
                    raise
