"""What one kernel's magics remember: its defaults, its open sandboxes and its shell sessions.

One :class:`KernelState` belongs to one magics instance (made by ``load_ipython_extension``),
never to the module, so two shells in one process (tests) do not share anything.
"""

from __future__ import annotations

import contextlib
import dataclasses
import os
import re
import sys
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from ..blocking import BlockingExecRemoteProcess, BlockingShellSession, Sandbox, connect
from ..errors import ShellClosedError, ShellNotFoundError
from ..protocol.names import is_job_id
from .dashboard_view import shell_session

if TYPE_CHECKING:
    from .background import BackgroundJob

__all__ = ["DEFAULT_SANDBOX", "MAX_SHELLS_TRIED", "Defaults", "KernelState", "notebook_shell", "notebook_tags"]

DEFAULT_SANDBOX = "local://"


@dataclass
class Defaults:
    """``%exec_remote_config`` settings, used when a cell does not say otherwise.

    :ivar widget: ``None`` or ``True``: a live job view for every cell where widgets render
        (a foreground flood stays capped and never trips "IOPub data rate exceeded");
        ``False``: capped text for foreground cells, a one-line note for ``--bg`` ones.
    :ivar interrupt_grace: seconds between the SIGINT an interrupted cell sends and the kill.
    """

    sandbox: str = DEFAULT_SANDBOX
    timeout: float | None = None
    cwd: str | None = None
    env: dict[str, str] = field(default_factory=dict)
    widget: bool | None = None
    interrupt_grace: float = 2.0

    def describe(self) -> str:
        return "\n".join(f"{f.name} = {getattr(self, f.name)!r}" for f in dataclasses.fields(self))


def notebook_tags() -> dict[str, str]:
    """Tags naming where a job was started: ``notebook`` (the path Jupyter Server gives the
    kernel's session in ``JPY_SESSION_NAME``) and ``kernel`` (the id in the kernel's connection
    file name, ``kernel-<id>.json``); either is left out where unknown (a terminal IPython)."""
    tags: dict[str, str] = {}
    notebook = os.environ.get("JPY_SESSION_NAME", "")
    if notebook:
        tags["notebook"] = notebook[-1024:]
    kernel_app = sys.modules.get("ipykernel.kernelapp")
    app = getattr(getattr(kernel_app, "IPKernelApp", None), "_instance", None)
    found = re.search(r"kernel-([0-9A-Za-z-]{1,64})\.json$", str(getattr(app, "connection_file", "") or ""))
    if found:
        tags["kernel"] = found.group(1)
    return tags


MAX_SHELLS_TRIED = 8
"""Sessions :func:`notebook_shell` looks up at most (newest first)."""


def notebook_shell(sb: Sandbox, notebook: str | None) -> BlockingShellSession | None:
    """This notebook's newest shell session still open in ``sb``, found through its commands'
    tags (a command a notebook runs in a session carries the notebook's path, as its jobs do),
    or ``None``: no notebook path known, or no open session ran one of its commands.

    The session id comes from the agent's labels (``shell <id>``): only one of the safe form is
    looked up.

    :raises RemoteExecError: the agent failed (``ProtocolError``: an unsafe listing).
    """
    if not notebook:
        return None
    runs = [j for j in sb.jobs() if (j.tags or {}).get("notebook") == notebook and shell_session(j)]
    tried: set[str] = set()
    for info in sorted(runs, key=lambda j: -j.started_at):
        session_id = shell_session(info)
        if session_id is None or session_id in tried or not is_job_id(session_id):
            continue
        if len(tried) >= MAX_SHELLS_TRIED:
            break
        tried.add(session_id)
        with contextlib.suppress(ShellNotFoundError, ShellClosedError):
            return sb.reattach_shell(session_id)
    return None


