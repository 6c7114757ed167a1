"""Where a browser reaches a forwarded port: directly, or through the Jupyter server's proxy.

A :class:`~remote_exec.PortForward` listens on the kernel's loopback, which only a browser on
the kernel's machine can reach. On Binder, JupyterHub or a Jupyter on a remote host the browser
only reaches the Jupyter server; `jupyter-server-proxy`_ (a server extension) serves
``<base_url>proxy/<port>/`` there by connecting to ``localhost:<port>`` on the server's host,
which is the kernel's host. So under a Jupyter server with that extension the URL for the
browser is that path, relative to the page's origin (whatever host name the browser used, which
the kernel cannot know).

How the server's base URL is found, first match wins:

1. ``REMOTE_EXEC_BROWSER_URL``: a template with ``{port}`` (``https://lab.example/proxy/{port}/``)
   for any other proxy, or ``local`` for ``http://127.0.0.1:<port>`` always.
2. ``JUPYTERHUB_SERVICE_PREFIX`` (JupyterHub and Binder set it for single-user servers and their
   kernels, e.g. ``/user/alice/``).
3. A kernel started by a Jupyter server (``JPY_SESSION_NAME`` in its environment): the server's
   ``base_url`` from its runtime file ``jpserver-<pid>.json`` (the server is the kernel's
   parent), else ``/``.

The proxy is used only when ``jupyter_server_proxy`` is importable here (it is installed where
the server runs, normally the same environment); otherwise, and outside Jupyter, the URL is the
plain ``http://127.0.0.1:<port>``.

.. _jupyter-server-proxy: https://jupyter-server-proxy.readthedocs.io/
"""

from __future__ import annotations

import importlib.util
import json
import os
from pathlib import Path

__all__ = ["BROWSER_URL_ENV", "browser_url", "jupyter_base_url"]

BROWSER_URL_ENV = "REMOTE_EXEC_BROWSER_URL"


def _runtime_dir() -> Path | None:
    if path := os.environ.get("JUPYTER_RUNTIME_DIR"):
        return Path(path)
    try:
        from jupyter_core.paths import jupyter_runtime_dir
    except ImportError:  # no Jupyter here at all
        return None
    return Path(jupyter_runtime_dir())


def _server_base_url() -> str:
    """The base URL of the Jupyter server that started this kernel (``/`` if unknown)."""
    runtime = _runtime_dir()
    if runtime is not None:
        try:
            info = json.loads((runtime / f"jpserver-{os.getppid()}.json").read_text())
        except (OSError, ValueError):
            pass  # another launcher (a nanny, a container): the default base URL
        else:
            base = info.get("base_url") if isinstance(info, dict) else None
            if isinstance(base, str) and base.startswith("/"):
                return base
    return "/"


def jupyter_base_url() -> str | None:
    """The base URL path (``/``, ``/user/alice/``) of the Jupyter server running this kernel.

    ``None`` when this process was not started by a Jupyter server (a script, a terminal
    IPython, nbclient).
    """
    prefix = os.environ.get("JUPYTERHUB_SERVICE_PREFIX")
    if prefix:
        return prefix if prefix.endswith("/") else prefix + "/"
    if os.environ.get("JPY_SESSION_NAME"):
        return _server_base_url()
    return None


def browser_url(port: int) -> str:
    """The URL of ``127.0.0.1:<port>`` for the browser showing this kernel's notebook.

    ``<base_url>proxy/<port>/`` (a path: relative to the page's origin) under a Jupyter server
    with jupyter-server-proxy, ``http://127.0.0.1:<port>`` otherwise; see the module doc.
    """
    local = f"http://127.0.0.1:{port}"
    template = os.environ.get(BROWSER_URL_ENV, "").strip()
    if template:
        return local if template == "local" else template.replace("{port}", str(port))
    base = jupyter_base_url()
    if base is None or importlib.util.find_spec("jupyter_server_proxy") is None:
        return local
    return f"{base}proxy/{port}/"
