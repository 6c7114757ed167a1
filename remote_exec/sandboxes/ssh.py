"""``ssh://[user@]host[:port]``: a remote host reached over ONE SSH connection (asyncssh).

Every :meth:`SSHTransport.spawn` is a new session channel on that connection, so the agent
probe, the persistent ``stdio`` channel and its re-spawns after a drop cost a few milliseconds
each instead of a new SSH handshake. If the connection itself drops, the next spawn reconnects.

Authentication is by key only (ssh-agent, ``~/.ssh/id_*``, ``?key=``), and the host key is
checked against ``known_hosts``: an unknown or changed key is refused unless you opt out.
``~/.ssh/config`` is honoured (host aliases, ``User``, ``Port``, ``IdentityFile``...).

URL query options:

- ``known_hosts=/path``: trust the keys in this file (default: ``~/.ssh/known_hosts``).
- ``host_key_check=no``: accept any host key (insecure; for throw-away hosts only).
- ``key=/path``: a private key to authenticate with (repeatable; default: ssh-agent and ~/.ssh).
- ``config=/path``: an ssh_config file to read instead of ``~/.ssh/config``.
- ``agent=CMD``: how to run the agent CLI on the host (shell words, e.g. ``/opt/venv/bin/remote-exec-agent``);
  ``python=/path``: shorthand for ``PATH -m remote_exec.agent``. Default: found with
  :meth:`~remote_exec.sandboxes.base.ExecTransport.locate_agent`.
- ``dir=/path``: the agent's state directory on the host.
- ``connect_timeout=SECONDS``: how long connecting may take (default 30).

asyncssh is an optional dependency (``pip install 'remote-exec-sandbox[ssh]'``), imported only when an
``ssh://`` sandbox is used.
"""

from __future__ import annotations

import asyncio
import contextlib
import importlib
import importlib.util
import shlex
from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING
from urllib.parse import urlsplit

from ..client.channel import Channel, PipeProcess
from ..client.rpc import RpcClient
from ..errors import AgentUnavailableError, RemoteExecError, SandboxError, SandboxLostError
from ..protocol import Empty, Method, ServerInfo
from .base import ExecTransport
from .hostcli import parse_query
from .ssh_pipe import SSHPipeProcess

if TYPE_CHECKING:
    import asyncssh

__all__ = ["SSHTransport"]

_OPTIONS = {"known_hosts", "host_key_check", "key", "config", "agent", "python", "dir", "connect_timeout"}
# A dead peer (cable pulled, host frozen) sends no RST: keepalives notice it within ~1 min and
# close the connection, which ends the stdio channel and makes the next spawn reconnect.
_KEEPALIVE_INTERVAL = 15.0
_KEEPALIVE_COUNT_MAX = 4


def _require_asyncssh() -> None:
    # Functions below import asyncssh where they need it (typed); this turns its absence into a
    # clear error when the transport is made. It only looks for the package: the transport is
    # made on an event loop, and asyncssh's first import runs `ldconfig -p` (ctypes looking for
    # liboqs), which _connect leaves to a thread.
    if importlib.util.find_spec("asyncssh") is None:
        raise SandboxError("ssh:// sandboxes need asyncssh: pip install 'remote-exec-sandbox[ssh]'")


