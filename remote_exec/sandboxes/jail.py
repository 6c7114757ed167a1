"""``jail://``: a bubblewrap box on this machine, entered with ``nsenter`` like ``docker exec``.

``jail://`` starts a box of its own when the sandbox opens and kills it, with everything in it,
when the sandbox closes: its own mount, PID, network, IPC and UTS namespaces, the host's system
dirs (``/usr``, ``/etc``, ``/bin``, ``/lib*``, ``/opt``) read-only and nothing else of the host's
(no ``/var``, ``/home``, ``/sys``...: no host socket it was not asked for), a private ``/tmp``,
a writable work dir at ``/workspace``, no capabilities, and (when the host side is root) jobs
and agent as the unprivileged uid :data:`~.jailbox.JAIL_UID`. See :mod:`.jailbox` for why.
URL options (repeatable where it makes sense):

- ``work=/path`` the host dir mounted at ``/workspace`` (created if missing and then given to
  the jail's uid, kept on close; an existing one must be writable by that uid);
  default: a fresh temporary dir, removed on close;
- ``ro=/a`` and ``rw=/b`` extra read-only / writable binds (``/host:/in/box`` to move them);
- ``net=none`` (the default: loopback only) or ``net=host``.

``jail://PID`` attaches to a running box whose init has host PID ``PID`` (see
:attr:`JailBox.url`) and leaves it running on close, so several sandboxes, one after the other
or at once, share its agent and jobs.

The agent runs with this very interpreter (``sys.executable -m remote_exec.agent``), whose
paths are bound read-only into the box (they must be readable by the jail's uid), with its
state dir in the box's private ``/tmp``.
"""

from __future__ import annotations

import asyncio
import shutil
import sys
import tempfile
from collections.abc import Sequence
from pathlib import Path
from typing import Literal
from urllib.parse import parse_qsl, urlsplit

import anyio

from ..client.channel import Channel, PipeProcess
from ..errors import AgentUnavailableError, RemoteExecError, SandboxError, SandboxLostError
from .base import ExecTransport
from .hostproc import spawn_host
from .jailbox import Bind, JailBox, JailConfig, exec_argv, prepare_work
from .jailcgroup import procs_of
from .jailcheck import check_box

__all__ = ["JailTransport"]

AGENT_STATE_DIR = "/tmp/remote-exec-agent"
_OPTIONS = {"work", "ro", "rw", "net"}


