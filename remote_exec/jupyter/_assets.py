"""The widgets' front-end code, ``static/*.js|*.css`` beside this module (package data in a wheel).

Each widget's module is ``common.js`` and ``connection.js`` (one disconnected state and one
Reconnect for every widget), then the shared parts it names (``health.js``: link
badge, sparkline, notifications...), then its own file (and likewise for CSS): anywidget loads a
module from its text, where a relative ``import`` cannot resolve, so the shared parts are
prepended instead of imported.

Hot reload: with ``ANYWIDGET_HMR=1`` and the files in a source checkout (not under
``site-packages``, anywidget's own rule), ``_esm``/``_css`` are file objects anywidget watches
and pushes to open views when either file changes; otherwise they are the text, read once.
"""

from __future__ import annotations

import os
import warnings
from collections.abc import Iterator
from pathlib import Path

from anywidget._file_contents import FileContents

__all__ = ["STATIC", "WatchedFiles", "css", "esm"]

STATIC = Path(__file__).resolve().parent / "static"
"""The folder holding the widgets' ``.js`` and ``.css`` files."""


class WatchedFiles(FileContents):
    """Several files read as one text, which anywidget re-sends to the views when any of them changes.

    anywidget watches one path per ``_esm``/``_css``; this is its ``FileContents`` (what it makes
    of a ``pathlib.Path``) over the concatenation. The folder is watched rather than the files, so
    an editor's atomic save (write a new file, rename it over the old) is seen too.

    :param paths: the files, in order; all in one folder.
    :param start_thread: watch for changes in a daemon thread (``stop_thread()`` ends it).
    """

    def __init__(self, *paths: Path, start_thread: bool = True) -> None:
        self._paths = paths
        super().__init__(paths[-1], start_thread=False)
        if start_thread:
            self.watch_in_thread()

    def watch(self) -> Iterator[tuple[int, str]]:
        """Yield ``(change, path)`` for each change to one of the files, after emitting ``changed``.

        Blocks until ``stop_thread()``.
        """
        from watchfiles import watch

        names = {str(p) for p in self._paths}
        for changes in watch(self._paths[0].parent, stop_event=self._stop_event):
            mine = [(int(change), path) for change, path in changes if path in names]
            if mine:
                self._contents = None
                self.changed.emit(str(self))
                yield from mine

    def __str__(self) -> str:
        if self._contents is None:
            self._contents = "\n".join(p.read_text(encoding="utf-8") for p in self._paths)
        return self._contents


def _hot_reload() -> bool:
    """anywidget's rule for watching a widget's file: asked for, and not an installed copy."""
    if os.environ.get("ANYWIDGET_HMR") != "1" or {"site-packages", "dist-packages"} & set(STATIC.parts):
        return False
    try:
        import watchfiles  # noqa: F401
    except ImportError:
        warnings.warn("ANYWIDGET_HMR=1 needs the watchfiles package; widgets will not reload", stacklevel=3)
        return False
    return True


SHARED = {".js": ("common", "connection"), ".css": ("common",)}
"""What every widget's module (and stylesheet) starts with."""


def _asset(name: str, suffix: str, parts: tuple[str, ...]) -> str | WatchedFiles:
    names = (*SHARED[suffix], *parts, name)
    paths = tuple(STATIC / f"{n}{suffix}" for n in names)
    if _hot_reload():
        return WatchedFiles(*paths)
    return "\n".join(p.read_text(encoding="utf-8") for p in paths)


def esm(name: str, *parts: str) -> str | WatchedFiles:
    """The ES module of widget ``name``: the shared helpers, the shared ``parts``, then the
    widget's own code."""
    return _asset(name, ".js", parts)


def css(name: str, *parts: str) -> str | WatchedFiles:
    """The stylesheet of widget ``name``, after the shared one and those of ``parts``."""
    return _asset(name, ".css", parts)
