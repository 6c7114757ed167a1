"""A Jupyter Server extension: kernel websockets send small messages at once (``TCP_NODELAY``).

Jupyter Server leaves Nagle's algorithm on for its kernel websockets: a small message written
while an earlier one is not yet acknowledged waits for the browser's delayed ACK (about 40 ms on
Linux). A keystroke in a terminal answers with several small messages (the kernel's busy/idle
status, the echo), so each echo waited for it: a comm round trip took ~55 ms here, ~22 ms with
``TCP_NODELAY`` (``bench/terminal.py``). Bulk output is unaffected: it is paced into a few large
messages anyway.

The extension wraps whichever kernel websocket connection class the server is configured with
(the default, a gateway's...), so it composes with other configuration. Enabled by
``etc/jupyter/jupyter_server_config.d/remote_exec_nodelay.json``, which the wheel installs into
the environment's prefix; ``jupyter server extension disable remote_exec.jupyter.nodelay`` turns
it off.
"""

from __future__ import annotations

import contextlib
from typing import Any

__all__ = ["load_jupyter_server_extension", "no_delay"]

SETTING = "kernel_websocket_connection_class"


def no_delay(base: type[Any]) -> type[Any]:
    """A subclass of the connection class ``base`` whose websocket sets ``TCP_NODELAY`` on connect."""

    class NoDelay(base):  # type: ignore[misc]  # the server's class, known at run time
        def connect(self) -> Any:
            with contextlib.suppress(Exception):  # a transport without the option: leave it as it is
                self.websocket_handler.set_nodelay(True)
            return super().connect()

    NoDelay.__name__ = NoDelay.__qualname__ = f"NoDelay{base.__name__}"
    return NoDelay


def _jupyter_server_extension_points() -> list[dict[str, str]]:
    return [{"module": "remote_exec.jupyter.nodelay"}]


def load_jupyter_server_extension(serverapp: Any) -> None:
    """Wrap the server's kernel websocket connection class (read per connection from its settings)."""
    settings = serverapp.web_app.settings
    base = settings.get(SETTING)
    if base is None or getattr(base, "__name__", "").startswith("NoDelay"):
        return
    settings[SETTING] = no_delay(base)
    serverapp.log.info("remote_exec: kernel websockets send small messages at once (TCP_NODELAY)")


_load_jupyter_server_extension = load_jupyter_server_extension