class JailTransport(ExecTransport):
    """Runs commands in a bubblewrap box; owns the box unless it attached to one by PID.

    :ivar box: the box started by this transport (None before opening, or when attached).
    :ivar pid: host PID of the box's init (None until known).
    """

    def __init__(
        self,
        work: Path | None = None,
        binds: Sequence[Bind] = (),
        net: Literal["none", "host"] = "none",
        *,
        pid: int | None = None,
    ) -> None:
        self.work = work
        self.binds = tuple(binds)
        self.net: Literal["none", "host"] = net
        self.pid = pid
        self.box: JailBox | None = None
        self._temp_work: Path | None = None
        self.agent_argv = [sys.executable, "-m", "remote_exec.agent"]
        self.agent_state_dir = AGENT_STATE_DIR
        self.url = f"jail://{pid}" if pid is not None else "jail://"

    @classmethod
    def from_url(cls, url: str) -> JailTransport:
        """The transport for a ``jail://`` URL (nothing starts until the sandbox opens).

        :raises SandboxError: malformed URL or unknown option.
        """
        parts = urlsplit(url)
        pairs = parse_qsl(parts.query, keep_blank_values=True)  # in order: later binds go on top
        unknown = {k for k, _ in pairs} - _OPTIONS
        if unknown:
            raise SandboxError(f"unknown jail:// option(s) {sorted(unknown)} in {url!r}")
        repeated = sorted({k for k, _ in pairs if k not in ("ro", "rw") and [p[0] for p in pairs].count(k) > 1})
        if repeated:  # refused, not "the last one wins": a pasted-in value could add &work=...
            raise SandboxError(f"option(s) {repeated} given more than once in {url!r}")
        if parts.path not in ("", "/"):
            raise SandboxError(f"jail:// takes no path: {url!r}")
        if parts.netloc:
            if not parts.netloc.isdigit() or pairs:
                raise SandboxError(f"jail://PID attaches to a running box by PID and takes no options: {url!r}")
            transport = cls(pid=int(parts.netloc))
        else:
            query = dict(pairs)  # single-valued options are single (checked above)
            net = query.get("net", "none")
            if net not in ("none", "host"):
                raise SandboxError(f"net must be none or host, not {net!r}")
            work = query.get("work", "")
            if work and not work.startswith("/"):
                raise SandboxError(f"work must be an absolute path: {work!r}")
            binds = [Bind.parse(v, k == "rw") for k, v in pairs if k in ("ro", "rw")]
            transport = cls(Path(work) if work else None, binds, "host" if net == "host" else "none")
        transport.url = url
        return transport

    async def spawn(self, argv: Sequence[str]) -> PipeProcess:
        """Run ``argv`` in the box (``nsenter``), cleaned of the host's env and capabilities.

        :raises SandboxError: the box is not running.
        """
        if self.pid is None or (self.box is not None and not self.box.alive()):
            raise SandboxError(f"the jail of {self.url} is not running")
        if self.box is None:
            # A box we attached to may have died and its PID been reused. (/proc reads: in a thread)
            await asyncio.to_thread(check_box, self.pid)
        if self.box is not None:
            procs = self.box.cgroup.procs() if self.box.cgroup is not None else []
        else:  # an attached box: its cgroup is wherever its init is (/proc reads: in a thread)
            procs = await asyncio.to_thread(procs_of, self.pid)
        return await spawn_host(exec_argv(self.pid, argv, procs))

    async def _start_box(self) -> None:
        created = True
        if self.work is None:
            made = await anyio.to_thread.run_sync(tempfile.mkdtemp, None, "remote-exec-jail-")
            self._temp_work = self.work = Path(made)
        elif await anyio.Path(self.work).is_dir():
            created = False
        else:
            await anyio.Path(self.work).mkdir(parents=True, exist_ok=True)
        await anyio.to_thread.run_sync(prepare_work, self.work, created)
        # launch() runs here, in the event loop's thread: bwrap's --die-with-parent fires when
        # the thread that forked it exits, and a worker thread may exit long before the box.
        self.box = JailBox.launch(JailConfig(self.work, self.binds, self.net))
        await anyio.to_thread.run_sync(self.box.wait_ready)
        self.pid = self.box.pid

    async def open_channel(self) -> Channel:
        """Start the box (or check the attached one) and the agent in it; return the channel.

        :raises SandboxError: the box cannot be started or attached to.
        :raises AgentUnavailableError: the agent does not start in the box.
        """
        try:
            if self.pid is None:
                await self._start_box()
            else:
                await asyncio.to_thread(check_box, self.pid)
            # `ensure` up front starts the agent now and says why it cannot run (a stdio channel
            # to a failing agent would only look like a dropped connection).
            ensure = ["sh", "-c", 'exec "$@" 2>&1', "sh", *self._agent_args("ensure")]
            code, out = await self.exec_capture(ensure)
            if code != 0:
                text = out.decode(errors="replace").strip()[-2000:]
                raise AgentUnavailableError(f"the agent does not start in {self.url} (exit {code}): {text}")
        except BaseException:
            await self.aclose()  # the sandbox never opened, so nobody else will
            raise
        return await super().open_channel()

    async def diagnose(self) -> RemoteExecError | None:
        """Lost when the box has exited (bubblewrap's init died: everything in it died too)."""
        if self.box is not None and not self.box.alive():
            return SandboxLostError(f"{self.url}: the jail's box has exited; its jobs died with it")
        if self.box is None and self.pid is not None:
            try:
                await asyncio.to_thread(check_box, self.pid)
            except SandboxError:
                return SandboxLostError(f"{self.url}: the jail's box (pid {self.pid}) is gone")
        return None

    async def aclose(self) -> None:
        """Kill the box this transport started, with everything in it, and remove a temporary
        work dir. An attached box is left running. Idempotent."""
        box, self.box = self.box, None
        if box is not None:
            self.pid = None  # its PID may be reused once the box is gone
            with anyio.CancelScope(shield=True):
                await anyio.to_thread.run_sync(box.kill)
        temp, self._temp_work = self._temp_work, None
        if temp is not None:
            with anyio.CancelScope(shield=True):
                await anyio.to_thread.run_sync(shutil.rmtree, temp, True)
