"""A notebook is a stranger's document: what one click may open, and the hints a user may paste.

A saved job record (and a view's widget state) names a job id and a sandbox URL, and the file may
come from anyone: downloaded, shared, opened from a pull request. The sandbox URL grammar can name
host programs and host paths (``k8s://ns/pod?kubectl=./run-me``, ``?kubeconfig=`` with its exec
plugins, ``ssh://host?config=`` with a ProxyCommand, ``docker://c?docker=./x``,
``docker+image://IMG?volume=/:/host``, ``local://?dir=``, ``jail://?rw=``), so a Reconnect opens
a URL only when it is on :data:`ONE_CLICK_URLS`, a closed list of forms that can neither run a
host program, nor mount or choose a host path, nor create a sandbox — or when the user already
opened that very URL in this kernel (with a magic they ran). Anything else gets the exact magic
to run, quoted by :func:`attach_hint`, and nothing happens until the user runs it.

The JupyterLab extension (``labextension/src/index.js``) holds the same list, so the button is
not even offered for another URL; this module is the authority: the kernel checks again.
"""

from __future__ import annotations

import re
import shlex

from ..protocol.names import is_job_id

__all__ = ["MAX_HINT_URL", "ONE_CLICK_URLS", "attach_hint", "jobs_hint", "one_click", "shell_hint"]

ONE_CLICK_URLS = (
    # Your own local agent: our own program, in its usual place (no dir= chosen by the file).
    re.compile(r"local://(?:\?scope=(?:project|user))?"),
    # A container that already runs, reached with the engine's CLI found on PATH: no options, so
    # no CLI path (docker=), no other daemon (host=), no user, state dir or injection choice.
    re.compile(r"(?:docker|podman)://[A-Za-z0-9][A-Za-z0-9_.-]{0,127}"),
)
"""The sandbox URLs a Reconnect opens with no more than a click (matched whole, as written).

Left out on purpose: ``k8s://`` (kubectl and the kubeconfig's exec plugins are host programs),
``ssh://`` (an ssh client to a host the file names, with the user's keys and config),
``docker+image://`` and ``jail://`` (each creates a sandbox, and takes host mounts),
and every option of every scheme."""

MAX_HINT_URL = 2048
"""Characters of a sandbox URL a hint shows (longer: the hint leaves it out)."""


def one_click(url: str) -> bool:
    """Whether a Reconnect may open ``url`` without the user's typed word (see the module doc)."""
    return any(p.fullmatch(url) for p in ONE_CLICK_URLS)


def _showable(url: str) -> bool:
    # Quoting keeps a value in one shell word, not in one line: a newline in a pasted hint would
    # end the magic and make the rest a line of Python. Only plain printable text is shown.
    return 0 < len(url) <= MAX_HINT_URL and url.isascii() and url.isprintable() and " " not in url


def attach_hint(job_id: str, url: str | None = None) -> str | None:
    """``%exec_remote_attach JOB --sandbox URL``, each value shell-quoted, safe to paste into a
    cell (the magic takes no ``{var}`` expansion); ``None`` for a job id not of the safe form or
    a URL that cannot be shown as one plain line (no hint rather than one naming another sandbox)."""
    if not is_job_id(job_id) or (url and not _showable(url)):
        return None
    hint = f"%exec_remote_attach {shlex.quote(job_id)}"
    return hint + f" --sandbox {shlex.quote(url)}" if url else hint


def shell_hint(session_id: str, url: str) -> str | None:
    """``%remote_shell --shell ID --sandbox URL`` (a shell session shown again), quoted as
    :func:`attach_hint` quotes; ``None`` on the same grounds."""
    if not is_job_id(session_id) or not _showable(url):
        return None
    return f"%remote_shell --shell {shlex.quote(session_id)} --sandbox {shlex.quote(url)}"


def jobs_hint(urls: list[str]) -> str | None:
    """``%remote_jobs --sandbox URL...`` (a dashboard of those sandboxes), quoted as
    :func:`attach_hint` quotes; ``None`` if one URL cannot be shown as one plain line, or holds
    ``{``, ``}`` or ``$``: ``%remote_jobs`` keeps IPython's ``{var}``/``$var`` expansion (the
    tutorials pass their sandboxes that way), so pasted, such a URL would run as code."""
    if not urls or not all(_showable(u) and not set(u) & set("{}$") for u in urls):
        return None
    return "%remote_jobs " + " ".join(f"--sandbox {shlex.quote(u)}" for u in urls)