class SSHTransport(ExecTransport):
    """A host reached over SSH, with one connection for the whole sandbox.

    :param host: host name, address or ``~/.ssh/config`` alias.
    :param port: TCP port (default: from ssh config, else 22).
    :param username: login name (default: from ssh config, else the local user).
    :param keys: private key files to authenticate with (default: ssh-agent and ``~/.ssh/id_*``).
    :param known_hosts: the known_hosts file to trust (default: ``~/.ssh/known_hosts``).
    :param host_key_check: ``False`` accepts any host key (insecure, explicit opt-out).
    :param config: ssh_config files to read (default: ``~/.ssh/config``).
    :param agent_argv: how to run the agent CLI on the host (default: located).
    :param state_dir: the agent's state directory on the host (default: the agent's default).
    :param connect_timeout: seconds connecting and authenticating may take.
    :ivar target: ``ssh://[user@]host[:port]``, the URL without its options (used in messages).
    """

    def __init__(
        self,
        host: str,
        *,
        port: int | None = None,
        username: str | None = None,
        keys: Sequence[str] = (),
        known_hosts: str | None = None,
        host_key_check: bool = True,
        config: Sequence[str] = (),
        agent_argv: Sequence[str] | None = None,
        state_dir: str | None = None,
        connect_timeout: float = 30.0,
    ) -> None:
        _require_asyncssh()
        if not host_key_check and known_hosts is not None:
            raise SandboxError("known_hosts and host_key_check=no contradict each other: pick one")
        self.host = host
        self.port = port
        self.username = username
        self.keys = list(keys)
        self.known_hosts = known_hosts
        self.host_key_check = host_key_check
        self.config = list(config)
        self.agent_argv = list(agent_argv) if agent_argv else None
        self._agent_given = bool(agent_argv)
        self.agent_state_dir = state_dir
        self.connect_timeout = connect_timeout
        user = f"{username}@" if username else ""
        self.target = f"ssh://{user}{host}" + (f":{port}" if port else "")
        self.url = self.target
        self._conn: asyncssh.SSHClientConnection | None = None
        self._conn_lock = asyncio.Lock()

    @classmethod
    def from_url(cls, url: str) -> SSHTransport:
        """Parse ``ssh://[user@]host[:port][?options]`` (options in the module docstring).

        :raises SandboxError: malformed URL, unknown option, or asyncssh not installed.
        """
        parts = urlsplit(url)
        try:
            port = parts.port
        except ValueError:
            raise SandboxError(f"bad port in {url!r}") from None
        if not parts.hostname:
            raise SandboxError(f"ssh:// needs a host: {url!r}")
        if parts.password is not None:
            raise SandboxError("ssh:// takes no password in the URL: authenticate with a key (?key=/path)")
        if parts.path not in ("", "/"):
            raise SandboxError(f"ssh:// takes no path (use ?dir= for the agent's state dir): {url!r}")
        query = parse_query(url, parts.query, _OPTIONS, multi=frozenset({"key", "config"}))
        one = {k: v[-1] for k, v in query.items()}
        if one.get("host_key_check", "yes") not in ("yes", "no"):
            raise SandboxError(f"host_key_check must be yes or no, not {one['host_key_check']!r}")
        if "agent" in one and "python" in one:
            raise SandboxError("give agent= or python=, not both")
        agent = shlex.split(one["agent"]) if "agent" in one else None
        if agent == [] or one.get("python") == "":
            raise SandboxError(f"agent= and python= need a command: {url!r}")
        if "python" in one:
            agent = [one["python"], "-m", "remote_exec.agent"]
        try:
            connect_timeout = float(one.get("connect_timeout", 30.0))
        except ValueError:
            raise SandboxError(f"connect_timeout must be a number: {url!r}") from None
        transport = cls(
            parts.hostname,
            port=port,
            username=parts.username,
            keys=query.get("key", []),
            known_hosts=one.get("known_hosts"),
            host_key_check=one.get("host_key_check", "yes") == "yes",
            config=query.get("config", []),
            agent_argv=agent,
            state_dir=one.get("dir"),
            connect_timeout=connect_timeout,
        )
        transport.url = url
        return transport

    # -- the connection ---------------------------------------------------------------------

    def _load_files(self) -> tuple[asyncssh.SSHKnownHosts | tuple[()] | None, Sequence[asyncssh.SSHKeyPair]]:
        """Read known_hosts and the keys up front, so a bad path is reported as such."""
        import asyncssh

        known: asyncssh.SSHKnownHosts | tuple[()] | None = () if self.host_key_check else None  # (): the default
        if self.known_hosts is not None:
            try:
                known = asyncssh.read_known_hosts(self.known_hosts)
            except (OSError, ValueError) as exc:
                raise SandboxError(f"cannot read known_hosts {self.known_hosts}: {exc}") from exc
        keys: Sequence[asyncssh.SSHKeyPair] = ()  # (): ssh-agent and ~/.ssh/id_*
        if self.keys:
            try:
                keys = asyncssh.load_keypairs(self.keys)
            except (OSError, ValueError) as exc:  # KeyImportError is a ValueError
                raise SandboxError(f"cannot load private key {', '.join(self.keys)}: {exc}") from exc
        return known, keys

    def _host_key_error(self, exc: Exception) -> str:
        """Say whether the host is unknown or its key changed (a possible attack)."""
        import asyncssh

        path = self.known_hosts or str(Path("~/.ssh/known_hosts").expanduser())
        where = f"?known_hosts={path}" if self.known_hosts else f"{path} (or your ssh config's UserKnownHostsFile)"
        port = self.port if self.port not in (None, 22) else None
        changed = False
        with contextlib.suppress(OSError, ValueError):
            trusted = asyncssh.read_known_hosts(path).match(self.host, "", port)
            changed = bool(trusted[0] or trusted[1])
        hostport = f"[{self.host}]:{port}" if port else self.host
        if changed:
            return (
                f"host key of {hostport} does NOT match the one recorded in {where}: refusing to connect "
                f"(possible man-in-the-middle attack; if the host was re-installed, remove the old entry "
                f"with `ssh-keygen -R '{hostport}'`) [{exc}]"
            )
        return (
            f"host key of {hostport} is unknown: it is not in {where}, and keys are not trusted on first "
            f"use. Check its fingerprint and add it (`ssh-keyscan -p {self.port or 22} {self.host}`), or "
            f"name a file with ?known_hosts=/path, or skip the check with ?host_key_check=no (insecure)"
        )

    async def _connect(self) -> asyncssh.SSHClientConnection:
        await asyncio.to_thread(importlib.import_module, "asyncssh")  # its first import blocks (ldconfig)
        import asyncssh  # (now from sys.modules)

        known_hosts, keys = await asyncio.to_thread(self._load_files)
        who = f"{self.username + '@' if self.username else ''}{self.host}"
        try:
            conn: asyncssh.SSHClientConnection = await asyncssh.connect(
                self.host,
                self.port if self.port is not None else (),
                username=self.username if self.username is not None else (),
                known_hosts=known_hosts,
                client_keys=keys,
                config=self.config or (),
                connect_timeout=self.connect_timeout,
                keepalive_interval=_KEEPALIVE_INTERVAL,
                keepalive_count_max=_KEEPALIVE_COUNT_MAX,
            )
        except asyncssh.HostKeyNotVerifiable as exc:
            raise SandboxError(await asyncio.to_thread(self._host_key_error, exc)) from exc
        except asyncssh.PermissionDenied as exc:
            raise SandboxError(
                f"ssh authentication failed for {who} ({exc.reason}): only key authentication is used; "
                "pass ?key=/path/to/private_key, load the key into ssh-agent, or check authorized_keys"
            ) from exc
        except (OSError, TimeoutError, asyncssh.Error) as exc:
            raise AgentUnavailableError(f"cannot connect to {self.target}: {exc or type(exc).__name__}") from exc
        return conn

    async def connection(self) -> asyncssh.SSHClientConnection:
        """The open SSH connection, (re)connecting if there is none or it was lost.

        Cancelling it while connecting abandons that attempt; the next call starts a new one.

        :raises SandboxError: host key unknown or changed, authentication failed, bad key file.
        :raises AgentUnavailableError: the host cannot be reached.
        """
        async with self._conn_lock:
            if self._conn is None or self._conn.is_closed():
                self._conn = await self._connect()
            return self._conn

    async def spawn(self, argv: Sequence[str]) -> PipeProcess:
        """Run ``argv`` on the host in a new session channel of the shared connection.

        The command goes through the login shell (as with ``ssh host cmd``), quoted word by word.
        A connection found dead is replaced once. Cancelling abandons the session being opened.

        :raises SandboxError: reconnecting failed on the host key or authentication.
        :raises AgentUnavailableError: the host cannot be reached, or refuses the session.
        """
        import asyncssh

        command = shlex.join(argv)
        for attempt in (1, 2):
            conn = await self.connection()
            try:
                process: asyncssh.SSHClientProcess[bytes] = await conn.create_process(
                    command, encoding=None, stderr=asyncssh.DEVNULL
                )
            except asyncssh.ChannelOpenError as exc:  # e.g. sshd's MaxSessions reached
                raise AgentUnavailableError(f"{self.target} refused a session: {exc.reason}") from exc
            except (asyncssh.Error, OSError) as exc:  # the connection died under us
                conn.abort()
                if attempt == 2:
                    raise AgentUnavailableError(f"lost the connection to {self.target}: {exc}") from exc
                continue
            return SSHPipeProcess(process)
        raise AssertionError("unreachable")

    async def open_channel(self) -> Channel:
        """Connect, check (or locate) the agent, and return the persistent stdio channel.

        On failure or cancellation the connection made so far is closed.

        :raises SandboxError: host key unknown or changed, authentication failed, bad key file.
        :raises AgentUnavailableError: unreachable host, or no working agent on it.
        """
        try:
            await self.connection()  # connection errors first, not disguised as "no agent"
            channel = await super().open_channel()
            if self._agent_given:
                await self._probe(channel)
            return channel
        except BaseException:
            await self.aclose()  # the sandbox never opened, so nobody else will close the connection
            raise

    async def _probe(self, channel: Channel) -> None:
        """Check a named agent command with one request over the channel itself.

        Cheaper than an ``ensure`` run first (each start of the agent CLI costs ~0.4 s of Python
        imports), and a command that is missing or broken still gets a clear error.
        """
        try:
            await RpcClient(channel, attempts=1).call(Method.SERVER_INFO, Empty(), ServerInfo, timeout=60.0)
        except RemoteExecError as exc:
            await channel.aclose()
            why = str(exc)
            with contextlib.suppress(RemoteExecError, OSError):  # only to word the error better
                code, _ = await self.exec_capture(self._agent_args("ensure"), timeout=30.0)
                why = "command not found (exit status 127)" if code == 127 else f"`ensure` exited {code}"
            argv = shlex.join(self.agent_argv or [])
            raise AgentUnavailableError(f"the agent command {argv!r} does not work on {self.target}: {why}") from exc
        self._agent_given = False  # checked once; re-spawns of the channel trust it

    async def diagnose(self) -> RemoteExecError | None:
        """Drop the connection that failed us (it may be silent for ever: a cut link, a frozen
        sshd) and try a new one: the host unreachable means the sandbox is lost; reachable, the
        next call uses the new connection."""
        async with self._conn_lock:
            conn, self._conn = self._conn, None
        if conn is not None:
            conn.abort()
        try:
            await self.connection()
        except AgentUnavailableError as exc:
            return SandboxLostError(f"{self.url}: {exc.message}")
        return None

    async def aclose(self) -> None:
        """Close the SSH connection (jobs held by the agent on the host live on). Idempotent.

        Cancelling it stops waiting; the connection still closes.
        """
        conn, self._conn = self._conn, None
        if conn is not None:
            conn.close()
            await conn.wait_closed()