class KernelState:
    """Defaults, sandboxes (one blocking connection per URL, kept open) and shells of a kernel."""

    def __init__(self) -> None:
        self.defaults = Defaults()
        self._sandboxes: dict[str, Sandbox] = {}
        self._shells: dict[str, tuple[str, BlockingShellSession]] = {}
        self._last: tuple[str, BlockingShellSession] | None = None
        self.background: list[BlockingExecRemoteProcess] = []
        """Handles of the ``--bg`` jobs started here (left running when the kernel exits)."""
        self.named: dict[str, BackgroundJob] = {}
        """The ``--bg --name`` jobs of this kernel by name: a re-run cell attaches to its name's
        running job (as it does, through the agent's tags, to an earlier kernel's)."""

    def sandbox(self, url: str) -> Sandbox:
        """The kernel's connection to ``url``, opened on first use.

        :raises SandboxError: bad URL or unknown scheme.
        :raises AgentUnavailableError: the agent cannot be started or reached.
        """
        sb = self._sandboxes.get(url)
        if sb is None:
            sb = self._sandboxes[url] = connect(url)
        return sb

    def is_open(self, url: str) -> bool:
        """Whether this kernel has opened ``url`` (with a magic its user ran): a Reconnect may
        open it again whatever it names (see :mod:`~remote_exec.jupyter.trust`)."""
        return url in self._sandboxes

    @property
    def sandboxes(self) -> list[Sandbox]:
        """The sandboxes this kernel has open."""
        return list(self._sandboxes.values())

    def shell(
        self, spec: str, url: str | None, cwd: str | None = None, env: dict[str, str] | None = None
    ) -> tuple[Sandbox, BlockingShellSession]:
        """The session ``spec`` names: ``new``, ``last`` (this kernel's most recent one, in ``url``
        if given; in a kernel that has used none, the notebook's own newest open session, found
        by :func:`notebook_shell`; else a new one) or a session id.

        :raises ShellNotFoundError: no session with that id.
        :raises ShellClosedError: that session has ended.
        """
        if spec == "last":
            found = self.last_shell(url)
            if found is not None:
                return self._remember(*found)
            where = self.shell_url(url)
            earlier = notebook_shell(self.sandbox(where), notebook_tags().get("notebook"))
            if earlier is not None:  # an earlier kernel's (this cell re-run after a restart)
                return self._remember(where, earlier)
            spec = "new"
        url = self.shell_url(url)
        sb = self.sandbox(url)
        if spec == "new":
            return self._remember(url, sb.shell(cwd=cwd, env=env))
        known = self._shells.get(spec)
        if known is not None and known[0] == url and not known[1].closed:
            return self._remember(*known)
        return self._remember(url, sb.reattach_shell(spec))

    def shell_url(self, url: str | None) -> str:
        """Where :meth:`shell` opens or finds a session: ``url``, else this kernel's last
        session's sandbox, else the default one."""
        return url or (self._last[0] if self._last else self.defaults.sandbox)

    def last_shell(self, url: str | None = None) -> tuple[str, BlockingShellSession] | None:
        """This kernel's most recently used open session (in ``url``, if given)."""
        if url is None:
            return self._last if self._last is not None and not self._last[1].closed else None
        for u, s in reversed(self._shells.values()):
            if u == url and not s.closed:
                return u, s
        return None

    def _remember(self, url: str, session: BlockingShellSession) -> tuple[Sandbox, BlockingShellSession]:
        self._shells.pop(session.session_id, None)  # re-insert: the dict's order is recency
        self._shells[session.session_id] = (url, session)
        self._last = (url, session)
        return self.sandbox(url), session

    def close(self, *, keep_background: bool = False) -> None:
        """Close the kernel's sandboxes; idempotent.

        Closing kills the jobs the sandboxes started that still run, except the ``--bg`` ones
        with ``keep_background`` (what a kernel's exit does: they go on, and a later kernel
        finds them with ``%remote_jobs``).
        """
        background, self.background = self.background, []
        if keep_background:
            for proc in background:
                proc.detach()
        sandboxes, self._sandboxes = list(self._sandboxes.values()), {}
        self._shells.clear()
        self._last = None
        for sb in sandboxes:
            sb.close()
