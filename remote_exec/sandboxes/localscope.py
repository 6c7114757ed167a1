"""Which ``local://`` agent a client talks to: one per project, or one shared on purpose.

One agent per user for every tool and notebook would put every notebook's jobs in every other's
``%remote_jobs`` and dashboard. The default scope is therefore the **project**: the git work tree
that holds the client's working directory (a notebook kernel's is the notebook's folder), or the
working directory itself outside git. A kernel restart in the same notebook, and ``remote-exec``
run from the same project, find the same agent, so reattach keeps working.

Shared on purpose: ``local://?scope=user`` (the per-user agent of
:func:`remote_exec.protocol.default_agent_dir`), ``local://?dir=PATH`` (any state dir of yours),
or ``$REMOTE_EXEC_AGENT_DIR`` (an explicit state dir for everything that has it set).

Project state dirs live next to the per-user one, in ``<it>-projects/<name>-<hash>`` (the hash is
of the project's real path, the name only helps a reader). The ``-projects`` parent is made 0700
and checked like a state dir (:func:`remote_exec.protocol.ownership.check_state_dir`) before the
agent makes its own dir in it: a predictable name under ``/tmp`` that another user made first is
refused, never used.
"""

from __future__ import annotations

import contextlib
import hashlib
import os
import re
from pathlib import Path
from typing import Literal

from ..protocol import default_agent_dir
from ..protocol.ownership import check_state_dir

__all__ = ["Scope", "project_root", "scope_dir", "secure_parent"]

Scope = Literal["project", "user"]
_EXPLICIT = "REMOTE_EXEC_AGENT_DIR"


def project_root(cwd: Path) -> Path:
    """The git work tree holding ``cwd`` (a ``.git`` directory or file), else ``cwd`` itself."""
    cwd = Path(os.path.realpath(cwd))
    for d in (cwd, *cwd.parents):
        if os.path.lexists(d / ".git"):
            return d
    return cwd


def scope_dir(scope: Scope, cwd: Path | None = None) -> tuple[Path, bool]:
    """The state dir of ``scope`` seen from ``cwd`` (default: the working directory), and
    whether it is a project's (whose parent :func:`secure_parent` must make first)."""
    explicit = os.environ.get(_EXPLICIT)
    if explicit:
        return Path(explicit), False
    user = default_agent_dir()
    if scope == "user":
        return user, False
    root = project_root(cwd if cwd is not None else Path.cwd())
    digest = hashlib.sha256(os.fsencode(root)).hexdigest()[:16]
    name = re.sub(r"[^A-Za-z0-9._-]", "_", root.name)[:24].lstrip(".") or "root"
    return user.with_name(user.name + "-projects") / f"{name}-{digest}", True


def secure_parent(state_dir: Path) -> None:
    """Make a project state dir's parent 0700, or check that the existing one is ours.

    :raises UntrustedAgentError: the parent is a symlink or another user's.
    """
    with contextlib.suppress(FileExistsError):
        os.mkdir(state_dir.parent, 0o700)
    check_state_dir(state_dir.parent)
